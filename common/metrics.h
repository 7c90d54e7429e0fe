/* Metrics (docs/operations.md): one registry per process (one daemon per process) of counters and
 * histograms, rendered in the Prometheus text format for GET /metrics (common/httpd.c). Every label value
 * comes from a bounded set: agents (profiles: the [agent.NAME] sections, never an agent id of a turn) and
 * tools from the configuration, rule names, statuses and error codes; anything else is counted as "other",
 * and a family never holds more than TW_METRICS_MAX_SERIES series.
 *
 * Who counts what (summed over all daemons, every figure counts each thing once):
 *  - turnwatch_turns_ended_total{agent,status,error}: the daemon whose own transaction ended the turn,
 *    when it publishes that transaction's events (tw_outbox_publish): the worker for what a step decided,
 *    the PMO for its reapers and turn deadlines. The PMO's outbox relay does not count (it publishes again
 *    what a writer counted already, or what no daemon wrote), so turns ended outside the daemons, by
 *    `turnwatch cancel` or the SQL API, are not in it.
 *  - turnwatch_step_duration_seconds{agent}, turnwatch_tool_call_duration_seconds{tool,status}: the worker
 *    that ran the program, when it ends by itself (exit, failure or its time limit; not when the worker
 *    stopped it because the claim was lost or the worker was stopping).
 *  - turnwatch_watchdog_actions_total{rule}, turnwatch_deadline_lateness_seconds{rule}: the daemon that ran
 *    the rule (TwRule's own counters, read at each scrape).
 *  - turnwatch_postgres_up, turnwatch_nats_up: this daemon's connections, as /healthz reports them.
 *  - turnwatch_limit_in_use{limit}, turnwatch_limit_waiting{limit}, turnwatch_limit_wait_seconds{limit}: the
 *    database's figures (flow control), read by each PMO at its tick: with several PMOs, read one of them. */
#ifndef TW_METRICS_H
#define TW_METRICS_H

#include <jansson.h>
#include <stdbool.h>

#include "config.h"
#include "rule.h"

#define TW_METRICS_MAX_SERIES 1000

/** The connections a daemon needs, for /healthz, the _up gauges and systemd's STATUS. */
typedef struct TwHealth {
    bool pg_up;   /* every PostgreSQL connection of the daemon is up */
    bool nats_up; /* its NATS connection is up */
} TwHealth;

/** Start a fresh registry for daemon (its build_info label). */
void tw_metrics_init(const char *daemon);
/** Add the agents (profiles) and tools of cfg to the label values allowed (a reload adds; what was
 *  allowed stays allowed, so the series of a removed agent keep their names). */
void tw_metrics_learn_names(const TwConfig *cfg);
/** One turn ended by this daemon. agent is a profile name; status done|failed|timeout|cancelled; error an
 *  error code or NULL. */
void tw_metrics_turn_ended(const char *agent, const char *status, const char *error);
/** Count the final events (evt.agent.<agent>.task with an event_id) among the items a daemon's own
 *  transaction returned to publish. Borrowed. */
void tw_metrics_count_final_events(json_t *items);
/** An agent step's program ended by itself after seconds. */
void tw_metrics_step(const char *agent, double seconds);
/** A tool program ended by itself after seconds with status ok|error|timeout. */
void tw_metrics_tool_call(const char *tool, const char *status, double seconds);
/** Expose these rules' action counters and lateness histograms (they must outlive the registry or be
 *  dropped with tw_metrics_forget_rules). */
void tw_metrics_watch_rules(const TwRule *rules, int n);
void tw_metrics_forget_rules(void);
/** Flow control's figures (tw.limits_metrics(), read by the PMO at every tick; takes the reference): the
 * gauges turnwatch_limit_in_use{limit}, turnwatch_limit_waiting{limit} and the histogram
 *  turnwatch_limit_wait_seconds{limit} are the database's, not this daemon's (several PMOs show the same). */
void tw_metrics_set_limits(json_t *limits);
/** The last SIGHUP reload: applied (true) or refused (false). */
void tw_metrics_reload_result(bool ok);
/** The whole exposition, malloc'd (NULL when out of memory). */
char *tw_metrics_render(const TwHealth *health);
/** Free everything (tests; the end of a daemon). */
void tw_metrics_reset(void);

#endif
