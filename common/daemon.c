/* The daemon shell shared by turnwatch-pmo and turnwatch-worker: connections, health, signals and the drain,
 * the counters, reloads. */
#include "daemon.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "policy.h"
#include "schedules.h"
#include "profiles.h"

/* ---- reload */

static void reload_done(TwNotify *notify, bool ok)
{
    tw_metrics_reload_result(ok);
    tw_notify_reloaded(notify, ok);
}

static const char *metrics_listen(const TwDaemon *d, const TwConfig *cfg)
{
    return d->ops->runs_programs ? cfg->worker.metrics_listen : cfg->pmo.metrics_listen;
}

/* Run by cfg from now on (takes the reference): the metrics listener first, the one part besides the daemon's
 * own that can fail, so that a refused file changes nothing; then the daemon's part; the old configuration is
 * dropped (a worker's running jobs keep theirs). Returns -1, keeping the old one and dropping cfg, when cfg
 * cannot be applied. */
static int apply_config(TwDaemon *d, TwConfig *cfg)
{
    TwConfig *old = d->cfg;

    if (tw_httpd_configure(&d->httpd, d->base, metrics_listen(d, cfg), tw_daemon_health, d) != 0) {
        log_error(
            "reload refused: [%s] metrics_listen %s cannot be opened; the running configuration is kept",
            d->ops->kind, metrics_listen(d, cfg));
        tw_config_unref(cfg);
        return -1;
    }
    tw_daemon_log_changes(old, cfg);
    d->cfg = cfg;
    if (d->ops->apply(d->self, old) != 0) {
        d->cfg = old;
        if (tw_httpd_configure(&d->httpd, d->base, metrics_listen(d, old), tw_daemon_health, d) != 0)
            log_warn("reload: [%s] metrics_listen %s could not be opened again", d->ops->kind,
                     metrics_listen(d, old));
        tw_config_unref(cfg);
        return -1;
    }
    tw_daemon_apply_log(cfg);
    tw_config_unref(old);
    return 0;
}

/* The database's answer to the new file's profiles: apply it, or refuse it (issue 23). */
typedef struct Reload {
    TwDaemon *d;
    TwConfig *cfg;
} Reload;

static void reload_vetted(TwProfilesOutcome outcome, const char *why, void *arg)
{
    Reload r = *(Reload *)arg;
    TwDaemon *d = r.d;

    free(arg);
    d->reloading = false;
    if (d->stopping) {
        tw_config_unref(r.cfg);
        return;
    }
    if (outcome == TW_PROFILES_REFUSED) {
        log_error("reload refused: %s: %s; the running configuration is kept", r.cfg->path, why);
        tw_config_unref(r.cfg);
        reload_done(d->notify, false);
        return;
    }
    if (outcome == TW_PROFILES_UNKNOWN)
        log_warn("reload: the profiles of %s could not be checked against the roster (%s); applying it, they "
                 "are published when the database answers",
                 r.cfg->path, why ? why : "no answer");
    bool ok = apply_config(d, r.cfg) == 0;
    if (ok)
        tw_daemon_fd_limit(d->cfg, d->ops->runs_programs, false);
    reload_done(d->notify, ok);
}

/* SIGHUP: RELOADING=1 to systemd and the file read again with the same checks as at start-up (the worker's
 * programs too); then its profiles are published, and unless the database refuses them (a profile whose name
 * the roster binds, as an agent, to another profile: the reload is refused and logged, the running
 * configuration kept) the file is applied; then READY=1 and the result for the metrics' reload gauge. The
 * database answers on the loop: a SIGHUP meanwhile is logged and ignored, and a file whose answer comes while
 * stopping is dropped. When the database cannot answer, the file is applied (its profiles are published when
 * it can). */
static void sighup_cb(evutil_socket_t sig, short what, void *arg)
{
    TwDaemon *d = arg;
    TwConfig *cfg;
    Reload *r;

    if (d->stopping)
        return;
    if (d->reloading) {
        log_warn(
            "SIGHUP: the last reload is still being checked against the database; ignored (send it again "
            "once that one is applied or refused)");
        return;
    }
    log_info("SIGHUP: reading %s again", d->cfg->path);
    tw_notify_reloading(d->notify);
    if (!(cfg = tw_daemon_reload(d->cfg->path, d->ops->runs_programs))) {
        reload_done(d->notify, false);
        return;
    }
    if (!(r = malloc(sizeof *r))) {
        log_error("reload refused: out of memory; the running configuration is kept");
        tw_config_unref(cfg);
        reload_done(d->notify, false);
        return;
    }
    *r = (Reload){d, cfg};
    d->reloading = true;
    tw_profiles_publish(tw_pgpool_pick(&d->pool), cfg, reload_vetted, r);
}

/* A global key's value as text, for the change log. */
static void param_text(const TwParam *p, const void *base, char *buf, size_t size)
{
    const char *at = (const char *)base + p->offset;

    switch (p->type) {
    case TW_PT_INT:
        snprintf(buf, size, "%d", *(const int *)at);
        break;
    case TW_PT_BOOL:
        snprintf(buf, size, "%s", *(const bool *)at ? "true" : "false");
        break;
    case TW_PT_STR:
    case TW_PT_LIST:
        snprintf(buf, size, "%s", *(char *const *)at ? *(char *const *)at : "");
        break;
    case TW_PT_ARGV:
        snprintf(buf, size, "(program)");
        break;
    }
}

static bool limits_same(const TwLimitsConf *a, const TwLimitsConf *b)
{
    return a->memory_limit_mb == b->memory_limit_mb && a->cpu_limit_sec == b->cpu_limit_sec &&
           a->max_open_files == b->max_open_files && a->max_processes == b->max_processes &&
           strcmp(a->run_as_user ? a->run_as_user : "", b->run_as_user ? b->run_as_user : "") == 0;
}

static bool agent_same(const TwAgentConf *a, const TwAgentConf *b)
{
    return strcmp(a->exec ? a->exec : "", b->exec ? b->exec : "") == 0 &&
           a->step_timeout_sec == b->step_timeout_sec && a->kill_grace_sec == b->kill_grace_sec &&
           limits_same(&a->limits, &b->limits);
}

static bool tool_same(const TwToolConf *a, const TwToolConf *b)
{
    return strcmp(a->exec ? a->exec : "", b->exec ? b->exec : "") == 0 && a->external == b->external &&
           a->timeout_sec == b->timeout_sec && a->suspend_timeout_sec == b->suspend_timeout_sec &&
           strcmp(a->mcp_exec ? a->mcp_exec : "", b->mcp_exec ? b->mcp_exec : "") == 0 &&
           limits_same(&a->limits, &b->limits);
}

void tw_daemon_log_changes(const TwConfig *old, const TwConfig *cfg)
{
    size_t np;
    const TwParam *params = tw_config_params(&np);
    int changes = 0;

    for (size_t i = 0; i < np; i++) {
        const TwParam *p = &params[i];
        char a[512], b[512];
        if (p->section > TW_SEC_LOG)
            continue;
        param_text(p, old, a, sizeof a);
        param_text(p, cfg, b, sizeof b);
        if (strcmp(a, b) == 0)
            continue;
        changes++;
        if (p->reload == TW_RESTART)
            /* The connections stay as they are (and a DSN or URL may hold a password: no values). */
            log_warn("reload: [%s] %s changed; it takes effect at the next restart",
                     tw_config_section_name(p->section), p->key);
        else
            log_info("reload: [%s] %s: %s -> %s", tw_config_section_name(p->section), p->key, a, b);
    }
    for (size_t i = 0; i < cfg->n_agents; i++) {
        const TwAgentConf *was = tw_config_agent(old, cfg->agents[i].name);
        if (!was || !agent_same(was, &cfg->agents[i])) {
            changes++;
            log_info("reload: [agent.%s] %s", cfg->agents[i].name, was ? "changed" : "added");
        }
    }
    for (size_t i = 0; i < old->n_agents; i++)
        if (!tw_config_agent(cfg, old->agents[i].name)) {
            changes++;
            log_info("reload: [agent.%s] removed", old->agents[i].name);
        }
    for (size_t i = 0; i < cfg->n_tools; i++) {
        const TwToolConf *was = tw_config_tool(old, cfg->tools[i].name);
        if (!was || !tool_same(was, &cfg->tools[i])) {
            changes++;
            log_info("reload: [tool.%s] %s", cfg->tools[i].name, was ? "changed" : "added");
        }
    }
    for (size_t i = 0; i < old->n_tools; i++)
        if (!tw_config_tool(cfg, old->tools[i].name)) {
            changes++;
            log_info("reload: [tool.%s] removed", old->tools[i].name);
        }
    if (changes == 0)
        log_info("reload: nothing changed");
}

/* ---- health, and what a connection coming up does */

void tw_daemon_health(void *arg, TwHealth *h)
{
    TwDaemon *d = arg;

    h->pg_up = tw_pgpool_all_up(&d->pool) && tw_pgpool_all_up(&d->wd_pool);
    h->nats_up = tw_bus_is_up(d->bus);
}

/* A connection came or went: tell systemd (READY=1 the first time everything is up, STATUS on changes). */
static void health_changed(TwDaemon *d)
{
    TwHealth h;

    tw_daemon_health(d, &h);
    tw_notify_health(d->notify, &h);
}

/* The database's answer to our profiles: a refusal before it ever took them is a configuration this daemon
 * must not run on (issue 23: a profile whose name the roster binds, as an agent, to another profile). */
static void profiles_published(TwProfilesOutcome outcome, const char *why, void *arg)
{
    TwDaemon *d = arg;

    if (!d->stopping &&
        tw_profiles_refused_at_start(outcome, why, d->cfg->path, d->ops->prog, &d->profiles_ok)) {
        d->exit_code = 1;
        tw_daemon_stop(d, 0);
    }
}

/* Our profiles (docs/roster.md), at every (re)connect (cheap, and the database may be a new one) and
 * after a reload; then the timeout policies (the worker's: of the agents it serves, before any claim). */
static void publish_profiles(TwDaemon *d, TwPg *pg)
{
    tw_profiles_publish(pg, d->cfg, profiles_published, d);
    tw_policy_publish(pg, d->cfg, d->ops->runs_programs, d->id);
    /* The limits of flow control are the workers' (their tools hold them). */
    if (d->ops->runs_programs)
        tw_flow_limits_publish(pg, d->cfg);
    else
        tw_schedules_publish(pg, d->cfg); /* the schedules are the PMOs' (docs/schedules.md) */
}

void tw_daemon_pg_state(TwPg *pg, bool up, void *arg)
{
    TwDaemon *d = arg;

    health_changed(d);
    if (!up)
        return;
    publish_profiles(d, pg);
    if (d->ops->pg_up)
        d->ops->pg_up(d->self, pg);
}

void tw_daemon_wd_state(TwPg *pg, bool up, void *arg)
{
    TwDaemon *d = arg;

    health_changed(d);
    if (!up)
        return;
    tw_due_pg_up(d->due, pg);
    if (d->ops->wd_up)
        d->ops->wd_up(d->self);
}

/* NATS came back: doorbells and wake-ups may have been missed meanwhile; look at the clock now. */
static void bus_state(TwBus *bus, bool up, void *arg)
{
    TwDaemon *d = arg;

    health_changed(d);
    if (!up)
        return;
    tw_due_wake(d->due);
    if (d->ops->bus_up)
        d->ops->bus_up(d->self);
}

/* cmd.<kind>.wakeup: another daemon created a deadline that may be due before our timer. */
static void wakeup_cb(TwBus *bus, const char *subject, const char *data, size_t len, void *arg)
{
    TwDaemon *d = arg;

    if (!d->stopping)
        tw_due_wake(d->due);
}

/* ---- stopping */

#define DAEMON_DRAIN_MS 50

/* Let queries in flight finish (their effects are committed either way), and then the daemon's own work. */
static void drain_cb(evutil_socket_t fd, short what, void *arg)
{
    TwDaemon *d = arg;
    size_t queries = tw_pgpool_queued(&d->pool) + tw_pgpool_queued(&d->wd_pool);
    int give_up = d->ops->drain_give_up_sec * 1000 / DAEMON_DRAIN_MS;

    if (queries > 0 && give_up > 0 && ++d->drain_ticks > give_up) {
        log_warn("shutdown: %zu queries still unanswered after %d s; giving them up", queries,
                 d->ops->drain_give_up_sec);
        queries = 0;
    }
    if (queries > 0 || (d->ops->in_flight && d->ops->in_flight(d->self) > 0))
        return;
    event_base_loopexit(d->base, NULL);
}

void tw_daemon_stop(TwDaemon *d, int sig)
{
    struct timeval tv = {0, DAEMON_DRAIN_MS * 1000};
    char status[128] = "stopping";

    d->stopping = true;
    d->ops->stop(d->self, sig, status, sizeof status);
    tw_notify_stopping(d->notify, status);
    tw_due_stop(d->due);
    event_add(d->drain, &tv);
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    TwDaemon *d = arg;

    if (!d->stopping) {
        tw_daemon_stop(d, (int)sig);
    } else if (d->ops->second_signal) {
        d->ops->second_signal(d->self);
    } else {
        log_info("second signal: exiting now");
        event_base_loopexit(d->base, NULL);
    }
}

/* ---- counters */

#define DAEMON_COUNTERS_SEC 60

void tw_daemon_log_counters(TwDaemon *d)
{
    char who[32];

    tw_rules_log_counters(d->ops->kind, d->rules, d->n_rules);
    snprintf(who, sizeof who, "%s liveness", d->ops->kind);
    tw_rules_log_counters(who, tw_live_rule(d->live), 1);
    if (d->ops->log_counters)
        d->ops->log_counters(d->self);
}

static void counters_cb(evutil_socket_t fd, short what, void *arg)
{
    tw_daemon_log_counters(arg);
}

/* ---- start-up, reconfiguration and teardown */

int tw_daemon_open(TwDaemon *d, const TwDaemonOps *ops, void *self, struct event_base *base, TwConfig *cfg,
                   int conns)
{
    char name[64];
    int wd_conns = 1;

    memset(d, 0, sizeof *d);
    d->ops = ops;
    d->self = self;
    d->base = base;
    d->cfg = cfg;
    tw_live_daemon_id(d->id, sizeof d->id);
    tw_pg_set_actor(d->id);
    tw_pg_set_query_timeout(cfg->pg_query_timeout_sec);
    if ((d->n_rules = tw_watchdogs_fill(d->rules, ops->rules, cfg, d->id)) < 0)
        return -1;
    tw_metrics_init(ops->prog);
    tw_metrics_learn_names(cfg);
    d->notify = tw_notify_new(base);
    snprintf(name, sizeof name, "%s-watchdogs", ops->kind);
    /* The watchdogs' connections: one, or as many as a rule runs at once (TwRuleDef.parallel). */
    for (int i = 0; i < d->n_rules; i++)
        wd_conns = d->rules[i].parallel > wd_conns ? d->rules[i].parallel : wd_conns;
    if (tw_pgpool_init(&d->pool, base, cfg->pg_dsn, cfg->pg_keepalive_sec, ops->kind, conns,
                       tw_daemon_pg_state, d) != 0 ||
        tw_pgpool_init(&d->wd_pool, base, cfg->pg_dsn, cfg->pg_keepalive_sec, name, wd_conns,
                       tw_daemon_wd_state, d) != 0)
        return -1;
    if (!(d->bus = tw_bus_new(base, cfg, ops->prog)))
        return -1;
    tw_bus_set_state_cb(d->bus, bus_state, d);
    tw_bus_keep_events(d->bus, cfg->nats_events_stream, cfg->nats_events_max_age_sec,
                       cfg->nats_events_replicas);
    snprintf(name, sizeof name, "cmd.%s.wakeup", ops->kind);
    return tw_bus_subscribe(d->bus, name, wakeup_cb, d);
}

/* What the configuration decides for the due-time firing besides the rules' parameters. */
static void due_conf(TwDaemon *d, TwDueConf *due, void (*on_acted)(void *self))
{
    *due = (TwDueConf){
        .who = d->ops->kind,
        .rules = d->rules,
        .n_rules = d->n_rules,
        .sweep_sec =
            d->ops->runs_programs ? d->cfg->worker.watchdog_interval_sec : d->cfg->pmo.watchdog_interval_sec,
        .grace_ms = tw_due_grace_ms(d->cfg),
        .on_acted = on_acted,
        .arg = d->self,
    };
}

int tw_daemon_arm(TwDaemon *d, json_t *info, void (*on_acted)(void *self), TwLiveReclaimedCb on_reclaimed)
{
    struct timeval counters = {DAEMON_COUNTERS_SEC, 0};
    const char *listen = metrics_listen(d, d->cfg);
    TwDueConf due;

    due_conf(d, &due, on_acted);
    d->due = tw_due_new(d->base, &d->wd_pool, d->bus, &due);
    d->live = tw_live_new(d->base, d->cfg, d->bus, d->ops->kind, d->id, info, tw_due_grace_ms(d->cfg),
                          on_reclaimed, d->self);
    if (!d->due || !d->live)
        return -1;
    tw_metrics_watch_rules(d->rules, d->n_rules);
    tw_metrics_watch_rules(tw_live_rule(d->live), 1);
    if (*listen && !(d->httpd = tw_httpd_new(d->base, listen, tw_daemon_health, d)))
        return -1;
    d->counters = event_new(d->base, -1, EV_PERSIST, counters_cb, d);
    d->drain = event_new(d->base, -1, EV_PERSIST, drain_cb, d);
    d->sigterm = evsignal_new(d->base, SIGTERM, signal_cb, d);
    d->sigint = evsignal_new(d->base, SIGINT, signal_cb, d);
    d->sighup = evsignal_new(d->base, SIGHUP, sighup_cb, d);
    if (!d->counters || !d->drain || !d->sigterm || !d->sigint || !d->sighup)
        return -1;
    event_add(d->counters, &counters);
    event_add(d->sigterm, NULL);
    event_add(d->sigint, NULL);
    event_add(d->sighup, NULL);
    return 0;
}

int tw_daemon_start(TwDaemon *d)
{
    if (tw_bus_start(d->bus) != 0)
        return -1;
    tw_due_start(d->due);
    tw_live_start(d->live);
    tw_pgpool_start(&d->pool);
    tw_pgpool_start(&d->wd_pool);
    return 0;
}

void tw_daemon_reconfigure(TwDaemon *d, json_t *info)
{
    TwRule fresh[TW_WATCHDOGS_MAX];
    TwDueConf due;

    if (tw_watchdogs_fill(fresh, d->ops->rules, d->cfg, d->id) == d->n_rules)
        tw_rules_update_params(d->rules, fresh, d->n_rules);
    due_conf(d, &due, NULL);
    tw_due_reconfigure(d->due, &due);
    tw_live_reconfigure(d->live, info, tw_due_grace_ms(d->cfg));
    tw_metrics_learn_names(d->cfg);
    publish_profiles(d, tw_pgpool_pick(&d->pool)); /* the new file's */
}

void tw_daemon_disconnect(TwDaemon *d)
{
    struct event *evs[] = {d->counters, d->drain, d->sigterm, d->sigint, d->sighup};

    d->stopping = true; /* callbacks run below start nothing new */
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
        if (evs[i])
            event_free(evs[i]);
    d->counters = d->drain = d->sigterm = d->sigint = d->sighup = NULL;
    /* Queries still in flight (a second signal, or a drain that timed out: the database is slow or away) get
     * their callbacks when their connection is freed, and those use the watchdogs, the liveness and the
     * outbox (and what the daemon frees after this): free the connections while these still exist, and after
     * the bus, whose unconfirmed publishes are told so (without touching a connection). */
    if (d->due)
        tw_due_stop(d->due);
    tw_bus_free(d->bus);
    d->bus = NULL;
    tw_pgpool_free(&d->pool);
    tw_pgpool_free(&d->wd_pool);
}

void tw_daemon_close(TwDaemon *d)
{
    tw_due_free(d->due);
    tw_live_free(d->live);
    tw_httpd_free(d->httpd);
    tw_notify_free(d->notify);
    tw_metrics_forget_rules();
    tw_config_unref(d->cfg);
    d->due = NULL;
    d->live = NULL;
    d->httpd = NULL;
    d->notify = NULL;
    d->cfg = NULL;
}
