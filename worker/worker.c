/* The worker's loop: connections, doorbell subscriptions, timers, signals, the wiring between claim,
 * heartbeat, jobs and watchdogs, and an orderly shutdown. */
#include "worker.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#define WRK_COUNTERS_SEC 60

/* A text[] literal of the served names; names are [A-Za-z0-9_-] so they need no quoting. */
static char *names_array(const TwConfig *cfg, bool tools)
{
    size_t n = tools ? cfg->n_tools : cfg->n_agents, len = 3;
    char *s;

    for (size_t i = 0; i < n; i++)
        len += 66;
    if (!(s = malloc(len)))
        return NULL;
    strcpy(s, "{");
    for (size_t i = 0; i < n; i++) {
        const char *name = tools ? cfg->tools[i].name : cfg->agents[i].name;
        if (!tw_config_serves(cfg, name) || (tools && cfg->tools[i].external))
            continue;
        if (s[1])
            strcat(s, ",");
        strcat(s, name);
    }
    strcat(s, "}");
    return s;
}

static void claim_more(TwWorker *w, bool results)
{
    w->claim.dirty = true;
    if (results)
        w->claim.results_dirty = true;
    wrk_claim_kick(&w->claim);
}

static void doorbell_cb(TwBus *bus, const char *subject, const char *data, size_t len, void *arg)
{
    /* A hint only: whatever it says, look at the inbox. */
    claim_more(arg, strncmp(subject, "cmd.agent.", 10) == 0);
}

/* cmd.worker.wakeup: another daemon created a deadline that may be due before our timer. */
static void wakeup_cb(TwBus *bus, const char *subject, const char *data, size_t len, void *arg)
{
    TwWorker *w = arg;

    if (!w->stopping)
        tw_due_wake(w->due);
}

static void poll_cb(evutil_socket_t fd, short what, void *arg)
{
    claim_more(arg, true);
}

static void heartbeat_cb(evutil_socket_t fd, short what, void *arg)
{
    TwWorker *w = arg;

    wrk_heartbeat_tick(&w->beat);
}

void wrk_log_counters(TwWorker *w)
{
    tw_rules_log_counters("worker", w->rules, WRK_RULE_COUNT);
    tw_rules_log_counters("worker liveness", tw_live_rule(w->live), 1);
    log_info("worker counters: steps_run=%ld tools_run=%ld running=%d", w->jobs.steps_run, w->jobs.tools_run,
             w->jobs.n);
}

static void counters_cb(evutil_socket_t fd, short what, void *arg)
{
    wrk_log_counters(arg);
}

static void on_pg_state(TwPg *pg, bool up, void *arg)
{
    if (up)
        claim_more(arg, false);
}

static void on_wd_state(TwPg *pg, bool up, void *arg)
{
    TwWorker *w = arg;

    if (up)
        tw_due_pg_up(w->due);
}

static void on_bus_state(TwBus *bus, bool up, void *arg)
{
    TwWorker *w = arg;

    /* Doorbells and wake-ups may have been missed while NATS was away: look at the inbox and the clock now.
     */
    if (!up)
        return;
    tw_due_wake(w->due);
    claim_more(w, false);
}

/* One wake-up message per kind and loop pass, however many changes asked for it. */
static void wake_cb(evutil_socket_t fd, short what, void *arg)
{
    TwWorker *w = arg;

    if (w->wake_pmo_due)
        tw_due_wake_peers(w->bus, "pmo");
    if (w->wake_workers_due)
        tw_due_wake_peers(w->bus, "worker");
    w->wake_pmo_due = w->wake_workers_due = false;
}

static void want_wake(TwWorker *w, bool pmo, bool workers)
{
    w->wake_pmo_due |= pmo && w->wake_pmo;
    w->wake_workers_due |= workers && w->wake_workers;
    if (w->wake_pmo_due || w->wake_workers_due)
        event_active(w->wake, EV_TIMEOUT, 0);
}

static void on_slot_free(void *arg)
{
    TwWorker *w = arg;

    wrk_claim_kick(&w->claim);
}

/* After every apply: doorbells for targets we serve ourselves need no round trip through NATS, and the
 * deadlines the change started (tool calls: 2.2; a dispatched turn, new inbox items: 2.4, 2.7) may need a
 * wake-up. */
static void on_applied(void *arg, const WrkJob *job, json_t *publish)
{
    TwWorker *w = arg;
    size_t i;
    json_t *it;
    bool suspended = !job->is_tool && json_object_get(job->outcome, "tool_calls");

    json_array_foreach(publish, i, it)
    {
        const char *subject = json_string_value(json_object_get(it, "subject"));
        const char *target = json_string_value(json_object_get(json_object_get(it, "data"), "target"));
        if (!subject || !target || json_object_get(it, "event_id"))
            continue;
        if ((strncmp(subject, "cmd.agent.", 10) == 0 && tw_config_agent(w->cfg, target)) ||
            (strncmp(subject, "cmd.tool.", 9) == 0 && tw_config_tool(w->cfg, target)))
            if (tw_config_serves(w->cfg, target))
                w->claim.dirty = true;
    }
    if (suspended && w->wake_workers)
        tw_due_wake(w->due);
    want_wake(w, json_array_size(publish) > 0, suspended);
}

/* A claim started steps (2.6's clock, for the PMO) and leases (2.1, 2.3, for the other workers). */
static void on_claimed(void *arg, int n_jobs)
{
    want_wake(arg, true, true);
}

static void on_resumed(void *arg)
{
    TwWorker *w = arg;

    wrk_heartbeat_tick(&w->beat);
}

/* Another daemon's session ended and what it held is pending again: claim it now. The items' re-ring clock
 * (2.7) started again, which the PMO watches. */
static void on_reclaimed(void *arg)
{
    want_wake(arg, true, false);
    claim_more(arg, true);
}

/* A worker rule acted: 2.1 put items back to pending and 2.2 wrote timeout reports, both starting 2.7's
 * clock. */
static void on_rule_acted(void *arg)
{
    want_wake(arg, true, false);
}

static void sigchld_cb(evutil_socket_t sig, short what, void *arg)
{
    wrk_proc_reap_children();
}

static void exit_check_cb(evutil_socket_t fd, short what, void *arg)
{
    TwWorker *w = arg;

    if (tw_pgpool_queued(&w->pool) > 0 || tw_pgpool_queued(&w->wd_pool) > 0)
        return;
    if (w->jobs.n == 0 && wrk_proc_count() == 0)
        event_base_loopexit(w->base, NULL);
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    TwWorker *w = arg;
    struct timeval tv = {0, 50000};

    if (!w->stopping) {
        log_info("signal %d: no new work; finishing %d running job(s) (signal again to release them now)",
                 (int)sig, w->jobs.n);
        w->stopping = true;
        w->jobs.stopping = true;
        w->claim.stopped = true;
        evtimer_del(w->poll);
        tw_due_stop(w->due);
        event_add(w->exit_check, &tv);
        return;
    }
    if (!w->jobs.releasing) {
        log_info("second signal: stopping programs and releasing %d job(s)", w->jobs.n);
        wrk_jobs_release_all(&w->jobs);
    }
}

/* The shortest clock a worker's changes start for each kind of daemon, against that kind's sweep (the INI is
 * shared): only when a deadline could fall before the next sweep does a wake-up pay off. */
static void choose_wakeups(TwWorker *w)
{
    const TwConfig *cfg = w->cfg;
    int pmo_min = cfg->pmo.dispatched_retry_sec, wrk_min = cfg->worker.inbox_processing_timeout_sec;

    if (cfg->pmo.pending_wakeup_sec < pmo_min)
        pmo_min = cfg->pmo.pending_wakeup_sec;
    if (cfg->pmo.active_reap_sec < pmo_min)
        pmo_min = cfg->pmo.active_reap_sec;
    /* A waiting call's deadline is at least [worker] suspend_timeout_seconds (contract 7, 2.2). */
    if (cfg->worker.suspend_timeout_sec < wrk_min)
        wrk_min = cfg->worker.suspend_timeout_sec;
    w->wake_pmo = pmo_min < cfg->pmo.watchdog_interval_sec;
    w->wake_workers = wrk_min < cfg->worker.watchdog_interval_sec;
}

static int subscribe_doorbells(TwWorker *w)
{
    const TwConfig *cfg = w->cfg;
    char subject[128];

    for (size_t i = 0; i < cfg->n_agents; i++) {
        if (!tw_config_serves(cfg, cfg->agents[i].name))
            continue;
        snprintf(subject, sizeof subject, "cmd.agent.%s.wakeup", cfg->agents[i].name);
        if (tw_bus_subscribe(w->bus, subject, doorbell_cb, w) != 0)
            return -1;
    }
    for (size_t i = 0; i < cfg->n_tools; i++) {
        if (!tw_config_serves(cfg, cfg->tools[i].name) || cfg->tools[i].external)
            continue;
        snprintf(subject, sizeof subject, "cmd.tool.%s.wakeup", cfg->tools[i].name);
        if (tw_bus_subscribe(w->bus, subject, doorbell_cb, w) != 0)
            return -1;
    }
    return tw_bus_subscribe(w->bus, "cmd.worker.wakeup", wakeup_cb, w);
}

int wrk_setup(TwWorker *w, struct event_base *base, const TwConfig *cfg)
{
    struct timeval poll = {cfg->worker.watchdog_interval_sec, 0};
    struct timeval hb = {cfg->worker.heartbeat_sec, 0};
    struct timeval counters = {WRK_COUNTERS_SEC, 0};

    memset(w, 0, sizeof *w);
    w->base = base;
    w->cfg = cfg;
    tw_live_daemon_id(w->id, sizeof w->id);
    wrk_watchdog_rules(w->rules, cfg);
    choose_wakeups(w);
    w->agents_arr = names_array(cfg, false);
    w->tools_arr = names_array(cfg, true);
    if (!w->agents_arr || !w->tools_arr)
        return -1;
    if (tw_pgpool_init(&w->pool, base, cfg->pg_dsn, cfg->pg_keepalive_sec, "worker", WRK_PG_CONNS,
                       on_pg_state, w) != 0)
        return -1;
    if (tw_pgpool_init(&w->wd_pool, base, cfg->pg_dsn, cfg->pg_keepalive_sec, "worker-watchdogs", 1,
                       on_wd_state, w) != 0)
        return -1;
    if (!(w->bus = tw_bus_new(base, cfg->nats_url, "turnwatch-worker")))
        return -1;
    tw_bus_set_state_cb(w->bus, on_bus_state, w);
    tw_bus_keep_events(w->bus, cfg->nats_events_stream, cfg->nats_events_max_age_sec);
    if (subscribe_doorbells(w) != 0)
        return -1;

    wrk_jobs_init(&w->jobs, base, &w->pool, w->bus, cfg, w->id, w->agents_arr);
    w->jobs.on_slot_free = on_slot_free;
    w->jobs.on_applied = on_applied;
    w->jobs.arg = w;
    w->claim = (WrkClaim){.jobs = &w->jobs,
                          .tools_arr = w->tools_arr,
                          .concurrency = cfg->worker.concurrency,
                          .lease_sec = cfg->worker.inbox_processing_timeout_sec,
                          .on_resumed = on_resumed,
                          .on_claimed = on_claimed,
                          .arg = w};
    w->beat = (WrkBeat){.jobs = &w->jobs, .lease_sec = cfg->worker.inbox_processing_timeout_sec};

    TwDueConf due = {.who = "worker",
                     .rules = w->rules,
                     .n_rules = WRK_RULE_COUNT,
                     .next_sql = "SELECT tw.worker_next_due($1::integer)",
                     .next_nparams = 1,
                     .next_params = {cfg->worker.inbox_processing_timeout_sec},
                     .sweep_sec = cfg->worker.watchdog_interval_sec,
                     .grace_ms = tw_due_grace_ms(cfg),
                     .on_acted = on_rule_acted,
                     .arg = w};
    json_t *info = json_pack("{s:s,s:s,s:i}", "agents", w->agents_arr, "tools", w->tools_arr, "concurrency",
                             cfg->worker.concurrency);
    w->due = tw_due_new(base, &w->wd_pool, w->bus, &due);
    w->live = tw_live_new(base, cfg, w->bus, "worker", w->id, info, tw_due_grace_ms(cfg), on_reclaimed, w);
    json_decref(info);
    if (!w->due || !w->live)
        return -1;

    w->poll = event_new(base, -1, EV_PERSIST, poll_cb, w);
    w->heartbeat = event_new(base, -1, EV_PERSIST, heartbeat_cb, w);
    w->counters = event_new(base, -1, EV_PERSIST, counters_cb, w);
    w->exit_check = event_new(base, -1, EV_PERSIST, exit_check_cb, w);
    w->wake = event_new(base, -1, 0, wake_cb, w);
    w->sigterm = evsignal_new(base, SIGTERM, signal_cb, w);
    w->sigint = evsignal_new(base, SIGINT, signal_cb, w);
    w->sigchld = evsignal_new(base, SIGCHLD, sigchld_cb, w);
    if (!w->poll || !w->heartbeat || !w->counters || !w->exit_check || !w->wake || !w->sigterm ||
        !w->sigint || !w->sigchld)
        return -1;
    event_add(w->poll, &poll);
    event_add(w->heartbeat, &hb);
    event_add(w->counters, &counters);
    event_add(w->sigterm, NULL);
    event_add(w->sigint, NULL);
    event_add(w->sigchld, NULL);
    if (tw_bus_start(w->bus) != 0)
        return -1;
    tw_due_start(w->due);
    tw_live_start(w->live);
    tw_pgpool_start(&w->pool);
    tw_pgpool_start(&w->wd_pool);
    return 0;
}

void wrk_teardown(TwWorker *w)
{
    struct event *evs[] = {w->poll, w->heartbeat, w->counters, w->exit_check,
                           w->wake, w->sigterm,   w->sigint,   w->sigchld};

    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
        if (evs[i])
            event_free(evs[i]);
    wrk_jobs_free_all(&w->jobs);
    tw_due_free(w->due);
    tw_live_free(w->live);
    tw_bus_free(w->bus);
    tw_pgpool_free(&w->pool);
    tw_pgpool_free(&w->wd_pool);
    free(w->agents_arr);
    free(w->tools_arr);
}
