/* test_serve.c — serve mode (contract section 10) against real servers and daemons: one long-lived process
 * serves several steps and turns; a process that crashes, hangs past its step's time limit or writes a bad
 * line (not JSON, or longer than 1 MiB) fails only that step, with exec mode's error codes, and is replaced;
 * max_requests replaces it after N requests; a reply that comes after its step was timed out is discarded
 * with its process; a frozen worker's serve process that replies after the turn was taken over changes
 * nothing (the epoch fence); serve-mode tools, their reuse and their time limit; a process that exits or
 * writes a stray line right after a good reply costs the next turn nothing, and a request goes to a new
 * process once at most. */
#include "turn_helpers.h"
#include "suite.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The scriptable test agent and the echo and sleep tools, in serve mode; short limits. */
#define SV_BASE                                                                                              \
    "[agent.tester]\nmode = serve\nstep_timeout_seconds = 2\nkill_grace_seconds = 1\n"                       \
    "[tool.echo]\nmode = serve\n[tool.sleep]\nmode = serve\n"

typedef struct Sv {
    TwFx *fx;
    TwFxEvents *ev;
    TwFxProc *pmo, *worker;
    pid_t pid; /* the agent's serve process, as sv_serving and sv_failure last saw it */
} Sv;

static Sv sv_start(const char *extra)
{
    Sv s = {0};
    char *ovr = wd_fmt("%s%s", SV_BASE, extra ? extra : "");

    ck_assert_msg(tw_fx_daemons_built(), "turnwatch-pmo, turnwatch-worker and turnwatch must be built");
    s.fx = wd_fixture(ovr);
    s.ev = tw_fx_events_new(s.fx, "evt.agent.*.task");
    s.pmo = tw_fx_start_pmo(s.fx, NULL);
    s.worker = tw_fx_start_worker(s.fx, NULL);
    free(ovr);
    return s;
}

static void sv_dump(Sv *s)
{
    char *log = tw_fx_proc_log(s->worker);
    size_t n = strlen(log);
    fprintf(stderr, "---- worker log (last lines)\n%s\n", n > 8000 ? log + n - 8000 : log);
    free(log);
}

/* Submits input to `agent`, waits for the turn to reach `status` and returns its id. */
static char *sv_turn(Sv *s, const char *agent, const char *input, const char *status)
{
    char *turn = wd_submit(s->fx, agent, input);
    if (!wd_wait_status(s->fx, turn, status)) {
        sv_dump(s);
        char *st = tw_fx_sql_str(s->fx,
                                 "SELECT status || ' ' || coalesce(error, '-') FROM state.turns WHERE "
                                 "turn_id = $1",
                                 1, turn);
        ck_abort_msg("turn %s (input %s): expected %s, is %s", turn, input, status, st ? st : "(none)");
    }
    return turn;
}

/* The turn's deliverable output (a new reference). */
static json_t *sv_output(Sv *s, const char *turn)
{
    char *text = tw_fx_sql_str(s->fx,
                               "SELECT c.content -> 'output' FROM state.cards c JOIN state.turns t "
                               "ON t.deliverable_card_id = c.card_id WHERE t.turn_id = $1",
                               1, turn);
    json_t *j = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
    ck_assert_msg(j != NULL, "turn %s has no deliverable output", turn);
    free(text);
    return j;
}

/* A done turn of the test agent in mode pid: which serve process served it, and its request count. */
static pid_t sv_pid_turn(Sv *s, int *served)
{
    char *turn = sv_turn(s, "tester", "{\"mode\":\"pid\"}", "done");
    json_t *out = sv_output(s, turn);
    pid_t pid = (pid_t)json_integer_value(json_object_get(out, "pid"));

    ck_assert_msg(json_is_true(json_object_get(out, "serving")), "TURNWATCH_MODE=serve was not set");
    ck_assert_msg(json_is_false(json_object_get(out, "turn_env")),
                  "a serve process got TURNWATCH_TURN_ID in its environment");
    ck_assert_int_gt(pid, 1);
    if (served)
        *served = (int)json_integer_value(json_object_get(out, "served"));
    json_decref(out);
    free(turn);
    return pid;
}

/* The turn's error code, and its error message must contain `says`. */
static void sv_error_is(Sv *s, const char *turn, const char *code, const char *says)
{
    char *err = tw_fx_sql_str(s->fx, "SELECT error FROM state.turns WHERE turn_id = $1", 1, turn);
    char *msg = tw_fx_sql_str(s->fx, "SELECT error_message FROM state.turns WHERE turn_id = $1", 1, turn);
    ck_assert_msg(err && strcmp(err, code) == 0, "turn %s: error %s, expected %s", turn, err ? err : "(none)",
                  code);
    ck_assert_msg(msg && strstr(msg, says), "turn %s: the error message does not say '%s': %s", turn, says,
                  msg ? msg : "(none)");
    free(err);
    free(msg);
}

/* sv_start, then a first turn: its serve process is s.pid. */
static Sv sv_serving(const char *extra)
{
    Sv s = sv_start(extra);
    s.pid = sv_pid_turn(&s, NULL);
    return s;
}

/* The turn of `input` fails with `code`, its message saying `says`, and costs the serve process that served
 * the turn before it, s->pid: that process is gone (at once when `gone_at_once`, else within WD_WAIT_MS) and
 * the next turn is served by a new one, the new s->pid (its request count into *served unless NULL).
 * Returns the failed turn's id. */
static char *sv_failure(Sv *s, const char *input, const char *code, const char *says, bool gone_at_once,
                        int *served)
{
    pid_t before = s->pid;
    char *turn = sv_turn(s, "tester", input, "failed");

    sv_error_is(s, turn, code, says);
    if (gone_at_once)
        ck_assert_msg(wd_pid_gone(&before), "serve process %d outlived the turn it failed", (int)before);
    else
        ck_assert_msg(tw_fx_wait_until(wd_pid_gone, &before, WD_WAIT_MS),
                      "serve process %d was never stopped", (int)before);
    s->pid = sv_pid_turn(s, served);
    ck_assert_int_ne(s->pid, before);
    return turn;
}

/* How many serve processes of `kind` ("agent", "tool") running `program` the worker started. */
static int sv_started(Sv *s, const char *kind, const char *program)
{
    char *log = tw_fx_proc_log(s->worker), *needle = wd_fmt("%s serve pid=", kind);
    int n = 0;
    char *save = NULL;

    for (char *line = strtok_r(log, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        n += strstr(line, needle) && strstr(line, ": started (") && strstr(line, program);
    free(needle);
    free(log);
    return n;
}

static void sv_stop(Sv *s, pid_t serve_pid)
{
    /* SIGTERM: the worker ends its idle serve processes and exits 0 once they are gone. */
    int rc = tw_fx_proc_terminate(s->worker, 15000);
    if (rc != 0)
        sv_dump(s);
    ck_assert_msg(rc == 0, "the worker exited %d on SIGTERM", rc);
    if (serve_pid > 0)
        ck_assert_msg(wd_pid_gone(&serve_pid), "serve process %d outlived its worker", (int)serve_pid);
    wd_assert_no_deadlock(s->fx);
    tw_fx_free(s->fx);
}

/* ---- reuse
 * ------------------------------------------------------------------------------------------------------ */

START_TEST(test_serve_reuse)
{
    /* tester2 runs the same program with the same limits: it shares tester's process. */
    char *prog = tw_fx_build_path("examples/agents/tw-test-agent");
    char *twin = wd_fmt(
        "[agent.tester2]\nexec = %s\nmode = serve\nstep_timeout_seconds = 2\nkill_grace_seconds = 1\n", prog);
    Sv s = sv_start(twin);
    int served = 0;

    /* Several turns, one process: its request count goes up by one each time. */
    pid_t pid = sv_pid_turn(&s, &served);
    ck_assert_int_eq(served, 1);
    for (int i = 2; i <= 4; i++) {
        ck_assert_int_eq(sv_pid_turn(&s, &served), pid);
        ck_assert_int_eq(served, i);
    }
    /* Several steps of one turn (three steps: two tool rounds, each resumed) in that same process. */
    char *t = sv_turn(&s, "tester",
                      "{\"mode\":\"tools\",\"rounds\":2,\"calls\":[{\"id\":\"c\",\"tool\":\"echo\","
                      "\"args\":{\"n\":1}}]}",
                      "done");
    ck_assert_int_eq(sv_pid_turn(&s, &served), pid);
    ck_assert_int_eq(served, 8);
    /* Another agent of the same program is served by the same process. */
    char *t2 = sv_turn(&s, "tester2", "{\"mode\":\"pid\"}", "done");
    json_t *o2 = sv_output(&s, t2);
    ck_assert_int_eq(json_integer_value(json_object_get(o2, "pid")), pid);
    ck_assert_int_eq(json_integer_value(json_object_get(o2, "served")), 9);
    json_decref(o2);
    free(t2);
    ck_assert_int_eq(sv_started(&s, "agent", "tw-test-agent"), 1);
    /* The tool ran in serve mode too: its two calls came from one process. */
    ck_assert_int_eq(sv_started(&s, "tool", "tw-echo-tool"), 1);
    json_t *out = sv_output(&s, t);
    ck_assert_int_eq(json_array_size(json_object_get(out, "tool_results")), 2);
    json_decref(out);
    free(t);
    free(prog);
    free(twin);
    sv_stop(&s, pid);
}
END_TEST

/* ---- failures: each fails its own step only, and the next turn gets a new process
 * ----------------------- */

START_TEST(test_serve_crash)
{
    Sv s = sv_serving(NULL);
    int served = 0;

    char *t =
        sv_failure(&s, "{\"mode\":\"exit\",\"code\":3}", "agent_exit", "exited with status 3", true, &served);
    ck_assert_int_eq(served, 1);
    ck_assert_uint_eq(wd_task_events(s.ev, t), 1);
    free(t);
    sv_stop(&s, s.pid);
}
END_TEST

START_TEST(test_serve_hang)
{
    Sv s = sv_serving(NULL);

    /* It ignores SIGTERM: stopped with SIGKILL after kill_grace_seconds. */
    free(sv_failure(&s, "{\"mode\":\"hang\"}", "step_timeout", "SIGKILL after SIGTERM", false, NULL));
    sv_stop(&s, s.pid);
}
END_TEST

START_TEST(test_serve_bad_lines)
{
    Sv s = sv_serving(NULL);
    int served = 0;

    free(sv_failure(&s, "{\"mode\":\"garbage\"}", "bad_output", "not a JSON object", false, NULL));
    /* A line longer than 1 MiB: the process is stopped before it ends the line. */
    free(sv_failure(&s, "{\"mode\":\"oversize\",\"bytes\":3000000}", "bad_output", "more than 1048576 bytes",
                    false, &served));
    ck_assert_int_eq(served, 1);
    /* A valid reply line of 1 MiB and one byte, newline included, is over the limit as in exec mode; one of
     * exactly 1 MiB is a reply. */
    free(sv_failure(&s, "{\"mode\":\"big_reply\",\"bytes\":1048577}", "bad_output", "more than 1048576 bytes",
                    false, NULL));
    free(sv_turn(&s, "tester", "{\"mode\":\"big_reply\",\"bytes\":1048576}", "done"));
    sv_stop(&s, s.pid);
}
END_TEST

/* ---- between requests: exiting or writing after a good reply costs the next request nothing
 * ------------------------------ */

#define SV_ROW 20

/* SV_ROW turns of `mode` in a row, submitted in one statement so that each is handed to the serve process as
 * soon as the one before is applied (while that process may still be on its way out). Every turn ends done,
 * with its own reply (the test agent echoes input.n), from a process that served no other request. Odd turns
 * linger 0.2 s before exiting (or writing the stray line), even ones do it at once. */
static void sv_row(Sv *s, const char *mode)
{
    char n[8];
    char *turns[SV_ROW];

    snprintf(n, sizeof n, "%d", SV_ROW);
    tw_fx_sql_exec(
        s->fx,
        "SELECT tw.submit_turn('tester', 'row-' || i, jsonb_build_object('mode', $2::text, 'n', i, "
        "'linger', CASE WHEN i % 2 = 1 THEN 0.2 ELSE 0 END)) FROM generate_series(0, $1::integer - 1) "
        "i ORDER BY i",
        2, n, mode);
    for (int i = 0; i < SV_ROW; i++) {
        char idx[8];
        snprintf(idx, sizeof idx, "%d", i);
        turns[i] = tw_fx_sql_str(
            s->fx, "SELECT turn_id::text FROM state.turns WHERE channel_id = 'row-' || $1", 1, idx);
        ck_assert_ptr_nonnull(turns[i]);
    }
    for (int i = 0; i < SV_ROW; i++) {
        if (!tw_fx_sql_wait(s->fx, WD_WAIT_MS, "t",
                            "SELECT status IN ('done', 'failed', 'cancelled') FROM "
                            "state.turns WHERE turn_id = $1",
                            1, turns[i])) {
            sv_dump(s);
            ck_abort_msg("turn %d (%s) never ended", i, turns[i]);
        }
    }
    for (int i = 0; i < SV_ROW; i++) {
        char *st = tw_fx_sql_str(s->fx,
                                 "SELECT status || ' ' || coalesce(error, '-') || ' ' || "
                                 "coalesce(error_message, '-') FROM state.turns WHERE turn_id = $1",
                                 1, turns[i]);
        if (strncmp(st, "done ", 5) != 0)
            sv_dump(s);
        ck_assert_msg(strncmp(st, "done ", 5) == 0, "turn %d of %d (mode %s) ended %s", i, SV_ROW, mode, st);
        json_t *out = sv_output(s, turns[i]);
        ck_assert_int_eq(json_integer_value(json_object_get(out, "n")), i);
        ck_assert_int_eq(json_integer_value(json_object_get(out, "served")), 1);
        json_decref(out);
        free(st);
        free(turns[i]);
    }
}

START_TEST(test_serve_exit_after_reply)
{
    Sv s = sv_start("[worker]\nconcurrency = 1\n");

    sv_row(&s, "reply_exit");
    ck_assert_int_eq(sv_started(&s, "agent", "tw-test-agent"), SV_ROW);
    sv_stop(&s, 0);
}
END_TEST

START_TEST(test_serve_stray_line_after_reply)
{
    Sv s = sv_start("[worker]\nconcurrency = 1\n");

    sv_row(&s, "stray");
    ck_assert_int_eq(sv_started(&s, "agent", "tw-test-agent"), SV_ROW);
    /* Each process was replaced for its stray line, and said so. */
    char *log = tw_fx_proc_log(s.worker);
    int replaced = 0;
    for (const char *p = strstr(log, "replaced after 1 request(s): it wrote"); p;
         p = strstr(p + 1, "replaced after 1 request(s): it wrote"))
        replaced++;
    free(log);
    ck_assert_msg(replaced >= SV_ROW - 1, "%d processes were replaced for their stray line, not %d", replaced,
                  SV_ROW - 1);
    sv_stop(&s, 0);
}
END_TEST

/* A request goes to a new process once at most. Process A serves turn 1 and exits 1 s later without reading
 * turn 2, which it was given meanwhile; turn 2 goes to a new process B, which dies before reading anything
 * (the file `die` exists by then): turn 2 fails with B's exit, as it would in exec mode, and no third process
 * is started for it. */
START_TEST(test_serve_resent_once)
{
    char dir[] = "/tmp/tw-serve-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char *prog = tw_fx_build_path("examples/agents/tw-test-agent");
    char *die = wd_fmt("%s/die", dir), *gate = wd_fmt("%s/gate", dir);
    char *dier = wd_fmt("[agent.dier]\nexec = %s --exit-at-start-if %s\nmode = serve\n"
                        "step_timeout_seconds = 10\nkill_grace_seconds = 1\n",
                        prog, die);
    char *input = wd_fmt("{\"mode\":\"reply_exit\",\"n\":1,\"linger\":1,\"hold\":\"%s\"}", gate);
    Sv s = sv_start(dier);

    tw_fx_sql_exec(s.fx,
                   "SELECT tw.submit_turn('dier', 'c-' || i, CASE WHEN i = 1 THEN $1::jsonb ELSE "
                   "'{\"mode\":\"pid\"}'::jsonb END) FROM generate_series(1, 2) i ORDER BY i",
                   1, input);
    char *t1 = tw_fx_sql_str(s.fx, "SELECT turn_id::text FROM state.turns WHERE channel_id = 'c-1'", 0);
    char *t2 = tw_fx_sql_str(s.fx, "SELECT turn_id::text FROM state.turns WHERE channel_id = 'c-2'", 0);
    ck_assert(t1 && t2);
    /* A is there and holds turn 1: from now on a new process dies at once. */
    ck_assert(tw_fx_wait_until(wd_log_line_has, &(WdLogHas){s.worker, t1, "holding until"}, WD_WAIT_MS));
    FILE *f = fopen(die, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    f = fopen(gate, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    if (!wd_wait_status(s.fx, t2, "failed"))
        sv_dump(&s);
    WD_STATUS_IS(s.fx, t1, "done");
    sv_error_is(&s, t2, "agent_exit", "exited with status 3");
    ck_assert_int_eq(sv_started(&s, "agent", "--exit-at-start-if"), 2);
    unlink(die);
    unlink(gate);
    rmdir(dir);
    free(t1);
    free(t2);
    free(input);
    free(dier);
    free(gate);
    free(die);
    free(prog);
    sv_stop(&s, 0);
}
END_TEST

/* ---- max_requests
 * ----------------------------------------------------------------------------------------------- */

START_TEST(test_serve_max_requests)
{
    Sv s = sv_start("[agent.tester]\nmax_requests = 3\n");
    pid_t pids[7];
    int served[7];

    for (int i = 0; i < 7; i++)
        pids[i] = sv_pid_turn(&s, &served[i]);
    for (int i = 0; i < 7; i++) {
        ck_assert_msg(served[i] == i % 3 + 1, "turn %d was request %d of its process", i, served[i]);
        if (i % 3)
            ck_assert_int_eq(pids[i], pids[i - 1]);
        else if (i)
            ck_assert_int_ne(pids[i], pids[i - 1]);
    }
    ck_assert_int_eq(sv_started(&s, "agent", "tw-test-agent"), 3);
    /* A replaced process is let go politely (EOF on stdin) and ends. */
    ck_assert(tw_fx_wait_until(wd_pid_gone, &pids[0], WD_WAIT_MS));
    ck_assert(tw_fx_wait_until(wd_pid_gone, &pids[3], WD_WAIT_MS));
    sv_stop(&s, pids[6]);
}
END_TEST

/* ---- fencing
 * ---------------------------------------------------------------------------------------------------- */

/* A reply that comes after the step's time limit (the program ignores SIGTERM and answers during the grace
 * period) is not applied: the step fails with step_timeout and the reply goes with the process. */
START_TEST(test_serve_late_reply_discarded)
{
    Sv s = sv_serving("[agent.tester]\nstep_timeout_seconds = 1\nkill_grace_seconds = 4\n");

    char *t = sv_failure(&s, "{\"mode\":\"sleep\",\"seconds\":2,\"ignore_term\":true}", "step_timeout",
                         "did not reply within its 1 second limit", false, NULL);
    /* SIGTERM did not stop it; it replied at 2 s and then, its stdin closed, exited by itself before the
     * SIGKILL due at 5 s: the worker read that reply and dropped it. */
    char *log = tw_fx_proc_log(s.worker);
    ck_assert_msg(!strstr(log, "sending SIGKILL"), "the program did not reply during its grace period");
    free(log);
    char *st = tw_fx_sql_str(s.fx, "SELECT status || ' ' || error FROM state.turns WHERE turn_id = $1", 1, t);
    ck_assert_str_eq(st, "failed step_timeout");
    ck_assert_uint_eq(wd_task_events(s.ev, t), 1);
    /* No deliverable card: the late reply's output went nowhere. */
    ck_assert_int_eq(tw_fx_sql_int(s.fx, "SELECT count(*) FROM state.cards WHERE turn_id = $1", 1, t), 0);
    free(st);
    free(t);
    sv_stop(&s, s.pid);
}
END_TEST

/* Worker A's serve process is working on a step when A freezes; worker B (exec mode) takes the turn over
 * after the lease and completes it. A's process then replies, A wakes up: the reply changes nothing. */
START_TEST(test_serve_stale_reply_fenced)
{
    /* The lease (2.1) runs out long before the PMO would reap the turn (2.6). */
    static const char leases[] = "[pmo]\nactive_reap_seconds = 120\n"
                                 "[worker]\ninbox_processing_timeout_seconds = 3\n";
    char *ovr_a = wd_fmt("%s[agent.tester]\nstep_timeout_seconds = 60\n", leases);
    char *ovr_b = wd_fmt("%s[agent.tester]\nmode = exec\nstep_timeout_seconds = 60\n", leases);
    Sv s = sv_start(ovr_a);
    char *gate = wd_fmt("%s/gate", tw_fx_dir(s.fx));
    char *input = wd_fmt("{\"mode\":\"pid\",\"hold\":\"%s\"}", gate);
    const char *cfg_b = tw_fx_write_config(s.fx, "b.ini", ovr_b);

    char *t = wd_submit(s.fx, "tester", input);
    ck_assert(tw_fx_sql_wait(s.fx, WD_WAIT_MS, "running", "SELECT status FROM state.turns WHERE turn_id = $1",
                             1, t));
    ck_assert(
        tw_fx_wait_until(wd_log_line_has, &(WdLogHas){s.worker, "agent serve pid=", "started"}, WD_WAIT_MS));
    ck_assert(tw_fx_proc_freeze(s.worker));
    TwFxProc *b = tw_fx_start_worker(s.fx, cfg_b);
    /* B claims the turn once A's lease has run out (inbox_processing_timeout_seconds), and waits at the gate
     * too; opening it lets both replies go, A's into the pipe of its frozen worker. */
    if (!tw_fx_wait_until(wd_log_line_has, &(WdLogHas){b, "agent=tester", "claimed"}, 30000)) {
        char *log = tw_fx_proc_log(b);
        fprintf(stderr, "---- worker b\n%s\n", log);
        free(log);
        ck_abort_msg("worker b never claimed turn %s", t);
    }
    FILE *f = fopen(gate, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    WD_STATUS_IS(s.fx, t, "done");
    ck_assert(tw_fx_events_wait(s.ev, NULL, t, 1, WD_WAIT_MS));
    int64_t outbox = tw_fx_sql_int(s.fx, "SELECT count(*) FROM state.outbox WHERE turn_id = $1", 1, t);
    int64_t cards = tw_fx_sql_int(s.fx, "SELECT count(*) FROM state.cards WHERE turn_id = $1", 1, t);
    ck_assert(tw_fx_proc_thaw(s.worker));
    /* A reads its process's reply or learns from its heartbeat that it lost the claim: either way it drops
     * the output. */
    ck_assert_msg(tw_fx_wait_until(wd_log_line_has, &(WdLogHas){s.worker, t, "dropped"}, WD_WAIT_MS) ||
                      tw_fx_wait_until(wd_log_line_has, &(WdLogHas){s.worker, t, "lost its claim"}, 100),
                  "the stale worker never dropped the output of turn %s", t);
    tw_fx_sleep_ms(500); /* anything it might still do would show by now */
    json_t *out = sv_output(&s, t);
    ck_assert_msg(json_is_false(json_object_get(out, "serving")),
                  "the stale serve process's reply was applied");
    json_decref(out);
    ck_assert_int_eq(tw_fx_sql_int(s.fx, "SELECT count(*) FROM state.outbox WHERE turn_id = $1", 1, t),
                     outbox);
    ck_assert_int_eq(tw_fx_sql_int(s.fx, "SELECT count(*) FROM state.cards WHERE turn_id = $1", 1, t), cards);
    ck_assert_uint_eq(wd_task_events(s.ev, t), 1);
    ck_assert(tw_fx_proc_alive(s.worker));
    ck_assert_int_eq(tw_fx_proc_terminate(b, 15000), 0);
    free(t);
    free(input);
    free(gate);
    free(ovr_a);
    free(ovr_b);
    sv_stop(&s, 0);
}
END_TEST

/* ---- tools
 * ------------------------------------------------------------------------------------------------------ */

/* A serve-mode tool: reused across calls; one that outlives its call's time limit is reported as
 * tool_timeout (as in exec mode) and replaced; the turn goes on. */
START_TEST(test_serve_tool)
{
    Sv s = sv_start("[tool.sleep]\nmax_requests = 100\n");
    char *t = sv_turn(&s, "tester",
                      "{\"mode\":\"tools\",\"rounds\":3,\"calls\":[{\"id\":\"s\",\"tool\":\"sleep\","
                      "\"args\":{\"seconds\":0}}]}",
                      "done");
    ck_assert_int_eq(sv_started(&s, "tool", "tw-sleep-tool"), 1);
    free(t);

    t = sv_turn(
        &s, "tester",
        "{\"mode\":\"tools\",\"calls\":[{\"id\":\"slow\",\"tool\":\"sleep\",\"args\":{\"seconds\":30},"
        "\"timeout_seconds\":1}]}",
        "done");
    json_t *out = sv_output(&s, t);
    json_t *r = json_array_get(json_array_get(json_object_get(out, "tool_results"), 0), 0);
    ck_assert_str_eq(json_string_value(json_object_get(r, "status")), "timeout");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(r, "error"), "code")), "tool_timeout");
    json_decref(out);
    free(t);

    t = sv_turn(&s, "tester",
                "{\"mode\":\"tools\",\"calls\":[{\"id\":\"s\",\"tool\":\"sleep\",\"args\":{\"seconds\":0}}]}",
                "done");
    out = sv_output(&s, t);
    r = json_array_get(json_array_get(json_object_get(out, "tool_results"), 0), 0);
    ck_assert_str_eq(json_string_value(json_object_get(r, "status")), "ok");
    json_decref(out);
    ck_assert_int_eq(sv_started(&s, "tool", "tw-sleep-tool"), 2);
    free(t);
    sv_stop(&s, 0);
}
END_TEST

TW_SUITE_DEFINE(serve, {
                           {"serve_reuse", test_serve_reuse, 120},
                           {"serve_crash", test_serve_crash, 120},
                           {"serve_hang", test_serve_hang, 120},
                           {"serve_bad_lines", test_serve_bad_lines, 120},
                           {"serve_max_requests", test_serve_max_requests, 120},
                           {"serve_late_reply_discarded", test_serve_late_reply_discarded, 120},
                           {"serve_stale_reply_fenced", test_serve_stale_reply_fenced, 120},
                           {"serve_tool", test_serve_tool, 120},
                           {"serve_between_requests", test_serve_exit_after_reply, 120},
                           {"serve_between_requests", test_serve_stray_line_after_reply, 120},
                           {"serve_between_requests", test_serve_resent_once, 120},
                       })
