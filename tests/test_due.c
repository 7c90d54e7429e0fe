/* test_due.c — contract section 9: every rule fires at its due time, not at the next sweep (both daemons'
 * watchdog_interval_seconds is 30 s here, so an action within a couple of seconds of its due time can only
 * come from the due-time timer and the wake-ups); a worker that dies is handed back within a second or two
 * through its liveness lock, whatever the lease length, while a frozen one is still left to the leases; and
 * after a database outage nobody is judged by heartbeats before the others could write again. Real
 * PostgreSQL, nats-server and daemons. Lateness per action is printed as "MEASURE ..." lines. */
#include <libpq-fe.h>
#include <signal.h>
#include <unistd.h>

#include "turn_helpers.h"
#include "suite.h"

/* Far below the 30 s sweep, and loose enough for a loaded machine running sanitizer builds. The figures
 * themselves (a few ms) are the benchmark's business (tools/bench lag). */
#define DUE_LATE_OK_MS 2000

static const char due_overrides[] = "[pmo]\n"
                                    "watchdog_interval_seconds = 30\n"
                                    "dispatched_retry_seconds = 2\n"
                                    "dispatched_timeout_seconds = 4\n"
                                    "pending_wakeup_seconds = 2\n"
                                    "pending_wakeup_skip_seconds = 60\n"
                                    "active_reap_seconds = 6\n"
                                    "[worker]\n"
                                    "watchdog_interval_seconds = 30\n"
                                    "inbox_processing_timeout_seconds = 3\n"
                                    "heartbeat_seconds = 1\n"
                                    "suspend_timeout_seconds = 2\n"
                                    "agents = echo,tester,slow\n"
                                    "[tool.ext]\n"
                                    "timeout_seconds = 2\n"
                                    "suspend_timeout_seconds = 2\n";

static bool due_file_exists(void *path)
{
    return access(path, F_OK) == 0;
}

static char *due_fixture_config(void)
{
    char *agent = tw_fx_build_path("examples/agents/tw-test-agent");
    char *echo = tw_fx_build_path("examples/agents/tw-echo-agent");
    char *ovr = wd_fmt("%s[agent.slow]\nexec = %s\nstep_timeout_seconds = 1\nkill_grace_seconds = 1\n"
                       "[agent.orphan]\nexec = %s\n[agent.orphan2]\nexec = %s\n"
                       "[agent.frozen]\nexec = %s\n[agent.frozen2]\nexec = %s\n",
                       due_overrides, agent, echo, echo, agent, agent);
    free(agent);
    free(echo);
    return ovr;
}

/* The one action of `rule` about `turn` in the logs of procs, checked for lateness; NULL-safe output. */
static void due_one_action(TwFxProc *const *procs, size_t n, const char *rule, const char *turn)
{
    json_t *all = wd_actions_of(procs, n, rule);
    json_t *mine = wd_actions_where(all, "turn_id", turn);
    ck_assert_msg(json_array_size(mine) >= 1, "rule %s never acted on %s", rule, turn);
    wd_report_delays(rule, mine, DUE_LATE_OK_MS);
    json_decref(mine);
    json_decref(all);
}

/* ---- the PMO's rules: 2.4, 2.5, 2.7 and a turn deadline, with a 30 s sweep
 * -----------------------------------------------------------------------------------------------------------
 */

START_TEST(test_pmo_rules_at_due_time)
{
    char *ovr = due_fixture_config();
    TwFx *fx = wd_fixture(ovr);
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, NULL);

    /* No worker serves orphan: its turn is dispatched, re-rung (2.4) and its envelope re-rung (2.7) at 2 s,
     * then reaped (2.5) at 4 s. orphan2's turn has a 2 s deadline and ends before its 2.5. */
    char *t1 = wd_submit(fx, "orphan", "{}");
    char *t2 = wd_submit_full(fx, "orphan2", "{}", NULL, "2");
    WD_STATUS_IS(fx, t2, "timeout");
    WD_STATUS_IS(fx, t1, "timeout");
    char *err = tw_fx_sql_str(fx, "SELECT error FROM state.turns WHERE turn_id = $1", 1, t1);
    ck_assert_str_eq(err, "dispatch_timeout");
    free(err);
    err = tw_fx_sql_str(fx, "SELECT error FROM state.turns WHERE turn_id = $1", 1, t2);
    ck_assert_str_eq(err, "turn_deadline_exceeded");
    free(err);
    due_one_action(&pmo, 1, "2.4 rering_dispatched", t1);
    due_one_action(&pmo, 1, "2.5 reap_dispatched", t1);
    due_one_action(&pmo, 1, "2.7 rering_pending", t1);
    due_one_action(&pmo, 1, "turn_deadline", t2);
    /* Both ended by their rule within seconds of the due time, long before the first sweep (30 s). */
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turns WHERE turn_id IN ($1, $2) "
                                   "AND ended_at < created_at + interval '10 seconds'",
                                   2, t1, t2),
                     2);
    free(t1);
    free(t2);
    free(ovr);
    tw_fx_free(fx);
}
END_TEST

/* ---- every dispatch arms the PMO's rules at once, whoever makes it (a 3 s dispatch timeout, a 30 s sweep)
 * -----------------------------------------------------------------------------------------------------------
 */

/* The turn ended by 2.5 (dispatch_timeout) within a few seconds after its dispatch + 3 s: by the due-time
 * timer, not by the first sweep (30 s after the PMO started). */
static void due_reaped_in_time(TwFx *fx, const char *what, const char *turn)
{
    WD_STATUS_WITHIN(fx, turn, "timeout", 45000);
    char *err = tw_fx_sql_str(fx, "SELECT error FROM state.turns WHERE turn_id = $1", 1, turn);
    ck_assert_str_eq(err, "dispatch_timeout");
    free(err);
    char *after =
        tw_fx_sql_str(fx,
                      "SELECT round(extract(epoch FROM ended_at - dispatched_at)::numeric, 1)::text "
                      "FROM state.turns WHERE turn_id = $1",
                      1, turn);
    fprintf(stderr, "MEASURE %s: dispatched -> reaped (3 s timeout) in %s s\n", what, after);
    /* 3 s + 3 s against load, far below the 30 s sweep. */
    ck_assert_msg(after && atof(after) <= 6.0,
                  "%s: the turn dispatched %s s before its reap; the 3 s dispatch timeout should have fired "
                  "within 3 s of its due time",
                  what, after ? after : "?");
    free(after);
}

START_TEST(test_client_dispatches_arm_rules)
{
    /* No worker: every turn here waits dispatched until 2.5 reaps it. Each is dispatched in a client's own
     * transaction, which no daemon sees: a CLI submit and a SQL API submit that dispatch their turn, and a
     * CLI cancel and a SQL API cancel whose agent's next turn is dispatched in the cancel's transaction. */
    TwFx *fx = wd_fixture("[pmo]\nwatchdog_interval_seconds = 30\ndispatched_retry_seconds = 2\n"
                          "dispatched_timeout_seconds = 3\npending_wakeup_seconds = 2\n"
                          "[worker]\nwatchdog_interval_seconds = 30\n");
    tw_fx_start_pmo(fx, NULL);
    /* The PMO has asked for its first due times (nothing due) before anything is dispatched. */
    ck_assert(
        tw_fx_sql_wait(fx, WD_WAIT_MS, "1", "SELECT count(*) FROM state.daemons WHERE kind = 'pmo'", 0));
    tw_fx_sleep_ms(500);

    char *cli_submit = wd_submit(fx, "echo", "{}");
    char *sql_submit = wd_submit_sql(fx, "tester", "{}", NULL);

    /* The next turns of these two agents are dispatched by the cancels of their first. */
    char *first = wd_submit(fx, "failer", "{}");
    char *cli_next = wd_submit(fx, "failer", "{}");
    char *first2 = wd_submit_sql(fx, "racer", "{}", NULL);
    char *sql_next = wd_submit_sql(fx, "racer", "{}", NULL);
    char *out = NULL, *err = NULL;
    ck_assert_int_eq(tw_fx_cli(fx, &out, &err, "cancel", first, NULL), 0);
    free(out);
    free(err);
    char *res = tw_fx_sql_str(fx, "SELECT tw.cancel_turn($1::uuid)", 1, first2);
    ck_assert_str_eq(res, "cancelled");
    free(res);
    WD_STATUS_IS(fx, cli_next, "dispatched");
    WD_STATUS_IS(fx, sql_next, "dispatched");

    due_reaped_in_time(fx, "turnwatch submit", cli_submit);
    due_reaped_in_time(fx, "tw.submit_turn", sql_submit);
    due_reaped_in_time(fx, "turnwatch cancel, the next turn", cli_next);
    due_reaped_in_time(fx, "tw.cancel_turn, the next turn", sql_next);
    free(cli_submit);
    free(sql_submit);
    free(first);
    free(cli_next);
    free(first2);
    free(sql_next);
    tw_fx_free(fx);
}
END_TEST

/* The daemons' own dispatches wake the PMOs themselves (NATS): a delegating step's child turn, dispatched by
 * the worker's apply, for a profile no worker serves, is reaped by 2.5 at its due time too. */
START_TEST(test_worker_dispatch_arms_rules)
{
    char *echo = tw_fx_build_path("examples/agents/tw-echo-agent");
    char *ovr =
        wd_fmt("[pmo]\nwatchdog_interval_seconds = 30\ndispatched_retry_seconds = 2\n"
               "dispatched_timeout_seconds = 3\npending_wakeup_seconds = 2\n"
               "[worker]\nwatchdog_interval_seconds = 30\nagents = fanout\n"
               "[agent.orphan]\nexec = %s\n"
               "[tool.ask]\nagent_profile = orphan\nsuspend_timeout_seconds = 60\ntimeout_seconds = 60\n",
               echo);
    TwFx *fx = wd_fixture(ovr);
    tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, NULL);
    char *parent = wd_submit(fx, "fanout", "{\"n\":1,\"tool\":\"ask\"}");
    WD_STATUS_IS(fx, parent, "suspended");
    char *child = NULL;
    for (int i = 0; i < 200 && !child; i++) {
        child =
            tw_fx_sql_str(fx, "SELECT turn_id::text FROM state.turns WHERE parent_turn_id = $1", 1, parent);
        if (!child)
            tw_fx_sleep_ms(50);
    }
    ck_assert_ptr_nonnull(child);
    due_reaped_in_time(fx, "a child turn the worker dispatched", child);
    free(child);
    free(parent);
    free(ovr);
    free(echo);
    wd_done(fx);
}
END_TEST

/* ---- a deadline fires at its due time while a client's transaction holds the agent's row
 * -----------------------------------------------------------------------------------------------------------
 */

START_TEST(test_deadline_with_held_agent_row)
{
    char *ovr = due_fixture_config();
    TwFx *fx = wd_fixture(ovr);
    free(ovr);
    tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, NULL);
    char *turn = wd_submit_full(fx, "tester", "{\"mode\":\"sleep\",\"seconds\":30}", NULL, "3");
    WD_STATUS_IS(fx, turn, "running");

    /* An application submits the agent's next turn in its own transaction and keeps it open (the SQL API
     * allows it): its submit holds the agent's row until it commits. */
    PGconn *app = PQconnectdb(tw_fx_pg_dsn(fx));
    ck_assert(PQstatus(app) == CONNECTION_OK);
    PQclear(PQexec(app, "BEGIN"));
    PGresult *r = PQexec(app, "SELECT tw.submit_turn('tester', 'chan-1', '{}'::jsonb, NULL)::text");
    ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK, "%s", PQerrorMessage(app));
    char *next = strdup(PQgetvalue(r, 0, 0));
    PQclear(r);

    /* The deadline ends the turn at its due time all the same (3 s after the submit, plus 3 s against load),
     * while the application's transaction is still open. */
    WD_STATUS_WITHIN(fx, turn, "timeout", 15000);
    char *late = tw_fx_sql_str(fx,
                               "SELECT round(extract(epoch FROM ended_at - deadline_at)::numeric, 1)::text "
                               "FROM state.turns WHERE turn_id = $1",
                               1, turn);
    fprintf(stderr, "MEASURE a deadline with the agent's row held: ended %s s after its due time\n", late);
    ck_assert_msg(late && atof(late) <= 3.0, "the deadline fired %s s late while the row was held", late);
    free(late);
    ck_assert_int_eq(PQtransactionStatus(app), PQTRANS_INTRANS);

    /* Committed: the turn it submitted runs (it was queued behind the one that ended). */
    PQclear(PQexec(app, "COMMIT"));
    WD_STATUS_IS(fx, next, "done");
    PQfinish(app);
    free(next);
    free(turn);
    wd_done(fx);
}
END_TEST

/* ---- the worker's rules (2.1, 2.2, 2.3), a step timeout, and 2.6, with a 30 s sweep
 * -----------------------------------------------------------------------------------------------------------
 */

START_TEST(test_worker_rules_at_due_time)
{
    char *ovr = due_fixture_config();
    TwFx *fx = wd_fixture(ovr);
    char *ovr2 = wd_fmt("%s[worker]\nagents = frozen,frozen2\n", ovr);
    const char *w2_ini = tw_fx_write_config(fx, "w2.ini", ovr2);
    free(ovr2);
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    TwFxProc *w1 = tw_fx_start_worker(fx, NULL);
    TwFxProc *w2 = tw_fx_start_worker(fx, w2_ini);
    TwFxProc *all[3] = {pmo, w1, w2};

    /* 2.2: an external call nobody answers times out 2 s after the turn suspended. */
    char *t_tool = wd_submit(fx, "tester",
                             "{\"mode\":\"tools\",\"calls\":[{\"id\":\"e1\",\"tool\":\"ext\",\"args\":{}}]}");
    /* Step timeout: the worker's own timer stops a 10 s step after 1 s. */
    char *t_step = wd_submit(fx, "slow", "{\"mode\":\"sleep\",\"seconds\":10}");

    /* frozen2's resumed step sleeps while w2 holds its resume ledger lease; frozen's first step sleeps while
     * w2 holds its inbox claim. Then w2 freezes: its session (and liveness lock) lives on, so only the leases
     * hand the work back (2.1, 2.3), and the turns are reaped (2.6) when their heartbeats stop. */
    char *marker = wd_fmt("%s/resume.pid", tw_fx_dir(fx));
    char *in2 = wd_fmt("{\"mode\":\"tools\",\"calls\":[{\"id\":\"e1\",\"tool\":\"ext\",\"args\":{}}],"
                       "\"resume_sleep\":30,\"resume_sleep_once\":\"%s\"}",
                       marker);
    char *t_ledger = wd_submit(fx, "frozen2", in2);
    WD_STATUS_IS(fx, t_ledger, "suspended");
    ck_assert_int_eq(wd_tool_result(fx, t_ledger, "e1", "{}"), 0);
    ck_assert(tw_fx_wait_until(due_file_exists, marker, WD_WAIT_MS));
    char *t_inbox = wd_submit(fx, "frozen", "{\"mode\":\"sleep\",\"seconds\":30}");
    WD_STATUS_IS(fx, t_inbox, "running");
    ck_assert(tw_fx_wait_until(wd_log_line_has, &(WdLogHas){w2, t_inbox, "claimed"}, WD_WAIT_MS));
    ck_assert(tw_fx_proc_freeze(w2));

    WD_STATUS_IS(fx, t_tool, "done");
    WD_STATUS_IS(fx, t_step, "failed");
    WD_STATUS_IS(fx, t_inbox, "failed");
    WD_STATUS_IS(fx, t_ledger, "failed");
    due_one_action(all, 3, "2.2 tool_timeouts", t_tool);
    due_one_action(all, 3, "2.1 reclaim_inbox", t_inbox);
    due_one_action(all, 3, "2.3 requeue_expired_resume_ledgers", t_ledger);
    due_one_action(all, 3, "2.6 reap_running", t_inbox);
    due_one_action(all, 3, "2.6 reap_running", t_ledger);
    char *e = tw_fx_sql_str(fx, "SELECT error FROM state.turns WHERE turn_id = $1", 1, t_step);
    ck_assert_str_eq(e, "step_timeout");
    free(e);
    /* The step timeout is the worker's own timer: 1 s after the step started, plus the time to stop it. */
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turns WHERE turn_id = $1 "
                                   "AND ended_at BETWEEN started_at + interval '1 second' "
                                   "AND started_at + interval '3 seconds'",
                                   1, t_step),
                     1);
    /* The frozen worker was never judged gone: its lock is held while it is stopped. */
    ck_assert_uint_eq(wd_action_count(all, 3, "liveness reclaim_gone_daemons"), 0);
    free(t_tool);
    free(t_step);
    free(t_ledger);
    free(t_inbox);
    free(in2);
    free(marker);
    free(ovr);
    wd_done(fx);
}
END_TEST

/* ---- liveness: SIGKILL in the middle of a long step, with the shipped 300 s leases
 * -----------------------------------------------------------------------------------------------------------
 */

typedef struct {
    TwFx *fx;
    const char *turn;
    const char *not_by;
} DueClaim;

/* The turn's step is processing again under a claim other than the dead worker's. */
static bool due_reclaimed(void *arg)
{
    DueClaim *c = arg;
    char *by =
        tw_fx_sql_str(c->fx,
                      "SELECT claimed_by FROM state.agent_inbox WHERE turn_id = $1 AND message_type = 'turn' "
                      "AND status = 'processing'",
                      1, c->turn);
    bool ok = by && strcmp(by, c->not_by) != 0;
    free(by);
    return ok;
}

START_TEST(test_sigkill_reclaimed_at_once)
{
    TwFx *fx = wd_fixture("[pmo]\nactive_reap_seconds = 300\ndispatched_timeout_seconds = 30\n"
                          "dispatched_retry_seconds = 10\n"
                          "[worker]\ninbox_processing_timeout_seconds = 300\nheartbeat_seconds = 10\n");
    TwFxEvents *ev = tw_fx_events_new(fx, "evt.agent.*.task");
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    TwFxProc *w[2] = {tw_fx_start_worker(fx, NULL), tw_fx_start_worker(fx, NULL)};
    /* Both workers registered before the kill (the survivor judges from then on). */
    ck_assert(tw_fx_sql_wait(fx, WD_WAIT_MS, "2",
                             "SELECT count(*) FROM state.daemons WHERE kind = 'worker' AND gone_at IS NULL",
                             0));

    char *turn = wd_submit(fx, "tester", "{\"mode\":\"sleep\",\"seconds\":4}");
    WD_STATUS_IS(fx, turn, "running");
    char *holder = NULL;
    for (int i = 0; i < 200 && !holder; i++) {
        holder = tw_fx_sql_str(fx,
                               "SELECT claimed_by FROM state.agent_inbox WHERE turn_id = $1 "
                               "AND message_type = 'turn' AND status = 'processing'",
                               1, turn);
        if (!holder)
            tw_fx_sleep_ms(20);
    }
    ck_assert_ptr_nonnull(holder);
    char *pid0 = wd_fmt(":%d", (int)tw_fx_proc_pid(w[0]));
    int k = strstr(holder, pid0) ? 0 : 1;
    free(pid0);
    int64_t t0 = tw_fx_now_ms();
    tw_fx_proc_kill9(w[k]);
    ck_assert_msg(tw_fx_wait_until(due_reclaimed, &(DueClaim){fx, turn, holder}, WD_WAIT_MS),
                  "the step of %s was never claimed again", turn);
    int64_t took = tw_fx_now_ms() - t0;
    fprintf(stderr, "MEASURE liveness: SIGKILL -> step claimed by the other worker in %lld ms\n",
            (long long)took);
    ck_assert_msg(took <= 2000, "re-claimed %lld ms after the kill", (long long)took);

    WD_STATUS_IS(fx, turn, "done");
    ck_assert(tw_fx_events_wait(ev, NULL, turn, 1, WD_WAIT_MS));
    tw_fx_sleep_ms(300);
    ck_assert_uint_eq(wd_task_events(ev, turn), 1);
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT attempts FROM state.agent_inbox WHERE turn_id = $1 AND message_type = 'turn'",
                      1, turn),
        2);
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.force_terminations WHERE turn_id = $1", 1, turn), 0);
    ck_assert_uint_eq(wd_action_count(&pmo, 1, "2.6 reap_running"), 0);
    /* `turnwatch daemons`: the dead worker is gone (its session ended), the PMO and the other worker alive.
     */
    char *out = NULL, *err = NULL;
    ck_assert_int_eq(tw_fx_cli(fx, &out, &err, "daemons", "--json", NULL), 0);
    json_t *list = json_loads(out, 0, NULL), *d;
    ck_assert_msg(json_is_array(list), "daemons --json: %s", out);
    size_t i, alive = 0, dead = 0;
    json_array_foreach(list, i, d)
    {
        const char *id = json_string_value(json_object_get(d, "daemon_id"));
        if (json_is_true(json_object_get(d, "alive")))
            alive++;
        else if (id && strcmp(id, holder) == 0 &&
                 strcmp(json_string_value(json_object_get(d, "gone_reason")), "session ended") == 0)
            dead++;
    }
    ck_assert_uint_eq(alive, 2);
    ck_assert_uint_eq(dead, 1);
    json_decref(list);
    free(out);
    free(err);
    free(holder);
    free(turn);
    wd_done(fx);
}
END_TEST

/* ---- a database outage: nobody is judged by heartbeats before the others could write again
 * -----------------------------------------------------------------------------------------------------------
 */

START_TEST(test_no_reap_right_after_outage)
{
    /* Heartbeats every second, reaped after 3 s without one: a 5 s outage leaves every running turn's last
     * heartbeat older than that when the database returns. Without the grace the PMO reaped turns that were
     * still running, before their workers had reconnected. */
    char *real = tw_fx_build_path("examples/agents/tw-test-agent");
    char *ovr = strdup("[pmo]\nactive_reap_seconds = 3\n[worker]\nheartbeat_seconds = 1\nconcurrency = 8\n");
    wd_agents(&ovr, "d", 8, real);
    TwFx *fx = wd_fixture(ovr);
    tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, NULL);
    char *turns[8];
    for (int i = 0; i < 8; i++) {
        char agent[16];
        snprintf(agent, sizeof agent, "d%02d", i + 1);
        turns[i] = wd_submit(fx, agent, "{\"mode\":\"sleep\",\"seconds\":8}");
    }
    for (int i = 0; i < 8; i++)
        WD_STATUS_IS(fx, turns[i], "running");
    tw_fx_pg_stop(fx);
    tw_fx_sleep_ms(5000);
    tw_fx_pg_start(fx);
    for (int i = 0; i < 8; i++) {
        WD_STATUS_IS(fx, turns[i], "done");
        free(turns[i]);
    }
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.force_terminations", 0), 0);
    free(ovr);
    free(real);
    tw_fx_free(fx);
}
END_TEST

/* ---- a rule that fails every time is held back, and acts once it can
 * -------------------------------------------------------------------------------------------------------
 */

START_TEST(test_failing_rule_held_back)
{
    /* No worker: the turn stays pending until its 1 s deadline. The rule's action is broken on purpose (it
     * counts its calls in a sequence, which a rollback does not undo, then fails). Before, a failed run left
     * its due time in the past and the daemon ran it again at once: 184 runs a second. */
    char *ovr = due_fixture_config();
    TwFx *fx = wd_fixture(ovr);
    free(ovr);
    tw_fx_start_pmo(fx, NULL);
    char *def =
        tw_fx_sql_str(fx, "SELECT pg_get_functiondef('tw.wd_turn_deadlines(integer)'::regprocedure)", 0);
    tw_fx_sql_exec(fx, "CREATE SEQUENCE public.due_broken_calls", 0);
    tw_fx_sql_exec(fx,
                   "CREATE OR REPLACE FUNCTION tw.wd_turn_deadlines(p_limit integer) RETURNS jsonb"
                   " LANGUAGE plpgsql AS $$ BEGIN PERFORM nextval('public.due_broken_calls');"
                   " RAISE EXCEPTION 'broken on purpose'; END $$",
                   0);
    char *turn = wd_submit_full(fx, "echo", "{}", NULL, "1");
    ck_assert(tw_fx_sql_wait_count(fx,
                                   "SELECT count(*) FROM pg_sequences WHERE sequencename = 'due_broken_calls'"
                                   " AND last_value IS NOT NULL",
                                   1, 10000));
    tw_fx_sleep_ms(4000);
    int64_t calls = tw_fx_sql_int(fx, "SELECT last_value FROM public.due_broken_calls", 0);
    fprintf(stderr, "MEASURE a rule failing for 4 s ran %lld times\n", (long long)calls);
    /* Held 25, 50, ... up to 1000 ms between runs: about 8 runs in 4 s; without the hold, hundreds. */
    ck_assert_msg(calls >= 2 && calls <= 40, "a rule failing for 4 s ran %lld times", (long long)calls);
    tw_fx_sql_exec(fx, def, 0);
    WD_STATUS_IS(fx, turn, "timeout");
    free(turn);
    free(def);
    tw_fx_free(fx);
}
END_TEST

TW_SUITE_DEFINE(due, {
                         {"pmo_rules_at_due_time", test_pmo_rules_at_due_time, 120},
                         {"client_dispatches_arm_rules", test_client_dispatches_arm_rules, 180},
                         {"worker_dispatch_arms_rules", test_worker_dispatch_arms_rules, 180},
                         {"deadline_with_held_agent_row", test_deadline_with_held_agent_row, 180},
                         {"worker_rules_at_due_time", test_worker_rules_at_due_time, 120},
                         {"sigkill_reclaimed_at_once", test_sigkill_reclaimed_at_once, 120},
                         {"no_reap_right_after_outage", test_no_reap_right_after_outage, 120},
                         {"failing_rule_held_back", test_failing_rule_held_back, 120},
                     })
