/* turnwatch-worker: claims inbox items and resume ledger entries, runs agent and tool programs, applies
 * their results, heartbeats what it holds, and runs the worker watchdogs (2.1-2.3). */
#ifndef WRK_WORKER_H
#define WRK_WORKER_H

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>

#include "bus.h"
#include "config.h"
#include "pgconn.h"
#include "rule.h"
#include "runner.h"
#include "steps.h"

/* Connections per worker: claims, applies and heartbeats are independent transactions, and more than
 * one lets the database use more than one core for a busy worker. */
#define WRK_PG_CONNS 2

enum { WRK_RULE_RECLAIM_INBOX, WRK_RULE_TOOL_TIMEOUTS, WRK_RULE_REQUEUE_LEDGERS, WRK_RULE_COUNT };

typedef struct WrkJob WrkJob;

typedef struct TwWorker {
    struct event_base *base;
    const TwConfig *cfg;
    TwPg *pgs[WRK_PG_CONNS];
    TwBus *bus;
    char id[128];     /* host:pid, recorded as claimed_by */
    char *agents_arr; /* served agents as a text[] literal */
    char *tools_arr;  /* served (non-external) tools as a text[] literal */
    WrkJob *jobs;
    int n_jobs;
    long next_job_id;
    bool claim_busy;
    bool claim_dirty;   /* there may be more work: a doorbell rang, or the last claim came back full */
    bool results_dirty; /* an agent doorbell rang (or the poll timer): results may wait, even with no free
                           slot */
    bool heartbeat_busy;
    bool stopping;
    bool releasing;
    struct event *poll, *heartbeat, *watchdog, *counters, *sigterm, *sigint, *sigchld, *exit_check;
    TwRule rules[WRK_RULE_COUNT];
    long steps_run, tools_run;
} TwWorker;

struct WrkJob {
    WrkJob *next, *prev;
    TwWorker *w;
    long id;
    json_t *claim; /* the job object from tw.claim: fence, id, token, turn_id, epoch, step, doc, ... */
    json_t *fence; /* the claim without its doc: what applies, heartbeats and releases send back */
    bool is_tool;
    const char *agent;
    const char *turn_id;
    long long epoch;
    const TwAgentConf *agent_conf;
    const TwToolConf *tool_conf;
    WrkProc *proc;
    json_t *outcome; /* what to apply once the program is done */
    bool lost;       /* the claim or epoch moved on: drop the output */
    bool applying;
    bool release_pending; /* a tw.release is in flight; its callback frees the job */
    struct event *retry;
    char label[160];
};

int wrk_setup(TwWorker *w, struct event_base *base, const TwConfig *cfg) __attribute__((warn_unused_result));
void wrk_teardown(TwWorker *w);

/** The connection with the least queued work among those that are up (the first one when none is). */
TwPg *wrk_pg(TwWorker *w);

/* claim.c */
void wrk_claim_kick(TwWorker *w);

/* jobs.c */
void wrk_job_start(TwWorker *w, json_t *claim);
void wrk_job_free(WrkJob *job);
void wrk_jobs_release_all(TwWorker *w);

/* heartbeat.c */
void wrk_heartbeat_tick(TwWorker *w);

/* watchdog.c: 2.1-2.3 */
void wrk_watchdog_setup(TwWorker *w);
void wrk_watchdog_tick(TwWorker *w);

#endif
