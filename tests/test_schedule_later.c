/* test_schedule_later.c — turns that run later (docs/schedules.md, "Later"): `submit --in/--at` waits pending
 * (reason scheduled) and is dispatched at its time by the due-time machinery, with both daemons'
 * watchdog_interval_seconds at 30 s (so a dispatch within a few seconds of its time can only come from the
 * due timer); the agent's other turns pass it; its deadline counts from its time; cancel works while it
 * waits; a PMO down across its time dispatches it when it comes back. Times are the database's, as recorded.
 */
#include <libpq-fe.h>
#include <unistd.h>

#include "turn_helpers.h"
#include "suite.h"

static const char later_overrides[] = "[pmo]\n"
                                      "watchdog_interval_seconds = 30\n"
                                      "[worker]\n"
                                      "watchdog_interval_seconds = 30\n";

/* `turnwatch submit --json --agent AGENT --channel chan-1 --input INPUT OPT VAL [OPT2 VAL2]`: the turn id. */
static char *later_submit(TwFx *fx, const char *agent, const char *input, const char *opt, const char *val,
                          const char *opt2, const char *val2)
{
    char *out = NULL, *err = NULL;
    int rc = tw_fx_cli(fx, &out, &err, "submit", "--json", "--agent", agent, "--channel", "chan-1", "--input",
                       input, opt, val, opt2, val2, NULL);
    ck_assert_msg(rc == 0, "submit exited %d: %s", rc, err);
    json_t *j = json_loads(out, 0, NULL);
    ck_assert_ptr_nonnull(j);
    char *id = strdup(json_string_value(json_object_get(j, "turn_id")));
    json_decref(j);
    free(out);
    free(err);
    return id;
}

/* `turnwatch turn show ID --json`'s field (malloc'd; NULL when null or absent). */
static char *later_show(TwFx *fx, const char *turn, const char *field)
{
    char *out = NULL, *err = NULL;
    int rc = tw_fx_cli(fx, &out, &err, "turn", "show", turn, "--json", NULL);
    ck_assert_msg(rc == 0, "turn show exited %d: %s", rc, err);
    json_t *j = json_loads(out, 0, NULL);
    ck_assert_ptr_nonnull(j);
    const char *v = json_string_value(json_object_get(j, field));
    char *r = v ? strdup(v) : NULL;
    json_decref(j);
    free(out);
    free(err);
    return r;
}

START_TEST(test_in_dispatched_at_its_time)
{
    TwFx *fx = wd_fixture(later_overrides);
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, NULL);

    char *later = later_submit(fx, "echo", "{\"n\":1}", "--in", "2s", NULL, NULL);
    char *now = wd_submit(fx, "echo", "{\"n\":2}");
    /* Waiting, and saying why; the turn submitted after it is not held behind it. */
    char *reason = later_show(fx, later, "pending_reason");
    ck_assert_msg(reason && strcmp(reason, "scheduled") == 0, "pending_reason %s",
                  reason ? reason : "(null)");
    free(reason);
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turns WHERE turn_id = $1 AND status = 'pending' "
                      "AND not_before BETWEEN created_at + interval '1.9 s' AND created_at + "
                      "interval '2.1 s'",
                      1, later),
        1);
    WD_STATUS_WITHIN(fx, now, "done", 20000);
    WD_STATUS_WITHIN(fx, later, "done", 20000);
    /* Not before its time, and by its timer, not a sweep (30 s) late. */
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turns WHERE turn_id = $1 "
                      "AND dispatched_at >= not_before AND dispatched_at < not_before + interval "
                      "'5 s'",
                      1, later),
        1);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turns a, state.turns b WHERE a.turn_id = $1 "
                                   "AND b.turn_id = $2 AND b.dispatched_at < a.dispatched_at",
                                   2, later, now),
                     1);
    json_t *all = wd_actions_of(&pmo, 1, "retry_due");
    json_t *acts = wd_actions_where(all, "turn_id", later);
    json_decref(all);
    ck_assert_int_eq(json_array_size(acts), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(acts, 0), "timer")), "not_before");
    json_decref(acts);
    free(later);
    free(now);
    tw_fx_free(fx);
}
END_TEST

START_TEST(test_deadline_counts_from_its_time)
{
    TwFx *fx = wd_fixture(later_overrides);
    tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, NULL);

    char *at = tw_fx_sql_str(fx,
                             "SELECT to_char((now() + interval '3 s') AT TIME ZONE 'UTC', "
                             "'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')",
                             0);
    char *turn =
        later_submit(fx, "tester", "{\"mode\":\"sleep\",\"seconds\":30}", "--at", at, "--timeout", "2");
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turns WHERE turn_id = $1 "
                      "AND deadline_at = not_before + interval '2 s' AND not_before = $2::timestamptz",
                      2, turn, at),
        1);
    WD_STATUS_WITHIN(fx, turn, "timeout", 30000);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turns WHERE turn_id = $1 AND "
                                   "error = 'turn_deadline_exceeded' AND started_at >= not_before "
                                   "AND ended_at >= not_before + interval '2 s'",
                                   1, turn),
                     1);
    free(at);
    free(turn);
    tw_fx_free(fx);
}
END_TEST

START_TEST(test_cancel_while_waiting)
{
    TwFx *fx = wd_fixture(later_overrides);
    tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, NULL);

    char *turn = later_submit(fx, "echo", "{}", "--in", "1h30m", NULL, NULL);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turns WHERE turn_id = $1 "
                                   "AND not_before = created_at + interval '90 minutes'",
                                   1, turn),
                     1);
    char *out = NULL, *err = NULL;
    int rc = tw_fx_cli(fx, &out, &err, "cancel", turn, NULL);
    ck_assert_msg(rc == 0, "cancel exited %d: %s", rc, err);
    free(out);
    free(err);
    WD_STATUS_WITHIN(fx, turn, "cancelled", 10000);
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT (SELECT count(*) FROM state.turn_timers WHERE turn_id = $1) + "
                      "(SELECT count(*) FROM state.turn_queue WHERE turn_id = $1) + "
                      "(SELECT count(*) FROM state.turns WHERE turn_id = $1 AND dispatched_at IS NOT "
                      "NULL)",
                      1, turn),
        0);
    /* Bad times are refused before the database. */
    rc = tw_fx_cli(fx, &out, &err, "submit", "--agent", "echo", "--channel", "c", "--in", "2x", NULL);
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(err, "--in must be a duration"), "%s", err);
    free(out);
    free(err);
    rc = tw_fx_cli(fx, &out, &err, "submit", "--agent", "echo", "--channel", "c", "--at", "2026-12-01 09:00",
                   NULL);
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(err, "--at must be an ISO 8601 time"), "%s", err);
    free(out);
    free(err);
    free(turn);
    tw_fx_free(fx);
}
END_TEST

START_TEST(test_pmo_down_across_its_time)
{
    TwFx *fx = wd_fixture(later_overrides);
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, NULL);

    char *turn = later_submit(fx, "echo", "{}", "--in", "2s", NULL, NULL);
    ck_assert_int_eq(tw_fx_proc_terminate(pmo, 10000), 0);
    tw_fx_sleep_ms(3500);
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turns WHERE turn_id = $1 AND status = 'pending' "
                      "AND not_before < now()",
                      1, turn),
        1);
    char *back = tw_fx_sql_str(fx, "SELECT now()::text", 0);
    tw_fx_start_pmo(fx, NULL);
    WD_STATUS_WITHIN(fx, turn, "done", 20000);
    /* At once, at its start-up: not a sweep (30 s) later. */
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turns WHERE turn_id = $1 "
                                   "AND dispatched_at >= $2::timestamptz "
                                   "AND dispatched_at < $2::timestamptz + interval '15 s'",
                                   2, turn, back),
                     1);
    free(back);
    free(turn);
    tw_fx_free(fx);
}
END_TEST

/* The set-based submit takes not_befores too, in step with tw.submit_turn. */
START_TEST(test_submit_turns_not_before)
{
    TwFx *fx = wd_fixture(later_overrides);
    tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, NULL);
    tw_fx_sql_exec(fx, "SELECT tw.add_agent('echo2', 'echo')", 0);

    char *ids = tw_fx_sql_str(fx,
                              "SELECT string_agg(turn_id::text, ',') FROM tw.submit_turns("
                              "ARRAY['echo', 'echo2'], ARRAY['c', 'c'], ARRAY['{}'::jsonb, '{}'], "
                              "ARRAY[5, NULL]::integer[], NULL, NULL, NULL, "
                              "ARRAY[now() + interval '2 s', NULL]::timestamptz[])",
                              0);
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turns t JOIN state.turn_timers x "
                      "ON x.turn_id = t.turn_id AND x.kind = 'not_before' AND x.due_at = t.not_before "
                      "WHERE t.agent = 'echo' AND t.deadline_at = t.not_before + interval '5 s'",
                      0),
        1);
    /* Twenty more agents' turns due at one instant: dispatched together by the rule, each at its time. */
    tw_fx_sql_exec(fx, "SELECT count(tw.add_agent('l' || i, 'echo')) FROM generate_series(1, 20) i", 0);
    tw_fx_sql_exec(
        fx,
        "SELECT count(*) FROM tw.submit_turns(ARRAY(SELECT 'l' || i FROM generate_series(1, 20) i), "
        "array_fill('c'::text, ARRAY[20]), array_fill('{}'::jsonb, ARRAY[20]), NULL, NULL, NULL, NULL, "
        "array_fill(now() + interval '2 s', ARRAY[20]))",
        0);
    ck_assert_msg(tw_fx_sql_wait(fx, 30000, "22",
                                 "SELECT count(*) FROM state.turns WHERE status = 'done' AND "
                                 "dispatched_at >= coalesce(not_before, created_at)",
                                 0),
                  "every turn done, the later ones not before their time: %s", ids);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turns WHERE agent LIKE 'l%' "
                                   "AND dispatched_at < not_before + interval '10 s'",
                                   0),
                     20);
    free(ids);
    tw_fx_free(fx);
}
END_TEST

Suite *schedule_later_suite(void)
{
    Suite *s = suite_create("schedule_later");
    TCase *tc = tcase_create("later");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_in_dispatched_at_its_time);
    tcase_add_test(tc, test_deadline_counts_from_its_time);
    tcase_add_test(tc, test_cancel_while_waiting);
    tcase_add_test(tc, test_pmo_down_across_its_time);
    tcase_add_test(tc, test_submit_turns_not_before);
    suite_add_tcase(s, tc);
    return s;
}
