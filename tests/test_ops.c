/* test_ops.c — operations (contract section 12) against real servers: /metrics scraped over HTTP and parsed
 * (figures move as turns run, each ended turn counted once over both daemons, the lateness histograms there),
 * /healthz following NATS and PostgreSQL down and back, systemd's notify datagrams (READY, STATUS, WATCHDOG,
 * RELOADING, STOPPING) on a socket the test binds, and SIGHUP reloads with a valid file (an agent added runs,
 * one removed is no longer claimed, a running step keeps its configuration, the log level and the metrics
 * address change) and with invalid ones (every error logged, the old configuration kept). */
#include "fixture.h"
#include "suite.h"

#include <check.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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

TW_SUITE_DEFINE(ops, {
                         {"metrics", test_metrics_after_turns, 180},
                         {"metrics", test_healthz_follows_connections, 180},
                         {"systemd", test_systemd_notify, 180},
                         {"reload", test_reload_valid, 180},
                         {"reload", test_reload_invalid, 180},
                     })
