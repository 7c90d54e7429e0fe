/* The worker's loop: connections, doorbell subscriptions, timers, signals, the wiring between claim,
 * heartbeat, jobs and watchdogs, and an orderly shutdown. */
#include "worker.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "applier.h"
#include "daemon.h"
#include "log.h"
#include "metrics.h"
#include "names.h"
#include "profiles.h"
#include "policy.h"

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
        if (!tw_config_serves(cfg, name) ||
            (tools && (cfg->tools[i].external || cfg->tools[i].agent_profile)))
            continue;
        if (s[1])
            strcat(s, ",");
        strcat(s, name);
    }
    strcat(s, "}");
    return s;
}

/* The served profiles (or tools) as a JSON array, for state.daemons info: tw.profile_clock reads "profiles".
 */
static json_t *names_json(const TwConfig *cfg, bool tools)
{
    json_t *a = json_array();
    size_t n = tools ? cfg->n_tools : cfg->n_agents;

    for (size_t i = 0; a && i < n; i++) {
        const char *name = tools ? cfg->tools[i].name : cfg->agents[i].name;
        if (tw_config_serves(cfg, name) &&
            (!tools || (!cfg->tools[i].external && !cfg->tools[i].agent_profile)))
            json_array_append_new(a, json_string(name));
    }
    return a;
}

/* Whether this worker takes new work now and has none waiting for it: capacity.c tells 2.4/2.5 (contract
 * section 14). A worker whose last claim came back full is working through a backlog as fast as it can claim,
 * even when its steps end at once and leave slots free (steps that suspend on a tool): its profiles'
 * dispatched turns are not waiting for nothing. */
static bool has_free_slot(const TwWorker *w)
{
    return !w->stopping && w->jobs.n < w->cfg->worker.concurrency && !w->claim.full;
}

static void on_count(void *arg)
{
    TwWorker *w = arg;

    wrk_capacity_update(&w->capacity, has_free_slot(w));
}

/* Whether an agent doorbell concerns us: it names the agent's profile (older writers did not: then yes). */
static bool serves_doorbell(const TwWorker *w, json_t *data)
{
    const char *profile = json_string_value(json_object_get(data, "profile"));

    return !profile || (tw_config_agent(w->cfg, profile) && tw_config_serves(w->cfg, profile));
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
    TwWorker *w = arg;
    bool agent = strncmp(subject, "cmd.agent.", 10) == 0;
    const char *target = subject + (agent ? 10 : 9), *end = strchr(target, '.');
    char name[TW_NAME_MAX + 1];

    /* Every agent's doorbell reaches every worker (agents are a roster, not a config list): look at the inbox
     * for those of our profiles. A hint only: whatever else it says, look at the inbox. */
    if (agent) {
        json_t *doc = json_loadb(data, len, 0, NULL);
        bool ours = serves_doorbell(w, doc);
        json_decref(doc);
        if (ours)
            claim_more(w, true);
        return;
    }
    /* A reload may have dropped the tool this subscription was for: such a doorbell is not ours any more. */
    if (!end || end - target > TW_NAME_MAX)
        return;
    snprintf(name, sizeof name, "%.*s", (int)(end - target), target);
    if (!tw_config_serves(w->cfg, name) || !tw_config_tool(w->cfg, name))
        return;
    claim_more(w, false);
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

void wrk_health(void *arg, TwHealth *h)
{
    TwWorker *w = arg;

    h->pg_up = tw_pgpool_all_up(&w->pool) && tw_pgpool_all_up(&w->wd_pool);
    h->nats_up = tw_bus_is_up(w->bus);
}

/* A connection came or went: tell systemd (READY=1 the first time everything is up, STATUS on changes). */
static void health_changed(TwWorker *w)
{
    TwHealth h;

    wrk_health(w, &h);
    tw_notify_health(w->notify, &h);
}

static void wrk_stop(TwWorker *w);

/* The database's answer to our profiles: a refusal before it ever took them is a configuration this worker
 * must not run on (issue 23: a profile whose name the roster binds, as an agent, to another profile). */
static void profiles_published(TwProfilesOutcome outcome, const char *why, void *arg)
{
    TwWorker *w = arg;

    if (!w->stopping &&
        tw_profiles_refused_at_start(outcome, why, w->cfg->path, "turnwatch-worker", &w->profiles_ok)) {
        w->exit_code = 1;
        wrk_stop(w);
    }
}

static void on_pg_state(TwPg *pg, bool up, void *arg)
{
    TwWorker *w = arg;

    health_changed(w);
    if (!up)
        return;
    /* Our profiles (contract section 14), at every (re)connect: cheap, and the database may be a new one. */
    tw_profiles_publish(pg, w->cfg, profiles_published, w);
    /* Before any claim on this session: the policies of the agents we serve (what a failed step becomes). */
    tw_policy_publish(pg, w->cfg, true, w->id);
    /* Results that could not be applied while the database was away (a failover) go in now. */
    wrk_jobs_retry_now(&w->jobs);
    claim_more(w, false);
}

/* NOTIFY tw_work: a submit dispatched a turn of this profile itself (sql/fn/submit.sql); claim it now, no
 * doorbell through the PMO and NATS needed. A hint like a doorbell: the inbox says what there is. */
static void on_work_notify(TwPg *pg, const char *channel, const char *payload, void *arg)
{
    TwWorker *w = arg;

    if (strcmp(channel, "tw_work") == 0 && !w->stopping && payload &&
        (!*payload || (tw_config_agent(w->cfg, payload) && tw_config_serves(w->cfg, payload))))
        claim_more(w, false);
}

static void on_wd_state(TwPg *pg, bool up, void *arg)
{
    TwWorker *w = arg;

    health_changed(w);
    if (!up)
        return;
    tw_due_pg_up(w->due);
    wrk_capacity_reset(&w->capacity, has_free_slot(w));
}

static void on_bus_state(TwBus *bus, bool up, void *arg)
{
    TwWorker *w = arg;

    health_changed(w);
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
        json_t *data = json_object_get(it, "data");
        const char *target = json_string_value(json_object_get(data, "target"));
        if (!subject || !target || json_object_get(it, "event_id"))
            continue;
        if ((strncmp(subject, "cmd.agent.", 10) == 0 && json_object_get(data, "profile") &&
             serves_doorbell(w, data)) ||
            (strncmp(subject, "cmd.tool.", 9) == 0 && tw_config_tool(w->cfg, target) &&
             tw_config_serves(w->cfg, target)))
            w->claim.dirty = true;
    }
    /* Tool calls start 2.2's deadlines and their warnings: ask our own database when they are due (one cheap
     * query; the other workers hear of it only when the deadline can fall before their sweep). */
    if (suspended)
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
    TwWorker *w = arg;
    struct rusage ru;
    int status;
    pid_t pid;

    /* wait4: what a program used tells a stop by its limits from other ends (runner.h). */
    while ((pid = wait4(-1, &status, WNOHANG, &ru)) > 0)
        if (!wrk_proc_exited(pid, status, &ru))
            (void)wrk_serve_exited(w->jobs.serve, pid, status, &ru);
}

static void exit_check_cb(evutil_socket_t fd, short what, void *arg)
{
    TwWorker *w = arg;

    if (tw_pgpool_queued(&w->pool) > 0 || tw_pgpool_queued(&w->wd_pool) > 0)
        return;
    if (w->jobs.n == 0)
        wrk_serve_stop_idle(w->jobs.serve); /* nothing more to serve: let them go, and wait for them */
    if (w->jobs.n == 0 && wrk_jobs_programs(&w->jobs) == 0)
        event_base_loopexit(w->base, NULL);
}

/* Shut down: no new work; the running jobs finish, then the loop ends (exit_check). */
static void wrk_stop(TwWorker *w)
{
    struct timeval tv = {0, 50000};
    char status[96];

    snprintf(status, sizeof status, "stopping: finishing %d running job(s)", w->jobs.n);
    tw_notify_stopping(w->notify, status);
    w->stopping = true;
    w->jobs.stopping = true;
    wrk_capacity_update(&w->capacity, false); /* takes no new work: not a free slot for 2.4/2.5 */
    w->claim.stopped = true;
    evtimer_del(w->poll);
    tw_due_stop(w->due);
    event_add(w->exit_check, &tv);
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    TwWorker *w = arg;

    if (!w->stopping) {
        log_info("signal %d: no new work; finishing %d running job(s) (signal again to release them now)",
                 (int)sig, w->jobs.n);
        wrk_stop(w);
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
    bool any_profile = false;

    /* Agents are a roster, any number of them: one subscription for every agent's doorbell, filtered by the
     * profile it names (doorbell_cb). */
    for (size_t i = 0; i < cfg->n_agents; i++)
        any_profile |= tw_config_serves(cfg, cfg->agents[i].name);
    if (any_profile && !tw_bus_subscribed(w->bus, "cmd.agent.*.wakeup") &&
        tw_bus_subscribe(w->bus, "cmd.agent.*.wakeup", doorbell_cb, w) != 0)
        return -1;
    for (size_t i = 0; i < cfg->n_tools; i++) {
        if (!tw_config_serves(cfg, cfg->tools[i].name) || cfg->tools[i].external ||
            cfg->tools[i].agent_profile)
            continue;
        snprintf(subject, sizeof subject, "cmd.tool.%s.wakeup", cfg->tools[i].name);
        if (!tw_bus_subscribed(w->bus, subject) && tw_bus_subscribe(w->bus, subject, doorbell_cb, w) != 0)
            return -1;
    }
    if (tw_bus_subscribed(w->bus, "cmd.worker.wakeup"))
        return 0;
    return tw_bus_subscribe(w->bus, "cmd.worker.wakeup", wakeup_cb, w);
}

/* What the configuration decides for the next-due question and the sweep, at start-up and after a reload. */
static void due_conf(TwWorker *w, TwDueConf *due)
{
    const TwConfig *cfg = w->cfg;

    *due = (TwDueConf){.who = "worker",
                       .rules = w->rules,
                       .n_rules = WRK_RULE_COUNT,
                       .next_sql = "SELECT tw.worker_next_due($1::integer)",
                       .next_nparams = 1,
                       .next_params = {cfg->worker.inbox_processing_timeout_sec},
                       .sweep_sec = cfg->worker.watchdog_interval_sec,
                       .grace_ms = tw_due_grace_ms(cfg),
                       .on_acted = on_rule_acted,
                       .arg = w};
}

static json_t *live_info(const TwWorker *w)
{
    return json_pack("{s:o,s:o,s:i}", "profiles", names_json(w->cfg, false), "tools",
                     names_json(w->cfg, true), "concurrency", w->cfg->worker.concurrency);
}

/* Everything the served agents and tools decide: the names claims and applies send, the claim's slots and
 * leases, the wake-ups, the doorbells. w->cfg is the configuration in force; the arrays are built already. */
static void serve(TwWorker *w)
{
    const TwConfig *cfg = w->cfg;

    w->jobs.cfg = w->cfg;
    w->jobs.agents_arr = w->agents_arr;
    w->claim.tools_arr = w->tools_arr;
    w->claim.concurrency = cfg->worker.concurrency;
    w->claim.lease_sec = cfg->worker.inbox_processing_timeout_sec;
    w->beat.lease_sec = cfg->worker.inbox_processing_timeout_sec;
    w->beat.unknown_grace_sec = 2 * cfg->pg_query_timeout_sec;
    choose_wakeups(w);
}

/* A persistent timer's period changed: re-arm it (a stopping worker keeps its poll off). */
static void rearm(struct event *ev, int old_sec, int new_sec)
{
    struct timeval tv = {new_sec, 0};

    if (old_sec == new_sec || !event_pending(ev, EV_TIMEOUT, NULL))
        return;
    event_del(ev);
    event_add(ev, &tv);
}

int wrk_apply_config(TwWorker *w, TwConfig *cfg)
{
    TwConfig *old = w->cfg;
    char *agents_arr = names_array(cfg, false), *tools_arr = names_array(cfg, true);
    TwRule fresh[WRK_RULE_COUNT];
    TwDueConf due;
    json_t *info;

    /* What can fail goes first, so that a refused file changes nothing. */
    if (!agents_arr || !tools_arr) {
        log_error("reload refused: out of memory; the running configuration is kept");
        goto refuse;
    }
    if (tw_httpd_configure(&w->httpd, w->base, cfg->worker.metrics_listen, wrk_health, w) != 0) {
        log_error("reload refused: [worker] metrics_listen %s cannot be opened; the running configuration is "
                  "kept",
                  cfg->worker.metrics_listen);
        goto refuse;
    }
    tw_daemon_log_changes(old, cfg);
    w->cfg = cfg;
    free(w->agents_arr);
    free(w->tools_arr);
    w->agents_arr = agents_arr;
    w->tools_arr = tools_arr;
    serve(w);
    if (subscribe_doorbells(w) != 0)
        log_warn("reload: could not subscribe to every doorbell; the poll every %d s finds their work",
                 cfg->worker.watchdog_interval_sec);
    wrk_watchdog_rules(fresh, cfg);
    tw_rules_update_params(w->rules, fresh, WRK_RULE_COUNT);
    due_conf(w, &due);
    tw_due_reconfigure(w->due, &due);
    rearm(w->poll, old->worker.watchdog_interval_sec, cfg->worker.watchdog_interval_sec);
    rearm(w->heartbeat, old->worker.heartbeat_sec, cfg->worker.heartbeat_sec);
    info = live_info(w);
    tw_live_reconfigure(w->live, info, tw_due_grace_ms(cfg));
    json_decref(info);
    tw_metrics_learn_names(cfg);
    /* The profiles of the new file (contract section 14), and the slots 2.4/2.5 count. */
    tw_profiles_publish(tw_pgpool_pick(&w->pool), cfg, profiles_published, w);
    tw_policy_publish(tw_pgpool_pick(&w->pool), cfg, true, w->id);
    w->capacity.slots = cfg->worker.concurrency;
    wrk_capacity_reset(&w->capacity, has_free_slot(w));
    log_info(
        "reload: configuration from %s applied: agents=%s tools=%s concurrency=%d (%d running job(s) keep "
        "the one they started with)",
        cfg->path, w->agents_arr, w->tools_arr, cfg->worker.concurrency, w->jobs.n);
    tw_daemon_apply_log(cfg);
    tw_config_unref(old);
    /* Newly served agents and tools may have work waiting, and a larger concurrency free slots. */
    claim_more(w, true);
    return 0;
refuse:
    free(agents_arr);
    free(tools_arr);
    tw_config_unref(cfg);
    return -1;
}

static int apply_config(void *w, TwConfig *cfg)
{
    return wrk_apply_config(w, cfg);
}

static void sighup_cb(evutil_socket_t sig, short what, void *arg)
{
    TwWorker *w = arg;

    /* The same checks as at start-up, the programs it would serve included. */
    if (!w->stopping)
        tw_daemon_sighup(w->cfg->path, true, apply_config, w, w->notify, tw_pgpool_pick(&w->pool),
                         &w->reloading, &w->stopping);
}

int wrk_setup(TwWorker *w, struct event_base *base, TwConfig *cfg)
{
    struct timeval poll = {cfg->worker.watchdog_interval_sec, 0};
    struct timeval hb = {cfg->worker.heartbeat_sec, 0};
    struct timeval counters = {WRK_COUNTERS_SEC, 0};

    memset(w, 0, sizeof *w);
    w->base = base;
    w->cfg = cfg;
    tw_live_daemon_id(w->id, sizeof w->id);
    tw_pg_set_actor(w->id);
    tw_pg_set_query_timeout(cfg->pg_query_timeout_sec);
    wrk_watchdog_rules(w->rules, cfg);
    tw_metrics_init("turnwatch-worker");
    tw_metrics_learn_names(cfg);
    w->notify = tw_notify_new(base);
    w->agents_arr = names_array(cfg, false);
    w->tools_arr = names_array(cfg, true);
    if (!w->agents_arr || !w->tools_arr)
        return -1;
    int conns = cfg->worker.concurrency / 2;
    conns = conns < WRK_PG_CONNS_MIN ? WRK_PG_CONNS_MIN : conns > WRK_PG_CONNS_MAX ? WRK_PG_CONNS_MAX : conns;
    if (tw_pgpool_init(&w->pool, base, cfg->pg_dsn, cfg->pg_keepalive_sec, "worker", conns, on_pg_state, w) !=
        0)
        return -1;
    if (tw_pgpool_init(&w->wd_pool, base, cfg->pg_dsn, cfg->pg_keepalive_sec, "worker-watchdogs", 1,
                       on_wd_state, w) != 0)
        return -1;
    /* The watchdogs' connection is the quiet one: it hears submits that dispatched a turn themselves. */
    tw_pg_set_callbacks(w->wd_pool.conns[0], on_wd_state, on_work_notify, w);
    if (tw_pg_listen(w->wd_pool.conns[0], "tw_work") != 0)
        return -1;
    if (!(w->bus = tw_bus_new(base, cfg, "turnwatch-worker")))
        return -1;
    tw_bus_set_state_cb(w->bus, on_bus_state, w);
    tw_bus_keep_events(w->bus, cfg->nats_events_stream, cfg->nats_events_max_age_sec,
                       cfg->nats_events_replicas);
    if (subscribe_doorbells(w) != 0)
        return -1;

    if (wrk_jobs_init(&w->jobs, base, &w->pool, w->bus, cfg, w->id, w->agents_arr) != 0)
        return -1;
    w->jobs.apply_push = wrk_applier_push;
    w->jobs.on_slot_free = on_slot_free;
    w->jobs.on_applied = on_applied;
    w->jobs.on_count = on_count;
    w->jobs.arg = w;
    w->claim = (WrkClaim){.jobs = &w->jobs,
                          .on_resumed = on_resumed,
                          .on_claimed = on_claimed,
                          .on_settled = on_count,
                          .arg = w};
    w->beat = (WrkBeat){.jobs = &w->jobs};
    serve(w);

    if (wrk_capacity_init(&w->capacity, base, &w->wd_pool, w->id, cfg->worker.concurrency) != 0)
        return -1;
    TwDueConf due;
    due_conf(w, &due);
    json_t *info = live_info(w);
    w->due = tw_due_new(base, &w->wd_pool, w->bus, &due);
    w->live = tw_live_new(base, cfg, w->bus, "worker", w->id, info, tw_due_grace_ms(cfg), on_reclaimed, w);
    json_decref(info);
    if (!w->due || !w->live)
        return -1;
    tw_metrics_watch_rules(w->rules, WRK_RULE_COUNT);
    tw_metrics_watch_rules(tw_live_rule(w->live), 1);
    if (*cfg->worker.metrics_listen &&
        !(w->httpd = tw_httpd_new(base, cfg->worker.metrics_listen, wrk_health, w)))
        return -1;

    w->poll = event_new(base, -1, EV_PERSIST, poll_cb, w);
    w->heartbeat = event_new(base, -1, EV_PERSIST, heartbeat_cb, w);
    w->counters = event_new(base, -1, EV_PERSIST, counters_cb, w);
    w->exit_check = event_new(base, -1, EV_PERSIST, exit_check_cb, w);
    w->wake = event_new(base, -1, 0, wake_cb, w);
    w->sigterm = evsignal_new(base, SIGTERM, signal_cb, w);
    w->sigint = evsignal_new(base, SIGINT, signal_cb, w);
    w->sighup = evsignal_new(base, SIGHUP, sighup_cb, w);
    w->sigchld = evsignal_new(base, SIGCHLD, sigchld_cb, w);
    if (!w->poll || !w->heartbeat || !w->counters || !w->exit_check || !w->wake || !w->sigterm ||
        !w->sigint || !w->sighup || !w->sigchld)
        return -1;
    event_add(w->poll, &poll);
    event_add(w->heartbeat, &hb);
    event_add(w->counters, &counters);
    event_add(w->sigterm, NULL);
    event_add(w->sigint, NULL);
    event_add(w->sighup, NULL);
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
    struct event *evs[] = {w->poll,    w->heartbeat, w->counters, w->exit_check, w->wake,
                           w->sigterm, w->sigint,    w->sighup,   w->sigchld};

    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
        if (evs[i])
            event_free(evs[i]);
    /* As in pmo_teardown: queries still in flight get their callbacks when their connection is freed, and
     * those use the jobs, the watchdogs, the liveness and the capacity: free the connections (after the bus)
     * while these still exist. */
    if (w->due)
        tw_due_stop(w->due);
    tw_bus_free(w->bus);
    tw_pgpool_free(&w->pool);
    tw_pgpool_free(&w->wd_pool);
    wrk_jobs_free_all(&w->jobs);
    tw_due_free(w->due);
    tw_live_free(w->live);
    wrk_capacity_free(&w->capacity);
    free(w->agents_arr);
    free(w->tools_arr);
    tw_httpd_free(w->httpd);
    tw_notify_free(w->notify);
    tw_metrics_forget_rules();
    tw_config_unref(w->cfg);
    w->cfg = NULL;
}
