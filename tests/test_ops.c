/* test_ops.c — operations (contract section 12) against real servers: /metrics scraped over HTTP and parsed
 * (figures move as turns run, each ended turn counted once over both daemons, the lateness histograms there),
 * /healthz following NATS and PostgreSQL down and back, systemd's notify datagrams (READY, STATUS, WATCHDOG,
 * RELOADING, STOPPING) on a socket the test binds, and SIGHUP reloads with a valid file (an agent added runs,
 * one removed is no longer claimed, a running step keeps its configuration, the log level and the metrics
 * address change) and with invalid ones (every error logged, the old configuration kept). Then hostile
 * clients of both endpoints (issue 23): 1,100 slow connections each, a trickling request, 1 MiB header lines,
 * daemons out of descriptors; and the open-file limit the daemons start with. */
#include "fixture.h"
#include "suite.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define WAIT_MS 30000

/* ---- helpers
 * ---------------------------------------------------------------------------------------------------- */

typedef struct Env {
    TwFx *fx;
    TwFxProc *pmo, *worker;
    TwFxEvents *ev;
    int pmo_port, worker_port;
    const char
        *daemons_ini; /* the daemons' file, which reload tests rewrite; the CLI keeps the default one */
} Env;

/* The daemons' file: both metrics endpoints plus overrides. */
static void write_daemons_ini(Env *e, int worker_port, const char *overrides)
{
    char *all = NULL;
    ck_assert_int_gt(
        asprintf(&all, "[pmo]\nmetrics_listen = 127.0.0.1:%d\n[worker]\nmetrics_listen = 127.0.0.1:%d\n%s",
                 e->pmo_port, worker_port, overrides ? overrides : ""),
        0);
    e->daemons_ini = tw_fx_write_config(e->fx, "daemons.ini", all);
    free(all);
}

/* Servers, schema, an event collector, the default config (the CLI's) and the daemons' file; the daemons are
 * started by the test (some need an environment of their own first). */
static Env env_new(const char *overrides)
{
    Env e = {0};
    e.fx = tw_fx_new();
    tw_fx_pg_init(e.fx);
    tw_fx_nats_start(e.fx);
    e.pmo_port = tw_fx_free_port();
    e.worker_port = tw_fx_free_port();
    tw_fx_write_config(e.fx, NULL, overrides);
    write_daemons_ini(&e, e.worker_port, overrides);
    tw_fx_migrate(e.fx);
    e.ev = tw_fx_events_new(e.fx, "evt.>");
    return e;
}

static TwFxProc *start_pmo(Env *e)
{
    return e->pmo = tw_fx_start_pmo(e->fx, e->daemons_ini);
}

static TwFxProc *start_worker(Env *e)
{
    return e->worker = tw_fx_start_worker(e->fx, e->daemons_ini);
}

static void env_start(Env *e)
{
    start_pmo(e);
    start_worker(e);
}

/* env_new and env_start. */
static Env env_up(const char *overrides)
{
    Env e = env_new(overrides);
    env_start(&e);
    return e;
}

/* Rewrite the daemons' file (same path) for a reload. */
static void rewrite_config(Env *e, int worker_port, const char *overrides)
{
    write_daemons_ini(e, worker_port, overrides);
}

static void dump_logs(Env *e)
{
    TwFxProc *procs[] = {e->pmo, e->worker};
    for (size_t i = 0; i < 2; i++) {
        if (!procs[i])
            continue;
        tw_fx_proc_dump(procs[i]);
    }
}

static void stop_daemon(TwFxProc *p)
{
    int rc = tw_fx_proc_terminate(p, 20000);
    if (rc != 0)
        tw_fx_proc_dump(p);
    ck_assert_msg(rc == 0, "%s exited %d on SIGTERM", tw_fx_proc_log_path(p), rc);
}

/* The worker, then the PMO, then everything else. */
static void env_stop(Env *e)
{
    stop_daemon(e->worker);
    stop_daemon(e->pmo);
    tw_fx_free(e->fx);
}

/* After a SIGTERM the test sent itself: the daemon must exit 0. */
static void wait_exit0(Env *e, TwFxProc *p)
{
    int status = -1;
    bool ended = tw_fx_proc_wait(p, WAIT_MS, &status);
    if (!ended || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        dump_logs(e);
    ck_assert_msg(ended, "%s did not exit after SIGTERM", tw_fx_proc_log_path(p));
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s ended with status %d",
                  tw_fx_proc_log_path(p), status);
}

static char *submit(Env *e, const char *agent, const char *input)
{
    char *out = NULL, *err = NULL;
    int rc =
        tw_fx_cli(e->fx, &out, &err, "submit", "--agent", agent, "--channel", "ops", "--input", input, NULL);
    ck_assert_msg(rc == 0, "submit %s exited %d: %s", agent, rc, err);
    char *nl = strchr(out, '\n');
    if (nl)
        *nl = '\0';
    char *found = tw_fx_sql_str(e->fx, "SELECT 1 FROM state.turns WHERE turn_id::text = $1", 1, out);
    ck_assert_msg(found != NULL, "submit printed '%s', not a turn id", out);
    free(found);
    free(err);
    return out;
}

/* The turn's final status from its one final event. */
static char *final_status(Env *e, const char *turn)
{
    if (!tw_fx_events_wait(e->ev, "evt.agent.*.task", turn, 1, WAIT_MS)) {
        tw_fx_events_dump(e->ev);
        dump_logs(e);
        ck_abort_msg("turn %s never ended", turn);
    }
    json_t *ev = tw_fx_events_get(e->ev, "evt.agent.*.task", turn, 0, NULL, NULL);
    char *status = strdup(json_string_value(json_object_get(ev, "status")));
    json_decref(ev);
    return status;
}

static void expect_final(Env *e, const char *turn, const char *status)
{
    char *got = final_status(e, turn);
    if (strcmp(got, status) != 0)
        dump_logs(e);
    ck_assert_msg(strcmp(got, status) == 0, "turn %s ended %s, want %s", turn, got, status);
    free(got);
}

/* GET /metrics, parsed (the test fails when it does not answer 200 with valid exposition). */
static json_t *scrape(int port)
{
    char *body = NULL, *err = NULL;
    int code = tw_fx_http_get(port, "/metrics", &body);
    ck_assert_msg(code == 200, "GET :%d/metrics answered %d", port, code);
    json_t *s = tw_fx_prom_parse(body, &err);
    ck_assert_msg(s != NULL, ":%d/metrics is not valid exposition: %s", port, err);
    free(body);
    return s;
}

/* Sum of every sample of a family (name followed by '{' or ' ' in the key). */
static double family_sum(json_t *samples, const char *name)
{
    const char *k;
    json_t *v;
    double sum = 0;
    size_t n = strlen(name);
    json_object_foreach(samples, k, v) if (strncmp(k, name, n) == 0 && (k[n] == '{' || !k[n])) sum +=
        json_real_value(v);
    return sum;
}

typedef struct Health {
    int port;
    int want;
    const char *body_has;
} Health;

static bool health_is(void *arg)
{
    Health *h = arg;
    char *body = NULL;
    int code = tw_fx_http_get(h->port, "/healthz", &body);
    bool ok = code == h->want && (!h->body_has || (body && strstr(body, h->body_has)));
    free(body);
    return ok;
}

static void wait_health(Env *e, int port, int want, const char *body_has)
{
    Health h = {port, want, body_has};
    if (!tw_fx_wait_until(health_is, &h, WAIT_MS)) {
        char *body = NULL;
        int code = tw_fx_http_get(port, "/healthz", &body);
        dump_logs(e);
        ck_abort_msg(":%d/healthz is %d '%s', want %d with '%s'", port, code, body ? body : "", want,
                     body_has ? body_has : "");
    }
}

/* Both daemons' /healthz: the worker's, then the PMO's. */
static void wait_health_both(Env *e, int want, const char *body_has)
{
    wait_health(e, e->worker_port, want, body_has);
    wait_health(e, e->pmo_port, want, body_has);
}

typedef struct LogWait {
    TwFxProc *p;
    const char *needle;
    int n;
} LogWait;

static int log_count(TwFxProc *p, const char *needle)
{
    char *log = tw_fx_proc_log(p);
    int n = 0;
    for (const char *s = log; (s = strstr(s, needle)); s++)
        n++;
    free(log);
    return n;
}

static bool log_has_n(void *arg)
{
    LogWait *w = arg;
    return log_count(w->p, w->needle) >= w->n;
}

static void wait_log(Env *e, TwFxProc *p, const char *needle, int n)
{
    LogWait w = {p, needle, n};
    if (!tw_fx_wait_until(log_has_n, &w, WAIT_MS)) {
        dump_logs(e);
        ck_abort_msg("%s: '%s' did not appear %d time(s)", tw_fx_proc_log_path(p), needle, n);
    }
}

/* ---- systemd notify socket
 * ------------------------------------------------------------------------------------ */

typedef struct Notify {
    int fd;
    char path[108];
    char **msgs;
    size_t n;
} Notify;

static Notify *notify_bind(Env *e, const char *name)
{
    Notify *ns = calloc(1, sizeof *ns);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    ck_assert_ptr_nonnull(ns);
    snprintf(ns->path, sizeof ns->path, "%s/%s", tw_fx_dir(e->fx), name);
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", ns->path);
    ns->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ck_assert_int_ge(ns->fd, 0);
    ck_assert_msg(bind(ns->fd, (struct sockaddr *)&sa, sizeof sa) == 0, "bind %s: %s", ns->path,
                  strerror(errno));
    return ns;
}

static void notify_read(Notify *ns)
{
    char buf[4096];
    ssize_t n;
    while ((n = recv(ns->fd, buf, sizeof buf - 1, 0)) > 0) {
        buf[n] = '\0';
        ns->msgs = realloc(ns->msgs, (ns->n + 1) * sizeof *ns->msgs);
        ns->msgs[ns->n++] = strdup(buf);
    }
}

/* Messages that have every line of want (a "\n"-separated list of exact lines). */
static size_t notify_count(Notify *ns, const char *want)
{
    size_t hits = 0;
    notify_read(ns);
    for (size_t i = 0; i < ns->n; i++) {
        char *copy = strdup(want), *save = NULL;
        bool all = true;
        for (char *line = strtok_r(copy, "\n", &save); line && all; line = strtok_r(NULL, "\n", &save)) {
            /* A line of the message equal to line, or starting with it when it ends in '*'. */
            size_t len = strlen(line);
            bool prefix = len && line[len - 1] == '*';
            bool found = false;
            for (const char *m = ns->msgs[i]; m && *m && !found;) {
                const char *end = strchr(m, '\n');
                size_t ml = end ? (size_t)(end - m) : strlen(m);
                found = prefix ? ml >= len - 1 && strncmp(m, line, len - 1) == 0
                               : ml == len && strncmp(m, line, len) == 0;
                m = end ? end + 1 : NULL;
            }
            all = found;
        }
        free(copy);
        hits += all;
    }
    return hits;
}

static void notify_dump(Notify *ns)
{
    fprintf(stderr, "---- datagrams on %s ----\n", ns->path);
    for (size_t i = 0; i < ns->n; i++)
        fprintf(stderr, "[%zu] %s\n", i, ns->msgs[i]);
}

static void wait_notify(Env *e, Notify *ns, const char *want, size_t n)
{
    int64_t deadline = tw_fx_now_ms() + WAIT_MS;
    while (notify_count(ns, want) < n)
        if (!tw_fx_poll(deadline)) {
            notify_dump(ns);
            dump_logs(e);
            ck_abort_msg("%s: %zu message(s) with '%s' did not arrive", ns->path, n, want);
        }
}

static void notify_free(Notify *ns)
{
    close(ns->fd);
    for (size_t i = 0; i < ns->n; i++)
        free(ns->msgs[i]);
    free(ns->msgs);
    free(ns);
}

/* ---- tests
 * ------------------------------------------------------------------------------------------------------ */

/* Turns of every kind, then both endpoints: figures for what ran, by whom, with bounded labels. The worker
 * serves neither fanout nor racer, so a racer turn is dispatched, nobody takes it and the PMO's rule 2.5 ends
 * it: a PMO action with its lateness. */
START_TEST(test_metrics_after_turns)
{
    Env e = env_up("[worker]\nagents = echo,failer,tester,sleep\n");
    wait_health_both(&e, 200, "ok: postgres up, nats up");

    json_t *w0 = scrape(e.worker_port), *p0 = scrape(e.pmo_port);
    ck_assert(tw_fx_prom_value(w0, "turnwatch_postgres_up") == 1 &&
              tw_fx_prom_value(w0, "turnwatch_nats_up") == 1);
    ck_assert(tw_fx_prom_value(p0, "turnwatch_postgres_up") == 1 &&
              tw_fx_prom_value(p0, "turnwatch_nats_up") == 1);
    ck_assert(tw_fx_prom_value(w0, "turnwatch_build_info{version=\"0.1.0\",daemon=\"turnwatch-worker\"}") ==
              1);
    ck_assert(tw_fx_prom_value(p0, "turnwatch_build_info{version=\"0.1.0\",daemon=\"turnwatch-pmo\"}") == 1);
    ck_assert(family_sum(w0, "turnwatch_turns_ended_total") == 0);
    ck_assert(isnan(tw_fx_prom_value(w0, "turnwatch_step_duration_seconds_count{agent=\"echo\"}")));
    /* Every rule of each daemon is there from the start, lateness histogram included. */
    ck_assert(tw_fx_prom_value(w0, "turnwatch_watchdog_actions_total{rule=\"2.1 reclaim_inbox\"}") == 0);
    ck_assert(tw_fx_prom_value(
                  w0, "turnwatch_deadline_lateness_seconds_bucket{rule=\"2.2 tool_timeouts\",le=\"+Inf\"}") ==
              0);
    ck_assert(
        tw_fx_prom_value(p0, "turnwatch_deadline_lateness_seconds_count{rule=\"2.5 reap_dispatched\"}") == 0);
    ck_assert(tw_fx_prom_value(
                  p0, "turnwatch_watchdog_actions_total{rule=\"liveness reclaim_gone_daemons\"}") == 0);
    json_decref(w0);
    json_decref(p0);

    char *echo1 = submit(&e, "echo", "{\"n\":1}");
    char *echo2 = submit(&e, "echo", "{\"n\":2}");
    char *failed = submit(&e, "failer", "{}");
    char *tools =
        submit(&e, "tester", "{\"mode\":\"tools\",\"calls\":[{\"id\":\"a\",\"tool\":\"echo\",\"args\":{}}]}");
    char *unserved = submit(&e, "racer", "{}");
    expect_final(&e, echo1, "done");
    expect_final(&e, echo2, "done");
    expect_final(&e, failed, "failed");
    expect_final(&e, tools, "done");
    expect_final(&e, unserved, "timeout");

    json_t *w = scrape(e.worker_port), *p = scrape(e.pmo_port);
    ck_assert(tw_fx_prom_value(w, "turnwatch_turns_ended_total{agent=\"echo\",status=\"done\",error=\"\"}") ==
              2);
    ck_assert(
        tw_fx_prom_value(
            w, "turnwatch_turns_ended_total{agent=\"failer\",status=\"failed\",error=\"agent_failed\"}") ==
        1);
    ck_assert(
        tw_fx_prom_value(w, "turnwatch_turns_ended_total{agent=\"tester\",status=\"done\",error=\"\"}") == 1);
    ck_assert(
        tw_fx_prom_value(
            p,
            "turnwatch_turns_ended_total{agent=\"racer\",status=\"timeout\",error=\"dispatch_timeout\"}") ==
        1);
    /* Each ended turn once, by the daemon whose transaction ended it. */
    double ended =
        family_sum(w, "turnwatch_turns_ended_total") + family_sum(p, "turnwatch_turns_ended_total");
    if (ended != 5)
        dump_logs(&e);
    ck_assert_msg(ended == 5, "%g turns counted over both daemons, 5 ended", ended);
    /* Steps: two for echo, one for failer, two for tester (the call, then the resumed step). */
    ck_assert(tw_fx_prom_value(w, "turnwatch_step_duration_seconds_count{agent=\"echo\"}") == 2);
    ck_assert(tw_fx_prom_value(w, "turnwatch_step_duration_seconds_count{agent=\"failer\"}") == 1);
    ck_assert(tw_fx_prom_value(w, "turnwatch_step_duration_seconds_count{agent=\"tester\"}") == 2);
    ck_assert(tw_fx_prom_value(w, "turnwatch_step_duration_seconds_bucket{agent=\"echo\",le=\"+Inf\"}") == 2);
    ck_assert(tw_fx_prom_value(w, "turnwatch_step_duration_seconds_sum{agent=\"echo\"}") > 0);
    ck_assert(
        tw_fx_prom_value(w, "turnwatch_tool_call_duration_seconds_count{tool=\"echo\",status=\"ok\"}") == 1);
    /* The PMO runs no programs. */
    ck_assert(family_sum(p, "turnwatch_step_duration_seconds_count") == 0);
    /* Rule 2.5 acted on the racer turn, late by what its histogram says, all of it under +Inf. */
    ck_assert(tw_fx_prom_value(p, "turnwatch_watchdog_actions_total{rule=\"2.5 reap_dispatched\"}") >= 1);
    double late_n =
        tw_fx_prom_value(p, "turnwatch_deadline_lateness_seconds_count{rule=\"2.5 reap_dispatched\"}");
    ck_assert_msg(late_n >= 1, "2.5 lateness count %g", late_n);
    ck_assert(
        tw_fx_prom_value(
            p, "turnwatch_deadline_lateness_seconds_bucket{rule=\"2.5 reap_dispatched\",le=\"+Inf\"}") ==
        late_n);
    ck_assert(tw_fx_prom_value(
                  p, "turnwatch_deadline_lateness_seconds_bucket{rule=\"2.5 reap_dispatched\",le=\"10\"}") <=
              late_n);
    /* Nothing per turn in any label: no turn id appears in either exposition. */
    const char *ids[] = {echo1, echo2, failed, tools, unserved};
    json_t *both[] = {w, p};
    for (size_t b = 0; b < 2; b++) {
        const char *k;
        json_t *v;
        json_object_foreach(both[b], k, v) for (size_t i = 0; i < 5; i++)
            ck_assert_msg(!strstr(k, ids[i]), "%s names a turn", k);
    }
    json_decref(w);
    json_decref(p);

    /* Anything but /metrics and /healthz is not there. */
    char *body = NULL;
    ck_assert_int_eq(tw_fx_http_get(e.worker_port, "/", &body), 404);
    free(body);
    for (size_t i = 0; i < 5; i++)
        free((char *)ids[i]);
    env_stop(&e);
}
END_TEST

/* /healthz follows the connections: 503 naming NATS while it is stopped and 200 once it is back, the same
 * for PostgreSQL; /metrics keeps answering meanwhile with the _up gauges at 0. */
START_TEST(test_healthz_follows_connections)
{
    Env e = env_up(NULL);
    wait_health_both(&e, 200, "ok: postgres up, nats up");

    tw_fx_nats_stop(e.fx);
    wait_health_both(&e, 503, "unavailable: postgres up, nats down");
    json_t *s = scrape(e.worker_port);
    ck_assert(tw_fx_prom_value(s, "turnwatch_nats_up") == 0 &&
              tw_fx_prom_value(s, "turnwatch_postgres_up") == 1);
    json_decref(s);
    tw_fx_nats_start(e.fx);
    wait_health_both(&e, 200, "ok: postgres up, nats up");
    s = scrape(e.pmo_port);
    ck_assert(tw_fx_prom_value(s, "turnwatch_nats_up") == 1);
    json_decref(s);

    tw_fx_pg_stop(e.fx);
    wait_health_both(&e, 503, "postgres down, nats up");
    s = scrape(e.pmo_port);
    ck_assert(tw_fx_prom_value(s, "turnwatch_postgres_up") == 0 &&
              tw_fx_prom_value(s, "turnwatch_nats_up") == 1);
    json_decref(s);
    tw_fx_pg_start(e.fx);
    wait_health_both(&e, 200, "ok");

    /* And the daemons work again: a turn runs. */
    char *turn = submit(&e, "echo", "{}");
    expect_final(&e, turn, "done");
    free(turn);
    env_stop(&e);
}
END_TEST

/* The notify protocol with a socket the test binds: READY=1 once connected, WATCHDOG=1 every half
 * WATCHDOG_USEC, STATUS when NATS goes and comes back, RELOADING=1 then READY=1 around SIGHUP, STOPPING=1 on
 * SIGTERM; the programs the worker runs do not get the notify socket. */
START_TEST(test_systemd_notify)
{
    /* The agent fails when it sees systemd's variables. */
    Env e = env_new("[agent.envcheck]\n"
                    "exec = /bin/sh -c 'if [ -n \"$NOTIFY_SOCKET$WATCHDOG_USEC$WATCHDOG_PID\" ]; then echo "
                    "\"{\\\"fail\\\":{\\\"error\\\":\\\"notify socket leaked\\\"}}\"; else echo "
                    "\"{\\\"complete\\\":{\\\"output\\\":{}}}\"; fi'\n");
    Notify *wn = notify_bind(&e, "worker.notify"), *pn = notify_bind(&e, "pmo.notify");
    /* 400 ms: a keep-alive every 200 ms. The fixture's processes inherit the environment at spawn. */
    setenv("WATCHDOG_USEC", "400000", 1);
    setenv("NOTIFY_SOCKET", wn->path, 1);
    start_worker(&e);
    setenv("NOTIFY_SOCKET", pn->path, 1);
    unsetenv("WATCHDOG_USEC");
    start_pmo(&e);
    unsetenv("NOTIFY_SOCKET");

    wait_notify(&e, wn, "READY=1\nSTATUS=running: postgres up, nats up", 1);
    wait_notify(&e, pn, "READY=1\nSTATUS=running: postgres up, nats up", 1);
    ck_assert_uint_eq(notify_count(wn, "STATUS=starting*"), 1);
    /* READY exactly once so far, and only the worker was given a watchdog. */
    ck_assert_uint_eq(notify_count(wn, "READY=1"), 1);
    wait_notify(&e, wn, "WATCHDOG=1", 5);
    ck_assert_uint_eq(notify_count(pn, "WATCHDOG=1"), 0);

    char *turn = submit(&e, "envcheck", "{}");
    expect_final(&e, turn, "done");
    free(turn);

    tw_fx_nats_stop(e.fx);
    wait_notify(&e, wn, "STATUS=waiting: postgres up, nats down (reconnecting)", 1);
    wait_notify(&e, pn, "STATUS=waiting: postgres up, nats down (reconnecting)", 1);
    tw_fx_nats_start(e.fx);
    wait_notify(&e, wn, "STATUS=running: postgres up, nats up", 2);
    wait_notify(&e, pn, "STATUS=running: postgres up, nats up", 2);
    /* The keep-alives went on meanwhile (the loop was never stuck) and READY was not said again. */
    size_t beats = notify_count(wn, "WATCHDOG=1");
    wait_notify(&e, wn, "WATCHDOG=1", beats + 3);
    ck_assert_uint_eq(notify_count(wn, "READY=1"), 1);

    ck_assert(tw_fx_proc_signal(e.worker, SIGHUP));
    wait_notify(&e, wn, "RELOADING=1\nMONOTONIC_USEC=*", 1);
    wait_notify(&e, wn, "READY=1\nSTATUS=running: postgres up, nats up (configuration reloaded)", 1);

    ck_assert(tw_fx_proc_signal(e.pmo, SIGTERM));
    wait_notify(&e, pn, "STOPPING=1\nSTATUS=stopping*", 1);
    wait_exit0(&e, e.pmo);
    ck_assert(tw_fx_proc_signal(e.worker, SIGTERM));
    wait_notify(&e, wn, "STOPPING=1\nSTATUS=stopping: finishing *", 1);
    wait_exit0(&e, e.worker);
    notify_free(wn);
    notify_free(pn);
    tw_fx_free(e.fx);
}
END_TEST

/* A valid file: failer (not served before) runs, tester (served, its section removed) is no longer claimed
 * while its step that was running finishes under the configuration it started with, the log level goes to
 * debug, metrics move to another port, and the reload gauge says so. */
START_TEST(test_reload_valid)
{
    /* The held step must outlive the reload however slow the machine: a long step limit. */
    Env e = env_up("[worker]\nagents = tester,echo\n[agent.tester]\nstep_timeout_seconds = 120\n");
    wait_health(&e, e.worker_port, 200, "ok");
    char gate[512];
    snprintf(gate, sizeof gate, "%s/gate", tw_fx_dir(e.fx));
    char *input = NULL;
    ck_assert_int_gt(asprintf(&input, "{\"mode\":\"sleep\",\"seconds\":60,\"gate\":\"%s\"}", gate), 0);
    char *held = submit(&e, "tester", input);
    free(input);
    ck_assert_msg(tw_fx_sql_wait(e.fx, WAIT_MS, "running",
                                 "SELECT status FROM state.turns WHERE turn_id = $1", 1, held),
                  "the tester turn did not start");
    char *early = submit(&e, "failer", "{}");
    ck_assert_int_eq(log_count(e.worker, " DEBUG: "), 0);

    /* tester's section goes away entirely (a running step that read it after this would read freed memory,
     * which ASan reports), failer comes in, the level is debug, the metrics move. */
    int new_port = tw_fx_free_port();
    rewrite_config(
        &e, new_port,
        "![agent.tester]\n[worker]\nagents = failer,echo\nconcurrency = 3\n[log]\nlevel = debug\n");
    ck_assert(tw_fx_proc_signal(e.worker, SIGHUP));
    wait_log(&e, e.worker, "reload: configuration from", 1);
    ck_assert_int_eq(log_count(e.worker, "reload refused"), 0);
    ck_assert_int_eq(log_count(e.worker, "reload: [agent.tester] removed"), 1);
    ck_assert_int_eq(log_count(e.worker, "reload: [worker] agents: tester,echo -> failer,echo"), 1);
    ck_assert_int_eq(log_count(e.worker, "reload: [worker] concurrency: 4 -> 3"), 1);
    ck_assert_int_eq(log_count(e.worker, "reload: [log] level: info -> debug"), 1);
    wait_log(&e, e.worker, " DEBUG: ", 1);

    /* The failer turn waited for a worker that serves it: now there is one. */
    expect_final(&e, early, "failed");
    /* The held step was never stopped and finishes under the configuration it started with. */
    FILE *f = fopen(gate, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    expect_final(&e, held, "done");

    /* tester is no longer claimed: its turn, submitted first, stays unclaimed while echo's runs. */
    char *orphan = submit(&e, "tester", "{}");
    char *after = submit(&e, "echo", "{}");
    expect_final(&e, after, "done");
    char needle[128];
    snprintf(needle, sizeof needle, "turn=%s", orphan);
    ck_assert_int_eq(log_count(e.worker, needle), 0);
    char *st = tw_fx_sql_str(e.fx, "SELECT status FROM state.turns WHERE turn_id = $1", 1, orphan);
    ck_assert_msg(strcmp(st, "pending") == 0 || strcmp(st, "dispatched") == 0 || strcmp(st, "timeout") == 0,
                  "the unserved tester turn is %s", st);
    free(st);

    /* The metrics moved with the file; the old port is closed. */
    char *body = NULL;
    ck_assert_int_eq(tw_fx_http_get(e.worker_port, "/healthz", &body), -1);
    free(body);
    json_t *s = scrape(new_port);
    ck_assert(tw_fx_prom_value(s, "turnwatch_config_last_reload_successful") == 1);
    ck_assert(
        tw_fx_prom_value(
            s, "turnwatch_turns_ended_total{agent=\"failer\",status=\"failed\",error=\"agent_failed\"}") ==
        1);
    /* The step that ran across the reload counts under the name it started with. */
    ck_assert(tw_fx_prom_value(s, "turnwatch_step_duration_seconds_count{agent=\"tester\"}") == 1);
    json_decref(s);

    /* The PMO takes the same file. */
    ck_assert(tw_fx_proc_signal(e.pmo, SIGHUP));
    wait_log(&e, e.pmo, "reload: configuration from", 1);
    ck_assert_int_eq(log_count(e.pmo, "reload: [log] level: info -> debug"), 1);

    free(held);
    free(early);
    free(orphan);
    free(after);
    env_stop(&e);
}
END_TEST

/* Invalid files: every error is logged and the running configuration stays in force (work goes on, the
 * reload gauge says 0); a program that does not exist is an error for the worker only. */
START_TEST(test_reload_invalid)
{
    Env e = env_up(NULL);
    wait_health_both(&e, 200, "ok");

    rewrite_config(&e, e.worker_port, "[worker]\nconcurrency = 0\nno_such_key = 1\n");
    const char *path = e.daemons_ini;
    ck_assert(tw_fx_proc_signal(e.worker, SIGHUP));
    ck_assert(tw_fx_proc_signal(e.pmo, SIGHUP));
    TwFxProc *both[] = {e.worker, e.pmo};
    for (size_t i = 0; i < 2; i++) {
        char refused[600];
        snprintf(refused, sizeof refused,
                 "reload refused: %s has 2 errors; the running configuration is kept", path);
        wait_log(&e, both[i], refused, 1);
        ck_assert_int_eq(log_count(both[i], "[worker] concurrency: 0 is out of range (1 to 1024)"), 1);
        ck_assert_int_eq(log_count(both[i], "[worker] no_such_key: unknown key"), 1);
        ck_assert_int_eq(log_count(both[i], "reload: configuration from"), 0);
    }
    char *turn = submit(&e, "echo", "{}");
    expect_final(&e, turn, "done");
    free(turn);
    json_t *s = scrape(e.worker_port);
    ck_assert(tw_fx_prom_value(s, "turnwatch_config_last_reload_successful") == 0);
    json_decref(s);

    /* A missing program: the worker checks the programs it would run (as at start-up), the PMO runs none. */
    rewrite_config(&e, e.worker_port, "[agent.echo]\nexec = /nonexistent/echo-agent\n");
    ck_assert(tw_fx_proc_signal(e.worker, SIGHUP));
    ck_assert(tw_fx_proc_signal(e.pmo, SIGHUP));
    wait_log(&e, e.worker, "[agent.echo] exec: /nonexistent/echo-agent does not exist", 1);
    wait_log(&e, e.worker, "has 1 error; the running configuration is kept", 1);
    wait_log(&e, e.pmo, "reload: configuration from", 1);
    turn = submit(&e, "echo", "{}");
    expect_final(&e, turn, "done");
    free(turn);

    /* Fixed: applied, and the gauge says so. */
    rewrite_config(&e, e.worker_port, NULL);
    ck_assert(tw_fx_proc_signal(e.worker, SIGHUP));
    wait_log(&e, e.worker, "reload: configuration from", 1);
    s = scrape(e.worker_port);
    ck_assert(tw_fx_prom_value(s, "turnwatch_config_last_reload_successful") == 1);
    json_decref(s);
    env_stop(&e);
}
END_TEST

/* The [nats] files at a reload: read with the checks of a start. One whose content changed since the start is
 * said to take effect at the next restart; one that is gone (a start would fail) refuses the reload; a secret
 * file others may read is warned about at the start. */
static void write_token(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(chmod(path, mode), 0);
}

START_TEST(test_reload_nats_files)
{
    Env e = env_new(NULL);
    char *token = NULL, *ovr = NULL, *msg = NULL;
    ck_assert_int_gt(asprintf(&token, "%s/nats.token", tw_fx_dir(e.fx)), 0);
    write_token(token, "t0kenOne\n", 0644);
    ck_assert_int_gt(asprintf(&ovr, "[nats]\ntoken_file = %s\n", token), 0);
    rewrite_config(&e, e.worker_port, ovr);
    env_start(&e);
    wait_health_both(&e, 200, "ok");
    TwFxProc *both[] = {e.worker, e.pmo};
    ck_assert_int_gt(
        asprintf(&msg, "[nats] token_file: %s has mode 0644: group or others may read it", token), 0);
    for (size_t i = 0; i < 2; i++)
        wait_log(&e, both[i], msg, 1);
    free(msg);

    /* Another token, this user's only now: applied, and said to need a restart. */
    write_token(token, "t0kenTwo\n", 0600);
    ck_assert_int_gt(
        asprintf(&msg,
                 "reload: [nats] token_file: %s changed since start; it takes effect at the next "
                 "restart",
                 token),
        0);
    for (size_t i = 0; i < 2; i++) {
        ck_assert(tw_fx_proc_signal(both[i], SIGHUP));
        wait_log(&e, both[i], "reload: configuration from", 1);
        ck_assert_int_eq(log_count(both[i], msg), 1);
        ck_assert_int_eq(log_count(both[i], "t0ken"), 0);
    }
    free(msg);

    /* Gone: the daemon could not start with this file, so the reload is refused and says why. */
    ck_assert_int_eq(unlink(token), 0);
    ck_assert_int_gt(asprintf(&msg, "[nats] token_file: cannot read %s: No such file or directory", token),
                     0);
    for (size_t i = 0; i < 2; i++) {
        ck_assert(tw_fx_proc_signal(both[i], SIGHUP));
        wait_log(&e, both[i], "reload refused:", 1);
        ck_assert_int_eq(log_count(both[i], msg), 1);
        ck_assert_int_eq(log_count(both[i], "reload: configuration from"), 1);
    }
    free(msg);
    char *turn = submit(&e, "echo", "{}");
    expect_final(&e, turn, "done");
    free(turn);
    free(ovr);
    free(token);
    env_stop(&e);
}
END_TEST

/* A port another process listens on, for a metrics_listen that cannot be opened; *fd holds it. */
static int hold_port(int *fd)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;

    *fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(*fd, 0);
    ck_assert_int_eq(bind(*fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(*fd, 1), 0);
    ck_assert_int_eq(getsockname(*fd, (struct sockaddr *)&a, &len), 0);
    return ntohs(a.sin_port);
}

/* A file whose metrics_listen cannot be opened (another process holds the port): each daemon refuses the
 * whole file, so its [log] level is not taken either, goes on serving its endpoint where it was, and the
 * reload gauge says 0; both stop and reload the same way, and the next good file is applied. */
START_TEST(test_reload_refused_listen)
{
    Env e = env_up(NULL);
    wait_health_both(&e, 200, "ok");
    int fd, taken = hold_port(&fd), pmo_port = e.pmo_port;
    TwFxProc *both[] = {e.worker, e.pmo};
    const char *section[] = {"worker", "pmo"};
    int ports[] = {e.worker_port, e.pmo_port};

    e.pmo_port = taken;
    rewrite_config(&e, taken, "[log]\nlevel = debug\n");
    e.pmo_port = pmo_port;
    for (size_t i = 0; i < 2; i++) {
        char refused[160];
        snprintf(
            refused, sizeof refused,
            "reload refused: [%s] metrics_listen 127.0.0.1:%d cannot be opened; the running configuration "
            "is kept",
            section[i], taken);
        ck_assert(tw_fx_proc_signal(both[i], SIGHUP));
        wait_log(&e, both[i], refused, 1);
        ck_assert_int_eq(log_count(both[i], "reload: configuration from"), 0);
        ck_assert_int_eq(log_count(both[i], " DEBUG: "), 0);
        json_t *s = scrape(ports[i]);
        ck_assert(tw_fx_prom_value(s, "turnwatch_config_last_reload_successful") == 0);
        json_decref(s);
    }
    char *turn = submit(&e, "echo", "{}");
    expect_final(&e, turn, "done");
    free(turn);

    rewrite_config(&e, e.worker_port, NULL);
    for (size_t i = 0; i < 2; i++) {
        ck_assert(tw_fx_proc_signal(both[i], SIGHUP));
        wait_log(&e, both[i], "reload: configuration from", 1);
        json_t *s = scrape(ports[i]);
        ck_assert(tw_fx_prom_value(s, "turnwatch_config_last_reload_successful") == 1);
        json_decref(s);
    }
    close(fd);
    env_stop(&e);
}
END_TEST

/* ---- hostile clients of the endpoints
 * -------------------------------------------------------------------------- */

/* What a slow client holds on each endpoint, and the open-file limit the daemons get for it: far fewer
 * descriptors than slow clients, as on the probe's worker (1,015 connections of 1,024 descriptors). */
#define SLOW_CLIENTS 1100
#define DAEMON_FDS 256
#define SLOW_PREFIX "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "

/* Raises this process's own soft open-file limit for the clients it opens; the test fails when the hard limit
 * is too low for them. */
static void need_fds(rlim_t n)
{
    struct rlimit rl;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    ck_assert_msg(rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= n,
                  "this test opens %lu connections; the hard open-file limit is %lu", (unsigned long)n,
                  (unsigned long)rl.rlim_max);
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < n) {
        rl.rlim_cur = n;
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }
}

/* A running daemon's soft open-file limit, set from outside (prlimit(2), as `prlimit --pid` does): what it
 * has open stays open, a new descriptor numbered at or above the limit fails with EMFILE. 0 gives it back its
 * hard limit. Only the soft limit moves, so no privilege is needed to raise it again. */
static void set_fd_limit(TwFxProc *p, rlim_t soft)
{
    struct rlimit rl;
    pid_t pid = tw_fx_proc_pid(p);
    ck_assert_msg(prlimit(pid, RLIMIT_NOFILE, NULL, &rl) == 0, "prlimit %d: %s", (int)pid, strerror(errno));
    rl.rlim_cur = soft ? soft : rl.rlim_max;
    ck_assert_msg(prlimit(pid, RLIMIT_NOFILE, &rl, NULL) == 0, "prlimit %d: %s", (int)pid, strerror(errno));
}

/* The lowest descriptor number a process does not use: with its limit there, it can open nothing more. */
static rlim_t lowest_free_fd(TwFxProc *p)
{
    static bool used[65536];
    char path[64];
    struct dirent *d;
    rlim_t n = 0;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)tw_fx_proc_pid(p));
    DIR *dir = opendir(path);
    ck_assert_msg(dir != NULL, "%s: %s", path, strerror(errno));
    memset(used, 0, sizeof used);
    while ((d = readdir(dir)))
        if (d->d_name[0] != '.' && atoi(d->d_name) < 65536)
            used[atoi(d->d_name)] = true;
    closedir(dir);
    while (n < 65536 && used[n])
        n++;
    return n;
}

/* VmRSS of a process, in kB. */
static long rss_kb(TwFxProc *p)
{
    char path[64], line[256];
    long kb = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)tw_fx_proc_pid(p));
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    ck_assert_int_gt(kb, 0);
    return kb;
}

/* The size of a daemon's log: a flood of warnings is measured without reading it. */
static long log_size(TwFxProc *p)
{
    struct stat st;
    return stat(tw_fx_proc_log_path(p), &st) == 0 ? (long)st.st_size : 0;
}

/* At most `max` bytes of a daemon's log from byte `from` to stderr (a flooded log is not dumped whole). */
static void log_excerpt(TwFxProc *p, long from, long max)
{
    FILE *f = fopen(tw_fx_proc_log_path(p), "r");
    char buf[4096];
    size_t n;
    if (!f)
        return;
    fseek(f, from, SEEK_SET);
    fprintf(stderr, "---- %s from byte %ld (at most %ld bytes) ----\n", tw_fx_proc_log_path(p), from, max);
    while (max > 0 && (n = fread(buf, 1, max < (long)sizeof buf ? (size_t)max : sizeof buf, f)) > 0) {
        fwrite(buf, 1, n, stderr);
        max -= (long)n;
    }
    fputc('\n', stderr);
    fclose(f);
}

/* Lines of a daemon's log from byte `from` that hold needle (the first 64 MiB of them at most). */
static int log_count_from(TwFxProc *p, long from, const char *needle)
{
    FILE *f = fopen(tw_fx_proc_log_path(p), "r");
    char line[1024];
    int n = 0;
    if (!f)
        return 0;
    fseek(f, from, SEEK_SET);
    for (long read = 0; read < 64L << 20 && fgets(line, sizeof line, f); read += (long)strlen(line))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* Both endpoints answer /healthz 200 to a fresh connection, polled for WAIT_MS; on failure the logs are shown
 * from byte from_w / from_p, at most 8 KiB of each. */
static void wait_health_quiet(Env *e, long from_w, long from_p, const char *when)
{
    int ports[2] = {e->worker_port, e->pmo_port};
    TwFxProc *procs[2] = {e->worker, e->pmo};
    long from[2] = {from_w, from_p};
    for (int i = 0; i < 2; i++) {
        Health h = {ports[i], 200, "ok"};
        if (!tw_fx_wait_until(health_is, &h, WAIT_MS)) {
            char *body = NULL;
            int code = tw_fx_http_get(ports[i], "/healthz", &body);
            log_excerpt(procs[0], from[0], 8192);
            log_excerpt(procs[1], from[1], 8192);
            ck_abort_msg("%s: the %s's /healthz is %d '%s', want 200", when, i ? "PMO" : "worker", code,
                         body ? body : "");
        }
    }
}

/* A non-blocking connection to 127.0.0.1:port, its connect under way; -1 when there is no socket. */
static int tcp_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno != EINPROGRESS) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* A slow client: connects, sends the start of a request and then one more header byte every 2 s, never the
 * end, as the probe did (evhttp's idle timeout was reset by every byte). */
typedef struct SlowConn {
    int fd;
    bool started;      /* the request line went out */
    int64_t reopen_ms; /* reconnecting: not before this */
} SlowConn;

typedef struct Slow {
    int ports[2];
    size_t n;       /* connections: SLOW_CLIENTS per port */
    bool reconnect; /* open a new connection 1 s after the daemon ended one */
    atomic_bool stop;
    atomic_long ended; /* connections the daemon closed (refused, or cut at its deadline) */
    atomic_long open;  /* connections open now */
    atomic_bool ready; /* all of them opened, and the first round of polling done */
    pthread_t thread;
    SlowConn conns[2 * SLOW_CLIENTS];
    struct pollfd pfd[2 * SLOW_CLIENTS];
} Slow;

static void slow_open(Slow *s, size_t i)
{
    s->conns[i] = (SlowConn){.fd = tcp_open(s->ports[i % 2])};
    if (s->conns[i].fd >= 0)
        atomic_fetch_add(&s->open, 1);
}

/* One connection the daemon ended (EOF, reset, refused): closed here, and perhaps opened again later. */
static void slow_ended(Slow *s, SlowConn *c)
{
    close(c->fd);
    c->fd = -1;
    c->started = false;
    c->reopen_ms = tw_fx_now_ms() + 1000;
    atomic_fetch_add(&s->ended, 1);
    atomic_fetch_sub(&s->open, 1);
}

static void *slow_run(void *arg)
{
    Slow *s = arg;
    int64_t next_byte = tw_fx_now_ms() + 2000;
    for (size_t i = 0; i < s->n; i++)
        slow_open(s, i);
    while (!atomic_load(&s->stop)) {
        for (size_t i = 0; i < s->n; i++)
            s->pfd[i] = (struct pollfd){.fd = s->conns[i].fd,
                                        .events = (short)(POLLIN | (s->conns[i].started ? 0 : POLLOUT))};
        poll(s->pfd, s->n, 100);
        bool trickle = tw_fx_now_ms() >= next_byte;
        for (size_t i = 0; i < s->n; i++) {
            SlowConn *c = &s->conns[i];
            short ev = s->pfd[i].revents;
            char buf[512];
            if (c->fd < 0) {
                if (s->reconnect && tw_fx_now_ms() >= c->reopen_ms)
                    slow_open(s, i);
                continue;
            }
            bool gone = (ev & (POLLERR | POLLHUP)) != 0;
            if (!gone && (ev & POLLIN)) {
                ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
                gone = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
            }
            if (!gone && !c->started && (ev & POLLOUT)) {
                ssize_t n = send(c->fd, SLOW_PREFIX, strlen(SLOW_PREFIX), MSG_NOSIGNAL | MSG_DONTWAIT);
                c->started = n == (ssize_t)strlen(SLOW_PREFIX);
                gone = n < 0 && errno != EAGAIN;
            } else if (!gone && c->started && trickle) {
                gone = send(c->fd, "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN;
            }
            if (gone)
                slow_ended(s, c);
        }
        if (trickle)
            next_byte = tw_fx_now_ms() + 2000;
        atomic_store(&s->ready, true);
    }
    for (size_t i = 0; i < s->n; i++)
        if (s->conns[i].fd >= 0)
            close(s->conns[i].fd);
    return NULL;
}

/* SLOW_CLIENTS slow clients on each of the two ports, from a thread of their own. */
static Slow *slow_start(int port_a, int port_b, bool reconnect)
{
    Slow *s = calloc(1, sizeof *s);
    ck_assert_ptr_nonnull(s);
    s->ports[0] = port_a;
    s->ports[1] = port_b;
    s->n = 2 * SLOW_CLIENTS;
    s->reconnect = reconnect;
    ck_assert_int_eq(pthread_create(&s->thread, NULL, slow_run, s), 0);
    return s;
}

/* Until the clients are all there, and then two seconds more: the daemons have taken what they take. */
static void slow_wait_ready(Slow *s)
{
    int64_t deadline = tw_fx_now_ms() + WAIT_MS;
    while (!atomic_load(&s->ready))
        if (!tw_fx_poll(deadline))
            ck_abort_msg("the slow clients did not get going");
    tw_fx_sleep_ms(2000);
}

static void slow_stop(Slow *s)
{
    atomic_store(&s->stop, true);
    pthread_join(s->thread, NULL);
    free(s);
}

/* One request on a fresh connection, the whole reply (until the daemon closes) in a static buffer. */
static const char *raw_request(int port, const char *request)
{
    static char reply[65536];
    size_t got = 0;
    int fd = tcp_open(port);
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(poll(&p, 1, WAIT_MS), 1);
    ck_assert_int_eq(send(fd, request, strlen(request), MSG_NOSIGNAL), (ssize_t)strlen(request));
    p.events = POLLIN;
    while (got < sizeof reply - 1 && poll(&p, 1, WAIT_MS) > 0) {
        ssize_t n = recv(fd, reply + got, sizeof reply - 1 - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    reply[got] = '\0';
    return reply;
}

static void expect_reply(int port, const char *request, const char *status, const char *has,
                         const char *lacks)
{
    const char *r = raw_request(port, request);
    ck_assert_msg(strncmp(r, status, strlen(status)) == 0 && (!has || strstr(r, has)) &&
                      (!lacks || !strstr(r, lacks)),
                  "'%s' got '%.400s', want '%s' with '%s' and without '%s'", request, r, status,
                  has ? has : "", lacks ? lacks : "");
}

/* What the endpoint answers, request by request: GET and HEAD of its two paths (a query string is ignored,
 * bare LF line ends and empty lines before the request are accepted), 405 for other methods, 404 for other
 * paths, 400 for what is not HTTP/1.x; every reply closes the connection. */
START_TEST(test_endpoint_requests)
{
    Env e = env_up(NULL);
    wait_health_both(&e, 200, "ok: postgres up, nats up");
    int port = e.worker_port;
    expect_reply(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 200 OK\r\n",
                 "Connection: close\r\n", NULL);
    expect_reply(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 200 OK\r\n",
                 "\r\n\r\nok: postgres up, nats up\n", NULL);
    expect_reply(port, "HEAD /healthz HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\n", "Content-Length: 25\r\n",
                 "ok: postgres");
    expect_reply(port, "\r\nGET /metrics?x=1 HTTP/1.0\n\n", "HTTP/1.1 200 OK\r\n",
                 "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n", NULL);
    expect_reply(port, "GET /metrics HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\n", "turnwatch_build_info{", NULL);
    expect_reply(port, "POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", "HTTP/1.1 405 ",
                 "Allow: GET, HEAD\r\n", NULL);
    expect_reply(port, "GET /metricsx HTTP/1.1\r\n\r\n", "HTTP/1.1 404 ", NULL, NULL);
    expect_reply(port, "GET http://x/metrics HTTP/1.1\r\n\r\n", "HTTP/1.1 400 ", NULL, NULL);
    expect_reply(port, "GET /metrics HTTP/2.0\r\n\r\n", "HTTP/1.1 400 ", NULL, NULL);
    expect_reply(port, "GET /metrics\r\n\r\n", "HTTP/1.1 400 ", NULL, NULL);
    expect_reply(port, "GET  /metrics HTTP/1.1\r\n\r\n", "HTTP/1.1 400 ", NULL, NULL);
    env_stop(&e);
}
END_TEST

/* 1,100 slow clients on each endpoint of daemons that have 256 descriptors: the daemons refuse what is over
 * their connection limit and cut the rest at the request deadline, so /healthz answers a fresh connection
 * while the slow clients still trickle, every slow connection is ended by the daemon, turns run (the worker
 * still has descriptors for its programs) while the clients reconnect as fast as they are cut, and the logs
 * are not flooded (libevent's accept warnings once wrote 1 GB in 50 s). */
START_TEST(test_endpoint_slow_clients)
{
    Env e = env_up(NULL);
    wait_health_both(&e, 200, "ok: postgres up, nats up");
    need_fds(2 * SLOW_CLIENTS + 256);
    set_fd_limit(e.worker, DAEMON_FDS);
    set_fd_limit(e.pmo, DAEMON_FDS);
    long from_w = log_size(e.worker), from_p = log_size(e.pmo);

    Slow *s = slow_start(e.worker_port, e.pmo_port, false);
    slow_wait_ready(s);
    wait_health_quiet(&e, from_w, from_p, "with 1,100 slow clients on each endpoint");
    /* Each of them ended by the daemons (refused, or cut at the deadline), none kept. */
    int64_t deadline = tw_fx_now_ms() + 60000;
    while (atomic_load(&s->ended) < 2 * SLOW_CLIENTS)
        if (!tw_fx_poll(deadline)) {
            log_excerpt(e.worker, from_w, 8192);
            ck_abort_msg("%ld of %d slow connections still open after 60 s", atomic_load(&s->open),
                         2 * SLOW_CLIENTS);
        }
    slow_stop(s);

    /* Clients that come back as soon as they are cut: programs still start. */
    s = slow_start(e.worker_port, e.pmo_port, true);
    deadline = tw_fx_now_ms() + WAIT_MS;
    while (atomic_load(&s->ended) < SLOW_CLIENTS)
        if (!tw_fx_poll(deadline))
            ck_abort_msg("the daemons ended only %ld slow connections", atomic_load(&s->ended));
    char *turns[3];
    for (int i = 0; i < 3; i++)
        turns[i] = submit(&e, "echo", "{}");
    for (int i = 0; i < 3; i++) {
        char *got = final_status(&e, turns[i]);
        if (strcmp(got, "done") != 0) {
            char *msg =
                tw_fx_sql_str(e.fx, "SELECT error_message FROM state.turns WHERE turn_id = $1", 1, turns[i]);
            log_excerpt(e.worker, from_w, 8192);
            ck_abort_msg("under slow clients, turn %s ended %s: %s", turns[i], got, msg ? msg : "");
        }
        free(got);
        free(turns[i]);
    }
    slow_stop(s);
    wait_health_quiet(&e, from_w, from_p, "after the slow clients");

    /* A few lines about refused connections, no warning per accept. */
    TwFxProc *both[] = {e.worker, e.pmo};
    long from[] = {from_w, from_p};
    for (int i = 0; i < 2; i++) {
        long grew = log_size(both[i]) - from[i];
        int accepts = log_count_from(both[i], from[i], "Error from accept");
        int refusals = log_count_from(both[i], from[i], "metrics:");
        if (grew > 64 * 1024 || accepts > 0 || refusals > 10)
            log_excerpt(both[i], from[i], 8192);
        ck_assert_msg(grew <= 64 * 1024, "%s grew by %ld bytes under slow clients",
                      tw_fx_proc_log_path(both[i]), grew);
        ck_assert_msg(accepts == 0, "%s: %d accept warnings", tw_fx_proc_log_path(both[i]), accepts);
        ck_assert_msg(refusals <= 10, "%s: %d metrics lines", tw_fx_proc_log_path(both[i]), refusals);
    }
    env_stop(&e);
}
END_TEST

/* A request whose headers trickle in (a byte every 250 ms, never the end) is cut at the request deadline, 5 s
 * from accept, on both endpoints: not earlier, and not never (an idle timeout, reset by every byte, never
 * fired). What the daemon says, if anything, is 408. */
START_TEST(test_endpoint_request_deadline)
{
    Env e = env_up(NULL);
    wait_health_both(&e, 200, "ok: postgres up, nats up");
    int ports[2] = {e.worker_port, e.pmo_port};
    int fds[2];
    int64_t start = tw_fx_now_ms(), cut_ms[2] = {0, 0};
    char reply[2][256] = {"", ""};
    size_t got[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        fds[i] = tcp_open(ports[i]);
        ck_assert_int_ge(fds[i], 0);
    }
    int64_t next_byte = start;
    size_t sent = 0;
    const char *req = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Trickle: ";
    while ((!cut_ms[0] || !cut_ms[1]) && tw_fx_now_ms() - start < 30000) {
        bool tick = tw_fx_now_ms() >= next_byte;
        for (int i = 0; i < 2; i++) {
            if (cut_ms[i])
                continue;
            struct pollfd p = {.fd = fds[i], .events = POLLIN};
            if (poll(&p, 1, 0) > 0) {
                ssize_t n = recv(fds[i], reply[i] + got[i], sizeof reply[i] - 1 - got[i], MSG_DONTWAIT);
                if (n > 0)
                    got[i] += (size_t)n;
                else if (n == 0 || (errno != EAGAIN && errno != EINTR))
                    cut_ms[i] = tw_fx_now_ms() - start;
            }
            if (!cut_ms[i] && tick)
                (void)send(fds[i], sent < strlen(req) ? req + sent : "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        if (tick) {
            sent++;
            next_byte += 250;
        }
        tw_fx_sleep_ms(10);
    }
    for (int i = 0; i < 2; i++) {
        close(fds[i]);
        ck_assert_msg(cut_ms[i] > 0, "the %s kept a trickling request open for 30 s (it sent '%s')",
                      i ? "PMO" : "worker", reply[i]);
        ck_assert_msg(cut_ms[i] >= 4500, "the %s cut a trickling request after %lld ms, before its deadline",
                      i ? "PMO" : "worker", (long long)cut_ms[i]);
        ck_assert_msg(got[i] == 0 || strncmp(reply[i], "HTTP/1.1 408 ", 13) == 0,
                      "the %s answered a trickling request with '%s'", i ? "PMO" : "worker", reply[i]);
    }
    /* And a request that comes whole is answered as before. */
    wait_health_both(&e, 200, "ok");
    env_stop(&e);
}
END_TEST

/* A request whose one header line would be 1 MiB, sent 16 KiB at a time while what the daemon says is read:
 * big_header_step does one step of either, until the daemon has closed the connection. */
typedef struct BigHeader {
    int fd;
    size_t sent;
    char reply[1024];
    size_t got;
    bool closed;
} BigHeader;

static void big_header_step(BigHeader *b)
{
    static char chunk[16384];
    struct pollfd p = {.fd = b->fd, .events = POLLIN | (b->sent < (1u << 20) ? POLLOUT : 0)};
    if (b->closed || poll(&p, 1, 0) <= 0)
        return;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t n = recv(b->fd, b->reply + b->got, sizeof b->reply - 1 - b->got, MSG_DONTWAIT);
        if (n > 0)
            b->got += (size_t)n;
        else if (n == 0 || (errno != EAGAIN && errno != EINTR))
            b->closed = true;
        return;
    }
    if (p.revents & POLLOUT) {
        if (!chunk[0])
            memset(chunk, 'a', sizeof chunk);
        const char *head = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ";
        ssize_t n = b->sent == 0 ? send(b->fd, head, strlen(head), MSG_NOSIGNAL | MSG_DONTWAIT)
                                 : send(b->fd, chunk, sizeof chunk, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0)
            b->sent += (size_t)n;
    }
}

/* 16 requests at once, each with a header line of 1 MiB, to the worker: each is refused with 431 once past
 * the 8 KiB limit and the worker's memory does not grow with them (it went from 15 to 95 MB for one 80 MB
 * line, and kept it). The PMO refuses one as well. */
START_TEST(test_endpoint_header_limit)
{
    Env e = env_up(NULL);
    wait_health_both(&e, 200, "ok: postgres up, nats up");
    BigHeader b[17];
    long before = rss_kb(e.worker);
    for (int i = 0; i < 17; i++) {
        b[i] = (BigHeader){.fd = tcp_open(i < 16 ? e.worker_port : e.pmo_port)};
        ck_assert_int_ge(b[i].fd, 0);
    }
    int64_t start = tw_fx_now_ms();
    for (bool all = false; !all && tw_fx_now_ms() - start < 30000;) {
        all = true;
        for (int i = 0; i < 17; i++) {
            big_header_step(&b[i]);
            all = all && b[i].closed;
        }
        tw_fx_sleep_ms(1);
    }
    long after = rss_kb(e.worker);
    for (int i = 0; i < 17; i++) {
        close(b[i].fd);
        b[i].reply[b[i].got] = '\0';
        ck_assert_msg(b[i].closed, "request %d (%zu bytes sent) still open after 30 s; it got '%s'", i,
                      b[i].sent, b[i].reply);
        ck_assert_msg(strncmp(b[i].reply, "HTTP/1.1 431 ", 13) == 0,
                      "request %d with a 1 MiB header line got '%s' (%zu bytes sent)", i, b[i].reply,
                      b[i].sent);
    }
    ck_assert_msg(after - before < 4096, "the worker grew from %ld kB to %ld kB", before, after);
    wait_health_both(&e, 200, "ok");
    env_stop(&e);
}
END_TEST

/* How many connections to its endpoint on `port` the daemon still holds a descriptor of: its socket
 * descriptors (/proc/PID/fd) whose TCP entry (/proc/PID/net/tcp, tcp6) has that local port and is not the
 * listener. */
static int held_connections(TwFxProc *p, int port)
{
    static unsigned long inodes[4096];
    size_t n = 0;
    int held = 0;
    char path[64], line[512];
    const char *tables[] = {"tcp", "tcp6"};
    for (int t = 0; t < 2; t++) {
        snprintf(path, sizeof path, "/proc/%d/net/%s", (int)tw_fx_proc_pid(p), tables[t]);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        while (fgets(line, sizeof line, f) && n < 4096) {
            char local[64];
            unsigned st;
            unsigned long inode;
            /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
            if (sscanf(line, " %*s %63s %*s %x %*s %*s %*s %*s %*s %lu", local, &st, &inode) != 3)
                continue;
            const char *colon = strrchr(local, ':');
            if (colon && strtol(colon + 1, NULL, 16) == port && st != 0x0A && inode != 0)
                inodes[n++] = inode;
        }
        fclose(f);
    }
    snprintf(path, sizeof path, "/proc/%d/fd", (int)tw_fx_proc_pid(p));
    DIR *dir = opendir(path);
    struct dirent *d;
    while (dir && (d = readdir(dir))) {
        char link[384], target[64];
        snprintf(link, sizeof link, "%s/%s", path, d->d_name);
        ssize_t len = readlink(link, target, sizeof target - 1);
        unsigned long inode;
        if (len <= 0)
            continue;
        target[len] = '\0';
        if (sscanf(target, "socket:[%lu]", &inode) == 1)
            for (size_t k = 0; k < n; k++)
                held += inodes[k] == inode;
    }
    if (dir)
        closedir(dir);
    return held;
}

/* Out of descriptors. The worker with none left: a program cannot be started, and the turn's error says why
 * (the worker is out of file descriptors, not a bad executable); its endpoint stops accepting without a
 * warning per attempt and serves the client that waited once descriptors are back. Then the same for the
 * PMO's endpoint. */
START_TEST(test_endpoint_out_of_descriptors)
{
    Env e = env_up(NULL);
    wait_health_both(&e, 200, "ok: postgres up, nats up");
    TwFxProc *procs[2] = {e.worker, e.pmo};
    int ports[2] = {e.worker_port, e.pmo_port};
    for (int i = 0; i < 2; i++) {
        long from = log_size(procs[i]);
        /* The limit is the lowest descriptor free: one the daemon closes afterwards lets the waiting client
         * in within the quarter kept for the daemon's own work, and it is refused (503, "too many
         * connections") as it should be. The health checks' connections are the ones it closes: wait until it
         * holds none. */
        int64_t quiet = tw_fx_now_ms() + WAIT_MS;
        while (held_connections(procs[i], ports[i]) > 0 && tw_fx_poll(quiet))
            ;
        ck_assert_int_eq(held_connections(procs[i], ports[i]), 0);
        set_fd_limit(procs[i], lowest_free_fd(procs[i]));
        int fd = tcp_open(ports[i]);
        const char *req = "GET /healthz HTTP/1.0\r\n\r\n";
        ck_assert_int_ge(fd, 0);
        int64_t start = tw_fx_now_ms();
        if (i == 0) {
            char *turn = submit(&e, "echo", "{}");
            char *got = final_status(&e, turn);
            char *msg =
                tw_fx_sql_str(e.fx, "SELECT error_message FROM state.turns WHERE turn_id = $1", 1, turn);
            ck_assert_msg(strcmp(got, "failed") == 0, "turn %s ended %s with no descriptors", turn, got);
            ck_assert_msg(msg && strstr(msg, "out of file descriptors (EMFILE)") &&
                              !strstr(msg, "executable"),
                          "turn %s failed with '%s'", turn, msg ? msg : "");
            free(msg);
            free(got);
            free(turn);
        }
        /* Two seconds of a client waiting: the listener pauses instead of spinning on accept. */
        while (tw_fx_now_ms() - start < 2000)
            tw_fx_sleep_ms(50);
        long grew = log_size(procs[i]) - from;
        int lines = log_count_from(procs[i], from, "metrics:");
        if (grew > 16384 || lines > 2)
            log_excerpt(procs[i], from, 8192);
        ck_assert_msg(grew <= 16384, "%s grew by %ld bytes in 2 s without descriptors",
                      tw_fx_proc_log_path(procs[i]), grew);
        ck_assert_msg(lines >= 1 && lines <= 2,
                      "%s: %d metrics lines in 2 s without descriptors, want 1 or 2",
                      tw_fx_proc_log_path(procs[i]), lines);

        /* Descriptors back: the client that waited is served. */
        set_fd_limit(procs[i], 0);
        ck_assert_int_eq(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
        char reply[512] = "";
        size_t got = 0;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        while (got < sizeof reply - 1 && poll(&p, 1, WAIT_MS) > 0) {
            ssize_t n = recv(fd, reply + got, sizeof reply - 1 - got, 0);
            if (n <= 0)
                break;
            got += (size_t)n;
        }
        close(fd);
        if (strncmp(reply, "HTTP/1.1 200 ", 13) != 0)
            log_excerpt(procs[i], from, 16384);
        ck_assert_msg(strncmp(reply, "HTTP/1.1 200 ", 13) == 0, "the client that waited on the %s got '%s'",
                      i == 0 ? "worker" : "PMO", reply);
    }
    char *turn = submit(&e, "echo", "{}");
    expect_final(&e, turn, "done");
    free(turn);
    env_stop(&e);
}
END_TEST

/* The open-file limit at start-up: a daemon raises its soft limit to the hard one (systemd starts services at
 * 1024 unless LimitNOFILE= says more), and the worker warns when even that is below what its configuration
 * may use at once (here 200 slots of concurrency, six descriptors each, in 1,024), and again after a reload
 * to 300. */
START_TEST(test_fd_limit_at_start)
{
    Env e = env_new("[worker]\nconcurrency = 200\n");
    struct rlimit mine, rl;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &mine), 0);
    ck_assert_msg(mine.rlim_max == RLIM_INFINITY || mine.rlim_max > 300, "hard open-file limit %lu",
                  (unsigned long)mine.rlim_max);
    rl = (struct rlimit){300, mine.rlim_max};
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    start_pmo(&e);
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &mine), 0);
    /* The worker under prlimit(1), which sets both limits and then runs it. */
    const char *argv[] = {
        "/usr/bin/prlimit", "--nofile=1024:1024", tw_fx_worker_path(), "-c", e.daemons_ini, NULL};
    e.worker = tw_fx_spawn(e.fx, "worker-prlimit", argv);
    wait_health_both(&e, 200, "ok: postgres up, nats up");

    ck_assert_int_eq(prlimit(tw_fx_proc_pid(e.pmo), RLIMIT_NOFILE, NULL, &rl), 0);
    ck_assert_msg(rl.rlim_cur == rl.rlim_max, "the PMO's soft limit is %lu of %lu",
                  (unsigned long)rl.rlim_cur, (unsigned long)rl.rlim_max);
    ck_assert_int_eq(log_count(e.pmo, "open files: limit raised from 300 to the hard limit"), 1);
    ck_assert_int_eq(log_count(e.pmo, "open files: the limit is"), 0);
    ck_assert_int_eq(log_count(e.worker, "open files: limit raised"), 0);
    ck_assert_int_eq(log_count(e.worker,
                               "open files: the limit is 1024, below the 1329 this configuration may "
                               "use at once (64 for the daemon itself, 65 for metrics_listen, 1200 for "
                               "programs: 6 per slot of concurrency)"),
                     1);
    /* A reload to more slots is checked as well. */
    rewrite_config(&e, e.worker_port, "[worker]\nconcurrency = 300\n");
    ck_assert(tw_fx_proc_signal(e.worker, SIGHUP));
    wait_log(&e, e.worker, "reload: [worker] concurrency: 200 -> 300", 1);
    wait_log(&e, e.worker, "open files: the limit is 1024, below the 1929 this configuration may use", 1);
    env_stop(&e);
}
END_TEST

TW_SUITE_DEFINE(ops, {
                         {"metrics", test_metrics_after_turns, 180},
                         {"metrics", test_healthz_follows_connections, 180},
                         {"systemd", test_systemd_notify, 180},
                         {"reload", test_reload_valid, 180},
                         {"reload", test_reload_invalid, 180},
                         {"reload", test_reload_refused_listen, 180},
                         {"reload", test_reload_nats_files, 180},
                         {"requests", test_endpoint_requests, 120},
                         {"slow_clients", test_endpoint_slow_clients, 240},
                         {"request_deadline", test_endpoint_request_deadline, 120},
                         {"header_limit", test_endpoint_header_limit, 120},
                         {"descriptors", test_endpoint_out_of_descriptors, 180},
                         {"descriptors", test_fd_limit_at_start, 120},
                     })
