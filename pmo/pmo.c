/* The PMO's loop: connections, wake-ups, the periodic tick, and an orderly shutdown. */
#include "pmo.h"

#include <signal.h>
#include <string.h>

#include "log.h"

#define PMO_COUNTERS_SEC 60

/* The dispatch scan and the relay catch what NOTIFY and the writers missed; the watchdog rules have their own
 * due-time timer and safety sweep (TwDue). */
static void pmo_tick_now(TwPmo *pmo)
{
    if (pmo->stopping)
        return;
    pmo_dispatch_scan(pmo);
    pmo_relay_tick(pmo);
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    pmo_tick_now(arg);
}

static void counters_cb(evutil_socket_t fd, short what, void *arg)
{
    TwPmo *pmo = arg;

    tw_rules_log_counters("pmo", pmo->rules, PMO_RULE_COUNT);
    tw_rules_log_counters("pmo liveness", tw_live_rule(pmo->live), 1);
}

static void on_notify(TwPg *pg, const char *channel, const char *payload, void *arg)
{
    TwPmo *pmo = arg;

    if (pmo->stopping)
        return;
    if (strcmp(channel, "tw_turn") == 0)
        pmo_dispatch_on_notify(pmo, payload);
    else if (strcmp(channel, "tw_due") == 0)
        tw_due_wake(pmo->due);
}

/* The liveness check handed back a gone worker's items: their re-ring clock (2.7) starts now. */
static void on_reclaimed(void *arg)
{
    TwPmo *pmo = arg;

    tw_due_wake(pmo->due);
}

/* cmd.pmo.wakeup: another daemon created a deadline that may be due before our timer. */
static void wakeup_cb(TwBus *bus, const char *subject, const char *data, size_t len, void *arg)
{
    TwPmo *pmo = arg;

    if (!pmo->stopping)
        tw_due_wake(pmo->due);
}

/* After every (re)connect, catch up from the database at once rather than at the next tick. */
static void on_pg_state(TwPg *pg, bool up, void *arg)
{
    if (up)
        pmo_tick_now(arg);
}

static void on_wd_state(TwPg *pg, bool up, void *arg)
{
    TwPmo *pmo = arg;

    if (!up)
        return;
    tw_due_pg_up(pmo->due);
    tw_due_sweep(pmo->due);
}

static void on_bus_state(TwBus *bus, bool up, void *arg)
{
    TwPmo *pmo = arg;

    if (!up)
        return;
    tw_due_wake(pmo->due);
    pmo_tick_now(pmo);
}

static void drain_cb(evutil_socket_t fd, short what, void *arg)
{
    TwPmo *pmo = arg;

    /* Let queries in flight finish (their effects are committed either way), up to 5 s. */
    if ((tw_pgpool_queued(&pmo->pool) == 0 && tw_pgpool_queued(&pmo->wd_pool) == 0) ||
        ++pmo->drain_ticks > 100)
        event_base_loopexit(pmo->base, NULL);
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    TwPmo *pmo = arg;
    struct timeval tv = {0, 50000};

    if (pmo->stopping) {
        log_info("second signal: exiting now");
        event_base_loopexit(pmo->base, NULL);
        return;
    }
    log_info("signal %d: shutting down", (int)sig);
    pmo->stopping = true;
    evtimer_del(pmo->tick);
    tw_due_stop(pmo->due);
    event_add(pmo->drain, &tv);
}

int pmo_setup(TwPmo *pmo, struct event_base *base, const TwConfig *cfg)
{
    struct timeval tick = {cfg->pmo.watchdog_interval_sec, 0};
    struct timeval counters = {PMO_COUNTERS_SEC, 0};
    const int sweep = cfg->pmo.watchdog_interval_sec;

    memset(pmo, 0, sizeof *pmo);
    pmo->base = base;
    pmo->cfg = cfg;
    tw_live_daemon_id(pmo->id, sizeof pmo->id);
    pmo_rering_setup(pmo);
    pmo_reaper_setup(pmo);
    /* A deadline shorter than the sweep would be found late by a PMO that only sweeps: its own dispatches
     * create 2.4 and 2.7 deadlines, so with such settings it asks for the next due time after each. */
    pmo->wake_on_dispatch = cfg->pmo.dispatched_retry_sec < sweep || cfg->pmo.pending_wakeup_sec < sweep;
    if (tw_pgpool_init(&pmo->pool, base, cfg->pg_dsn, cfg->pg_keepalive_sec, "pmo", 1, on_pg_state, pmo) != 0)
        return -1;
    pmo->pg = pmo->pool.conns[0];
    if (tw_pgpool_init(&pmo->wd_pool, base, cfg->pg_dsn, cfg->pg_keepalive_sec, "pmo-watchdogs", 1,
                       on_wd_state, pmo) != 0)
        return -1;
    tw_pg_set_callbacks(pmo->pg, on_pg_state, on_notify, pmo);
    if (tw_pg_listen(pmo->pg, "tw_turn") != 0 || tw_pg_listen(pmo->pg, "tw_due") != 0)
        return -1;
    if (!(pmo->bus = tw_bus_new(base, cfg->nats_url, "turnwatch-pmo")))
        return -1;
    tw_bus_set_state_cb(pmo->bus, on_bus_state, pmo);
    tw_bus_keep_events(pmo->bus, cfg->nats_events_stream, cfg->nats_events_max_age_sec);
    if (tw_bus_subscribe(pmo->bus, "cmd.pmo.wakeup", wakeup_cb, pmo) != 0)
        return -1;
    TwDueConf due = {
        .who = "pmo",
        .rules = pmo->rules,
        .n_rules = PMO_RULE_COUNT,
        .next_sql = "SELECT tw.pmo_next_due($1::integer, $2::integer, $3::integer, $4::integer, $5::integer)",
        .next_nparams = 5,
        .next_params = {cfg->pmo.dispatched_retry_sec, cfg->pmo.dispatched_timeout_sec,
                        cfg->pmo.active_reap_sec, cfg->pmo.pending_wakeup_sec,
                        cfg->pmo.pending_wakeup_skip_sec},
        .sweep_sec = sweep,
        .grace_ms = tw_due_grace_ms(cfg),
    };
    json_t *info = json_pack("{s:i}", "watchdog_interval_seconds", sweep);
    pmo->due = tw_due_new(base, &pmo->wd_pool, pmo->bus, &due);
    pmo->live =
        tw_live_new(base, cfg, pmo->bus, "pmo", pmo->id, info, tw_due_grace_ms(cfg), on_reclaimed, pmo);
    json_decref(info);
    if (!pmo->due || !pmo->live)
        return -1;
    pmo->tick = event_new(base, -1, EV_PERSIST, tick_cb, pmo);
    pmo->counters = event_new(base, -1, EV_PERSIST, counters_cb, pmo);
    pmo->drain = event_new(base, -1, EV_PERSIST, drain_cb, pmo);
    pmo->sigterm = evsignal_new(base, SIGTERM, signal_cb, pmo);
    pmo->sigint = evsignal_new(base, SIGINT, signal_cb, pmo);
    if (!pmo->tick || !pmo->counters || !pmo->drain || !pmo->sigterm || !pmo->sigint)
        return -1;
    event_add(pmo->tick, &tick);
    event_add(pmo->counters, &counters);
    event_add(pmo->sigterm, NULL);
    event_add(pmo->sigint, NULL);
    if (tw_bus_start(pmo->bus) != 0)
        return -1;
    tw_due_start(pmo->due);
    tw_live_start(pmo->live);
    tw_pgpool_start(&pmo->pool);
    tw_pgpool_start(&pmo->wd_pool);
    return 0;
}

void pmo_teardown(TwPmo *pmo)
{
    struct event *evs[] = {pmo->tick, pmo->counters, pmo->drain, pmo->sigterm, pmo->sigint};

    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
        if (evs[i])
            event_free(evs[i]);
    /* Queries still in flight (a second signal, or a drain that timed out: the database is slow or away) get
     * their callbacks when their connection is freed, and those use the watchdogs, the liveness and the
     * outbox: free the connections while these still exist, and after the bus, whose unconfirmed publishes
     * are told so (without touching a connection). */
    if (pmo->due)
        tw_due_stop(pmo->due);
    tw_bus_free(pmo->bus);
    tw_pgpool_free(&pmo->pool);
    tw_pgpool_free(&pmo->wd_pool);
    tw_due_free(pmo->due);
    tw_live_free(pmo->live);
}
