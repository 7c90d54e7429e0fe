/* test_fixture_smoke.c — proves the integration fixture works: PostgreSQL and nats-server start, serve, stop,
 * crash and come back; processes, CLI capture and configs behave as fixture.h promises. */
#include "fixture.h"
#include "suite.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static bool smoke_dir_exists(const char *dir)
{
    struct stat st;
    return stat(dir, &st) == 0;
}

START_TEST(test_pg_lifecycle)
{
    TwFx *fx = tw_fx_new();
    char *dir = strdup(tw_fx_dir(fx));
    tw_fx_pg_init(fx);
    ck_assert_ptr_nonnull(strstr(tw_fx_pg_dsn(fx), "127.0.0.1"));

    char *db = tw_fx_sql_str(fx, "SELECT current_database()", 0);
    ck_assert_str_eq(db, "turnwatch");
    free(db);
    tw_fx_sql_exec(fx, "CREATE TABLE t (id int PRIMARY KEY, note text)", 0);
    /* Parameters travel as data, never as SQL text. */
    tw_fx_sql_exec(fx, "INSERT INTO t VALUES ($1, $2)", 2, "1", "it's; DROP TABLE t; --");
    char *note = tw_fx_sql_str(fx, "SELECT note FROM t WHERE id = $1", 1, "1");
    ck_assert_str_eq(note, "it's; DROP TABLE t; --");
    free(note);
    ck_assert_ptr_null(tw_fx_sql_str(fx, "SELECT note FROM t WHERE id = $1", 1, "2"));
    ck_assert_ptr_null(tw_fx_sql_str(fx, "SELECT NULL::text", 0));
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM t", 0), 1);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT $1::bigint * 2", 1, "4611686018427387903"), INT64_MAX - 1);
    char *err = NULL;
    ck_assert(!tw_fx_sql_try(fx, &err, "INSERT INTO t VALUES (1, 'again')", 0));
    ck_assert_ptr_nonnull(strstr(err, "duplicate key"));
    free(err);

    tw_fx_pg_stop(fx);
    ck_assert(!tw_fx_pg_running(fx));
    ck_assert(!tw_fx_sql_try(fx, NULL, "SELECT 1", 0));
    tw_fx_pg_start(fx);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM t", 0), 1);

    /* A committed row survives an immediate shutdown: the daemons' crash tests depend on it. */
    tw_fx_sql_exec(fx, "INSERT INTO t VALUES (2, 'before the crash')", 0);
    tw_fx_pg_crash(fx);
    ck_assert(!tw_fx_sql_try(fx, NULL, "SELECT 1", 0));
    tw_fx_pg_start(fx);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM t", 0), 2);

    /* The fixture's own session dies with the restart and is re-established on the next call. */
    int backend = (int)tw_fx_sql_int(fx, "SELECT pg_backend_pid()", 0);
    tw_fx_pg_restart(fx);
    ck_assert_int_ne(tw_fx_sql_int(fx, "SELECT pg_backend_pid()", 0), backend);
    ck_assert(tw_fx_sql_wait(fx, 2000, "2", "SELECT count(*) FROM t", 0));
    ck_assert(!tw_fx_sql_wait(fx, 100, "3", "SELECT count(*) FROM t", 0));
    ck_assert(tw_fx_sql_wait(fx, 100, NULL, "SELECT note FROM t WHERE id = $1", 1, "99"));

    tw_fx_free(fx);
    ck_assert_msg(!smoke_dir_exists(dir), "%s should be gone", dir);
    free(dir);
}
END_TEST

/* Publishes a ping until the collector has seen one: after a restart both connections must reconnect first.
 */
typedef struct SmokePing {
    TwFx *fx;
    TwFxEvents *ev;
    const char *subject;
} SmokePing;

static bool smoke_ping_seen(void *arg)
{
    SmokePing *p = arg;
    if (tw_fx_events_count(p->ev, p->subject, NULL) > 0)
        return true;
    /* A publish that fails (server or publisher still reconnecting) is simply retried on the next poll. */
    bool sent = tw_fx_nats_publish(p->fx, p->subject, "{\"ping\":true}");
    (void)sent;
    return false;
}

static bool smoke_is_done(const char *subject, const json_t *data, void *arg)
{
    (void)subject, (void)arg;
    return json_is_string(json_object_get(data, "status")) &&
           strcmp(json_string_value(json_object_get(data, "status")), "done") == 0;
}

START_TEST(test_nats_lifecycle)
{
    TwFx *fx = tw_fx_new();
    tw_fx_nats_start(fx);
    int port = tw_fx_nats_port(fx);
    ck_assert_ptr_nonnull(strstr(tw_fx_nats_url(fx), "nats://127.0.0.1:"));
    ck_assert_int_gt(tw_fx_nats_pid(fx), 0);

    TwFxEvents *ev = tw_fx_events_new(fx, "evt.>");
    ck_assert(tw_fx_nats_publish(fx, "evt.agent.a.state", "{\"status\":\"idle\",\"n\":1}"));
    ck_assert(tw_fx_nats_publish(fx, "evt.agent.b.task", "{\"status\":\"done\",\"n\":2}"));
    ck_assert(tw_fx_nats_publish(fx, "cmd.agent.a.wakeup", "{\"target\":\"a\"}"));
    ck_assert(tw_fx_nats_publish(fx, "evt.agent.a.task", "not json"));
    ck_assert(tw_fx_events_wait(ev, NULL, NULL, 3, 5000));
    ck_assert_uint_eq(tw_fx_events_count(ev, "evt.agent.*.task", NULL), 2);
    ck_assert_uint_eq(tw_fx_events_count(ev, "evt.agent.a.>", NULL), 2);
    ck_assert_uint_eq(tw_fx_events_count(ev, NULL, "\"done\""), 1);
    ck_assert_uint_eq(tw_fx_events_count(ev, "evt.agent", NULL), 0);
    ck_assert_uint_eq(tw_fx_events_count_if(ev, smoke_is_done, NULL), 1);
    ck_assert(tw_fx_events_wait_if(ev, smoke_is_done, NULL, 1, 10));

    const char *subject = NULL;
    int64_t t0 = 0, t1 = 0;
    json_t *first = tw_fx_events_get(ev, NULL, NULL, 0, &subject, &t0);
    ck_assert_ptr_nonnull(first);
    ck_assert_str_eq(subject, "evt.agent.a.state");
    ck_assert_int_eq(json_integer_value(json_object_get(first, "n")), 1);
    json_decref(first);
    json_t *second = tw_fx_events_get(ev, "evt.agent.*.task", NULL, 0, NULL, &t1);
    ck_assert_int_eq(json_integer_value(json_object_get(second, "n")), 2);
    ck_assert_int_ge(t1, t0);
    json_decref(second);
    /* The non-JSON message is stored and counted but has no JSON form. */
    ck_assert_ptr_null(tw_fx_events_get(ev, "evt.agent.*.task", NULL, 1, &subject, NULL));
    ck_assert_ptr_null(tw_fx_events_get(ev, NULL, NULL, 3, NULL, NULL));
    ck_assert(!tw_fx_events_wait(ev, "cmd.>", NULL, 1, 200));

    /* Stopped server: publishing fails instead of being buffered for later. */
    tw_fx_nats_stop(fx);
    ck_assert(!tw_fx_nats_running(fx));
    ck_assert_int_eq(tw_fx_nats_pid(fx), 0);
    ck_assert(!tw_fx_nats_publish(fx, "evt.lost", "{}"));
    tw_fx_nats_start(fx);
    ck_assert_int_eq(tw_fx_nats_port(fx), port);
    ck_assert(tw_fx_wait_until(smoke_ping_seen, &(SmokePing){fx, ev, "evt.after.start"}, 10000));

    tw_fx_nats_restart(fx);
    ck_assert_int_eq(tw_fx_nats_port(fx), port);
    ck_assert(tw_fx_wait_until(smoke_ping_seen, &(SmokePing){fx, ev, "evt.after.restart"}, 10000));
    ck_assert_uint_eq(tw_fx_events_count(ev, "evt.lost", NULL), 0);

    tw_fx_events_clear(ev);
    ck_assert_uint_eq(tw_fx_events_count(ev, NULL, NULL), 0);
    tw_fx_free(fx);
}
END_TEST

static bool smoke_log_has(void *arg)
{
    void **a = arg;
    char *log = tw_fx_proc_log(a[0]);
    bool has = strstr(log, a[1]) != NULL;
    free(log);
    return has;
}

START_TEST(test_processes)
{
    TwFx *fx = tw_fx_new();
    const char *loop[] = {"/bin/sh", "-c",
                          "echo started; trap 'echo got TERM; exit 7' TERM; while :; do sleep 0.05; done",
                          NULL};
    TwFxProc *p = tw_fx_spawn(fx, "looper", loop);
    ck_assert(tw_fx_wait_until(smoke_log_has, (void *[]){p, "started"}, 5000));
    ck_assert(tw_fx_proc_alive(p));
    ck_assert(tw_fx_proc_freeze(p));
    tw_fx_sleep_ms(50);
    ck_assert_int_eq(tw_fx_pid_state(tw_fx_proc_pid(p)), 'T');
    ck_assert(tw_fx_proc_thaw(p));
    tw_fx_sleep_ms(50);
    ck_assert_int_ne(tw_fx_pid_state(tw_fx_proc_pid(p)), 'T');
    ck_assert_int_eq(tw_fx_proc_terminate(p, 5000), 7);
    ck_assert(smoke_log_has((void *[]){p, "got TERM"}));
    ck_assert(!tw_fx_proc_signal(p, SIGTERM));

    const char *sleeper[] = {"/bin/sleep", "30", NULL};
    TwFxProc *q = tw_fx_spawn(fx, "sleeper", sleeper);
    int status = 0;
    ck_assert(!tw_fx_proc_wait(q, 100, &status));
    tw_fx_proc_kill9(q);
    ck_assert(tw_fx_proc_wait(q, 0, &status));
    ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    char *out = NULL, *err = NULL;
    const char *both[] = {"/bin/sh", "-c", "echo out; echo err >&2; exit 3", NULL};
    ck_assert_int_eq(tw_fx_run(both, &out, &err), 3);
    ck_assert_str_eq(out, "out\n");
    ck_assert_str_eq(err, "err\n");
    free(out);
    free(err);

    /* Larger than a pipe buffer, so the writer and the readers must interleave. */
    size_t big = 200000;
    char *input = malloc(big + 1);
    memset(input, 'x', big);
    input[big] = '\0';
    const char *cat[] = {"cat", NULL};
    ck_assert_int_eq(tw_fx_run_full(cat, input, &out, NULL, 10000), 0);
    ck_assert_str_eq(out, input);
    free(out);
    free(input);

    const char *slow[] = {"sleep", "5", NULL};
    int64_t t0 = tw_fx_now_ms();
    ck_assert_int_eq(tw_fx_run_full(slow, NULL, NULL, &err, 200), -1);
    ck_assert_int_lt(tw_fx_now_ms() - t0, 3000);
    ck_assert_ptr_nonnull(strstr(err, "timeout"));
    free(err);

    const char *missing[] = {"no-such-program-anywhere", NULL};
    ck_assert_int_eq(tw_fx_run(missing, NULL, NULL), -1);
    const char *missing_path[] = {"/nonexistent/program", NULL};
    ck_assert_int_eq(tw_fx_run(missing_path, NULL, &err), -1);
    ck_assert_ptr_nonnull(strstr(err, "not found"));
    free(err);
    const char *sig[] = {"/bin/sh", "-c", "kill -9 $$", NULL};
    ck_assert_int_eq(tw_fx_run(sig, NULL, NULL), 128 + SIGKILL);
    tw_fx_free(fx);
}
END_TEST

static char *smoke_read(const char *path)
{
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

START_TEST(test_config)
{
    TwFx *fx = tw_fx_new_all();
    const char *ini = smoke_read(tw_fx_config_path(fx));
    char *dsn_line = NULL;
    ck_assert_int_gt(asprintf(&dsn_line, "dsn = %s\n", tw_fx_pg_dsn(fx)), 0);
    ck_assert_ptr_nonnull(strstr(ini, dsn_line));
    free(dsn_line);
    ck_assert_ptr_nonnull(strstr(ini, "[worker]\ninbox_processing_timeout_seconds = 10\n"));
    ck_assert_ptr_nonnull(strstr(ini, "[tool.ext]\nexternal = true\n"));

    /* Every program the config names exists, so daemons started with it can run the examples. */
    for (const char *p = strstr(ini, "exec = "); p; p = strstr(p + 1, "exec = ")) {
        char path[4096];
        ck_assert_int_eq(sscanf(p, "exec = %4095s", path), 1);
        ck_assert_msg(access(path, X_OK) == 0, "%s is not executable", path);
    }

    const char *alt = tw_fx_write_config(fx, "alt.ini",
                                         "[worker]\n concurrency = 2 \n!agents\n![tool.garbage]\n"
                                         "[tool.extra]\nexec = /bin/true\nthis line is junk\n");
    ck_assert_str_ne(alt, tw_fx_config_path(fx));
    ini = smoke_read(alt);
    ck_assert_ptr_nonnull(strstr(ini, "concurrency = 2\n"));
    ck_assert_ptr_null(strstr(ini, "agents ="));
    ck_assert_ptr_null(strstr(ini, "[tool.garbage]"));
    ck_assert_ptr_nonnull(strstr(ini, "[tool.extra]\nexec = /bin/true\nthis line is junk\n"));

    /* Once the daemons exist, the base config must pass their own validation. */
    if (tw_fx_daemons_built()) {
        const char *bins[] = {tw_fx_pmo_path(), tw_fx_worker_path()};
        for (size_t i = 0; i < 2; i++) {
            char *out = NULL, *err = NULL;
            const char *argv[] = {bins[i], "-c", tw_fx_config_path(fx), "--check-config", NULL};
            int rc = tw_fx_run(argv, &out, &err);
            ck_assert_msg(rc == 0, "%s --check-config exited %d: %s%s", bins[i], rc, out, err);
            free(out);
            free(err);
        }
    } else {
        fprintf(stderr, "test_config: daemons not built yet, --check-config not tried\n");
    }
    tw_fx_free(fx);
}
END_TEST

TW_SUITE_DEFINE(fixture_smoke, {
                                   {"postgres", test_pg_lifecycle, 120},
                                   {"nats", test_nats_lifecycle, 60},
                                   {"processes", test_processes, 60},
                                   {"config", test_config, 120},
                               })
