/* test_cancel.c — `turnwatch cancel` (issue 5, contract section 2): a running, a suspended and a pending turn
 * end `cancelled` with the output contract of a forced end; an ended turn is left alone; a frozen worker's
 * late output of a cancelled turn has no effect; a cancel racing a completion leaves exactly one terminal
 * state and one final event. Real PostgreSQL, nats-server and daemons. */
#include "turn_helpers.h"
#include "suite.h"

#include <sys/wait.h>

static const char cx_overrides[] =
    "[pmo]\nwatchdog_interval_seconds = 1\ndispatched_retry_seconds = 30\ndispatched_timeout_seconds = 60\n"
    "pending_wakeup_seconds = 60\npending_wakeup_skip_seconds = 300\nactive_reap_seconds = 60\n"
    "[worker]\nheartbeat_seconds = 1\n";

/* `turnwatch cancel ID` (with --json when json is true); returns the exit code, stdout and stderr. */
static int cx_cancel(TwFx *fx, const char *turn, bool json, char **out, char **err)
{
    return json ? tw_fx_cli(fx, out, err, "cancel", "--json", turn, NULL)
                : tw_fx_cli(fx, out, err, "cancel", turn, NULL);
}

static int64_t cx_outbox(TwFx *fx, const char *turn)
{
    return tw_fx_sql_int(fx, "SELECT count(*) FROM state.outbox WHERE turn_id = $1", 1, turn);
}

/* ---- a running turn, with its worker frozen until its program has answered
 * ------------------------------------- */

START_TEST(test_cancel_running)
{
    TwFxStack st = tw_fx_stack_start_events(cx_overrides, "evt.>");
    char *t1 = tw_fx_keep(
        st.fx, wd_submit_full(st.fx, "tester", "{\"mode\":\"sleep\",\"seconds\":1.5}", "box-c", NULL));
    char *t2 =
        tw_fx_keep(st.fx, wd_submit(st.fx, "tester", "{\"mode\":\"complete\",\"output\":{\"next\":true}}"));
    WD_STATUS_IS(st.fx, t1, "running");
    int64_t epoch = tw_fx_sql_int(st.fx, "SELECT turn_epoch FROM state.turns WHERE turn_id = $1", 1, t1);
    /* Freeze the worker so that the program's answer arrives after the cancel, whatever the timing. */
    ck_assert(tw_fx_proc_freeze(st.worker));

    char *out = NULL, *err = NULL;
    int rc = cx_cancel(st.fx, t1, false, &out, &err);
    ck_assert_msg(rc == 0, "cancel exited %d: %s", rc, err);
    ck_assert_ptr_nonnull(strstr(out, "cancelled"));
    free(out);
    free(err);
    free(wd_check_forced_end(st.fx, st.ev, t1, "cancelled", "cancelled", "box-c", epoch));
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.force_terminations WHERE turn_id = $1 AND "
                                   "detail ->> 'status_before' = 'running'",
                                   1, t1),
                     1);
    WD_STATUS_IS(st.fx, t2, "dispatched");

    /* The program answers while its worker is frozen; the worker wakes up and must drop that answer. */
    pid_t wpid = tw_fx_proc_pid(st.worker);
    ck_assert(tw_fx_wait_until(wd_children_exited, &wpid, WD_WAIT_MS));
    int64_t outbox = cx_outbox(st.fx, t1);
    int64_t cards = tw_fx_sql_int(st.fx, "SELECT count(*) FROM state.cards WHERE turn_id = $1", 1, t1);
    size_t seen = tw_fx_events_count_if(st.ev, wd_is_turn, t1);
    ck_assert(tw_fx_proc_thaw(st.worker));
    WD_STATUS_IS(st.fx, t2, "done");
    ck_assert_msg(tw_fx_wait_until(wd_log_line_has, &(WdLogHas){st.worker, t1, "dropped"}, WD_WAIT_MS),
                  "the worker never said it dropped the cancelled turn's output");
    tw_fx_sleep_ms(300);
    ck_assert_int_eq(cx_outbox(st.fx, t1), outbox);
    ck_assert_int_eq(tw_fx_sql_int(st.fx, "SELECT count(*) FROM state.cards WHERE turn_id = $1", 1, t1),
                     cards);
    ck_assert_uint_eq(tw_fx_events_count_if(st.ev, wd_is_turn, t1), seen);

    /* Cancelling an ended turn says so and changes nothing: the cancelled one, and the done one. */
    rc = cx_cancel(st.fx, t1, false, &out, &err);
    ck_assert_int_eq(rc, 1);
    ck_assert_ptr_nonnull(strstr(err, "already ended (cancelled)"));
    free(out);
    free(err);
    ck_assert(tw_fx_events_wait(st.ev, "evt.agent.*.task", t2, 1, WD_WAIT_MS));
    int64_t outbox2 = cx_outbox(st.fx, t2);
    char *updated = tw_fx_keep(
        st.fx, tw_fx_sql_str(st.fx, "SELECT updated_at::text FROM state.turns WHERE turn_id = $1", 1, t2));
    rc = cx_cancel(st.fx, t2, true, &out, &err);
    ck_assert_int_eq(rc, 1);
    ck_assert_ptr_nonnull(strstr(err, "already ended (done)"));
    json_t *j = json_loads(out, 0, NULL);
    ck_assert_msg(j, "cancel --json printed %s", out);
    ck_assert_str_eq(json_string_value(json_object_get(j, "result")), "already_ended");
    ck_assert_str_eq(json_string_value(json_object_get(j, "status")), "done");
    json_decref(j);
    free(out);
    free(err);
    ck_assert_int_eq(
        tw_fx_sql_int(st.fx,
                      "SELECT count(*) FROM state.turns WHERE turn_id = $1 AND status = 'done' AND "
                      "error IS NULL AND updated_at::text = $2",
                      2, t2, updated),
        1);
    ck_assert_int_eq(cx_outbox(st.fx, t2), outbox2);
    ck_assert_int_eq(
        tw_fx_sql_int(st.fx, "SELECT count(*) FROM state.force_terminations WHERE turn_id = $1", 1, t2), 0);
    ck_assert_int_eq(cx_outbox(st.fx, t1), outbox);
    /* A turn that does not exist is a usage error. */
    rc = cx_cancel(st.fx, "00000000-0000-4000-8000-000000000000", false, &out, &err);
    ck_assert_int_eq(rc, 2);
    free(out);
    free(err);
    tw_fx_sleep_ms(300);
    ck_assert_uint_eq(wd_task_events(st.ev, t1), 1);
    ck_assert_uint_eq(wd_task_events(st.ev, t2), 1);
    wd_done(st.fx);
}
END_TEST

/* ---- a suspended turn and the pending one behind it
 * -------------------------------------------------------------- */

START_TEST(test_cancel_suspended_and_pending)
{
    TwFxStack st = tw_fx_stack_start_events(cx_overrides, "evt.>");
    char *t1 = wd_submit(st.fx, "tester",
                         "{\"mode\":\"tools\",\"calls\":[{\"id\":\"e1\",\"tool\":\"ext\",\"args\":{}},"
                         "{\"id\":\"s1\",\"tool\":\"sleep\",\"args\":{\"seconds\":30}}]}");
    WD_STATUS_IS(st.fx, t1, "suspended");
    int64_t epoch = tw_fx_sql_int(st.fx, "SELECT turn_epoch FROM state.turns WHERE turn_id = $1", 1, t1);
    char *t2 = wd_submit(st.fx, "tester", "{\"mode\":\"complete\"}");
    char *t3 = wd_submit(st.fx, "tester", "{\"mode\":\"complete\"}");
    WD_STATUS_IS(st.fx, t2, "pending");

    char *out = NULL, *err = NULL;
    ck_assert_int_eq(cx_cancel(st.fx, t2, false, &out, &err), 0);
    free(out);
    free(err);
    free(wd_check_forced_end(st.fx, st.ev, t2, "cancelled", "cancelled", NULL, -1));
    ck_assert_int_eq(
        tw_fx_sql_int(st.fx, "SELECT count(*) FROM state.turns WHERE turn_id = $1 AND dispatched_at IS NULL",
                      1, t2),
        1);
    /* The agent was not touched by cancelling a turn it never had. */
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.agents WHERE agent = 'tester' AND status = "
                                   "'suspended' AND active_agent_turn_id = $1",
                                   1, t1),
                     1);

    ck_assert_int_eq(cx_cancel(st.fx, t1, true, &out, &err), 0);
    json_t *j = json_loads(out, 0, NULL);
    ck_assert_str_eq(json_string_value(json_object_get(j, "result")), "cancelled");
    json_decref(j);
    free(out);
    free(err);
    free(wd_check_forced_end(st.fx, st.ev, t1, "cancelled", "cancelled", NULL, epoch));
    /* Both calls were closed as cancelled, and no inbox item is left to run. */
    char *left = tw_fx_sql_str(st.fx,
                               "SELECT (SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1 "
                               "AND wait_status = 'cancelled') || ' cancelled calls, ' || (SELECT count(*) "
                               "FROM state.agent_inbox WHERE turn_id = $1 AND status IN ('pending', "
                               "'processing')) || ' open items'",
                               1, t1);
    ck_assert_str_eq(left, "2 cancelled calls, 0 open items");
    free(left);
    /* The external tool's answer now changes nothing. */
    ck_assert_int_eq(
        tw_fx_cli(st.fx, &out, &err, "tool-result", "--turn", t1, "--call", "e1", "--output", "{}", NULL), 1);
    ck_assert_ptr_nonnull(strstr(err, "already ended"));
    free(out);
    free(err);
    /* The agent goes on with the next turn. */
    WD_STATUS_IS(st.fx, t3, "done");
    tw_fx_sleep_ms(300);
    ck_assert_uint_eq(wd_task_events(st.ev, t1), 1);
    ck_assert_uint_eq(wd_task_events(st.ev, t2), 1);
    ck_assert_uint_eq(wd_task_events(st.ev, t3), 1);
    free(t1);
    free(t2);
    free(t3);
    wd_done(st.fx);
}
END_TEST

/* ---- cancel racing completion
 * ------------------------------------------------------------------------------------ */

#define CX_RACES 30

START_TEST(test_cancel_races_completion)
{
    TwFxStack st = tw_fx_stack_start_events(cx_overrides, "evt.agent.*.task");
    int cancelled = 0, completed = 0;
    for (int i = 0; i < CX_RACES; i++) {
        /* The step takes 0.2 s; the cancel lands from 0.1 s before to 0.2 s after the program's answer. */
        char *t = wd_submit(st.fx, "tester", "{\"mode\":\"sleep\",\"seconds\":0.2}");
        /* (Polled: on a busy machine the step may be over before a poll sees it running.) */
        ck_assert(tw_fx_sql_wait(st.fx, WD_WAIT_MS, "true",
                                 "SELECT (status IN ('running', 'done'))::text FROM "
                                 "state.turns WHERE turn_id = $1",
                                 1, t));
        tw_fx_sleep_ms(100 + (i % 10) * 30);
        char *out = NULL, *err = NULL;
        int rc = cx_cancel(st.fx, t, false, &out, &err);
        ck_assert_msg(rc == 0 || rc == 1, "cancel exited %d: %s", rc, err);
        ck_assert(wd_wait_status(st.fx, t, rc == 0 ? "cancelled" : "done"));
        if (rc == 1)
            ck_assert_ptr_nonnull(strstr(err, "already ended (done)"));
        free(out);
        free(err);
        if (rc == 0)
            cancelled++;
        else
            completed++;
        ck_assert_int_eq(
            tw_fx_sql_int(st.fx, "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND kind = 'task'", 1,
                          t),
            1);
        ck_assert(tw_fx_events_wait(st.ev, NULL, t, 1, WD_WAIT_MS));
        json_t *e = tw_fx_events_get(st.ev, NULL, t, 0, NULL, NULL);
        ck_assert_str_eq(json_string_value(json_object_get(e, "status")), rc == 0 ? "cancelled" : "done");
        json_decref(e);
        /* One terminal state: a cancelled turn has no real deliverable, a done one no force termination. */
        ck_assert_int_eq(
            tw_fx_sql_int(st.fx, "SELECT count(*) FROM state.force_terminations WHERE turn_id = $1", 1, t),
            rc == 0 ? 1 : 0);
        ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                       "SELECT count(*) FROM state.cards WHERE turn_id = $1 AND card_type = "
                                       "'task.deliverable'",
                                       1, t),
                         1);
        free(t);
    }
    fprintf(stderr, "cancel racing completion: %d cancelled, %d completed first (of %d)\n", cancelled,
            completed, CX_RACES);
    tw_fx_sleep_ms(300);
    ck_assert_int_eq(
        tw_fx_sql_int(st.fx,
                      "SELECT count(*) FROM (SELECT turn_id FROM state.outbox WHERE kind = 'task' "
                      "GROUP BY turn_id HAVING count(*) <> 1) x",
                      0),
        0);
    ck_assert_uint_eq(tw_fx_events_count(st.ev, "evt.agent.*.task", NULL), CX_RACES);
    ck_assert_int_eq(tw_fx_sql_int(st.fx, "SELECT count(*) FROM state.agents WHERE status <> 'idle'", 0), 0);
    wd_done(st.fx);
}
END_TEST

/* ---- lock order: a cancel meeting a heartbeat, a tool's result and a tool claim on the same rows
 * ---------------- */

/* Sessions waiting for a lock (the fixture's own session holds the row that makes them queue). */
static bool cx_waiters(TwFx *fx, int n, int timeout_ms)
{
    int64_t end = tw_fx_now_ms() + timeout_ms;
    do {
        if (tw_fx_sql_int(fx, "SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted", 0) >= n)
            return true;
        tw_fx_sleep_ms(20);
    } while (tw_fx_now_ms() < end);
    return false;
}

static TwFxProc *cx_cancel_async(TwFx *fx, const char *turn)
{
    const char *argv[] = {tw_fx_cli_path(), "-c", tw_fx_config_path(fx), "cancel", turn, NULL};
    return tw_fx_spawn(fx, "cancel", argv);
}

static void cx_cancel_exits_0(TwFx *fx, TwFxProc *c)
{
    int status = 0;
    ck_assert(tw_fx_proc_wait(c, WD_WAIT_MS, &status));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char *log = tw_fx_proc_log(c);
        fprintf(stderr, "cancel failed (status %d): %s", status, log);
        wd_assert_no_deadlock(fx);
        ck_abort_msg("cancel failed (status %d): %s", status, log);
    }
}

/* Each time the fixture's session holds a row so that the cancel and a worker's transaction queue behind it
 * in the order that would close a cycle if either took its locks out of order (agent, turn, waiting rows,
 * inbox rows). */
START_TEST(test_cancel_lock_order)
{
    TwFx *fx = wd_fixture(cx_overrides);
    tw_fx_start_pmo(fx, NULL);
    /* Worker A serves the agent only, so that a tool call waits in the inbox until worker B comes. */
    const char *cfg_a = tw_fx_write_config(fx, "a.ini", "[worker]\nheartbeat_seconds = 1\nagents = tester\n");
    const char *cfg_b = tw_fx_write_config(fx, "b.ini", "[worker]\nheartbeat_seconds = 1\nagents = sleep\n");
    tw_fx_start_worker(fx, cfg_a);

    /* A heartbeat of a running step queues first on the turn row, then the cancel. */
    char *t1 = wd_submit(fx, "tester", "{\"mode\":\"sleep\",\"seconds\":30}");
    WD_STATUS_IS(fx, t1, "running");
    tw_fx_sql_exec(fx, "BEGIN", 0);
    tw_fx_sql_exec(fx, "SELECT 1 FROM state.turns WHERE turn_id = $1 FOR UPDATE", 1, t1);
    ck_assert_msg(cx_waiters(fx, 1, WD_WAIT_MS), "the heartbeat never queued on the turn row");
    TwFxProc *c = cx_cancel_async(fx, t1);
    ck_assert(cx_waiters(fx, 2, WD_WAIT_MS));
    tw_fx_sql_exec(fx, "COMMIT", 0);
    cx_cancel_exits_0(fx, c);
    WD_STATUS_IS(fx, t1, "cancelled");

    /* A tool call waits in the inbox; the cancel queues on its waiting row, then worker B's claim of the
     * call. */
    char *t2 = wd_submit(fx, "tester",
                         "{\"mode\":\"tools\",\"calls\":[{\"id\":\"s1\",\"tool\":\"sleep\","
                         "\"args\":{\"seconds\":3}}]}");
    WD_STATUS_IS(fx, t2, "suspended");
    tw_fx_sql_exec(fx, "BEGIN", 0);
    tw_fx_sql_exec(fx, "SELECT 1 FROM state.turn_waiting_tools WHERE turn_id = $1 FOR UPDATE", 1, t2);
    c = cx_cancel_async(fx, t2);
    ck_assert(cx_waiters(fx, 1, WD_WAIT_MS));
    TwFxProc *b = tw_fx_start_worker(fx, cfg_b);
    /* (A claim that never waits here is the point; give one that does the time to queue.) */
    bool queued = cx_waiters(fx, 2, 3000);
    tw_fx_sql_exec(fx, "COMMIT", 0);
    cx_cancel_exits_0(fx, c);
    WD_STATUS_IS(fx, t2, "cancelled");
    fprintf(stderr, "tool claim %s behind the cancel\n", queued ? "queued" : "did not queue");

    /* A tool's result arrives while the cancel waits for the turn row. */
    char *t3 = wd_submit(fx, "tester",
                         "{\"mode\":\"tools\",\"calls\":[{\"id\":\"s1\",\"tool\":\"sleep\","
                         "\"args\":{\"seconds\":2}}]}");
    WD_STATUS_IS(fx, t3, "suspended");
    ck_assert(tw_fx_sql_wait(fx, WD_WAIT_MS, "processing",
                             "SELECT status FROM state.agent_inbox WHERE turn_id = $1 "
                             "AND message_type = 'tool.call'",
                             1, t3));
    tw_fx_sql_exec(fx, "BEGIN", 0);
    tw_fx_sql_exec(fx, "SELECT 1 FROM state.turns WHERE turn_id = $1 FOR UPDATE", 1, t3);
    c = cx_cancel_async(fx, t3);
    ck_assert(cx_waiters(fx, 1, WD_WAIT_MS));
    ck_assert_msg(cx_waiters(fx, 2, WD_WAIT_MS), "the tool's result never queued behind the cancel");
    tw_fx_sql_exec(fx, "COMMIT", 0);
    cx_cancel_exits_0(fx, c);
    WD_STATUS_IS(fx, t3, "cancelled");
    ck_assert(tw_fx_wait_until(wd_log_line_has, &(WdLogHas){b, "result not used", NULL}, WD_WAIT_MS));
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.cards WHERE turn_id = $1 AND card_type = "
                                   "'tool.result'",
                                   1, t3),
                     0);
    free(t1);
    free(t2);
    free(t3);
    wd_done(fx);
}
END_TEST

TW_SUITE_DEFINE(cancel, {
                            {"running", test_cancel_running, 90},
                            {"suspended_and_pending", test_cancel_suspended_and_pending, 90},
                            {"lock_order", test_cancel_lock_order, 90},
                            {"races_completion", test_cancel_races_completion, 120},
                        })
