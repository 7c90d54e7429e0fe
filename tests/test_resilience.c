/* test_resilience.c — nothing is lost when the servers go away under load or the daemons are told to stop:
 * nats-server restarted in the middle of a batch, a NATS connection that nats.c closes for good (a server's
 * -ERR, written by a proxy between the daemons and nats-server) made anew by both daemons, PostgreSQL
 * restarted or crashed in the middle of a batch, the worker stopped with SIGTERM (the running step finishes)
 * and with SIGTERM twice (the job is released and another worker completes it), and the PMO stopped with
 * SIGTERM, also while its queries hang. */
#include "fixture.h"
#include "suite.h"

#include <arpa/inet.h>
#include <check.h>
#include <libpq-fe.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define WAIT_MS 20000
#define BATCH 30
#define BATCH_AGENTS 3

/* ---- helpers
 * ---------------------------------------------------------------------------------------------------- */

/* Servers, schema, a config with agents tester, tester2 and tester3 (all tw-test-agent), one PMO, one worker
 * and a collector of every evt.* message. */
static TwFxStack env_start(const char *extra)
{
    char *exec = tw_fx_build_path("examples/agents/tw-test-agent");
    char overrides[2048];
    /* Steps held behind a gate wait up to 110 s: the step limit must not end them first. */
    snprintf(overrides, sizeof overrides,
             "[agent.tester]\nstep_timeout_seconds = 120\n"
             "[agent.tester2]\nexec = %s\nstep_timeout_seconds = 120\nkill_grace_seconds = 1\n"
             "[agent.tester3]\nexec = %s\nstep_timeout_seconds = 120\nkill_grace_seconds = 1\n%s",
             exec, exec, extra ? extra : "");
    free(exec);
    return tw_fx_stack_start(overrides);
}

static char *submit(TwFxStack *e, const char *agent, const char *channel, const char *input)
{
    char *out = NULL, *err = NULL;
    int rc = tw_fx_cli(e->fx, &out, &err, "submit", "--agent", agent, "--channel", channel, "--input", input,
                       NULL);
    ck_assert_msg(rc == 0, "submit exited %d: %s", rc, err);
    size_t n = strlen(out);
    while (n && (out[n - 1] == '\n' || out[n - 1] == ' '))
        out[--n] = '\0';
    ck_assert_msg(n == 36, "submit printed '%s'", out);
    free(err);
    return out;
}

static void assert_status(TwFxStack *e, const char *turn, const char *want)
{
    char *st = tw_fx_sql_str(e->fx, "SELECT status FROM state.turns WHERE turn_id = $1", 1, turn);
    ck_assert_str_eq(st, want);
    free(st);
}

/* Final events of `turn` in the outbox. */
static int64_t outbox_finals(TwFxStack *e, const char *turn)
{
    return tw_fx_sql_int(e->fx, "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND kind = 'task'", 1,
                         turn);
}

static int64_t count_status(TwFxStack *e, const char *status)
{
    return tw_fx_sql_int(e->fx, "SELECT count(*) FROM state.turns WHERE status = $1", 1, status);
}

static void wait_count(TwFxStack *e, const char *sql, int64_t at_least, int timeout_ms, const char *what)
{
    if (!tw_fx_sql_wait_count(e->fx, sql, at_least, timeout_ms)) {
        tw_fx_stack_dump(e);
        char *now = tw_fx_sql_str(e->fx, sql, 0);
        ck_abort_msg("%s: wanted >= %lld, have %s after %d ms", what, (long long)at_least, now ? now : "?",
                     timeout_ms);
    }
}

/* BATCH sleep turns, spread round-robin over tester, tester2, tester3 (each agent runs its turns one at a
 * time, in order). Turns HELD_FROM .. HELD_FROM+2, one per agent, sleep until the file `gate` exists: once
 * all three run, the HELD_FROM turns before them are done and the rest wait behind them, whatever the
 * machine's speed, so a test puts its fault in place mid-batch and then opens the gate. */
#define HELD_FROM 12

static void submit_batch(TwFxStack *e, char *turns[BATCH], const char *gate)
{
    static const char *agents[BATCH_AGENTS] = {"tester", "tester2", "tester3"};
    for (int i = 0; i < BATCH; i++) {
        char input[1024], channel[32];
        bool held = i >= HELD_FROM && i < HELD_FROM + BATCH_AGENTS;
        if (held)
            snprintf(input, sizeof input, "{\"mode\":\"sleep\",\"seconds\":110,\"gate\":\"%s\",\"i\":%d}",
                     gate, i);
        else
            snprintf(input, sizeof input, "{\"mode\":\"sleep\",\"seconds\":0.3,\"i\":%d}", i);
        snprintf(channel, sizeof channel, "%s-%d", held ? "held" : "batch", i);
        turns[i] = submit(e, agents[i % BATCH_AGENTS], channel, input);
    }
}

/* Waits until the three held turns run: the batch is then exactly HELD_FROM done, three in flight, the rest
 * pending. */
static void wait_batch_held(TwFxStack *e)
{
    wait_count(e, "SELECT count(*) FROM state.turns WHERE status = 'running' AND channel_id LIKE 'held-%'",
               BATCH_AGENTS, 60000, "held turns running");
    ck_assert_int_eq(count_status(e, "done"), HELD_FROM);
}

static char *gate_path(TwFxStack *e)
{
    char *path = NULL;
    ck_assert_int_gt(asprintf(&path, "%s/gate", tw_fx_dir(e->fx)), 0);
    return path;
}

static void gate_open(const char *path)
{
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "cannot create %s", path);
    fclose(f);
}

/* After the batch: every turn done with its deliverable, exactly one final (task) event row per turn, every
 * event published in the end, and both daemons still running. */
static void check_batch(TwFxStack *e, char *turns[BATCH])
{
    wait_count(e, "SELECT count(*) FROM state.turns WHERE status IN ('done','failed','timeout','cancelled')",
               BATCH, 60000, "turns ended");
    if (count_status(e, "done") != BATCH) {
        tw_fx_stack_dump(e);
        char *bad =
            tw_fx_sql_str(e->fx,
                          "SELECT string_agg(status || ' ' || coalesce(error, '') || ' '"
                          " || coalesce(error_message, ''), '; ') FROM state.turns WHERE status <> 'done'",
                          0);
        ck_abort_msg("not every turn ended done: %s", bad ? bad : "?");
    }
    for (int i = 0; i < BATCH; i++) {
        ck_assert_int_eq(
            tw_fx_sql_int(e->fx,
                          "SELECT count(*) FROM state.turns t JOIN state.cards c"
                          " ON c.card_id = t.deliverable_card_id AND c.card_type = 'task.deliverable'"
                          " AND c.turn_id = t.turn_id WHERE t.turn_id = $1",
                          1, turns[i]),
            1);
        ck_assert_int_eq(
            tw_fx_sql_int(e->fx,
                          "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND kind = 'task'"
                          " AND payload->>'status' = 'done'",
                          1, turns[i]),
            1);
    }
    ck_assert_int_eq(tw_fx_sql_int(e->fx, "SELECT count(*) FROM state.outbox WHERE kind = 'task'", 0), BATCH);
    ck_assert_int_eq(tw_fx_sql_int(e->fx, "SELECT count(*) FROM state.turns", 0), BATCH);
    wait_count(e, "SELECT count(*) FROM state.outbox WHERE published_at IS NOT NULL",
               tw_fx_sql_int(e->fx, "SELECT count(*) FROM state.outbox", 0), 30000,
               "outbox events published");
    if (!tw_fx_proc_alive(e->pmo) || !tw_fx_proc_alive(e->worker)) {
        tw_fx_stack_dump(e);
        ck_abort_msg("a daemon exited during the outage (pmo %s, worker %s)",
                     tw_fx_proc_alive(e->pmo) ? "alive" : "gone",
                     tw_fx_proc_alive(e->worker) ? "alive" : "gone");
    }
}

/* Every task event the collector saw carries the outbox row's event_id (copies are allowed, other ids are
 * not). */
static void check_seen_ids(TwFxStack *e, const char *turn)
{
    char *id = tw_fx_sql_str(
        e->fx, "SELECT event_id::text FROM state.outbox WHERE turn_id = $1 AND kind = 'task'", 1, turn);
    ck_assert_ptr_nonnull(id);
    size_t n = tw_fx_events_count(e->ev, "evt.agent.*.task", turn);
    for (size_t k = 0; k < n; k++) {
        json_t *j = tw_fx_events_get(e->ev, "evt.agent.*.task", turn, k, NULL, NULL);
        ck_assert_ptr_nonnull(j);
        ck_assert_str_eq(json_string_value(json_object_get(j, "event_id")), id);
        json_decref(j);
    }
    free(id);
}

/* ---- NATS restart
 * ----------------------------------------------------------------------------------------------- */

START_TEST(test_nats_restart_mid_batch)
{
    TwFxStack e = env_start(NULL);
    char *turns[BATCH], *gate = gate_path(&e);
    submit_batch(&e, turns, gate);
    wait_batch_held(&e);
    int64_t done_at_stop = count_status(&e, "done");

    /* NATS goes with three steps in flight and BATCH - HELD_FROM - 3 turns waiting behind them. */
    tw_fx_nats_stop(e.fx);
    gate_open(gate);
    /* Without NATS, every turn still moves on (NOTIFY and the scans); their final events wait in the outbox.
     */
    wait_count(&e, "SELECT count(*) FROM state.turns WHERE status = 'done'", BATCH, 60000,
               "done while NATS is down");
    int64_t unpublished = tw_fx_sql_int(
        e.fx, "SELECT count(*) FROM state.outbox WHERE kind = 'task' AND published_at IS NULL", 0);
    ck_assert_msg(unpublished >= 1,
                  "final events of turns that ended while NATS was down were marked published");

    /* Taken while NATS is still down: whatever is published after it was published after the restart. */
    char *t_start = tw_fx_sql_str(e.fx, "SELECT now()::text", 0);
    tw_fx_nats_start(e.fx);
    ck_assert(tw_fx_nats_wait_echo(e.fx, e.ev, "evt.test.ping", "{}", WAIT_MS));
    char *t_back = tw_fx_sql_str(e.fx, "SELECT now()::text", 0);

    check_batch(&e, turns);
    /* What waited in the outbox went out after NATS came back (the relay, or the writer's retry). */
    int64_t late = tw_fx_sql_int(
        e.fx, "SELECT count(*) FROM state.outbox WHERE kind = 'task' AND published_at > $1::timestamptz", 1,
        t_start);
    ck_assert_int_ge(late, unpublished);
    /* Events committed once our collector was connected again all reached it: wait for the last of them. */
    int64_t after = tw_fx_sql_int(
        e.fx, "SELECT count(*) FROM state.outbox WHERE kind = 'task' AND created_at > $1::timestamptz", 1,
        t_back);
    for (int i = 0; i < BATCH; i++) {
        char *created_after = tw_fx_sql_str(e.fx,
                                            "SELECT (created_at > $2::timestamptz)::text FROM state.outbox"
                                            " WHERE turn_id = $1 AND kind = 'task'",
                                            2, turns[i], t_back);
        if (strcmp(created_after, "true") == 0 &&
            !tw_fx_events_wait(e.ev, "evt.agent.*.task", turns[i], 1, WAIT_MS)) {
            tw_fx_stack_dump(&e);
            ck_abort_msg("final event of turn %s (committed after NATS was back) never arrived", turns[i]);
        }
        free(created_after);
        check_seen_ids(&e, turns[i]);
    }
    fprintf(stderr,
            "nats restart: %lld done before the stop, %lld events waited in the outbox, %lld published "
            "after the restart, %lld committed after the collector was back\n",
            (long long)done_at_stop, (long long)unpublished, (long long)late, (long long)after);
    char *log = tw_fx_proc_log(e.worker);
    ck_assert_ptr_nonnull(strstr(log, "lost; reconnecting"));
    free(log);
    /* The events the worker could not publish were published by the PMO's outbox relay. */
    log = tw_fx_proc_log(e.pmo);
    ck_assert_ptr_nonnull(strstr(log, "outbox relay: publishing"));
    free(log);
    free(t_start);
    free(t_back);
    free(gate);
    for (int i = 0; i < BATCH; i++)
        free(turns[i]);
    tw_fx_free(e.fx);
}
END_TEST

/* ---- PostgreSQL restart and crash
 * ------------------------------------------------------------------------------- */

/* The log has "postgres connection X lost ...; retrying with backoff" and, after it, "postgres connection X
 * up". */
static bool lost_then_up(TwFxProc *p)
{
    char *log = tw_fx_proc_log(p);
    bool ok = false;
    const char *lost = strstr(log, "; retrying with backoff");
    for (const char *q = lost ? strstr(lost, "postgres connection ") : NULL; q && !ok;
         q = strstr(q + 1, "postgres connection ")) {
        const char *eol = strchr(q, '\n');
        size_t len = eol ? (size_t)(eol - q) : strlen(q);
        ok = len > 3 && strncmp(q + len - 3, " up", 3) == 0;
    }
    if (!ok)
        tw_fx_proc_dump(p);
    free(log);
    return ok;
}

static void pg_outage_mid_batch(bool crash)
{
    TwFxStack e = env_start(NULL);
    char *turns[BATCH], *gate = gate_path(&e);
    submit_batch(&e, turns, gate);
    /* Steps are in flight when the server goes, and turns wait behind them. */
    wait_batch_held(&e);
    int64_t done_before = count_status(&e, "done");
    if (crash) {
        /* Every server process quits at once; committed rows survive, sessions and in-flight transactions do
         * not. The held steps end while it is down: their results wait in the worker. */
        tw_fx_pg_crash(e.fx);
        gate_open(gate);
        tw_fx_sleep_ms(1000);
        ck_assert(tw_fx_proc_alive(e.pmo) && tw_fx_proc_alive(e.worker));
        tw_fx_pg_start(e.fx);
    } else {
        tw_fx_pg_restart(e.fx);
        gate_open(gate);
    }
    check_batch(&e, turns);
    for (int i = 0; i < BATCH; i++)
        check_seen_ids(&e, turns[i]);
    /* Both daemons noticed the outage and reconnected. */
    ck_assert_msg(lost_then_up(e.worker),
                  "the worker log shows no lost and re-established PostgreSQL connection");
    ck_assert_msg(lost_then_up(e.pmo), "the PMO log shows no lost and re-established PostgreSQL connection");
    fprintf(stderr, "postgres %s: %lld of %d turns done before it, all %d done after\n",
            crash ? "crash" : "restart", (long long)done_before, BATCH, BATCH);
    free(gate);
    for (int i = 0; i < BATCH; i++)
        free(turns[i]);
    tw_fx_free(e.fx);
}

START_TEST(test_pg_restart_mid_batch)
{
    pg_outage_mid_batch(false);
}
END_TEST

START_TEST(test_pg_crash_mid_batch)
{
    pg_outage_mid_batch(true);
}
END_TEST

/* ---- shutdown
 * --------------------------------------------------------------------------------------------------- */

/* True when some process has TURNWATCH_TURN_ID=turn in its environment: the agent program of that turn. */
static bool agent_running(void *arg)
{
    return tw_fx_turn_pid(arg) != 0;
}

static bool log_has(void *arg)
{
    void **a = arg;
    char *log = tw_fx_proc_log(a[0]);
    bool has = strstr(log, a[1]) != NULL;
    free(log);
    return has;
}

/* A turn of tester on `channel` whose step sleeps (up to 110 s) until the file *gate (malloc'd) exists;
 * returns once its program runs. */
static char *start_gated_step(TwFxStack *e, const char *channel, char **gate)
{
    char input[1024];
    *gate = gate_path(e);
    snprintf(input, sizeof input, "{\"mode\":\"sleep\",\"seconds\":110,\"gate\":\"%s\"}", *gate);
    char *turn = submit(e, "tester", channel, input);
    ck_assert_msg(tw_fx_wait_until(agent_running, turn, WAIT_MS), "the step never started");
    return turn;
}

static int exit_code(TwFxProc *p, int timeout_ms)
{
    int status = 0;
    if (!tw_fx_proc_wait(p, timeout_ms, &status)) {
        tw_fx_proc_dump(p);
        ck_abort_msg("%s did not exit within %d ms", tw_fx_proc_log_path(p), timeout_ms);
    }
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        tw_fx_proc_dump(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

START_TEST(test_worker_sigterm_finishes_step)
{
    TwFxStack e = env_start(NULL);
    /* The step runs until the test opens its gate, so SIGTERM finds it running on any machine. */
    char *gate = NULL, *turn = start_gated_step(&e, "term-1", &gate);
    ck_assert(tw_fx_proc_signal(e.worker, SIGTERM));
    ck_assert(tw_fx_wait_until(log_has, (void *[]){e.worker, "no new work"}, WAIT_MS));
    /* A turn submitted now is not taken by the stopping worker. */
    char *later = submit(&e, "tester2", "term-2", "{\"mode\":\"complete\"}");
    ck_assert(tw_fx_proc_alive(e.worker));
    gate_open(gate);

    ck_assert_int_eq(exit_code(e.worker, WAIT_MS), 0);
    /* It exited only after the step had finished and been applied. */
    assert_status(&e, turn, "done");
    ck_assert_int_eq(outbox_finals(&e, turn), 1);
    ck_assert(tw_fx_turn_pid(turn) == 0);
    char *st = tw_fx_sql_str(e.fx, "SELECT status FROM state.turns WHERE turn_id = $1", 1, later);
    ck_assert_msg(strcmp(st, "pending") == 0 || strcmp(st, "dispatched") == 0,
                  "a turn submitted after SIGTERM went %s on the stopping worker", st);
    free(st);
    ck_assert_int_eq(tw_fx_sql_int(e.fx,
                                   "SELECT count(*) FROM state.agent_inbox WHERE turn_id = $1 AND status = "
                                   "'processing'",
                                   1, later),
                     0);
    char *log = tw_fx_proc_log(e.worker);
    ck_assert_ptr_nonnull(strstr(log, "finishing 1 running job"));
    free(log);

    /* The PMO stops on SIGTERM too, with status 0. */
    ck_assert(tw_fx_proc_signal(e.pmo, SIGTERM));
    ck_assert_int_eq(exit_code(e.pmo, WAIT_MS), 0);
    free(gate);
    free(turn);
    free(later);
    tw_fx_free(e.fx);
}
END_TEST

START_TEST(test_worker_double_sigterm_releases)
{
    TwFxStack e = env_start(NULL);
    /* The step cannot end before the test opens its gate (or after 110 s): a worker that exits within
     * WAIT_MS released it rather than finishing it, on any machine. */
    char *gate = NULL, *turn = start_gated_step(&e, "release", &gate);
    char *first =
        tw_fx_sql_str(e.fx,
                      "SELECT claimed_by FROM state.agent_inbox WHERE turn_id = $1 AND message_type = 'turn'"
                      " AND status = 'processing'",
                      1, turn);
    ck_assert_ptr_nonnull(first);
    ck_assert(tw_fx_proc_signal(e.worker, SIGTERM));
    /* The first signal is handled before the second is sent (two pending SIGTERMs would be one). */
    ck_assert(tw_fx_wait_until(log_has, (void *[]){e.worker, "no new work"}, WAIT_MS));
    ck_assert(tw_fx_proc_signal(e.worker, SIGTERM));
    /* Released at once, not after the step: the step is still held by its gate. */
    ck_assert_int_eq(exit_code(e.worker, WAIT_MS), 0);
    ck_assert(tw_fx_turn_pid(turn) == 0);

    /* The job is back in the inbox, ready for anyone; the turn itself was not failed. */
    ck_assert_int_eq(
        tw_fx_sql_int(e.fx,
                      "SELECT count(*) FROM state.agent_inbox WHERE turn_id = $1 AND message_type = 'turn'"
                      " AND status = 'pending' AND processed_at IS NULL AND archived_at IS NULL",
                      1, turn),
        1);
    assert_status(&e, turn, "running");
    ck_assert_int_eq(outbox_finals(&e, turn), 0);

    gate_open(gate);
    TwFxProc *second = tw_fx_start_worker(e.fx, NULL);
    ck_assert(
        tw_fx_sql_wait(e.fx, WAIT_MS, "done", "SELECT status FROM state.turns WHERE turn_id = $1", 1, turn));
    char *by = tw_fx_sql_str(
        e.fx, "SELECT claimed_by FROM state.agent_inbox WHERE turn_id = $1 AND message_type = 'turn'", 1,
        turn);
    ck_assert_str_ne(by, first);
    ck_assert_int_eq(
        tw_fx_sql_int(e.fx,
                      "SELECT attempts FROM state.agent_inbox WHERE turn_id = $1 AND message_type = 'turn'",
                      1, turn),
        2);
    ck_assert_int_eq(outbox_finals(&e, turn), 1);
    ck_assert_int_eq(tw_fx_sql_int(e.fx, "SELECT count(*) FROM state.cards WHERE turn_id = $1", 1, turn), 1);
    ck_assert(tw_fx_proc_signal(second, SIGTERM));
    ck_assert_int_eq(exit_code(second, WAIT_MS), 0);
    ck_assert(tw_fx_proc_signal(e.pmo, SIGTERM));
    ck_assert_int_eq(exit_code(e.pmo, WAIT_MS), 0);
    free(by);
    free(first);
    free(gate);
    free(turn);
    tw_fx_free(e.fx);
}
END_TEST

/* The PMO told to stop while its queries hang (in life, a database that is slow or away; here its server
 * processes are frozen with SIGSTOP, since a lock would be given up by the session's lock_timeout): the
 * drain gives up after 5 s, and the queries still in flight are answered "shutting down" as their
 * connections close. Their callbacks must find the watchdogs still there (they were freed first, and the PMO
 * wrote into freed memory: a crash found by tools/soak). */
static char *pmo_backends(TwFx *fx)
{
    return tw_fx_sql_str(fx,
                         "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity"
                         " WHERE application_name LIKE 'turnwatch pmo%%'",
                         0);
}

static void signal_pids(const char *pids, int sig)
{
    for (const char *p = pids; p && *p;) {
        char *end;
        long pid = strtol(p, &end, 10);
        if (end == p)
            break;
        if (pid > 0)
            kill((pid_t)pid, sig);
        p = end;
    }
}

START_TEST(test_pmo_sigterm_with_queries_in_flight)
{
    TwFxStack e = env_start(NULL);
    ck_assert(tw_fx_wait_until(log_has, (void *[]){e.pmo, "liveness: registered"}, WAIT_MS));
    char *pids = pmo_backends(e.fx);
    ck_assert_msg(pids && strchr(pids, ' '), "the PMO's sessions are not named in pg_stat_activity: %s",
                  pids ? pids : "none");
    signal_pids(pids, SIGSTOP);
    /* The liveness poll (every 200 ms) and the watchdogs send their next statements into the frozen sessions,
     * which never answer. */
    tw_fx_sleep_ms(1000);
    ck_assert(tw_fx_proc_signal(e.pmo, SIGTERM));
    int rc = exit_code(e.pmo, WAIT_MS);
    signal_pids(pids, SIGCONT);
    free(pids);
    char *log = tw_fx_proc_log(e.pmo);
    ck_assert_msg(!strstr(log, "AddressSanitizer"), "the PMO's shutdown touched freed memory");
    ck_assert_msg(strstr(log, "still unanswered after 5 s"),
                  "no query of the PMO was in flight at its shutdown");
    free(log);
    ck_assert_int_eq(rc, 0);
    ck_assert(tw_fx_proc_signal(e.worker, SIGTERM));
    ck_assert_int_eq(exit_code(e.worker, WAIT_MS), 0);
    tw_fx_free(e.fx);
}
END_TEST

/* ---- a connection that nats.c closes for good
 * --------------------------------------------------------------- */

/* A TCP proxy between the daemons and nats-server. On request it writes, towards every client connected
 * through it, the error line a server sends before it closes a connection (nats.c then closes it for good:
 * it reconnects after a lost connection, never after a server's -ERR other than a stale connection, a
 * permission or an authorization error); while `refuse` is set it closes every new connection at once. */
#define PX_PAIRS 16
#define PX_ERR "-ERR 'Unknown Protocol Operation'\r\n"

typedef struct Proxy {
    int lfd, port, target_port;
    pthread_t thread;
    atomic_int inject_asked; /* requests so far */
    atomic_int injected;     /* connections told so far */
    atomic_int refused;      /* connections closed at once so far */
    atomic_bool refuse, stop;
    int inject_done;       /* proxy thread only */
    int pair[PX_PAIRS][2]; /* client, server descriptors; -1 when free (proxy thread only) */
} Proxy;

static void px_close_pair(Proxy *p, int i)
{
    close(p->pair[i][0]);
    close(p->pair[i][1]);
    p->pair[i][0] = p->pair[i][1] = -1;
}

static bool px_send_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        buf += n;
        len -= (size_t)n;
    }
    return true;
}

static int px_connect_target(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static void px_accept(Proxy *p)
{
    int c = accept(p->lfd, NULL, NULL), s = -1;
    if (c < 0)
        return;
    if (atomic_load(&p->refuse) || (s = px_connect_target(p->target_port)) < 0) {
        atomic_fetch_add(&p->refused, 1);
        close(c);
        return;
    }
    for (int i = 0; i < PX_PAIRS; i++)
        if (p->pair[i][0] < 0) {
            p->pair[i][0] = c;
            p->pair[i][1] = s;
            return;
        }
    close(c);
    close(s);
}

static void *px_main(void *arg)
{
    Proxy *p = arg;
    char buf[65536];

    while (!atomic_load(&p->stop)) {
        struct pollfd fds[1 + 2 * PX_PAIRS];
        int who[1 + 2 * PX_PAIRS], n = 0;
        fds[n] = (struct pollfd){.fd = p->lfd, .events = POLLIN};
        who[n++] = -1;
        for (int i = 0; i < PX_PAIRS; i++)
            for (int side = 0; side < 2 && p->pair[i][0] >= 0; side++) {
                fds[n] = (struct pollfd){.fd = p->pair[i][side], .events = POLLIN};
                who[n++] = i * 2 + side;
            }
        if (poll(fds, (nfds_t)n, 20) < 0)
            continue;
        int asked = atomic_load(&p->inject_asked);
        if (asked != p->inject_done) {
            p->inject_done = asked;
            for (int i = 0; i < PX_PAIRS; i++)
                if (p->pair[i][0] >= 0 && px_send_all(p->pair[i][0], PX_ERR, strlen(PX_ERR)))
                    atomic_fetch_add(&p->injected, 1);
        }
        for (int k = 1; k < n; k++) {
            int i = who[k] / 2, side = who[k] % 2;
            if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR)) || p->pair[i][side] != fds[k].fd)
                continue;
            ssize_t got = recv(fds[k].fd, buf, sizeof buf, 0);
            if (got <= 0 || !px_send_all(p->pair[i][1 - side], buf, (size_t)got))
                px_close_pair(p, i);
        }
        if (fds[0].revents & POLLIN)
            px_accept(p);
    }
    for (int i = 0; i < PX_PAIRS; i++)
        if (p->pair[i][0] >= 0)
            px_close_pair(p, i);
    return NULL;
}

static void px_start(Proxy *p, int target_port)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof a;
    int one = 1;

    memset(p, 0, sizeof *p);
    memset(p->pair, -1, sizeof p->pair);
    p->target_port = target_port;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(p->lfd, 0);
    setsockopt(p->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    ck_assert_int_eq(bind(p->lfd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(p->lfd, 16), 0);
    ck_assert_int_eq(getsockname(p->lfd, (struct sockaddr *)&a, &len), 0);
    p->port = ntohs(a.sin_port);
    ck_assert_int_eq(pthread_create(&p->thread, NULL, px_main, p), 0);
}

static void px_stop(Proxy *p)
{
    atomic_store(&p->stop, true);
    pthread_join(p->thread, NULL);
    close(p->lfd);
}

static bool proxy_refused_some(void *arg)
{
    return atomic_load(&((Proxy *)arg)->refused) >= 4;
}

/* The proxy counts a connection told just after writing to it: a daemon may react (and log) before that. */
static bool proxy_told_both(void *arg)
{
    return atomic_load(&((Proxy *)arg)->injected) >= 2;
}

typedef struct Health {
    int port, want;
} Health;

static bool health_is(void *arg)
{
    Health *h = arg;
    char *body = NULL;
    int code = tw_fx_http_get(h->port, "/healthz", &body);
    free(body);
    return code == h->want;
}

static void wait_health(TwFxStack *e, int port, int want, int timeout_ms)
{
    Health h = {port, want};
    if (!tw_fx_wait_until(health_is, &h, timeout_ms)) {
        char *body = NULL;
        int code = tw_fx_http_get(port, "/healthz", &body);
        if (body)
            body[strcspn(body, "\r\n")] = '\0';
        tw_fx_stack_dump(e);
        ck_abort_msg(":%d/healthz is %d '%s' after %d ms, want %d", port, code, body ? body : "", timeout_ms,
                     want);
    }
}

static int nats_up_gauge(int port)
{
    char *body = NULL;
    ck_assert_int_eq(tw_fx_http_get(port, "/metrics", &body), 200);
    const char *at = strstr(body, "\nturnwatch_nats_up ");
    int up = at ? atoi(at + strlen("\nturnwatch_nats_up ")) : -1;
    free(body);
    return up;
}

static int count_in_log(TwFxProc *p, const char *needle)
{
    char *log = tw_fx_proc_log(p);
    int n = 0;
    for (const char *at = log; (at = strstr(at, needle)); at += strlen(needle))
        n++;
    free(log);
    return n;
}

static void wait_final_event(TwFxStack *e, const char *turn)
{
    if (!tw_fx_events_wait(e->ev, "evt.agent.*.task", turn, 1, WAIT_MS)) {
        tw_fx_stack_dump(e);
        ck_abort_msg("no final event of turn %s on NATS", turn);
    }
}

/* The server ends both daemons' connections with an error: nats.c closes them for good. Each daemon says
 * so, reports NATS down (/healthz 503, turnwatch_nats_up 0) while no new connection can be made, and makes
 * one within its backoff once it can: up again, its subscriptions and events stream back, a step that ended
 * meanwhile has its final event published, and turns run end to end. */
START_TEST(test_nats_closed_connection_rebuilt)
{
    TwFxStack e = {.fx = tw_fx_new_migrated(NULL)};
    Proxy px;
    px_start(&px, tw_fx_nats_port(e.fx));
    int pmo_port = tw_fx_free_port(), worker_port = tw_fx_free_port();
    char *ovr = NULL;
    ck_assert_int_gt(
        asprintf(&ovr,
                 "[nats]\nurl = nats://127.0.0.1:%d\nevents_stream = TWEVENTS\n"
                 "[pmo]\nmetrics_listen = 127.0.0.1:%d\n[worker]\nmetrics_listen = 127.0.0.1:%d\n",
                 px.port, pmo_port, worker_port),
        0);
    const char *ini = tw_fx_write_config(e.fx, "daemons.ini", ovr);
    e.ev = tw_fx_events_new(e.fx, "evt.>");
    e.pmo = tw_fx_start_pmo(e.fx, ini);
    e.worker = tw_fx_start_worker(e.fx, ini);
    wait_health(&e, pmo_port, 200, WAIT_MS);
    wait_health(&e, worker_port, 200, WAIT_MS);
    char *t1 = submit(&e, "echo", "close-1", "{}");
    wait_final_event(&e, t1);
    char *gate = NULL, *held = start_gated_step(&e, "close-held", &gate);

    /* The error line, to both connections; new ones are refused for now. */
    atomic_store(&px.refuse, true);
    atomic_fetch_add(&px.inject_asked, 1);
    ck_assert(tw_fx_wait_until(log_has, (void *[]){e.pmo, "nats connection turnwatch-pmo lost"}, WAIT_MS));
    ck_assert(
        tw_fx_wait_until(log_has, (void *[]){e.worker, "nats connection turnwatch-worker lost"}, WAIT_MS));
    ck_assert_msg(tw_fx_wait_until(proxy_told_both, &px, WAIT_MS), "the proxy told %d connections, not 2",
                  atomic_load(&px.injected));
    wait_health(&e, pmo_port, 503, WAIT_MS);
    wait_health(&e, worker_port, 503, WAIT_MS);
    ck_assert_int_eq(nats_up_gauge(pmo_port), 0);
    ck_assert_int_eq(nats_up_gauge(worker_port), 0);
    /* A step ends while NATS is away: its events cannot be confirmed and stay for the relay. */
    gate_open(gate);
    ck_assert(
        tw_fx_sql_wait(e.fx, WAIT_MS, "done", "SELECT status FROM state.turns WHERE turn_id = $1", 1, held));
    char *t2 = submit(&e, "echo", "close-2", "{}");
    /* Both have tried new connections by now (and go on trying, backing off). */
    if (!tw_fx_wait_until(proxy_refused_some, &px, WAIT_MS)) {
        tw_fx_stack_dump(&e);
        ck_abort_msg("the daemons tried %d new NATS connections in %d ms after nats.c closed theirs, want 4",
                     atomic_load(&px.refused), WAIT_MS);
    }
    wait_health(&e, pmo_port, 503, WAIT_MS);
    wait_health(&e, worker_port, 503, WAIT_MS);

    /* New connections are possible again: both daemons are back within their backoff (at most 5 s between
     * tries). */
    atomic_store(&px.refuse, false);
    int64_t t0 = tw_fx_now_ms();
    wait_health(&e, pmo_port, 200, 15000);
    wait_health(&e, worker_port, 200, 15000);
    fprintf(stderr, "resilience: both daemons reconnected %lld ms after nats-server could be reached again\n",
            (long long)(tw_fx_now_ms() - t0));
    ck_assert_int_eq(nats_up_gauge(pmo_port), 1);
    ck_assert_int_eq(nats_up_gauge(worker_port), 1);
    wait_final_event(&e, held);
    wait_final_event(&e, t2);
    char *t3 = submit(&e, "echo", "close-3", "{}");
    wait_final_event(&e, t3);
    wait_count(&e, "SELECT count(*) FROM state.outbox WHERE published_at IS NOT NULL",
               tw_fx_sql_int(e.fx, "SELECT count(*) FROM state.outbox", 0), WAIT_MS,
               "outbox events published");

    /* One warning per close, with nats.c's reason; the events stream checked again on the new connection. */
    if (count_in_log(e.pmo, "nats connection turnwatch-pmo closed: Unknown Protocol Operation;") != 1 ||
        count_in_log(e.worker, "nats connection turnwatch-worker closed: Unknown Protocol Operation;") != 1 ||
        count_in_log(e.pmo, "events stream TWEVENTS") < 2 ||
        count_in_log(e.worker, "events stream TWEVENTS") < 2) {
        tw_fx_stack_dump(&e);
        ck_abort_msg("want one warning per close with its reason, and the events stream checked again");
    }

    /* And both stop cleanly, every nats.c callback of every connection accounted for. */
    ck_assert(tw_fx_proc_signal(e.pmo, SIGTERM));
    ck_assert(tw_fx_proc_signal(e.worker, SIGTERM));
    ck_assert_int_eq(exit_code(e.pmo, WAIT_MS), 0);
    ck_assert_int_eq(exit_code(e.worker, WAIT_MS), 0);
    ck_assert_int_eq(count_in_log(e.pmo, "callbacks still pending"), 0);
    ck_assert_int_eq(count_in_log(e.worker, "callbacks still pending"), 0);
    px_stop(&px);
    free(t1);
    free(t2);
    free(t3);
    free(held);
    free(gate);
    free(ovr);
    tw_fx_free(e.fx);
}
END_TEST

/* ---- an application's transaction held open
 * ------------------------------------------------------------------ */

/* Backends of the daemons (not this test's) waiting for a lock. */
static int64_t daemons_waiting(TwFx *fx)
{
    return tw_fx_sql_int(fx,
                         "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                         " AND pid <> pg_backend_pid() AND query NOT LIKE '%%tw.submit_turn%%'",
                         0);
}

/* An application submits a turn for a busy agent in a transaction it keeps open longer than the daemons'
 * query timeout (issue 23, defect 2). The agent's running step ends meanwhile; its apply needs the agent row
 * the submit holds. Before, the apply waited, the worker gave up on it after the query timeout and dropped
 * the connection, the server-side statement kept waiting and committed after the application did, handing the
 * agent's next turn to a worker that no longer knew of it (running for good, until rule 2.6); each retry left
 * one more waiting backend, and other agents' work queued on that connection stalled. Now the wait is bounded
 * server-side (lock_timeout, statement_timeout), the apply is tried again later, other agents' turns run
 * meanwhile, and once the application commits both turns end done. */
START_TEST(test_client_transaction_held_open)
{
    TwFxStack e = env_start("[postgres]\nquery_timeout_seconds = 3\n[worker]\nconcurrency = 2\n");
    char *gate, *first = start_gated_step(&e, "held-first", &gate);

    PGconn *app = PQconnectdb(tw_fx_pg_dsn(e.fx));
    ck_assert_msg(PQstatus(app) == CONNECTION_OK, "%s", PQerrorMessage(app));
    PGresult *r = PQexec(app, "BEGIN");
    PQclear(r);
    r = PQexec(app, "SELECT tw.submit_turn('tester', 'held-second', '{\"mode\":\"complete\"}')");
    ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK, "%s", PQerrorMessage(app));
    char *second = strdup(PQgetvalue(r, 0, 0));
    PQclear(r);

    /* The step ends; its apply now needs the row the open transaction holds. */
    gate_open(gate);
    int64_t open_until = tw_fx_now_ms() + 3 * 3000; /* three query timeouts */
    int64_t max_waiting = 0;
    int echoes = 0;
    while (tw_fx_now_ms() < open_until) {
        /* Other agents' turns run meanwhile, one after another. */
        char channel[32];
        snprintf(channel, sizeof channel, "other-%d", echoes++);
        char *other = submit(&e, "echo", channel, "{\"n\":1}");
        /* Counting the daemons' waiting statements every 10 ms meanwhile. */
        int64_t until = tw_fx_now_ms() + 8000;
        bool done = false;
        while (!done && tw_fx_now_ms() < until) {
            int64_t w = daemons_waiting(e.fx);
            if (w > max_waiting)
                max_waiting = w;
            char *status = tw_fx_sql_str(e.fx, "SELECT status FROM state.turns WHERE turn_id = $1", 1, other);
            done = status && strcmp(status, "done") == 0;
            free(status);
            if (!done)
                tw_fx_sleep_ms(10);
        }
        if (!done) {
            tw_fx_stack_dump(&e);
            ck_abort_msg("echo turn %d (%s) did not end done within 8 s while an application held its "
                         "transaction open",
                         echoes, other);
        }
        free(other);
    }
    /* Never a pile of abandoned ones, nor a batch queued behind another: one waiting apply at most, the held
     * agent's step sent alone. A batch of several steps does not wait for the held row (SKIP LOCKED: that
     * step is handed back and goes alone), so it never holds other agents' rows while it waits and no second
     * batch waits behind it (before issue 24, a clean-clone run saw 2). */
    ck_assert_msg(max_waiting <= 1, "%lld daemon statements waited on locks at once", (long long)max_waiting);
    assert_status(&e, first, "running");

    r = PQexec(app, "COMMIT");
    ck_assert_msg(PQresultStatus(r) == PGRES_COMMAND_OK, "%s", PQerrorMessage(app));
    PQclear(r);
    PQfinish(app);
    if (!tw_fx_sql_wait(
            e.fx, WAIT_MS, "2",
            "SELECT count(*)::text FROM state.turns WHERE turn_id IN ($1, $2) AND status = 'done'", 2, first,
            second)) {
        tw_fx_stack_dump(&e);
        char *st = tw_fx_sql_str(e.fx,
                                 "SELECT string_agg(turn_id || ' ' || status, ', ') FROM state.turns"
                                 " WHERE turn_id IN ($1, $2)",
                                 2, first, second);
        ck_abort_msg("after the commit both turns should end done: %s", st ? st : "?");
    }
    ck_assert_int_eq(outbox_finals(&e, first), 1);
    ck_assert_int_eq(outbox_finals(&e, second), 1);
    ck_assert_int_eq(
        tw_fx_sql_int(e.fx, "SELECT count(*) FROM state.agent_inbox WHERE status = 'processing'", 0), 0);
    free(first);
    free(second);
    free(gate);
    tw_fx_free(e.fx);
}
END_TEST

/* What a worker holds in the database but does not know of (a claim whose answer was lost with its
 * connection) goes back for another worker: here made by hand, an agent step claimed in the worker's name. */
START_TEST(test_unknown_claim_released)
{
    TwFxStack e = env_start("[postgres]\nquery_timeout_seconds = 2\n[worker]\nheartbeat_seconds = "
                            "1\ninbox_processing_timeout_seconds = 120\n");
    char *gate, *turn = start_gated_step(&e, "unknown", &gate);
    char *worker = tw_fx_sql_str(e.fx,
                                 "SELECT claimed_by FROM state.agent_inbox WHERE turn_id = $1"
                                 " AND status = 'processing'",
                                 1, turn);
    ck_assert_ptr_nonnull(worker);
    /* Stop the worker's own knowledge of the claim: kill the program and make the claim look like another
     * one of the same worker, older than twice the query timeout, that it never heard of. */
    tw_fx_sql_exec(
        e.fx,
        "UPDATE state.agent_inbox SET claim_token = nextval('state.claim_token_seq'),"
        " processed_at = now() - interval '10 seconds' WHERE turn_id = $1 AND status = 'processing'",
        1, turn);
    /* The worker's heartbeat finds its step lost (the token moved) and stops it; the item is then ours but
     * unknown to it: given back within a few heartbeats, and the step runs again. */
    gate_open(gate);
    if (!tw_fx_sql_wait(e.fx, WAIT_MS, "done", "SELECT status FROM state.turns WHERE turn_id = $1", 1,
                        turn)) {
        tw_fx_stack_dump(&e);
        ck_abort_msg("the turn whose claim the worker did not know of never ended");
    }
    char *log = tw_fx_proc_log(e.worker);
    ck_assert_msg(strstr(log, "never heard of it"), "no line about giving the claim back");
    free(log);
    free(worker);
    free(turn);
    free(gate);
    tw_fx_free(e.fx);
}
END_TEST

TW_SUITE_DEFINE(resilience, {
                                {"nats", test_nats_restart_mid_batch, 120},
                                {"nats_closed", test_nats_closed_connection_rebuilt, 120},
                                {"postgres", test_pg_restart_mid_batch, 120},
                                {"postgres", test_pg_crash_mid_batch, 120},
                                {"shutdown", test_worker_sigterm_finishes_step, 60},
                                {"shutdown", test_worker_double_sigterm_releases, 60},
                                {"shutdown", test_pmo_sigterm_with_queries_in_flight, 60},
                                {"locks", test_client_transaction_held_open, 90},
                                {"locks", test_unknown_claim_released, 60},
                            })
