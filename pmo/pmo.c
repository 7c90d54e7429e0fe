/* The PMO's loop: connections, wake-ups, the periodic tick, and an orderly shutdown. */
#include "pmo.h"

#include <signal.h>
#include <string.h>

#include "daemon.h"
#include "log.h"
#include "metrics.h"
#include "profiles.h"
#include "policy.h"

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

    tw_rules_log_counters("pmo", pmo->rules, pmo->n_rules);
    tw_rules_log_counters("pmo liveness", tw_live_rule(pmo->live), 1);
}

static void on_notify(TwPg *pg, const char *channel, const char *payload, void *arg)
{
    TwPmo *pmo = arg;

    if (pmo->stopping)
        return;
    if (strcmp(channel, "tw_turn") == 0)
        pmo_dispatch_on_notify(pmo, payload);
    else if (strcmp(channel, "tw_outbox") == 0)
        pmo_relay_now(pmo);
    else if (strcmp(channel, "tw_ring") == 0)
        pmo_ring(pmo, payload);
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

void pmo_health(void *arg, TwHealth *h)
{
    TwPmo *pmo = arg;

    h->pg_up = tw_pgpool_all_up(&pmo->pool) && tw_pgpool_all_up(&pmo->wd_pool);
    h->nats_up = tw_bus_is_up(pmo->bus);
}

/* A connection came or went: tell systemd (READY=1 the first time everything is up, STATUS on changes). */
static void health_changed(TwPmo *pmo)
{
    TwHealth h;

    pmo_health(pmo, &h);
    tw_notify_health(pmo->notify, &h);
}

static void pmo_stop(TwPmo *pmo);

/* The database's answer to our profiles: a refusal before it ever took them is a configuration this PMO must
 * not run on (issue 23: a profile whose name the roster binds, as an agent, to another profile). */
static void profiles_published(TwProfilesOutcome outcome, const char *why, void *arg)
{
    TwPmo *pmo = arg;

    if (!pmo->stopping &&
        tw_profiles_refused_at_start(outcome, why, pmo->cfg->path, "turnwatch-pmo", &pmo->profiles_ok)) {
        pmo->exit_code = 1;
        pmo_stop(pmo);
    }
}

/* After every (re)connect, catch up from the database at once rather than at the next tick; the profiles and
 * their policies are published first (the reaps and retries read them). */
static void on_pg_state(TwPg *pg, bool up, void *arg)
{
    TwPmo *pmo = arg;

    health_changed(pmo);
    if (!up)
        return;
    /* Our profiles (contract section 14), at every (re)connect: cheap, and the database may be a new one. */
    tw_profiles_publish(pg, pmo->cfg, profiles_published, pmo);
    tw_policy_publish(pg, pmo->cfg, false, pmo->id);
    pmo_tick_now(pmo);
    /* A NOTIFY tw_outbox sent while we were away is lost: whatever waits is relayed now, however young (a
     * submit that dispatched its turn itself leaves its event to the relay). */
    if (!pmo->stopping)
        pmo_relay_now(pmo);
}

static void on_wd_state(TwPg *pg, bool up, void *arg)
{
    TwPmo *pmo = arg;

    health_changed(pmo);
    if (!up)
        return;
    tw_due_pg_up(pmo->due);
    tw_due_sweep(pmo->due);
}

static void on_bus_state(TwBus *bus, bool up, void *arg)
{
    TwPmo *pmo = arg;

    health_changed(pmo);
    if (!up)
        return;
    tw_due_wake(pmo->due);
    pmo_tick_now(pmo);
}

static void drain_cb(evutil_socket_t fd, short what, void *arg)
{
    TwPmo *pmo = arg;

    size_t left = tw_pgpool_queued(&pmo->pool) + tw_pgpool_queued(&pmo->wd_pool);

    /* Let queries in flight finish (their effects are committed either way), up to 5 s. */
    if (left > 0 && ++pmo->drain_ticks > 100)
        log_warn("shutdown: %zu queries still unanswered after 5 s; giving them up", left);
    if (left == 0 || pmo->drain_ticks > 100)
        event_base_loopexit(pmo->base, NULL);
}

/* Shut down: no more rules or scans; the drain lets queries in flight finish. */
static void pmo_stop(TwPmo *pmo)
{
    struct timeval tv = {0, 50000};

    tw_notify_stopping(pmo->notify, "stopping: letting in-flight queries finish");
    pmo->stopping = true;
    evtimer_del(pmo->tick);
    tw_due_stop(pmo->due);
    event_add(pmo->drain, &tv);
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    TwPmo *pmo = arg;

    if (pmo->stopping) {
        log_info("second signal: exiting now");
        event_base_loopexit(pmo->base, NULL);
        return;
    }
    log_info("signal %d: shutting down", (int)sig);
    pmo_stop(pmo);
}

/* Everything the configuration decides besides the connections and the rules' parameters: the sweep and the
 * grace. The same at start-up and after a reload. */
static void due_conf(TwPmo *pmo, TwDueConf *due)
{
    const TwConfig *cfg = pmo->cfg;

    *due = (TwDueConf){
        .who = "pmo",
        .rules = pmo->rules,
        .n_rules = pmo->n_rules,
        .sweep_sec = cfg->pmo.watchdog_interval_sec,
        .grace_ms = tw_due_grace_ms(cfg),
    };
}

static void choose_wakeups(TwPmo *pmo)
{
    /* A deadline shorter than the sweep would be found late by a PMO that only sweeps: its own dispatches
     * start clocks (2.4, 2.5, 2.7), so with such settings it asks for the next due time after each. */
    pmo->wake_on_dispatch = tw_watchdogs_wake_pays(TW_RULES_PMO, TW_CLOCK_DISPATCH, pmo->cfg);
}

static json_t *live_info(const TwConfig *cfg)
{
    return json_pack("{s:i}", "watchdog_interval_seconds", cfg->pmo.watchdog_interval_sec);
}

int pmo_apply_config(TwPmo *pmo, TwConfig *cfg)
{
    TwConfig *old = pmo->cfg;
    TwRule fresh[TW_WATCHDOGS_MAX];
    TwDueConf due;
    json_t *info;

    /* The one part that can fail goes first, so that a refused file changes nothing. */
    if (tw_httpd_configure(&pmo->httpd, pmo->base, cfg->pmo.metrics_listen, pmo_health, pmo) != 0) {
        log_error(
            "reload refused: [pmo] metrics_listen %s cannot be opened; the running configuration is kept",
            cfg->pmo.metrics_listen);
        tw_config_unref(cfg);
        return -1;
    }
    tw_daemon_log_changes(old, cfg);
    pmo->cfg = cfg;
    if (tw_watchdogs_fill(fresh, TW_RULES_PMO, cfg, pmo->id) == pmo->n_rules)
        tw_rules_update_params(pmo->rules, fresh, pmo->n_rules);
    due_conf(pmo, &due);
    tw_due_reconfigure(pmo->due, &due);
    choose_wakeups(pmo);
    if (old->pmo.watchdog_interval_sec != cfg->pmo.watchdog_interval_sec && !pmo->stopping) {
        struct timeval tick = {cfg->pmo.watchdog_interval_sec, 0};
        evtimer_del(pmo->tick);
        event_add(pmo->tick, &tick);
    }
    info = live_info(cfg);
    tw_live_reconfigure(pmo->live, info, tw_due_grace_ms(cfg));
    json_decref(info);
    tw_metrics_learn_names(cfg);
    tw_profiles_publish(pmo->pg, cfg, profiles_published, pmo); /* the new file's (contract section 14) */
    tw_policy_publish(pmo->pg, cfg, false, pmo->id);
    tw_config_unref(old);
    log_info("reload: configuration from %s applied", cfg->path);
    tw_daemon_apply_log(cfg);
    return 0;
}

static int apply_config(void *pmo, TwConfig *cfg)
{
    return pmo_apply_config(pmo, cfg);
}

static void sighup_cb(evutil_socket_t sig, short what, void *arg)
{
    TwPmo *pmo = arg;

    /* The PMO runs no programs: no program checks. */
    if (!pmo->stopping)
        tw_daemon_sighup(pmo->cfg->path, false, apply_config, pmo, pmo->notify, pmo->pg, &pmo->reloading,
                         &pmo->stopping);
}

int pmo_setup(TwPmo *pmo, struct event_base *base, TwConfig *cfg)
{
    struct timeval tick = {cfg->pmo.watchdog_interval_sec, 0};
    struct timeval counters = {PMO_COUNTERS_SEC, 0};

    memset(pmo, 0, sizeof *pmo);
    pmo->base = base;
    pmo->cfg = cfg;
    tw_live_daemon_id(pmo->id, sizeof pmo->id);
    tw_pg_set_actor(pmo->id);
    tw_pg_set_query_timeout(cfg->pg_query_timeout_sec);
    if ((pmo->n_rules = tw_watchdogs_fill(pmo->rules, TW_RULES_PMO, cfg, pmo->id)) < 0)
        return -1;
    choose_wakeups(pmo);
    tw_metrics_init("turnwatch-pmo");
    tw_metrics_learn_names(cfg);
    pmo->notify = tw_notify_new(base);
    if (tw_pgpool_init(&pmo->pool, base, cfg->pg_dsn, cfg->pg_keepalive_sec, "pmo", 1, on_pg_state, pmo) != 0)
        return -1;
    pmo->pg = pmo->pool.conns[0];
    if (tw_pgpool_init(&pmo->wd_pool, base, cfg->pg_dsn, cfg->pg_keepalive_sec, "pmo-watchdogs", 1,
                       on_wd_state, pmo) != 0)
        return -1;
    tw_pg_set_callbacks(pmo->pg, on_pg_state, on_notify, pmo);
    if (tw_pg_listen(pmo->pg, "tw_turn") != 0 || tw_pg_listen(pmo->pg, "tw_due") != 0 ||
        tw_pg_listen(pmo->pg, "tw_outbox") != 0 || tw_pg_listen(pmo->pg, "tw_ring") != 0)
        return -1;
    if (!(pmo->bus = tw_bus_new(base, cfg, "turnwatch-pmo")))
        return -1;
    tw_bus_set_state_cb(pmo->bus, on_bus_state, pmo);
    tw_bus_keep_events(pmo->bus, cfg->nats_events_stream, cfg->nats_events_max_age_sec,
                       cfg->nats_events_replicas);
    if (tw_bus_subscribe(pmo->bus, "cmd.pmo.wakeup", wakeup_cb, pmo) != 0)
        return -1;
    TwDueConf due;
    due_conf(pmo, &due);
    json_t *info = live_info(cfg);
    pmo->due = tw_due_new(base, &pmo->wd_pool, pmo->bus, &due);
    pmo->live =
        tw_live_new(base, cfg, pmo->bus, "pmo", pmo->id, info, tw_due_grace_ms(cfg), on_reclaimed, pmo);
    json_decref(info);
    if (!pmo->due || !pmo->live)
        return -1;
    tw_metrics_watch_rules(pmo->rules, pmo->n_rules);
    tw_metrics_watch_rules(tw_live_rule(pmo->live), 1);
    if (*cfg->pmo.metrics_listen &&
        !(pmo->httpd = tw_httpd_new(base, cfg->pmo.metrics_listen, pmo_health, pmo)))
        return -1;
    pmo->tick = event_new(base, -1, EV_PERSIST, tick_cb, pmo);
    pmo->counters = event_new(base, -1, EV_PERSIST, counters_cb, pmo);
    pmo->drain = event_new(base, -1, EV_PERSIST, drain_cb, pmo);
    pmo->sigterm = evsignal_new(base, SIGTERM, signal_cb, pmo);
    pmo->sigint = evsignal_new(base, SIGINT, signal_cb, pmo);
    pmo->sighup = evsignal_new(base, SIGHUP, sighup_cb, pmo);
    if (!pmo->tick || !pmo->counters || !pmo->drain || !pmo->sigterm || !pmo->sigint || !pmo->sighup)
        return -1;
    event_add(pmo->tick, &tick);
    event_add(pmo->counters, &counters);
    event_add(pmo->sigterm, NULL);
    event_add(pmo->sigint, NULL);
    event_add(pmo->sighup, NULL);
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
    struct event *evs[] = {pmo->tick, pmo->counters, pmo->drain, pmo->sigterm, pmo->sigint, pmo->sighup};

    pmo->stopping = true; /* callbacks run below (the relay's among them) start nothing new */
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
    tw_httpd_free(pmo->httpd);
    tw_notify_free(pmo->notify);
    tw_metrics_forget_rules();
    tw_config_unref(pmo->cfg);
    pmo->cfg = NULL;
}
