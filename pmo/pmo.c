/* The PMO's loop in the daemon shell: its notifications, the periodic tick, and what a stop and a reload do.
 */
#include "pmo.h"

#include <string.h>

#include "log.h"
#include "metrics.h"
#include "tw_build.h"

static void limits_metrics_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    if (!err && res && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
        tw_metrics_set_limits(json_loads(PQgetvalue(res, 0, 0), 0, NULL));
}

/* The dispatch scan and the relay catch what NOTIFY and the writers missed; the watchdog rules have their own
 * due-time timer and safety sweep (TwDue). With a metrics listener, flow control's figures are read too. */
static void pmo_tick_now(TwPmo *pmo)
{
    if (pmo->d.stopping)
        return;
    pmo_dispatch_scan(pmo);
    pmo_relay_tick(pmo);
    if (*pmo->d.cfg->pmo.metrics_listen)
        tw_pg_query(pmo->pg, "SELECT tw.limits_metrics()", 0, NULL, limits_metrics_cb, NULL);
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    pmo_tick_now(arg);
}

/* The work's connection's notifications (its arg is the shell, as tw_daemon_pg_state's). */
static void on_notify(TwPg *pg, const char *channel, const char *payload, void *arg)
{
    TwPmo *pmo = ((TwDaemon *)arg)->self;

    if (pmo->d.stopping)
        return;
    if (strcmp(channel, "tw_turn") == 0)
        pmo_dispatch_on_notify(pmo, payload);
    else if (strcmp(channel, "tw_outbox") == 0)
        pmo_relay_now(pmo);
    else if (strcmp(channel, "tw_ring") == 0)
        pmo_ring(pmo, payload);
    else if (strcmp(channel, "tw_due") == 0 && payload && strcmp(payload, "dispatch") == 0)
        /* A client's transaction dispatched a turn (tw.dispatch_arms): the first clock that starts is 2.4's
         * (dispatched_retry_seconds < dispatched_timeout_seconds); no question to the database for each. */
        tw_due_expect(pmo->d.due, "2.4", (int64_t)pmo->d.cfg->pmo.dispatched_retry_sec * 1000);
    else if (strcmp(channel, "tw_due") == 0)
        tw_due_wake(pmo->d.due);
}

/* The liveness check handed back a gone worker's items: their re-ring clock (2.7) starts now. */
static void on_reclaimed(void *arg)
{
    TwPmo *pmo = arg;

    tw_due_wake(pmo->d.due);
}

/* After every (re)connect (our profiles and policies published first: the reaps and retries read them), catch
 * up from the database at once rather than at the next tick. */
static void pg_up(void *self, TwPg *pg)
{
    TwPmo *pmo = self;

    pmo_tick_now(pmo);
    /* A NOTIFY tw_outbox sent while we were away is lost: whatever waits is relayed now, however young (a
     * submit that dispatched its turn itself leaves its event to the relay). */
    if (!pmo->d.stopping)
        pmo_relay_now(pmo);
}

static void wd_up(void *self)
{
    TwPmo *pmo = self;

    tw_due_sweep(pmo->d.due);
}

static void bus_up(void *self)
{
    pmo_tick_now(self);
}

/* Shut down: no more scans (the shell stops the rules); the drain lets queries in flight finish. */
static void pmo_stop(void *self, int sig, char *status, size_t size)
{
    TwPmo *pmo = self;

    if (sig)
        log_info("signal %d: shutting down", sig);
    snprintf(status, size, "stopping: letting in-flight queries finish");
    evtimer_del(pmo->tick);
}

static void choose_wakeups(TwPmo *pmo)
{
    /* A deadline shorter than the sweep would be found late by a PMO that only sweeps: its own dispatches
     * start clocks (2.4, 2.5, 2.7), so with such settings it asks for the next due time after each. */
    pmo->wake_on_dispatch = tw_watchdogs_wake_pays(TW_RULES_PMO, TW_CLOCK_DISPATCH, pmo->d.cfg);
}

static json_t *live_info(const TwConfig *cfg)
{
    return json_pack("{s:i}", "watchdog_interval_seconds", cfg->pmo.watchdog_interval_sec);
}

/* A reload: the PMO runs no programs; its tick follows the sweep. */
static int pmo_apply(void *self, const TwConfig *old)
{
    TwPmo *pmo = self;
    const TwConfig *cfg = pmo->d.cfg;
    json_t *info = live_info(cfg);

    tw_daemon_reconfigure(&pmo->d, info);
    json_decref(info);
    choose_wakeups(pmo);
    if (old->pmo.watchdog_interval_sec != cfg->pmo.watchdog_interval_sec && !pmo->d.stopping) {
        struct timeval tick = {cfg->pmo.watchdog_interval_sec, 0};
        evtimer_del(pmo->tick);
        event_add(pmo->tick, &tick);
    }
    log_info("reload: configuration from %s applied", cfg->path);
    return 0;
}

static int pmo_setup(void *self, struct event_base *base, TwConfig *cfg)
{
    TwPmo *pmo = self;
    struct timeval tick = {cfg->pmo.watchdog_interval_sec, 0};
    char dsn[512], nats[512];
    json_t *info;
    int rc;

    memset(pmo, 0, sizeof *pmo);
    if (tw_daemon_open(&pmo->d, &pmo_ops, pmo, base, cfg, 1) != 0)
        return -1;
    choose_wakeups(pmo);
    pmo->pg = pmo->d.pool.conns[0];
    tw_pg_set_callbacks(pmo->pg, tw_daemon_pg_state, on_notify, &pmo->d);
    if (tw_pg_listen(pmo->pg, "tw_turn") != 0 || tw_pg_listen(pmo->pg, "tw_due") != 0 ||
        tw_pg_listen(pmo->pg, "tw_outbox") != 0 || tw_pg_listen(pmo->pg, "tw_ring") != 0)
        return -1;
    info = live_info(cfg);
    rc = tw_daemon_arm(&pmo->d, info, NULL, on_reclaimed);
    json_decref(info);
    if (rc != 0 || !(pmo->tick = event_new(base, -1, EV_PERSIST, tick_cb, pmo)))
        return -1;
    event_add(pmo->tick, &tick);
    if (tw_daemon_start(&pmo->d) != 0)
        return -1;
    log_info("turnwatch-pmo %s started: dsn=\"%s\" nats=%s watchdog_interval=%ds", TW_VERSION,
             tw_redact_dsn(cfg->pg_dsn, dsn, sizeof dsn), tw_redact_urls(cfg->nats_url, nats, sizeof nats),
             cfg->pmo.watchdog_interval_sec);
    return 0;
}

static void pmo_teardown(void *self)
{
    TwPmo *pmo = self;

    if (pmo->tick)
        event_free(pmo->tick);
    pmo->tick = NULL;
    tw_daemon_disconnect(&pmo->d);
    tw_daemon_close(&pmo->d);
}

const TwDaemonOps pmo_ops = {
    .prog = "turnwatch-pmo",
    .kind = "pmo",
    .summary = "Dispatches pending turns to agents, runs the PMO watchdogs (2.4-2.7 and turn\n"
               "deadlines) and relays unpublished outbox events.",
    .rules = TW_RULES_PMO,
    /* Queries in flight finish (their effects are committed either way), for up to 5 s. */
    .drain_give_up_sec = 5,
    .setup = pmo_setup,
    .teardown = pmo_teardown,
    .pg_up = pg_up,
    .wd_up = wd_up,
    .bus_up = bus_up,
    .stop = pmo_stop,
    .apply = pmo_apply,
};
