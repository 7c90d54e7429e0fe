/* The worker's loop in the daemon shell: doorbell subscriptions, its timers, the wiring between claim,
 * heartbeat, jobs and watchdogs, and what a stop and a reload do. */
#include "worker.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "applier.h"
#include "log.h"
#include "names.h"
#include "tw_build.h"

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

/* Whether this worker takes new work now and has none waiting for it: capacity.c tells 2.4/2.5
 * (docs/roster.md). A worker whose last claim came back full is working through a backlog as fast as it can
 * claim, even when its steps end at once and leave slots free (steps that suspend on a tool): its profiles'
 * dispatched turns are not waiting for nothing. */
static bool has_free_slot(const TwWorker *w)
{
    return !w->d.stopping && w->jobs.n < w->d.cfg->worker.concurrency && !w->claim.full;
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

    return !profile || (tw_config_agent(w->d.cfg, profile) && tw_config_serves(w->d.cfg, profile));
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
    if (!tw_config_serves(w->d.cfg, name) || !tw_config_tool(w->d.cfg, name))
        return;
    claim_more(w, false);
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

static void log_counters(void *self)
{
    TwWorker *w = self;

    log_info("worker counters: steps_run=%ld tools_run=%ld running=%d", w->jobs.steps_run, w->jobs.tools_run,
             w->jobs.n);
}

/* A connection of the work came up (our profiles and, before any claim on it, the policies of the agents we
 * serve were published first: what a failed step becomes). */
static void pg_up(void *self, TwPg *pg)
{
    TwWorker *w = self;

    /* Results that could not be applied while the database was away (a failover) go in now. */
    wrk_jobs_retry_now(&w->jobs);
    claim_more(w, false);
}

/* NOTIFY tw_work: a submit dispatched a turn of this profile itself (sql/fn/submit.sql); claim it now, no
 * doorbell through the PMO and NATS needed. A hint like a doorbell: the inbox says what there is. */
static void on_work_notify(TwPg *pg, const char *channel, const char *payload, void *arg)
{
    TwWorker *w = ((TwDaemon *)arg)->self; /* its arg is the shell, as tw_daemon_wd_state's */

    if (strcmp(channel, "tw_work") == 0 && !w->d.stopping && payload &&
        (!*payload || (tw_config_agent(w->d.cfg, payload) && tw_config_serves(w->d.cfg, payload))))
        claim_more(w, false);
}

static void wd_up(void *self)
{
    TwWorker *w = self;

    wrk_capacity_reset(&w->capacity, has_free_slot(w));
}

/* Doorbells may have been missed while NATS was away: look at the inbox now (the shell asks the clock). */
static void bus_up(void *self)
{
    claim_more(self, false);
}

/* One wake-up message per kind and loop pass, however many changes asked for it. */
static void wake_cb(evutil_socket_t fd, short what, void *arg)
{
    TwWorker *w = arg;

    if (w->wake_pmo_due)
        tw_due_wake_peers(w->d.bus, "pmo");
    if (w->wake_workers_due)
        tw_due_wake_peers(w->d.bus, "worker");
    w->wake_pmo_due = w->wake_workers_due = false;
}

static void want_wake(TwWorker *w, bool pmo, bool workers)
{
    w->wake_pmo_due |= pmo && w->wake_pmo;
    w->wake_workers_due |= workers && w->wake_workers;
    if ((w->wake_pmo_due || w->wake_workers_due) && w->wake) /* none once torn down */
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

    for (i = json_array_size(publish); i-- > 0;) {
        it = json_array_get(publish, i);
        const char *subject = json_string_value(json_object_get(it, "subject"));
        json_t *data = json_object_get(it, "data");
        const char *target = json_string_value(json_object_get(data, "target"));
        const char *reason = json_string_value(json_object_get(data, "reason"));
        if (!subject || !target || json_object_get(it, "event_id"))
            continue;
        bool ours_agent = strncmp(subject, "cmd.agent.", 10) == 0 && json_object_get(data, "profile") &&
                          serves_doorbell(w, data);
        if (ours_agent && reason && strcmp(reason, "tool.result") == 0) {
            /* A tool result for a profile we serve: we consume it ourselves (a claim consumes results
             * whatever its free slots), so it wakes no other worker of the profile (each would claim for it).
             * Lost with us, rule 2.7 rings for it again. */
            w->claim.results_dirty = true;
            w->claim.dirty = true;
            json_array_remove(publish, i);
        } else if (ours_agent || (strncmp(subject, "cmd.tool.", 9) == 0 && tw_config_tool(w->d.cfg, target) &&
                                  tw_config_serves(w->d.cfg, target))) {
            w->claim.dirty = true;
        }
    }
    /* Tool calls start 2.2's deadlines and their warnings: ask our own database when they are due (one cheap
     * query; the other workers hear of it only when the deadline can fall before their sweep). */
    if (suspended)
        tw_due_wake(w->d.due);
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

static bool is_program(pid_t pid, void *arg)
{
    TwWorker *w = arg;

    return wrk_proc_running(pid) || wrk_serve_running(w->jobs.serve, pid) ||
           wrk_mcp_running(w->jobs.mcp, pid);
}

static void sigchld_cb(evutil_socket_t sig, short what, void *arg)
{
    TwWorker *w = arg;
    struct rusage ru;
    int status;
    pid_t pid;

    /* wait4: what a program used tells a stop by its limits from other ends (child.h). A pid that is no
     * program's was left behind by one (wrk_orphans_end) and is just reaped. */
    while ((pid = wait4(-1, &status, WNOHANG, &ru)) > 0)
        if (!wrk_proc_exited(pid, status, &ru) && !wrk_serve_exited(w->jobs.serve, pid, status, &ru))
            (void)wrk_mcp_exited(w->jobs.mcp, pid, status, &ru);
    /* What the programs that ended left behind is the worker's child now: end it. */
    wrk_orphans_end(is_program, w);
}

/* While stopping, once no query is left: the running jobs and their programs (serve processes with nothing
 * more to serve are let go). */
static size_t in_flight(void *self)
{
    TwWorker *w = self;

    if (w->jobs.n == 0) {
        wrk_serve_stop_idle(w->jobs.serve);
        wrk_mcp_stop_idle(w->jobs.mcp);
    }
    return w->jobs.n > 0 ? (size_t)w->jobs.n : (size_t)wrk_jobs_programs(&w->jobs);
}

/* Shut down: no new work (the shell stops the rules); the running jobs finish, then the loop ends. */
static void wrk_stop(void *self, int sig, char *status, size_t size)
{
    TwWorker *w = self;

    if (sig)
        log_info("signal %d: no new work; finishing %d running job(s) (signal again to release them now)",
                 sig, w->jobs.n);
    snprintf(status, size, "stopping: finishing %d running job(s)", w->jobs.n);
    w->jobs.stopping = true;
    wrk_capacity_update(&w->capacity, false); /* takes no new work: not a free slot for 2.4/2.5 */
    w->claim.stopped = true;
    evtimer_del(w->poll);
}

static void second_signal(void *self)
{
    TwWorker *w = self;

    if (!w->jobs.releasing) {
        log_info("second signal: stopping programs and releasing %d job(s)", w->jobs.n);
        wrk_jobs_release_all(&w->jobs);
    }
}

/* The clocks a worker's changes start (dispatches, claims, tool calls), each kind of daemon's rules against
 * that kind's sweep (the INI is shared): only when a deadline could fall before the next sweep does a wake-up
 * pay off. */
static void choose_wakeups(TwWorker *w)
{
    w->wake_pmo = tw_watchdogs_wake_pays(TW_RULES_PMO, TW_CLOCK_ANY, w->d.cfg);
    w->wake_workers = tw_watchdogs_wake_pays(TW_RULES_WORKER, TW_CLOCK_ANY, w->d.cfg);
}

static int subscribe_doorbells(TwWorker *w)
{
    const TwConfig *cfg = w->d.cfg;
    char subject[128];
    bool any_profile = false;

    /* Agents are a roster, any number of them: one subscription for every agent's doorbell, filtered by the
     * profile it names (doorbell_cb). */
    for (size_t i = 0; i < cfg->n_agents; i++)
        any_profile |= tw_config_serves(cfg, cfg->agents[i].name);
    if (any_profile && !tw_bus_subscribed(w->d.bus, "cmd.agent.*.wakeup") &&
        tw_bus_subscribe(w->d.bus, "cmd.agent.*.wakeup", doorbell_cb, w) != 0)
        return -1;
    for (size_t i = 0; i < cfg->n_tools; i++) {
        if (!tw_config_serves(cfg, cfg->tools[i].name) || cfg->tools[i].external ||
            cfg->tools[i].agent_profile)
            continue;
        snprintf(subject, sizeof subject, "cmd.tool.%s.wakeup", cfg->tools[i].name);
        if (!tw_bus_subscribed(w->d.bus, subject) && tw_bus_subscribe(w->d.bus, subject, doorbell_cb, w) != 0)
            return -1;
    }
    return 0;
}

static json_t *live_info(const TwWorker *w)
{
    return json_pack("{s:o,s:o,s:i}", "profiles", names_json(w->d.cfg, false), "tools",
                     names_json(w->d.cfg, true), "concurrency", w->d.cfg->worker.concurrency);
}

/* Everything the served agents and tools decide: the names claims and applies send, the claim's slots and
 * leases, the wake-ups, the doorbells. w->d.cfg is the configuration in force; the arrays are built already.
 */
static void serve(TwWorker *w)
{
    const TwConfig *cfg = w->d.cfg;

    w->jobs.cfg = w->d.cfg;
    w->jobs.agents_arr = w->agents_arr;
    w->jobs.tools_arr = w->tools_arr;
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

/* A reload's own part: what it serves and claims, the doorbells, the poll and heartbeat, the slots 2.4/2.5
 * count. A running job keeps the configuration it started with. */
static int wrk_apply(void *self, const TwConfig *old)
{
    TwWorker *w = self;
    const TwConfig *cfg = w->d.cfg;
    char *agents_arr = names_array(cfg, false), *tools_arr = names_array(cfg, true);
    json_t *info;

    if (!agents_arr || !tools_arr) {
        log_error("reload refused: out of memory; the running configuration is kept");
        free(agents_arr);
        free(tools_arr);
        return -1;
    }
    free(w->agents_arr);
    free(w->tools_arr);
    w->agents_arr = agents_arr;
    w->tools_arr = tools_arr;
    serve(w);
    if (subscribe_doorbells(w) != 0)
        log_warn("reload: could not subscribe to every doorbell; the poll every %d s finds their work",
                 cfg->worker.watchdog_interval_sec);
    rearm(w->poll, old->worker.watchdog_interval_sec, cfg->worker.watchdog_interval_sec);
    rearm(w->heartbeat, old->worker.heartbeat_sec, cfg->worker.heartbeat_sec);
    info = live_info(w);
    tw_daemon_reconfigure(&w->d, info);
    json_decref(info);
    w->capacity.slots = cfg->worker.concurrency;
    wrk_capacity_reset(&w->capacity, has_free_slot(w));
    log_info(
        "reload: configuration from %s applied: agents=%s tools=%s concurrency=%d (%d running job(s) keep "
        "the one they started with)",
        cfg->path, w->agents_arr, w->tools_arr, cfg->worker.concurrency, w->jobs.n);
    /* Newly served agents and tools may have work waiting, and a larger concurrency free slots. */
    claim_more(w, true);
    return 0;
}

static int wrk_setup(void *self, struct event_base *base, TwConfig *cfg)
{
    TwWorker *w = self;
    struct timeval poll = {cfg->worker.watchdog_interval_sec, 0};
    struct timeval hb = {cfg->worker.heartbeat_sec, 0};
    int conns = cfg->worker.concurrency / 2;
    char dsn[512], nats[512];
    json_t *info;
    int rc;

    memset(w, 0, sizeof *w);
    /* Programs end with their step: what they leave behind becomes the worker's child (wrk_orphans_end). */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
        log_warn("prctl(PR_SET_CHILD_SUBREAPER): %s; processes that programs leave behind are not ended",
                 strerror(errno));
    conns = conns < WRK_PG_CONNS_MIN ? WRK_PG_CONNS_MIN : conns > WRK_PG_CONNS_MAX ? WRK_PG_CONNS_MAX : conns;
    if (tw_daemon_open(&w->d, &wrk_ops, w, base, cfg, conns) != 0)
        return -1;
    w->agents_arr = names_array(cfg, false);
    w->tools_arr = names_array(cfg, true);
    if (!w->agents_arr || !w->tools_arr)
        return -1;
    /* The watchdogs' connection is the quiet one: it hears submits that dispatched a turn themselves. */
    tw_pg_set_callbacks(w->d.wd_pool.conns[0], tw_daemon_wd_state, on_work_notify, &w->d);
    if (tw_pg_listen(w->d.wd_pool.conns[0], "tw_work") != 0 || subscribe_doorbells(w) != 0)
        return -1;

    if (wrk_jobs_init(&w->jobs, base, &w->d.pool, w->d.bus, cfg, w->d.id, w->agents_arr) != 0)
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
    if (wrk_claim_init(&w->claim, base) != 0)
        return -1;
    w->beat = (WrkBeat){.jobs = &w->jobs};
    serve(w);

    if (wrk_capacity_init(&w->capacity, base, &w->d.wd_pool, w->d.id, cfg->worker.concurrency) != 0)
        return -1;
    info = live_info(w);
    rc = tw_daemon_arm(&w->d, info, on_rule_acted, on_reclaimed);
    json_decref(info);
    if (rc != 0)
        return -1;
    w->poll = event_new(base, -1, EV_PERSIST, poll_cb, w);
    w->heartbeat = event_new(base, -1, EV_PERSIST, heartbeat_cb, w);
    w->wake = event_new(base, -1, 0, wake_cb, w);
    w->sigchld = evsignal_new(base, SIGCHLD, sigchld_cb, w);
    if (!w->poll || !w->heartbeat || !w->wake || !w->sigchld)
        return -1;
    event_add(w->poll, &poll);
    event_add(w->heartbeat, &hb);
    event_add(w->sigchld, NULL);
    if (tw_daemon_start(&w->d) != 0)
        return -1;
    log_info("turnwatch-worker %s started: id=%s dsn=\"%s\" nats=%s agents=%s tools=%s concurrency=%d",
             TW_VERSION, w->d.id, tw_redact_dsn(cfg->pg_dsn, dsn, sizeof dsn),
             tw_redact_urls(cfg->nats_url, nats, sizeof nats), w->agents_arr, w->tools_arr,
             cfg->worker.concurrency);
    return 0;
}

static void wrk_teardown(void *self)
{
    TwWorker *w = self;
    struct event *evs[] = {w->poll, w->heartbeat, w->wake, w->sigchld};

    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
        if (evs[i])
            event_free(evs[i]);
    w->poll = w->heartbeat = w->wake = w->sigchld = NULL;
    wrk_claim_free(&w->claim);
    /* Queries still in flight get their callbacks when their connection is freed, and those use the jobs and
     * the capacity too: the shell frees the connections first, these after. */
    tw_daemon_disconnect(&w->d);
    wrk_jobs_free_all(&w->jobs);
    wrk_orphans_end_all(2000);
    wrk_capacity_free(&w->capacity);
    free(w->agents_arr);
    free(w->tools_arr);
    w->agents_arr = w->tools_arr = NULL;
    tw_daemon_close(&w->d);
}

const TwDaemonOps wrk_ops = {
    .prog = "turnwatch-worker",
    .kind = "worker",
    .summary = "Claims inbox items, runs agent and tool programs, suspends and resumes turns,\n"
               "and runs the worker watchdogs (2.1-2.3).",
    .rules = TW_RULES_WORKER,
    .runs_programs = true,
    .setup = wrk_setup,
    .teardown = wrk_teardown,
    .pg_up = pg_up,
    .wd_up = wd_up,
    .bus_up = bus_up,
    .stop = wrk_stop,
    .second_signal = second_signal,
    .in_flight = in_flight,
    .apply = wrk_apply,
    .log_counters = log_counters,
};
