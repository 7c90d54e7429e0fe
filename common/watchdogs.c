/* The watchdog rules' table, and the TwRules a daemon builds from it. */
#include "watchdogs.h"

#include <stdio.h>
#include <string.h>

#include "log.h"

/* A parameter's designators, for braces at the place of use. */
#define PMO_KEY(k) .section = TW_SEC_PMO, .key = (k)
#define WORKER_KEY(k) .section = TW_SEC_WORKER, .key = (k)
#define VALUE(v) .value = (v)

/* The keys the rules take, each named once. */
#define DISPATCHED_RETRY PMO_KEY("dispatched_retry_seconds")
#define DISPATCHED_TIMEOUT PMO_KEY("dispatched_timeout_seconds")
#define ACTIVE_REAP PMO_KEY("active_reap_seconds")
#define PENDING_WAKEUP PMO_KEY("pending_wakeup_seconds")
#define PENDING_SKIP PMO_KEY("pending_wakeup_skip_seconds")
#define INBOX_LEASE WORKER_KEY("inbox_processing_timeout_seconds")
/* A waiting call's deadline is at least [worker] suspend_timeout_seconds (docs/watchdogs.md, 2.2). */
#define SUSPEND_TIMEOUT WORKER_KEY("suspend_timeout_seconds")
/* 2.4 and 2.5 count a worker as live for its profiles while it was seen this recently (tw.profile_clock). */
#define STALE VALUE(TW_LIVE_STALE_SEC)

/* Batch sizes: re-rings are cheap (a doorbell each), reaps and the policies' rules end or move turns. */
#define WORKER_BATCH 200
#define RERING_BATCH 200
#define REAP_BATCH 100
#define POLICY_BATCH 100
/* Schedule ticks: many schedules share a minute boundary; their turns are submitted together. */
#define SCHEDULE_BATCH 500
/* Turns that run later: many may share one instant, and are dispatched together (tw.next_turns); the retries
 * that the same rule dispatches one by one take a fifth of it. */
#define LATER_BATCH 500
/* Re-rings change nothing but a doorbell and are many under a large backlog: 20 lines per 10 s at info (the
 * rest at debug, counted in a summary line), where 2.7 alone once wrote 642,089 lines in 6 minutes. */
#define RERING_INFO_LINES 20

static const TwRuleDef rules[] = {
    /* The worker's (docs/watchdogs.md, 2.1-2.3): bounded batches, SKIP LOCKED, database clock, so any number
     * of workers may run them at once; they never emit final events. 2.1 and 2.3 judge other workers by their
     * leases, which heartbeats renew: held back for a grace after the database comes back, so that the others
     * can renew first. */
    {.file = "2.1_reclaim_inbox",
     .key = "2.1",
     .name = "2.1 reclaim_inbox",
     .daemon = TW_RULES_WORKER,
     .action = "tw.wd_reclaim_inbox",
     .due = "tw.due_reclaim_inbox",
     .n_params = 1,
     .params = {{INBOX_LEASE}},
     .batch = WORKER_BATCH,
     .clock = {INBOX_LEASE},
     .starts = TW_CLOCK_CLAIM,
     .heartbeat_judged = true},
    {.file = "2.2_tool_timeouts",
     .key = "2.2",
     .name = "2.2 tool_timeouts",
     .daemon = TW_RULES_WORKER,
     .action = "tw.wd_tool_timeouts",
     .due = "tw.due_tool_timeouts",
     .batch = WORKER_BATCH,
     .clock = {SUSPEND_TIMEOUT},
     .starts = TW_CLOCK_TOOL_CALL},
    /* A resume lease is as long as an inbox lease (tw.claim_work's p_lease_s). */
    {.file = "2.3_resume_leases",
     .key = "2.3",
     .name = "2.3 requeue_expired_resume_ledgers",
     .daemon = TW_RULES_WORKER,
     .action = "tw.requeue_expired_resume_ledgers",
     .due = "tw.due_resume_leases",
     .batch = WORKER_BATCH,
     .clock = {INBOX_LEASE},
     .starts = TW_CLOCK_CLAIM,
     .heartbeat_judged = true},
    /* Warnings at warn_at_percent of a waiting tool call's deadline (docs/timeouts.md). */
    {.file = "tool_call_warnings",
     .key = "warn",
     .name = "tool_call_warnings",
     .daemon = TW_RULES_WORKER,
     .action = "tw.wd_tool_warnings",
     .due = "tw.due_tool_warnings",
     .batch = WORKER_BATCH},

    /* The PMO's. Doorbell re-rings: 2.4 (agent dispatched but nobody took the turn), which judges workers by
     * whether they were seen and had a free slot: held back after a reconnect. */
    {.file = "2.4_rering_dispatched",
     .key = "2.4",
     .name = "2.4 rering_dispatched",
     .daemon = TW_RULES_PMO,
     .action = "tw.wd_rering_dispatched",
     .due = "tw.due_rering_dispatched",
     .n_params = 2,
     .params = {{DISPATCHED_RETRY}, {STALE}},
     .batch = RERING_BATCH,
     .clock = {DISPATCHED_RETRY},
     .starts = TW_CLOCK_DISPATCH,
     .heartbeat_judged = true,
     .info_lines_per_10s = RERING_INFO_LINES},
    /* Reaping into a terminal state with the output contract (the SQL does finish_turn_idle, the
     * force-termination record, the fallback deliverable, both events and dispatch_next in one transaction).
     * A backlog is not a failure: 2.5 runs on its profile's clock (tw.profile_clock), which judges workers by
     * whether they were seen and had a free slot; after the database comes back they need time to write. */
    {.file = "2.5_reap_dispatched",
     .key = "2.5",
     .name = "2.5 reap_dispatched",
     .daemon = TW_RULES_PMO,
     .action = "tw.wd_reap_dispatched",
     .due = "tw.due_reap_dispatched",
     .n_params = 2,
     .params = {{DISPATCHED_TIMEOUT}, {STALE}},
     .batch = REAP_BATCH,
     .clock = {DISPATCHED_TIMEOUT},
     .starts = TW_CLOCK_DISPATCH,
     .heartbeat_judged = true},
    /* 2.6 judges workers by their heartbeats: after the database comes back they need time to write. */
    {.file = "2.6_reap_running",
     .key = "2.6",
     .name = "2.6 reap_running",
     .daemon = TW_RULES_PMO,
     .action = "tw.wd_reap_running",
     .due = "tw.due_reap_running",
     .n_params = 1,
     .params = {{ACTIVE_REAP}},
     .batch = REAP_BATCH,
     .clock = {ACTIVE_REAP},
     .starts = TW_CLOCK_CLAIM,
     .heartbeat_judged = true},
    /* 2.7: an inbox item still pending. */
    {.file = "2.7_rering_pending",
     .key = "2.7",
     .name = "2.7 rering_pending",
     .daemon = TW_RULES_PMO,
     .action = "tw.wd_rering_pending",
     .due = "tw.due_rering_pending",
     .n_params = 2,
     .params = {{PENDING_WAKEUP}, {PENDING_SKIP}},
     .batch = RERING_BATCH,
     .clock = {PENDING_WAKEUP},
     .starts = TW_CLOCK_DISPATCH,
     .info_lines_per_10s = RERING_INFO_LINES},
    /* Turns past their own deadline. */
    {.file = "turn_deadline",
     .key = "deadline",
     .name = "turn_deadline",
     .daemon = TW_RULES_PMO,
     .action = "tw.wd_turn_deadlines",
     .due = "tw.due_turn_deadlines",
     .batch = REAP_BATCH},
    /* The child turns a cancel left for later (a large tree is cancelled in batches, one transaction each):
     * due as soon as a transaction leaves some (tw.cancel_children_upto); each run cancels at most one batch
     * (tw.cancel_batch), going through up to this many parents. */
    {.file = "tree_cancel",
     .key = "tree_cancel",
     .name = "tree_cancel",
     .daemon = TW_RULES_PMO,
     .action = "tw.wd_tree_cancels",
     .due = "tw.due_tree_cancels",
     .batch = REAP_BATCH},
    /* The timeout policies' (docs/timeouts.md): a retried turn is dispatched at its retry_at, a turn not yet
     * running at the end of its queue budget ends timeout/queue_timeout, and warnings go out at
     * warn_at_percent of turn deadlines and queue budgets. The policies themselves are in the database. */
    {.file = "retry_due",
     .key = "retry",
     .name = "retry_due",
     .daemon = TW_RULES_PMO,
     .action = "tw.wd_retry_due",
     .due = "tw.due_retries",
     .batch = LATER_BATCH,
     .parallel = 2},
    {.file = "queue_timeout",
     .key = "queue",
     .name = "queue_timeout",
     .daemon = TW_RULES_PMO,
     .action = "tw.wd_queue_timeouts",
     .due = "tw.due_queue_timeouts",
     .batch = POLICY_BATCH},
    {.file = "warnings",
     .key = "warn",
     .name = "warnings",
     .daemon = TW_RULES_PMO,
     .action = "tw.wd_pmo_warnings",
     .due = "tw.due_pmo_warnings",
     .batch = POLICY_BATCH},

    /* Flow control: a tool call waiting for a limit's token (or the end of its pause) starts at that time;
     * the grant that found it waiting set the time (state.limits next_grant_at, NOTIFY tw_due). */
    {.file = "limit_grants",
     .key = "limit",
     .name = "limit_grants",
     .daemon = TW_RULES_PMO,
     .action = "tw.wd_limit_grants",
     .due = "tw.due_limit_grants",
     .batch = POLICY_BATCH},

    /* Schedules (docs/schedules.md): each schedule's tick fires at its next_fire_at, which a change of a
     * schedule sets with NOTIFY tw_due; one tick per schedule per run, so a catch-up is due again at once.
     * Runs at once take different schedules (SKIP LOCKED), as two PMOs' runs do: many ticks on one boundary
     * are fired by two backends. */
    {.file = "schedule_ticks",
     .key = "schedule",
     .name = "schedule_ticks",
     .daemon = TW_RULES_PMO,
     .action = "tw.wd_schedule_ticks",
     .due = "tw.due_schedule_ticks",
     .batch = SCHEDULE_BATCH,
     .parallel = 2},

    /* Every daemon's liveness poll (liveness.c): daemons whose session ended are marked gone and what they
     * held is handed back. Polled a few times a second, not due-timed. */
    {.file = "liveness",
     .key = "liveness",
     .name = "liveness reclaim_gone_daemons",
     .daemon = TW_RULES_LIVENESS,
     .action = "tw.reclaim_gone_daemons",
     .n_params = 1,
     .params = {{.self = true}}},
};

const TwRuleDef *tw_watchdogs(size_t *n)
{
    *n = sizeof rules / sizeof rules[0];
    return rules;
}

int tw_watchdogs_param(const TwRuleParam *p, const TwConfig *cfg)
{
    size_t np;
    const TwParam *params = tw_config_params(&np);

    if (p->self)
        return -1;
    if (!p->key)
        return p->value;
    for (size_t i = 0; i < np; i++)
        if (params[i].section == p->section && params[i].section <= TW_SEC_LOG &&
            params[i].type == TW_PT_INT && strcmp(params[i].key, p->key) == 0)
            return *(const int *)((const char *)cfg + params[i].offset);
    return -1;
}

/* One rule from its row: the action's statement and the parameters' values under cfg. */
static int rule_from_row(TwRule *r, const TwRuleDef *def, const TwConfig *cfg, const char *self)
{
    size_t off;

    *r = (TwRule){.key = def->key,
                  .name = def->name,
                  .due = def->due,
                  .due_nparams = def->due ? def->n_params : 0,
                  .heartbeat_judged = def->heartbeat_judged,
                  .parallel = def->parallel > 1 ? def->parallel : 1,
                  .info_lines_per_10s = def->info_lines_per_10s};
    off = (size_t)snprintf(r->sql, sizeof r->sql, "SELECT %s(", def->action);
    for (int i = 0; i < def->n_params + (def->batch > 0); i++) {
        const TwRuleParam *p = i < def->n_params ? &def->params[i] : NULL;
        int v = p ? tw_watchdogs_param(p, cfg) : def->batch;
        if (p && p->self) {
            snprintf(r->params[i], sizeof r->params[i], "%s", self ? self : "");
        } else if (v < 0) {
            log_error("watchdog rule %s: [%s] %s is not an integer key of the configuration", def->name,
                      tw_config_section_name(p->section), p->key ? p->key : "(none)");
            return -1;
        } else {
            snprintf(r->params[i], sizeof r->params[i], "%d", v);
        }
        if (off < sizeof r->sql)
            off += (size_t)snprintf(r->sql + off, sizeof r->sql - off, "%s$%d%s", i ? ", " : "", i + 1,
                                    p && p->self ? "" : "::integer");
        r->nparams = i + 1;
    }
    if (off < sizeof r->sql)
        off += (size_t)snprintf(r->sql + off, sizeof r->sql - off, ")");
    if (off >= sizeof r->sql) {
        log_error("watchdog rule %s: its statement is longer than %zu bytes", def->name, sizeof r->sql);
        return -1;
    }
    return 0;
}

int tw_watchdogs_fill(TwRule *out, TwRuleDaemon daemon, const TwConfig *cfg, const char *self)
{
    int n = 0;

    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        if (rules[i].daemon != daemon)
            continue;
        if (n == TW_WATCHDOGS_MAX || rule_from_row(&out[n], &rules[i], cfg, self) != 0)
            return -1;
        n++;
    }
    return n;
}

bool tw_watchdogs_wake_pays(TwRuleDaemon daemon, unsigned starts, const TwConfig *cfg)
{
    const TwRuleParam sweep = {.section = daemon == TW_RULES_PMO ? TW_SEC_PMO : TW_SEC_WORKER,
                               .key = "watchdog_interval_seconds"};
    int sweep_sec = tw_watchdogs_param(&sweep, cfg);

    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        int clock = rules[i].clock.key ? tw_watchdogs_param(&rules[i].clock, cfg) : -1;
        if (rules[i].daemon == daemon && (rules[i].starts & starts) && clock >= 0 && clock < sweep_sec)
            return true;
    }
    return false;
}
