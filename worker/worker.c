/* The worker's loop: connections, doorbell subscriptions, timers, signals, and an orderly shutdown. */
#include "worker.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

#define WRK_COUNTERS_SEC 60

/* A text[] literal of the served names; names are [A-Za-z0-9_-] so they need no quoting. */
static char *names_array(const TwWorker *w, bool tools)
{
    size_t n = tools ? w->cfg->n_tools : w->cfg->n_agents, len = 3;
    char *s;

    for (size_t i = 0; i < n; i++)
        len += 66;
    if (!(s = malloc(len)))
        return NULL;
    strcpy(s, "{");
    for (size_t i = 0; i < n; i++) {
        const char *name = tools ? w->cfg->tools[i].name : w->cfg->agents[i].name;
        if (!tw_config_serves(w->cfg, name) || (tools && w->cfg->tools[i].external))
            continue;
        if (s[1])
            strcat(s, ",");
        strcat(s, name);
    }
    strcat(s, "}");
    return s;
}

TwPg *wrk_pg(TwWorker *w)
{
    TwPg *best = NULL;

    for (int i = 0; i < WRK_PG_CONNS; i++)
        if (tw_pg_is_up(w->pgs[i]) && (!best || tw_pg_queued(w->pgs[i]) < tw_pg_queued(best)))
            best = w->pgs[i];
    return best ? best : w->pgs[0];
}

static void doorbell_cb(TwBus *bus, const char *subject, const char *data, size_t len, void *arg)
{
    TwWorker *w = arg;

    /* A hint only: whatever it says, look at the inbox. */
    w->claim_dirty = true;
    if (strncmp(subject, "cmd.agent.", 10) == 0)
        w->results_dirty = true;
    wrk_claim_kick(w);
}

static void poll_cb(evutil_socket_t fd, short what, void *arg)
{
    TwWorker *w = arg;

    w->claim_dirty = true;
    w->results_dirty = true;
    wrk_claim_kick(w);
}

static void heartbeat_cb(evutil_socket_t fd, short what, void *arg)
{
    wrk_heartbeat_tick(arg);
}

static void watchdog_cb(evutil_socket_t fd, short what, void *arg)
{
    TwWorker *w = arg;

    if (!w->stopping)
        wrk_watchdog_tick(w);
}

static void counters_cb(evutil_socket_t fd, short what, void *arg)
{
    TwWorker *w = arg;

    tw_rules_log_counters("worker", w->rules, WRK_RULE_COUNT);
    log_info("worker counters: steps_run=%ld tools_run=%ld running=%d", w->steps_run, w->tools_run,
             w->n_jobs);
}

static void on_pg_state(TwPg *pg, bool up, void *arg)
{
    TwWorker *w = arg;

    if (up) {
        w->claim_dirty = true;
        wrk_claim_kick(w);
    }
}

static void on_bus_state(TwBus *bus, bool up, void *arg)
{
    TwWorker *w = arg;

    /* Doorbells may have been missed while NATS was away: look at the inbox now. */
    if (up) {
        w->claim_dirty = true;
        wrk_claim_kick(w);
    }
}

static void sigchld_cb(evutil_socket_t sig, short what, void *arg)
{
    wrk_proc_reap_children();
}

static void exit_check_cb(evutil_socket_t fd, short what, void *arg)
{
    TwWorker *w = arg;

    for (int i = 0; i < WRK_PG_CONNS; i++)
        if (tw_pg_is_up(w->pgs[i]) && tw_pg_queued(w->pgs[i]) > 0)
            return;
    if (w->n_jobs == 0 && wrk_proc_count() == 0)
        event_base_loopexit(w->base, NULL);
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    TwWorker *w = arg;
    struct timeval tv = {0, 50000};

    if (!w->stopping) {
        log_info("signal %d: no new work; finishing %d running job(s) (signal again to release them now)",
                 (int)sig, w->n_jobs);
        w->stopping = true;
        evtimer_del(w->poll);
        evtimer_del(w->watchdog);
        event_add(w->exit_check, &tv);
        return;
    }
    if (!w->releasing) {
        log_info("second signal: stopping programs and releasing %d job(s)", w->n_jobs);
        wrk_jobs_release_all(w);
    }
}

int wrk_setup(TwWorker *w, struct event_base *base, const TwConfig *cfg)
{
    struct timeval poll = {cfg->worker.watchdog_interval_sec, 0};
    struct timeval hb = {cfg->worker.heartbeat_sec, 0};
    struct timeval wd = {cfg->worker.watchdog_interval_sec, 0};
    struct timeval counters = {WRK_COUNTERS_SEC, 0};
    char host[64] = "localhost", subject[128];

    memset(w, 0, sizeof *w);
    w->base = base;
    w->cfg = cfg;
    gethostname(host, sizeof host - 1);
    snprintf(w->id, sizeof w->id, "%s:%d", host, (int)getpid());
    wrk_watchdog_setup(w);
    w->agents_arr = names_array(w, false);
    w->tools_arr = names_array(w, true);
    if (!w->agents_arr || !w->tools_arr)
        return -1;
    for (int i = 0; i < WRK_PG_CONNS; i++) {
        char name[16];
        snprintf(name, sizeof name, "worker/%d", i);
        if (!(w->pgs[i] = tw_pg_new(base, cfg->pg_dsn, name)))
            return -1;
        tw_pg_set_callbacks(w->pgs[i], on_pg_state, NULL, w);
    }
    if (!(w->bus = tw_bus_new(base, cfg->nats_url, "turnwatch-worker")))
        return -1;
    tw_bus_set_state_cb(w->bus, on_bus_state, w);
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
    w->poll = event_new(base, -1, EV_PERSIST, poll_cb, w);
    w->heartbeat = event_new(base, -1, EV_PERSIST, heartbeat_cb, w);
    w->watchdog = event_new(base, -1, EV_PERSIST, watchdog_cb, w);
    w->counters = event_new(base, -1, EV_PERSIST, counters_cb, w);
    w->exit_check = event_new(base, -1, EV_PERSIST, exit_check_cb, w);
    w->sigterm = evsignal_new(base, SIGTERM, signal_cb, w);
    w->sigint = evsignal_new(base, SIGINT, signal_cb, w);
    w->sigchld = evsignal_new(base, SIGCHLD, sigchld_cb, w);
    if (!w->poll || !w->heartbeat || !w->watchdog || !w->counters || !w->exit_check || !w->sigterm ||
        !w->sigint || !w->sigchld)
        return -1;
    event_add(w->poll, &poll);
    event_add(w->heartbeat, &hb);
    event_add(w->watchdog, &wd);
    event_add(w->counters, &counters);
    event_add(w->sigterm, NULL);
    event_add(w->sigint, NULL);
    event_add(w->sigchld, NULL);
    if (tw_bus_start(w->bus) != 0)
        return -1;
    for (int i = 0; i < WRK_PG_CONNS; i++)
        tw_pg_start(w->pgs[i]);
    return 0;
}

void wrk_teardown(TwWorker *w)
{
    struct event *evs[] = {w->poll,       w->heartbeat, w->watchdog, w->counters,
                           w->exit_check, w->sigterm,   w->sigint,   w->sigchld};

    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
        if (evs[i])
            event_free(evs[i]);
    while (w->jobs)
        wrk_job_free(w->jobs);
    tw_bus_free(w->bus);
    for (int i = 0; i < WRK_PG_CONNS; i++)
        tw_pg_free(w->pgs[i]);
    free(w->agents_arr);
    free(w->tools_arr);
}
