/* The PMO's loop: connections, the periodic tick, and an orderly shutdown. */
#include "pmo.h"

#include <signal.h>
#include <string.h>

#include "log.h"

#define PMO_COUNTERS_SEC 60

static void pmo_tick_now(TwPmo *pmo)
{
    if (pmo->stopping)
        return;
    pmo_dispatch_scan(pmo);
    pmo_rering_tick(pmo);
    pmo_reaper_tick(pmo);
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
}

static void on_notify(TwPg *pg, const char *channel, const char *payload, void *arg)
{
    TwPmo *pmo = arg;

    if (!pmo->stopping && strcmp(channel, "tw_turn") == 0)
        pmo_dispatch_on_notify(pmo, payload);
}

/* After every (re)connect, catch up from the database at once rather than at the next tick. */
static void on_pg_state(TwPg *pg, bool up, void *arg)
{
    if (up)
        pmo_tick_now(arg);
}

static void on_bus_state(TwBus *bus, bool up, void *arg)
{
    if (up)
        pmo_tick_now(arg);
}

static void drain_cb(evutil_socket_t fd, short what, void *arg)
{
    TwPmo *pmo = arg;

    /* Let queries in flight finish (their effects are committed either way), up to 5 s. */
    if (tw_pg_queued(pmo->pg) == 0 || !tw_pg_is_up(pmo->pg) || ++pmo->drain_ticks > 100)
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
    event_add(pmo->drain, &tv);
}

int pmo_setup(TwPmo *pmo, struct event_base *base, const TwConfig *cfg)
{
    struct timeval tick = {cfg->pmo.watchdog_interval_sec, 0};
    struct timeval counters = {PMO_COUNTERS_SEC, 0};

    memset(pmo, 0, sizeof *pmo);
    pmo->base = base;
    pmo->cfg = cfg;
    pmo_rering_setup(pmo);
    pmo_reaper_setup(pmo);
    if (!(pmo->pg = tw_pg_new(base, cfg->pg_dsn, "pmo")) ||
        !(pmo->bus = tw_bus_new(base, cfg->nats_url, "turnwatch-pmo")))
        return -1;
    tw_pg_set_callbacks(pmo->pg, on_pg_state, on_notify, pmo);
    if (tw_pg_listen(pmo->pg, "tw_turn") != 0)
        return -1;
    tw_bus_set_state_cb(pmo->bus, on_bus_state, pmo);
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
    tw_pg_start(pmo->pg);
    return 0;
}

void pmo_teardown(TwPmo *pmo)
{
    if (pmo->tick)
        event_free(pmo->tick);
    if (pmo->counters)
        event_free(pmo->counters);
    if (pmo->drain)
        event_free(pmo->drain);
    if (pmo->sigterm)
        event_free(pmo->sigterm);
    if (pmo->sigint)
        event_free(pmo->sigint);
    tw_bus_free(pmo->bus);
    tw_pg_free(pmo->pg);
}
