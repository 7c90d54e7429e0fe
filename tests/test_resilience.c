/* test_resilience.c — nothing is lost when the servers go away under load or the daemons are told to stop:
 * nats-server restarted in the middle of a batch, PostgreSQL restarted or crashed in the middle of a batch,
 * the worker stopped with SIGTERM (the running step finishes) and with SIGTERM twice (the job is released and
 * another worker completes it), and the PMO stopped with SIGTERM, also while its queries hang. */
#include "fixture.h"
#include "suite.h"

#include <check.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
        if (!tw_fx_sql_wait(e.fx, 8000, "done", "SELECT status FROM state.turns WHERE turn_id = $1", 1,
                            other)) {
            tw_fx_stack_dump(&e);
            ck_abort_msg("echo turn %d (%s) did not end done within 8 s while an application held its "
                         "transaction open",
                         echoes, other);
        }
        free(other);
        int64_t w = daemons_waiting(e.fx);
        if (w > max_waiting)
            max_waiting = w;
    }
    /* At most the one apply waits at a time, never a pile of abandoned ones. */
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
                                {"postgres", test_pg_restart_mid_batch, 120},
                                {"postgres", test_pg_crash_mid_batch, 120},
                                {"shutdown", test_worker_sigterm_finishes_step, 60},
                                {"shutdown", test_worker_double_sigterm_releases, 60},
                                {"shutdown", test_pmo_sigterm_with_queries_in_flight, 60},
                                {"locks", test_client_transaction_held_open, 90},
                                {"locks", test_unknown_claim_released, 60},
                            })
