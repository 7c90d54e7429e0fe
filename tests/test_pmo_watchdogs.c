/* test_pmo_watchdogs.c — the PMO half of the safety net (issue 5, contract section 7 rules 2.4-2.7): re-rings
 * of dispatched turns and pending inbox items at their configured spacing, reaps of dispatched and running
 * agents with the full output contract, turn deadlines, fencing of a frozen worker's late output, the outbox
 * relay, and two PMOs over 200 turns with faults. Real PostgreSQL, nats-server and daemons with short
 * configured timeouts. Measured delays between each rule's due time and its action are printed as "MEASURE
 * ..." lines on stderr. */
#include <libpq-fe.h>

#include "turn_helpers.h"
#include "suite.h"

#define PW_MANY 20

/* Everything after `turn` of one rule's actions. */
static json_t *pw_actions_for(TwFxProc *const *procs, size_t n, const char *rule, const char *turn)
{
    json_t *all = wd_actions_of(procs, n, rule);
    json_t *mine = wd_actions_where(all, "turn_id", turn);
    json_decref(all);
    return mine;
}

/* [pmo] with a one-second watchdog tick and these timings in seconds (dispatched_retry, dispatched_timeout,
 * pending_wakeup, pending_wakeup_skip, active_reap), then `more` (other sections, or NULL); malloc'd. */
static char *pw_config(int retry, int timeout, int wakeup, int skip, int reap, const char *more)
{
    return wd_fmt("[pmo]\nwatchdog_interval_seconds = 1\ndispatched_retry_seconds = %d\n"
                  "dispatched_timeout_seconds = %d\npending_wakeup_seconds = %d\n"
                  "pending_wakeup_skip_seconds = %d\nactive_reap_seconds = %d\n%s",
                  retry, timeout, wakeup, skip, reap, more ? more : "");
}

/* wd_fixture on pw_config's text. */
static TwFx *pw_fixture(int retry, int timeout, int wakeup, int skip, int reap, const char *more)
{
    char *ovr = pw_config(retry, timeout, wakeup, skip, reap, more);
    TwFx *fx = wd_fixture(ovr);
    free(ovr);
    return fx;
}

/* The needle that picks the doorbells of one reason out of the collected messages. */
static const char *pw_reason(char *buf, size_t size, const char *reason)
{
    snprintf(buf, size, "\"reason\":\"%s\"", reason);
    return buf;
}

/* Receive time of the k-th doorbell for `subject` with `reason`. */
static int64_t pw_ring_ms(TwFxEvents *ev, const char *subject, const char *reason, size_t k)
{
    char needle[128];
    int64_t t = -1;
    json_decref(tw_fx_events_get(ev, subject, pw_reason(needle, sizeof needle, reason), k, NULL, &t));
    return t;
}

static size_t pw_rings(TwFxEvents *ev, const char *subject, const char *reason)
{
    char needle[128];
    return tw_fx_events_count(ev, subject, pw_reason(needle, sizeof needle, reason));
}

static bool pw_wait_rings(TwFxEvents *ev, const char *subject, const char *reason, size_t n)
{
    char needle[128];
    return tw_fx_events_wait(ev, subject, pw_reason(needle, sizeof needle, reason), n, WD_WAIT_MS);
}

/* ---- 2.4 re-ring of a dispatched turn, then 2.5 reap, with no worker
 * ------------------------------------------- */

START_TEST(test_dispatched_rering_then_reap)
{
    TwFx *fx = pw_fixture(2, 11, 60, 300, 60, NULL);
    TwFxEvents *cmd = tw_fx_events_new(fx, "cmd.agent.echo.wakeup");
    TwFxEvents *evt = tw_fx_events_new(fx, "evt.>");
    /* Two PMOs run the rules at once: still one re-ring per spacing, one envelope, one reap. */
    TwFxProc *pmo[2] = {tw_fx_start_pmo(fx, NULL), tw_fx_start_pmo(fx, NULL)};
    char *t1 = wd_submit_full(fx, "echo", "{\"text\":\"one\"}", "box-7", NULL);
    char *t2 = wd_submit(fx, "echo", "{\"text\":\"two\"}");
    WD_STATUS_IS(fx, t1, "dispatched");
    int64_t epoch = tw_fx_sql_int(fx, "SELECT turn_epoch FROM state.agents WHERE agent = 'echo'", 0);
    char *updated = tw_fx_sql_str(fx, "SELECT updated_at::text FROM state.agents WHERE agent = 'echo'", 0);
    const char *copies_sql =
        "SELECT count(*) FROM state.agent_inbox WHERE turn_id = $1 AND message_type = 'turn' "
        "AND status = 'pending'";

    /* First re-ring: still dispatched, updated_at untouched, the envelope still there (not enqueued again).
     */
    ck_assert(pw_wait_rings(cmd, NULL, "dispatched_retry", 1));
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.agents WHERE agent = 'echo' AND status = "
                                   "'dispatched' AND updated_at::text = $1 AND active_agent_turn_id = $2",
                                   2, updated, t1),
                     1);
    ck_assert_int_eq(tw_fx_sql_int(fx, copies_sql, 1, t1), 1);
    /* The envelope gets lost: the next re-ring rebuilds it, once. */
    tw_fx_sql_exec(
        fx,
        "UPDATE state.agent_inbox SET status = 'archived', archived_at = now(), outcome = 'test_lost' "
        "WHERE turn_id = $1 AND message_type = 'turn'",
        1, t1);
    ck_assert(pw_wait_rings(cmd, NULL, "dispatched_retry", 2));
    ck_assert_int_eq(tw_fx_sql_int(fx, copies_sql, 1, t1), 1);
    char *copy =
        tw_fx_sql_str(fx,
                      "SELECT inbox_id::text FROM state.agent_inbox WHERE turn_id = $1 AND "
                      "message_type = 'turn' AND status = 'pending' AND (payload ->> 'rering')::boolean",
                      1, t1);
    ck_assert_ptr_nonnull(copy);
    ck_assert(pw_wait_rings(cmd, NULL, "dispatched_retry", 3));
    ck_assert_int_eq(tw_fx_sql_int(fx, copies_sql, 1, t1), 1);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.agent_inbox WHERE turn_id = $1 AND inbox_id = "
                                   "$2::bigint AND status = 'pending'",
                                   2, t1, copy),
                     1);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.agents WHERE agent = 'echo' AND status = "
                                   "'dispatched' AND updated_at::text = $1",
                                   1, updated),
                     1);
    WD_STATUS_IS(fx, t1, "dispatched");
    /* At the configured spacing: 2 s apart (one watchdog interval of slack, plus NATS and scheduling jitter).
     */
    for (size_t k = 1; k < 3; k++) {
        int64_t gap =
            pw_ring_ms(cmd, NULL, "dispatched_retry", k) - pw_ring_ms(cmd, NULL, "dispatched_retry", k - 1);
        fprintf(stderr, "2.4 re-ring spacing: %lld ms\n", (long long)gap);
        ck_assert_msg(gap >= 1700 && gap <= 5000, "re-rings %lld ms apart, configured 2000", (long long)gap);
    }

    /* 2.5 at updated_at + 11 s, although it was re-rung meanwhile. */
    WD_STATUS_IS(fx, t1, "timeout");
    char *card = wd_check_forced_end(fx, evt, t1, "timeout", "dispatch_timeout", "box-7", epoch);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turns WHERE turn_id = $1 AND ended_at >= "
                                   "dispatched_at + interval '11 seconds' AND ended_at < dispatched_at + "
                                   "interval '16 seconds'",
                                   1, t1),
                     1);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.cards WHERE card_id = $1::uuid AND "
                                   "content ->> 'status_before' = 'dispatched'",
                                   1, card),
                     1);
    /* Nothing of the reaped turn is left to work on. */
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.agent_inbox WHERE turn_id = $1 AND status IN "
                                   "('pending', 'processing')",
                                   1, t1),
                     0);
    /* The agent's next turn is dispatched under a new epoch (+1 for the reap, +1 for the dispatch). */
    WD_STATUS_IS(fx, t2, "dispatched");
    char *e2 = wd_fmt("%lld", (long long)(epoch + 2));
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turns t JOIN state.agents a ON a.agent = t.agent "
                      "WHERE t.turn_id = $1 AND t.turn_epoch = $2::bigint AND a.turn_epoch = "
                      "$2::bigint AND a.active_agent_turn_id = t.turn_id",
                      2, t2, e2),
        1);
    WdStateMatch dispatched = {t2, "dispatched"};
    ck_assert(tw_fx_events_wait_if(evt, wd_is_state, &dispatched, 1, WD_WAIT_MS));

    json_t *rerings = pw_actions_for(pmo, 2, "2.4 rering_dispatched", t1);
    json_t *reaps = pw_actions_for(pmo, 2, "2.5 reap_dispatched", t1);
    ck_assert_uint_ge(json_array_size(rerings), 3);
    ck_assert_uint_eq(json_array_size(reaps), 1);
    size_t i, enq = 0;
    json_t *a;
    json_array_foreach(rerings, i, a) enq += json_is_true(json_object_get(a, "enqueued"));
    ck_assert_uint_eq(enq, 1);
    wd_report_delays("2.4 rering_dispatched, one turn, two PMOs", rerings, 5000);
    wd_report_delays("2.5 reap_dispatched, one turn, two PMOs", reaps, 5000);
    ck_assert_uint_eq(wd_task_events(evt, t1), 1);
    json_decref(rerings);
    json_decref(reaps);
    free(e2);
    free(card);
    free(copy);
    free(updated);
    free(t1);
    free(t2);
    wd_done(fx);
}
END_TEST

/* ---- 2.6 reap of a running turn whose worker is frozen; its late output has no effect
 * -------------------------- */

START_TEST(test_running_reap_frozen_worker)
{
    TwFx *fx = pw_fixture(10, 30, 60, 300, 4,
                          "[worker]\ninbox_processing_timeout_seconds = 30\nheartbeat_seconds = 1\n");
    TwFxEvents *evt = tw_fx_events_new(fx, "evt.>");
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    TwFxProc *w = tw_fx_start_worker(fx, NULL);
    char *t1 = wd_submit_full(fx, "tester", "{\"mode\":\"sleep\",\"seconds\":2.5}", "box-1", NULL);
    char *t2 = wd_submit(fx, "tester", "{\"mode\":\"complete\",\"output\":{\"second\":true}}");
    WD_STATUS_IS(fx, t1, "running");
    ck_assert(tw_fx_proc_freeze(w));
    int64_t epoch = tw_fx_sql_int(fx, "SELECT turn_epoch FROM state.turns WHERE turn_id = $1", 1, t1);

    WD_STATUS_IS(fx, t1, "failed");
    char *card = wd_check_forced_end(fx, evt, t1, "failed", "timeout_reaped_by_watchdog", "box-1", epoch);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.force_terminations WHERE turn_id = $1 AND "
                                   "detail ->> 'status_before' = 'running'",
                                   1, t1),
                     1);
    WD_STATUS_IS(fx, t2, "dispatched");
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT turn_epoch FROM state.turns WHERE turn_id = $1", 1, t2),
                     epoch + 2);

    /* The frozen worker's program has finished by now: its output waits in the pipe of a frozen worker. */
    pid_t wpid = tw_fx_proc_pid(w);
    ck_assert(tw_fx_wait_until(wd_children_exited, &wpid, WD_WAIT_MS));
    int64_t outbox = tw_fx_sql_int(fx, "SELECT count(*) FROM state.outbox WHERE turn_id = $1", 1, t1);
    int64_t cards = tw_fx_sql_int(fx, "SELECT count(*) FROM state.cards WHERE turn_id = $1", 1, t1);
    size_t seen = tw_fx_events_count_if(evt, wd_is_turn, t1);

    ck_assert(tw_fx_proc_thaw(w));
    WD_STATUS_IS(fx, t2, "done");
    ck_assert_msg(tw_fx_wait_until(wd_log_line_has, &(WdLogHas){w, t1, "dropped"}, WD_WAIT_MS) ||
                      tw_fx_wait_until(wd_log_line_has, &(WdLogHas){w, t1, "lost its claim"}, 100),
                  "the worker never said it dropped the output of the reaped turn");
    /* Its late completion wrote nothing and published nothing. */
    tw_fx_sleep_ms(500);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.outbox WHERE turn_id = $1", 1, t1),
                     outbox);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.cards WHERE turn_id = $1", 1, t1), cards);
    ck_assert_uint_eq(tw_fx_events_count_if(evt, wd_is_turn, t1), seen);
    ck_assert_uint_eq(wd_task_events(evt, t1), 1);
    char *st = tw_fx_sql_str(fx, "SELECT status FROM state.turns WHERE turn_id = $1", 1, t1);
    ck_assert_str_eq(st, "failed");
    free(st);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.agent_inbox WHERE turn_id = $1 AND status = "
                                   "'archived' AND outcome = 'timeout_reaped_by_watchdog'",
                                   1, t1),
                     1);
    ck_assert(tw_fx_events_wait(evt, "evt.agent.*.task", t2, 1, WD_WAIT_MS));
    ck_assert_uint_eq(wd_task_events(evt, t2), 1);

    json_t *reaps = pw_actions_for(&pmo, 1, "2.6 reap_running", t1);
    ck_assert_uint_eq(json_array_size(reaps), 1);
    wd_report_delays("2.6 reap_running, one turn", reaps, 5000);
    json_decref(reaps);
    free(card);
    free(t1);
    free(t2);
    wd_done(fx);
}
END_TEST

/* ---- 2.7 re-ring of pending inbox items; a channel-less one is skipped
 * ----------------------------------------- */

START_TEST(test_pending_rering_and_missing_channel)
{
    TwFx *fx = pw_fixture(30, 60, 2, 5, 60, NULL);
    TwFxEvents *cmd = tw_fx_events_new(fx, "cmd.agent.*.wakeup");
    /* Two PMOs: each item is still re-rung once per spacing and skipped once. */
    TwFxProc *pmo[2] = {tw_fx_start_pmo(fx, NULL), tw_fx_start_pmo(fx, NULL)};
    /* echo is dispatched (no worker), so it has an active channel. */
    char *t = wd_submit(fx, "echo", "{}");
    WD_STATUS_IS(fx, t, "dispatched");
    const char *ins =
        "INSERT INTO state.agent_inbox (target_kind, target, message_type, channel_id, payload) "
        "VALUES ('agent', $1, 'note', $2, '{}') RETURNING inbox_id::text";
    char *r1 = tw_fx_sql_str(fx, ins, 2, "ghost", NULL);      /* no channel, no agent: skipped at 5 s */
    char *r2 = tw_fx_sql_str(fx, ins, 2, "ghost2", "chan-9"); /* a channel: only re-rung */
    char *r3 = tw_fx_sql_str(fx, ins, 2, "echo", NULL);       /* the agent's active channel: only re-rung */

    ck_assert(tw_fx_sql_wait(fx, WD_WAIT_MS, "skipped",
                             "SELECT status FROM state.agent_inbox WHERE inbox_id = "
                             "$1::bigint",
                             1, r1));
    size_t ghost_rings = pw_rings(cmd, "cmd.agent.ghost.wakeup", "pending_wakeup");
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.agent_inbox WHERE inbox_id = $1::bigint AND "
                      "watchdog_error = 'missing_channel' AND watchdog_at >= created_at + "
                      "interval '5 seconds' AND watchdog_at < created_at + interval '10 seconds'",
                      1, r1),
        1);
    /* Re-rung before it was skipped, once per 2 s. */
    ck_assert_uint_ge(ghost_rings, 1);
    for (size_t k = 1; k < ghost_rings; k++) {
        int64_t gap = pw_ring_ms(cmd, "cmd.agent.ghost.wakeup", "pending_wakeup", k) -
                      pw_ring_ms(cmd, "cmd.agent.ghost.wakeup", "pending_wakeup", k - 1);
        ck_assert_msg(gap >= 1700, "2.7 re-rang after %lld ms, configured 2000", (long long)gap);
    }
    /* The others keep being re-rung at the configured spacing, and are never skipped. */
    size_t g2 = pw_rings(cmd, "cmd.agent.ghost2.wakeup", "pending_wakeup");
    ck_assert(pw_wait_rings(cmd, "cmd.agent.ghost2.wakeup", "pending_wakeup", g2 + 2));
    size_t n2 = pw_rings(cmd, "cmd.agent.ghost2.wakeup", "pending_wakeup");
    for (size_t k = 1; k < n2; k++) {
        int64_t gap = pw_ring_ms(cmd, "cmd.agent.ghost2.wakeup", "pending_wakeup", k) -
                      pw_ring_ms(cmd, "cmd.agent.ghost2.wakeup", "pending_wakeup", k - 1);
        fprintf(stderr, "2.7 re-ring spacing: %lld ms\n", (long long)gap);
        ck_assert_msg(gap >= 1700 && gap <= 5000, "2.7 re-rang %lld ms apart, configured 2000",
                      (long long)gap);
    }
    ck_assert_uint_eq(pw_rings(cmd, "cmd.agent.ghost.wakeup", "pending_wakeup"), ghost_rings);
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.agent_inbox WHERE inbox_id IN ($1::bigint, "
                      "$2::bigint) AND status = 'pending' AND watchdog_error IS NULL AND rung_at IS "
                      "NOT NULL",
                      2, r2, r3),
        2);
    ck_assert_uint_ge(pw_rings(cmd, "cmd.agent.echo.wakeup", "pending_wakeup"), 2);
    WD_STATUS_IS(fx, t, "dispatched");

    json_t *acts = wd_actions_of(pmo, 2, "2.7 rering_pending");
    json_t *skips = wd_actions_where(acts, "action", "skipped");
    json_t *rerings = wd_actions_where(acts, "action", "rering");
    ck_assert_uint_eq(json_array_size(skips), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(skips, 0), "watchdog_error")),
                     "missing_channel");
    wd_report_delays("2.7 rering_pending, two PMOs", rerings, 5000);
    wd_report_delays("2.7 skip missing_channel, two PMOs", skips, 5000);
    json_decref(acts);
    json_decref(skips);
    json_decref(rerings);
    free(r1);
    free(r2);
    free(r3);
    free(t);
    wd_done(fx);
}
END_TEST

/* Under a backlog of pending items, 2.7 re-rings every one of them each spacing; it once wrote 642,089 log
 * lines in 6 minutes. Now at most 20 re-ring lines per 10 s are at level info, the rest counted in a summary
 * line. */
START_TEST(test_pending_rering_log_summarised)
{
    TwFx *fx = pw_fixture(30, 60, 1, 300, 60, NULL);
    TwFxEvents *cmd = tw_fx_events_new(fx, "cmd.agent.*.wakeup");
    tw_fx_sql_exec(fx,
                   "INSERT INTO state.agent_inbox (target_kind, target, message_type, channel_id, payload)"
                   " SELECT 'agent', 'ghost' || i, 'note', 'c', '{}' FROM generate_series(1, 300) i",
                   0);
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    /* Every item re-rung at least twice: 600 re-rings or more. */
    ck_assert(tw_fx_sql_wait_count(fx, "SELECT count(*) FROM state.agent_inbox WHERE rung_at IS NOT NULL",
                                   300, WD_WAIT_MS));
    int64_t deadline = tw_fx_now_ms() + WD_WAIT_MS;
    while (tw_fx_events_count(cmd, NULL, "pending_wakeup") < 600)
        ck_assert_msg(tw_fx_poll(deadline), "only %zu re-rings",
                      tw_fx_events_count(cmd, NULL, "pending_wakeup"));
    ck_assert_int_eq(tw_fx_proc_terminate(pmo, 10000), 0);
    char *log = tw_fx_proc_log(pmo);
    size_t lines = 0, summaries = 0;
    long said = 0;
    for (const char *p = log; (p = strstr(p, "watchdog rule=\"2.7 rering_pending\"")); p++) {
        if (p[strlen("watchdog rule=\"2.7 rering_pending\"")] == ':') {
            summaries++;
            said += strtol(p + strlen("watchdog rule=\"2.7 rering_pending\": "), NULL, 10);
        } else {
            lines++;
        }
    }
    int64_t counted = wd_counter(pmo, "2.7 rering_pending");
    fprintf(stderr, "MEASURE 2.7 under a backlog: %lld re-rings, %zu action lines, %zu summaries (%ld)\n",
            (long long)counted, lines, summaries, said);
    ck_assert_msg(counted >= 600, "the counters say %lld re-rings", (long long)counted);
    /* 20 lines per 10 s window: the run lasted well under a minute. */
    ck_assert_msg(lines <= 20 * 6, "%zu re-ring lines at level info for %lld re-rings", lines,
                  (long long)counted);
    ck_assert_msg(summaries >= 1 && (long)lines + said == counted,
                  "%zu lines and %zu summaries saying %ld more, for %lld re-rings", lines, summaries, said,
                  (long long)counted);
    free(log);
    wd_done(fx);
}
END_TEST

/* ---- turn deadlines: a suspended turn, a pending one, a running one that heartbeats
 * ---------------------------- */

START_TEST(test_turn_deadlines)
{
    char *real = tw_fx_build_path("examples/agents/tw-test-agent");
    char *slow = wd_fmt("[worker]\nheartbeat_seconds = 1\n"
                        "[agent.slow]\nexec = %s\nstep_timeout_seconds = 10\nkill_grace_seconds = 1\n",
                        real);
    char *ovr = pw_config(30, 60, 60, 300, 60, slow);
    free(slow);
    TwFxStack st = tw_fx_stack_start_events(ovr, "evt.>");
    char *t1 = wd_submit_full(st.fx, "tester",
                              "{\"mode\":\"tools\",\"calls\":[{\"id\":\"e1\",\"tool\":\"ext\","
                              "\"args\":{}}]}",
                              NULL, "8");
    WD_STATUS_IS(st.fx, t1, "suspended");
    int64_t e1 = tw_fx_sql_int(st.fx, "SELECT turn_epoch FROM state.turns WHERE turn_id = $1", 1, t1);
    char *t2 = wd_submit_full(st.fx, "tester", "{\"mode\":\"complete\"}", NULL, "2");
    char *t3 = wd_submit_full(st.fx, "slow", "{\"mode\":\"sleep\",\"seconds\":8}", NULL, "2");
    WD_STATUS_IS(st.fx, t3, "running");
    int64_t e3 = tw_fx_sql_int(st.fx, "SELECT turn_epoch FROM state.turns WHERE turn_id = $1", 1, t3);

    WD_STATUS_IS(st.fx, t2, "timeout");
    WD_STATUS_IS(st.fx, t3, "timeout");
    WD_STATUS_IS(st.fx, t1, "timeout");
    free(wd_check_forced_end(st.fx, st.ev, t1, "timeout", "turn_deadline_exceeded", NULL, e1));
    free(wd_check_forced_end(st.fx, st.ev, t2, "timeout", "turn_deadline_exceeded", NULL, -1));
    free(wd_check_forced_end(st.fx, st.ev, t3, "timeout", "turn_deadline_exceeded", NULL, e3));
    const char *ids[] = {t1, t2, t3}, *before[] = {"suspended", "pending", "running"};
    for (int k = 0; k < 3; k++) {
        ck_assert_int_eq(
            tw_fx_sql_int(st.fx,
                          "SELECT count(*) FROM state.force_terminations f JOIN state.turns t USING "
                          "(turn_id) WHERE turn_id = $1 AND f.detail ->> 'status_before' = $2 AND "
                          "t.ended_at >= t.deadline_at AND t.ended_at < t.deadline_at + interval "
                          "'5 seconds'",
                          2, ids[k], before[k]),
            1);
    }
    /* The pending turn never started; the suspended turn's call is closed; the running one was not extended
     * by its heartbeats, and its worker stopped the program. */
    ck_assert_int_eq(
        tw_fx_sql_int(st.fx,
                      "SELECT count(*) FROM state.turns WHERE turn_id = $1 AND dispatched_at IS NULL "
                      "AND turn_epoch IS NULL",
                      1, t2),
        1);
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1 AND "
                                   "wait_status = 'cancelled'",
                                   1, t1),
                     1);
    ck_assert_msg(tw_fx_wait_until(wd_log_line_has, &(WdLogHas){st.worker, t3, "lost its claim"}, WD_WAIT_MS),
                  "the worker did not learn that %s ended", t3);
    ck_assert(
        tw_fx_wait_until(wd_log_line_has, &(WdLogHas){st.worker, t3, "stopping (claim lost)"}, WD_WAIT_MS));
    char *out = NULL, *err = NULL;
    ck_assert_int_eq(
        tw_fx_cli(st.fx, &out, &err, "tool-result", "--turn", t1, "--call", "e1", "--output", "{}", NULL), 1);
    ck_assert_ptr_nonnull(strstr(err, "already ended"));
    free(out);
    free(err);
    tw_fx_sleep_ms(300);
    for (int k = 0; k < 3; k++)
        ck_assert_uint_eq(wd_task_events(st.ev, ids[k]), 1);
    wd_assert_acted(&st.pmo, 1, "turn_deadline", 3, "turn_deadline, three turns", 5000);
    free(t1);
    free(t2);
    free(t3);
    free(ovr);
    free(real);
    wd_done(st.fx);
}
END_TEST

/* ---- the outbox relay: events committed while NATS was down, and events marked unpublished
 * --------------------- */

START_TEST(test_outbox_relay)
{
    TwFx *fx = pw_fixture(1, 3, 60, 300, 60, NULL);
    TwFxEvents *ev = tw_fx_events_new_every(fx, "evt.agent.echo.>");
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    char *t = wd_submit(fx, "echo", "{}");
    WD_STATUS_IS(fx, t, "dispatched");

    /* The reap happens while NATS is down: committed, not published. */
    tw_fx_nats_stop(fx);
    WD_STATUS_IS(fx, t, "timeout");
    char *event_id =
        tw_fx_sql_str(fx,
                      "SELECT event_id::text FROM state.outbox WHERE turn_id = $1 AND kind = 'task' "
                      "AND published_at IS NULL",
                      1, t);
    ck_assert_msg(event_id, "the final event is not waiting in the outbox");
    ck_assert(tw_fx_proc_alive(pmo));

    /* NATS comes back; the collector reconnects first (the PMO is held), then the PMO relays. */
    ck_assert(tw_fx_proc_freeze(pmo));
    tw_fx_nats_start(fx);
    ck_assert(tw_fx_nats_wait_echo(fx, ev, "evt.agent.echo.ping", "{\"ping\":true}", WD_WAIT_MS));
    ck_assert(tw_fx_proc_thaw(pmo));
    ck_assert_msg(tw_fx_events_wait(ev, "evt.agent.echo.task", t, 1, WD_WAIT_MS),
                  "the relay never published it");
    ck_assert(tw_fx_sql_wait(fx, WD_WAIT_MS, "true",
                             "SELECT (published_at IS NOT NULL)::text FROM state.outbox "
                             "WHERE event_id = $1::uuid",
                             1, event_id));
    size_t n = wd_task_events(ev, t);
    for (size_t k = 0; k < n; k++) {
        json_t *e = tw_fx_events_get(ev, "evt.agent.echo.task", t, k, NULL, NULL);
        ck_assert_str_eq(json_string_value(json_object_get(e, "event_id")), event_id);
        json_decref(e);
    }

    /* Marked unpublished again, as if its mark had been lost before the relay's cursor passed it: published
     * again, with the same event_id. */
    tw_fx_sql_exec(fx,
                   "UPDATE state.outbox SET published_at = NULL, relay_lease_until = NULL WHERE event_id = "
                   "$1::uuid",
                   1, event_id);
    tw_fx_sql_exec(fx,
                   "UPDATE state.outbox_cursor SET (xid, seq) = (SELECT xid, seq FROM state.outbox "
                   "WHERE event_id = $1::uuid)",
                   1, event_id);
    ck_assert(tw_fx_events_wait(ev, "evt.agent.echo.task", t, n + 1, WD_WAIT_MS));
    json_t *e = tw_fx_events_get(ev, "evt.agent.echo.task", t, n, NULL, NULL);
    ck_assert_str_eq(json_string_value(json_object_get(e, "event_id")), event_id);
    json_decref(e);
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND kind = 'task'", 1, t), 1);
    ck_assert(wd_log_line_has(&(WdLogHas){pmo, "outbox relay: publishing", NULL}));
    free(event_id);
    free(t);
    wd_done(fx);
}
END_TEST

/* ---- two PMOs, two workers, 200 turns, kill -9 midway
 * ------------------------------------------------------------ */

#define PW_TURNS 200

/* Some turns fail; the others complete with their number. */
static void pw_input(char *buf, size_t size, int n)
{
    if (n % 7 == 0)
        snprintf(buf, size, "{\"mode\":\"fail\"}");
    else
        snprintf(buf, size, "{\"mode\":\"complete\",\"output\":{\"n\":%d}}", n);
}
#define PW_AGENTS 8

static const char pw_terminal_sql[] =
    "SELECT count(*) FROM state.turns WHERE status IN ('done', 'failed', 'timeout', 'cancelled')";

/* Distinct turn ids (and, per turn, distinct event ids) among the final events seen on NATS. */
static void pw_nats_finals(TwFxEvents *ev, json_t *by_turn)
{
    for (size_t k = 0;; k++) {
        json_t *e = tw_fx_events_get(ev, "evt.agent.*.task", NULL, k, NULL, NULL);
        if (!e) {
            if (k >= tw_fx_events_count(ev, "evt.agent.*.task", NULL))
                break;
            continue;
        }
        const char *turn = json_string_value(json_object_get(e, "turn_id"));
        const char *id = json_string_value(json_object_get(e, "event_id"));
        if (turn && id) {
            json_t *set = json_object_get(by_turn, turn);
            if (!set) {
                set = json_object();
                json_object_set_new(by_turn, turn, set);
            }
            json_object_set_new(set, id, json_true());
        }
        json_decref(e);
    }
}

typedef struct PwFinals {
    TwFxEvents *ev;
    size_t want;
} PwFinals;

static bool pw_finals_seen(void *arg)
{
    PwFinals *f = arg;
    json_t *by_turn = json_object();
    pw_nats_finals(f->ev, by_turn);
    bool ok = json_object_size(by_turn) >= f->want;
    json_decref(by_turn);
    return ok;
}

START_TEST(test_two_pmos_200_turns_with_faults)
{
    char *real = tw_fx_build_path("examples/agents/tw-test-agent");
    char *ovr =
        pw_config(1, 3, 2, 300, 6,
                  "[worker]\ninbox_processing_timeout_seconds = 3\nheartbeat_seconds = 1\nconcurrency = 8\n");
    wd_agents(&ovr, "p", PW_AGENTS, real);
    wd_agents(&ovr, "o", 1, real);
    TwFx *fx = wd_fixture(ovr);
    /* The workers serve p01..p08 only: o01's turns are never taken and end by 2.5. */
    char *served = wd_names("p", PW_AGENTS);
    char *wovr = wd_fmt("%s[worker]\nagents = %s\n", ovr, served);
    const char *wcfg = tw_fx_write_config(fx, "w.ini", wovr);
    TwFxEvents *ev = tw_fx_events_new(fx, "evt.agent.*.task");
    TwFxProc *pmo1 = tw_fx_start_pmo(fx, NULL);
    TwFxProc *pmo2 = tw_fx_start_pmo(fx, NULL);
    TwFxProc *w1 = tw_fx_start_worker(fx, wcfg);
    tw_fx_start_worker(fx, wcfg);

    char *turns[PW_TURNS];
    int n = 0;
    turns[n++] = wd_submit_sql(fx, "o01", "{}", NULL);
    turns[n++] = wd_submit_sql(fx, "o01", "{}", NULL);
    for (; n < PW_TURNS / 2; n++) {
        char agent[8], input[128];
        snprintf(agent, sizeof agent, "p%02d", n % PW_AGENTS + 1);
        /* Some fail, some have a deadline that races their completion. */
        pw_input(input, sizeof input, n);
        turns[n] = wd_submit_sql(fx, agent, input, n % 10 == 5 ? "1" : NULL);
    }
    ck_assert(tw_fx_sql_wait_count(fx, pw_terminal_sql, PW_TURNS / 4, 60000));
    /* Faults: one PMO and one worker die without a word, in the middle of the work. */
    tw_fx_proc_kill9(pmo1);
    tw_fx_proc_kill9(w1);
    for (; n < PW_TURNS; n++) {
        char agent[8], input[128];
        snprintf(agent, sizeof agent, "p%02d", n % PW_AGENTS + 1);
        pw_input(input, sizeof input, n);
        turns[n] = wd_submit_sql(fx, agent, input, n % 10 == 5 ? "1" : NULL);
    }
    ck_assert(tw_fx_sql_wait_count(fx, pw_terminal_sql, PW_TURNS * 6 / 10, 60000));
    TwFxProc *pmo3 = tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, wcfg);
    if (!tw_fx_sql_wait_count(fx, pw_terminal_sql, PW_TURNS, 60000)) {
        char *left =
            tw_fx_sql_str(fx,
                          "SELECT string_agg(agent || ':' || status, ' ') FROM state.turns WHERE status "
                          "NOT IN ('done', 'failed', 'timeout', 'cancelled')",
                          0);
        ck_abort_msg("not every turn ended: %s", left);
    }

    /* Exactly one final event per turn: in the outbox, and on NATS (same event id however often it was sent).
     */
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(DISTINCT turn_id) FROM state.outbox WHERE kind = 'task'", 0),
        PW_TURNS);
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM (SELECT turn_id FROM state.outbox WHERE kind = 'task' "
                      "GROUP BY turn_id HAVING count(*) <> 1) x",
                      0),
        0);
    ck_assert_msg(tw_fx_wait_until(pw_finals_seen, &(PwFinals){ev, PW_TURNS}, 30000),
                  "not every final event reached NATS");
    json_t *by_turn = json_object();
    pw_nats_finals(ev, by_turn);
    for (int k = 0; k < PW_TURNS; k++) {
        json_t *set = json_object_get(by_turn, turns[k]);
        ck_assert_msg(set && json_object_size(set) == 1, "turn %s: %zu distinct final events on NATS",
                      turns[k], set ? json_object_size(set) : 0);
        const char *id = NULL;
        json_t *v;
        json_object_foreach(set, id, v)
        {
            ck_assert_int_eq(
                tw_fx_sql_int(fx,
                              "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND kind = 'task' "
                              "AND event_id = $2::uuid",
                              2, turns[k], id),
                1);
        }
    }
    /* Every agent is idle again, and nothing is left in flight. */
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.agents WHERE status <> 'idle'", 0), 0);
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turns WHERE turn_id IN ($1, $2) AND agent = 'o01' "
                      "AND status = 'timeout' AND error = 'dispatch_timeout'",
                      2, turns[0], turns[1]),
        2);
    char *mix =
        tw_fx_sql_str(fx,
                      "SELECT string_agg(s, ', ' ORDER BY s) FROM (SELECT status || coalesce('/' || error, "
                      "'') || '=' || count(*) AS s FROM state.turns GROUP BY status, error) x",
                      0);
    TwFxProc *pmos[] = {pmo2, pmo3};
    json_t *reaps = wd_actions_of(pmos, 2, "2.5 reap_dispatched");
    fprintf(stderr, "two PMOs, 200 turns: %s; outbox relay used: %s\n", mix,
            wd_log_line_has(&(WdLogHas){pmo2, "outbox relay: publishing", NULL}) ||
                    wd_log_line_has(&(WdLogHas){pmo3, "outbox relay: publishing", NULL})
                ? "yes"
                : "no");
    ck_assert_uint_eq(wd_actions_dups(reaps, "turn_id"), 0);
    json_decref(reaps);
    free(mix);
    json_decref(by_turn);
    for (int k = 0; k < PW_TURNS; k++)
        free(turns[k]);
    free(served);
    free(wovr);
    free(ovr);
    free(real);
    wd_done(fx);
}
END_TEST

/* ---- delays: 20 cases of each PMO rule at once
 * --------------------------------------------------------------------- */

START_TEST(test_rule_delays)
{
    char *real = tw_fx_build_path("examples/agents/tw-test-agent");
    char *ovr = pw_config(
        2, 5, 2, 4, 4,
        "[worker]\ninbox_processing_timeout_seconds = 30\nheartbeat_seconds = 1\nconcurrency = 25\n");
    wd_agents(&ovr, "d", PW_MANY, real);
    /* r* steps are held behind a gate until the workers freeze: no step limit may end them first. */
    for (int i = 1; i <= PW_MANY; i++)
        wd_append(&ovr, "[agent.r%02d]\nexec = %s\nstep_timeout_seconds = 120\nkill_grace_seconds = 1\n", i,
                  real);
    TwFx *fx = wd_fixture(ovr);
    /* Due times are spread so that they fall at different phases of the watchdog tick: four workers started
     * 250 ms apart (so heartbeating at four phases) serve five r* agents each; d* turns and g* items are
     * created 60 ms apart. */
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    TwFxProc *w[4];
    for (int k = 0; k < 4; k++) {
        char *served = NULL, name[16];
        for (int i = k * 5 + 1; i <= k * 5 + 5; i++)
            wd_append(&served, "%sr%02d", served ? "," : "", i);
        char *wovr = wd_fmt("%s[worker]\nagents = %s\n", ovr, served);
        snprintf(name, sizeof name, "w%d.ini", k);
        w[k] = tw_fx_start_worker(fx, tw_fx_write_config(fx, name, wovr));
        free(served);
        free(wovr);
        tw_fx_sleep_ms(250);
    }
    char *d1[PW_MANY], *d2[PW_MANY], *r[PW_MANY];
    /* The r* steps run until the gate opens at the end (at most 110 s), not for a fixed time: all 20 are
     * still running when the workers freeze, however long the machine takes to start the last one. */
    char *gate = wd_fmt("%s/gate", tw_fx_dir(fx)),
         *r_input = wd_fmt("{\"mode\":\"sleep\",\"seconds\":110,\"gate\":\"%s\"}", gate);
    for (int i = 0; i < PW_MANY; i++) {
        char agent[8];
        snprintf(agent, sizeof agent, "r%02d", i + 1);
        r[i] = wd_submit_sql(fx, agent, r_input, NULL);
    }
    for (int i = 0; i < PW_MANY; i++)
        WD_STATUS_IS(fx, r[i], "running");
    /* 2.6: the workers freeze with 20 steps running. */
    for (int k = 0; k < 4; k++)
        ck_assert(tw_fx_proc_freeze(w[k]));
    for (int i = 0; i < PW_MANY; i++) {
        char agent[8];
        snprintf(agent, sizeof agent, "d%02d", i + 1);
        d1[i] = wd_submit_sql(fx, agent, "{}", NULL); /* 2.4, then 2.5: nobody serves d* */
        d2[i] = wd_submit_sql(fx, agent, "{}", "3");  /* pending behind d1: its deadline passes first */
        snprintf(agent, sizeof agent, "g%02d", i + 1);
        tw_fx_sql_exec(fx,
                       "INSERT INTO state.agent_inbox (target_kind, target, message_type, payload) VALUES "
                       "('agent', $1, 'note', '{}')",
                       1, agent); /* no channel anywhere: 2.7 skips it */
        tw_fx_sleep_ms(60);
    }
    for (int i = 0; i < PW_MANY; i++) {
        WD_STATUS_IS(fx, r[i], "failed");
        WD_STATUS_IS(fx, d1[i], "timeout");
        WD_STATUS_IS(fx, d2[i], "timeout");
    }
    ck_assert(tw_fx_sql_wait(fx, WD_WAIT_MS, "20",
                             "SELECT count(*)::text FROM state.agent_inbox WHERE status = "
                             "'skipped' AND watchdog_error = 'missing_channel'",
                             0));
    TwFxProc *p[1] = {pmo};
    static const struct {
        const char *rule, *label;
        size_t min;
    } rules[] = {
        {"2.4 rering_dispatched",
         "2.4 rering_dispatched (due = max(updated_at, last re-ring) + dispatched_retry)", 20},
        {"2.5 reap_dispatched", "2.5 reap_dispatched (due = updated_at + dispatched_timeout)", 20},
        {"2.6 reap_running", "2.6 reap_running (due = last heartbeat + active_reap)", 20},
        {"turn_deadline", "turn_deadline (due = deadline_at)", 20},
    };
    for (size_t k = 0; k < sizeof rules / sizeof rules[0]; k++) {
        json_t *acts = wd_actions_of(p, 1, rules[k].rule);
        ck_assert_msg(json_array_size(acts) >= rules[k].min, "%s: %zu actions", rules[k].rule,
                      json_array_size(acts));
        if (strcmp(rules[k].rule, "2.4 rering_dispatched") != 0)
            ck_assert_uint_eq(wd_actions_dups(acts, "turn_id"), 0);
        wd_report_delays(rules[k].label, acts, 5000);
        fprintf(stderr, "MEASURE %s: %zu distinct due times\n", rules[k].rule,
                wd_actions_distinct(acts, "due"));
        json_decref(acts);
    }
    /* The counters the PMO logs when it stops agree. */
    ck_assert_int_eq(tw_fx_proc_terminate(pmo, 10000), 0);
    ck_assert_int_eq(wd_counter(pmo, "2.5 reap_dispatched"), PW_MANY);
    ck_assert_int_eq(wd_counter(pmo, "2.6 reap_running"), PW_MANY);
    ck_assert_int_eq(wd_counter(pmo, "turn_deadline"), PW_MANY);
    json_t *acts = wd_actions_of(p, 1, "2.7 rering_pending");
    json_t *rerings = wd_actions_where(acts, "action", "rering");
    json_t *skips = wd_actions_where(acts, "action", "skipped");
    ck_assert_uint_ge(json_array_size(rerings), 20);
    ck_assert_uint_eq(json_array_size(skips), 20);
    wd_report_delays("2.7 rering_pending (due = max(created_at, rung_at) + pending_wakeup)", rerings, 5000);
    wd_report_delays("2.7 skip missing_channel (due = created_at + pending_wakeup_skip)", skips, 5000);
    json_decref(acts);
    json_decref(rerings);
    json_decref(skips);
    for (int i = 0; i < PW_MANY; i++) {
        free(d1[i]);
        free(d2[i]);
        free(r[i]);
    }
    /* Let the reaped r* programs end now rather than after 110 s. */
    FILE *g = fopen(gate, "w");
    ck_assert_ptr_nonnull(g);
    fclose(g);
    free(gate);
    free(r_input);
    free(ovr);
    free(real);
    wd_done(fx);
}
END_TEST

/* A transaction that wrote an event and commits only after the relay has scanned past it (a long
 * transaction): the relay's cursor never passes a transaction still running, so the event is relayed once it
 * commits. */
static PGresult *pw_exec_ok(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    ck_assert_msg(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK, "%s: %s",
                  sql, PQerrorMessage(c));
    return r;
}

/* Count the lines of a process's log that contain needle. */
static size_t pw_log_lines(TwFxProc *p, const char *needle)
{
    char *log = tw_fx_proc_log(p), *save = NULL;
    size_t n = 0;

    for (char *line = strtok_r(log, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        n += strstr(line, needle) != NULL;
    free(log);
    return n;
}

/* An error from the server on the PMO's dispatch is logged as a warning (once per interval, however often
 * it repeats), and dispatching resumes by itself once the error is gone. */
START_TEST(test_dispatch_server_error_is_logged)
{
    TwFx *fx = wd_fixture("[pmo]\nwatchdog_interval_seconds = 1\n");
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);

    tw_fx_sql_exec(fx, "ALTER FUNCTION tw.dispatch_next(text) RENAME TO dispatch_next_saved", 0);
    tw_fx_sql_exec(fx,
                   "CREATE FUNCTION tw.dispatch_next(p_agent text) RETURNS jsonb LANGUAGE plpgsql AS "
                   "$$ BEGIN RAISE EXCEPTION 'dispatch broken by the test'; END $$",
                   0);
    /* An agent of the roster (contract section 14), bound to the echo profile, busy while three turns are
     * submitted (an idle one would take the first at its submit, no PMO needed), then idle: the PMO's scan
     * (one a second) dispatches, and fails. */
    tw_fx_sql_exec(fx, "SELECT tw.add_agent('broken', 'echo')", 0);
    tw_fx_sql_exec(fx,
                   "UPDATE state.agents SET status = 'running', active_agent_turn_id = gen_random_uuid()"
                   " WHERE agent = 'broken'",
                   0);
    char *turn = wd_submit_sql(fx, "broken", "{}", NULL);
    free(wd_submit_sql(fx, "broken", "{}", NULL));
    free(wd_submit_sql(fx, "broken", "{}", NULL));
    tw_fx_sql_exec(
        fx, "UPDATE state.agents SET status = 'idle', active_agent_turn_id = NULL WHERE agent = 'broken'", 0);
    ck_assert_msg(
        tw_fx_wait_until(wd_log_line_has, &(WdLogHas){pmo, "dispatch broken by the test", NULL}, WD_WAIT_MS),
        "the server's error never reached the log");
    ck_assert_uint_eq(pw_log_lines(pmo, "WARN: dispatch failed: ERROR:  dispatch broken by the test"), 1);
    /* Two more scans (one a second) fail the same way within the interval: still one line. */
    usleep(2100 * 1000);
    ck_assert_uint_eq(pw_log_lines(pmo, "dispatch broken by the test"), 1);
    char *status = tw_fx_sql_str(fx, "SELECT status FROM state.turns WHERE turn_id = $1::uuid", 1, turn);
    ck_assert_str_eq(status, "pending");
    free(status);

    tw_fx_sql_exec(fx, "DROP FUNCTION tw.dispatch_next(text)", 0);
    tw_fx_sql_exec(fx, "ALTER FUNCTION tw.dispatch_next_saved(text) RENAME TO dispatch_next", 0);
    ck_assert_msg(wd_wait_status(fx, turn, "dispatched"), "dispatch did not resume");
    free(turn);
    tw_fx_free(fx);
}
END_TEST

START_TEST(test_outbox_relay_late_commit)
{
    TwFx *fx = wd_fixture("[pmo]\nwatchdog_interval_seconds = 1\n");
    TwFxEvents *ev = tw_fx_events_new(fx, "evt.agent.>");
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    PGconn *c = PQconnectdb(tw_fx_pg_dsn(fx));
    ck_assert_msg(PQstatus(c) == CONNECTION_OK, "%s", PQerrorMessage(c));

    /* The long transaction writes its event first and stays open. */
    PQclear(pw_exec_ok(c, "BEGIN"));
    PGresult *r =
        pw_exec_ok(c, "SELECT pg_current_xact_id()::text, tw.emit('state', 'evt.agent.late.state', "
                      "'{\"agent\":\"late\",\"status\":\"idle\"}', NULL, NULL) -> 0 ->> 'event_id'");
    char *xid = strdup(PQgetvalue(r, 0, 0)), *late = strdup(PQgetvalue(r, 0, 1));
    PQclear(r);

    /* A later transaction's event, committed and never published by its writer: the relay publishes it, so it
     * has scanned past the open transaction's place... */
    char *later =
        tw_fx_sql_str(fx,
                      "SELECT tw.emit('state', 'evt.agent.later.state', "
                      "'{\"agent\":\"later\",\"status\":\"idle\"}', NULL, NULL) -> 0 ->> 'event_id'",
                      0);
    ck_assert_msg(tw_fx_events_wait(ev, "evt.agent.later.state", later, 1, WD_WAIT_MS),
                  "the relay never ran");
    ck_assert(tw_fx_sql_wait(
        fx, WD_WAIT_MS, "true",
        "SELECT (published_at IS NOT NULL)::text FROM state.outbox WHERE event_id = $1::uuid", 1, later));
    /* ...but its cursor stays at or below it. */
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.outbox_cursor WHERE xid <= $1::xid8", 1, xid), 1);
    ck_assert_int_eq(tw_fx_events_count(ev, "evt.agent.late.state", late), 0);

    /* Commit: the relay publishes it, once, with its event_id. */
    PQclear(pw_exec_ok(c, "COMMIT"));
    ck_assert_msg(tw_fx_events_wait(ev, "evt.agent.late.state", late, 1, WD_WAIT_MS),
                  "an event committed late was never relayed");
    ck_assert(tw_fx_sql_wait(
        fx, WD_WAIT_MS, "true",
        "SELECT (published_at IS NOT NULL)::text FROM state.outbox WHERE event_id = $1::uuid", 1, late));
    ck_assert_int_eq(tw_fx_events_count(ev, "evt.agent.later.state", later), 1);
    PQfinish(c);
    free(xid);
    free(late);
    free(later);
    ck_assert(tw_fx_proc_alive(pmo));
    tw_fx_free(fx);
}
END_TEST

/* ---- issue 23: a flood of unpublished events (a cancelled tree whose writer never published them) drains at
 * once, and does not hold up a fresh event that a SQL API client left to the relay
 * ------------------------------------------------------------------------------------------------------------
 */

#define PW_FLOOD 20000

/* Over the collected messages in their order of arrival: the flood's (checked against the outbox's rows), and
 * how many of them came before the fresh turn's final event. */
typedef struct PwFlood {
    json_t *expected; /* event_id -> the outbox's payload */
    json_t *seen;     /* event_id -> true */
    const char *fresh_event;
    bool fresh_seen;
    size_t before_fresh, messages, wrong;
} PwFlood;

static bool pw_flood_scan(const char *subject, const json_t *data, void *arg)
{
    PwFlood *f = arg;
    const char *id = json_string_value(json_object_get(data, "event_id"));

    if (id && strcmp(id, f->fresh_event) == 0)
        f->fresh_seen = true;
    if (strncmp(subject, "evt.agent.flood", 15) != 0)
        return false;
    f->messages++;
    if (!f->fresh_seen)
        f->before_fresh++;
    if (!id || !json_equal((json_t *)data, json_object_get(f->expected, id)))
        f->wrong++;
    else
        json_object_set_new(f->seen, id, json_true());
    return false;
}

static void pw_flood_count(TwFxEvents *ev, PwFlood *f)
{
    json_object_clear(f->seen);
    f->fresh_seen = false;
    f->before_fresh = f->messages = f->wrong = 0;
    (void)tw_fx_events_count_if(ev, pw_flood_scan, f);
}

/* The flood: PW_FLOOD events of one transaction, written a minute ago, never published, no NOTIFY. Returns
 * where it ends in the relay's order, "xid:seq" (malloc'd). */
static char *pw_flood_load(TwFx *fx)
{
    tw_fx_sql_exec(
        fx,
        "INSERT INTO state.outbox (event_id, kind, subject, payload, turn_id, turn_epoch, created_at) "
        "SELECT e, 'state', 'evt.agent.flood' || (i % 50) || '.state', "
        "       jsonb_build_object('agent', 'flood' || (i % 50), 'status', 'cancelled', 'turn_id', t, "
        "                          'turn_epoch', 1, 'n', i, 'event_id', e, 'at', now()), "
        "       t, 1, now() - interval '1 minute' "
        "  FROM (SELECT i, gen_random_uuid() e, gen_random_uuid() t "
        "          FROM generate_series(1, $1::integer) i) s",
        1, "20000");
    char *end = tw_fx_sql_str(
        fx,
        "SELECT xid || ':' || max(seq) FROM state.outbox WHERE subject LIKE 'evt.agent.flood%' GROUP BY xid",
        0);
    ck_assert_ptr_nonnull(end);
    return end;
}

/* Waits until the whole flood is marked published (60 s) and received from NATS, each event as the outbox
 * holds it; fills f (the caller frees f->expected and f->seen). Returns when it was all marked
 * (tw_fx_now_ms). */
static int64_t pw_flood_drained(TwFx *fx, TwFxEvents *ev, PwFlood *f)
{
    char *expected = tw_fx_sql_str(fx,
                                   "SELECT json_object_agg(event_id, payload)::text FROM state.outbox "
                                   "WHERE subject LIKE 'evt.agent.flood%'",
                                   0);
    f->expected = json_loads(expected, 0, NULL);
    f->seen = json_object();
    free(expected);
    ck_assert_ptr_nonnull(f->expected);
    ck_assert_int_eq(json_object_size(f->expected), PW_FLOOD);
    bool marked = tw_fx_sql_wait(fx, 60000, "0",
                                 "SELECT count(*) FROM state.outbox WHERE published_at IS NULL "
                                 "AND subject LIKE 'evt.agent.flood%'",
                                 0);
    ck_assert_msg(
        marked, "the flood was not all published within 60 s (%lld events still unpublished)",
        (long long)tw_fx_sql_int(fx, "SELECT count(*) FROM state.outbox WHERE published_at IS NULL", 0));
    int64_t drained_ms = tw_fx_now_ms(), deadline = drained_ms + WD_WAIT_MS;
    for (pw_flood_count(ev, f); json_object_size(f->seen) < PW_FLOOD; pw_flood_count(ev, f))
        if (!tw_fx_poll(deadline))
            break;
    ck_assert_msg(json_object_size(f->seen) == PW_FLOOD && f->wrong == 0,
                  "%zu distinct flood events of %d received as written, %zu not as written",
                  json_object_size(f->seen), PW_FLOOD, f->wrong);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.outbox WHERE published_at IS NULL", 0), 0);
    return drained_ms;
}

/* The next claim moves the cursor past the flood (in windows of a few batches, one claim after another). */
static void pw_cursor_passes(TwFx *fx, const char *flood_end)
{
    tw_fx_sql_exec(fx, "SELECT pg_notify('tw_outbox', '')", 0);
    ck_assert_msg(
        tw_fx_sql_wait(fx, WD_WAIT_MS, "t",
                       "SELECT (xid, seq) > (split_part($1, ':', 1)::xid8, split_part($1, ':', 2)::bigint) "
                       "FROM state.outbox_cursor",
                       1, flood_end),
        "the cursor did not move past the flood");
}

START_TEST(test_outbox_relay_flood)
{
    /* The PMO's tick, and with it the relay's, comes once an hour: only NOTIFY tw_outbox asks for a relay.
     * The dispatched turn is neither re-rung nor reaped meanwhile. */
    TwFx *fx = wd_fixture("[pmo]\nwatchdog_interval_seconds = 3600\ndispatched_retry_seconds = 300\n"
                          "dispatched_timeout_seconds = 600\n");
    TwFxEvents *ev = tw_fx_events_new(fx, "evt.>");
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    char *turn = wd_submit_sql(fx, "echo", "{}", NULL);
    WD_STATUS_IS(fx, turn, "dispatched");
    if (!tw_fx_sql_wait(fx, WD_WAIT_MS, "0", "SELECT count(*) FROM state.outbox WHERE published_at IS NULL",
                        0)) {
        tw_fx_proc_dump(pmo);
        ck_abort_msg("the dispatched turn's events were not published");
    }
    char *flood_end = pw_flood_load(fx);

    /* A SQL API client cancels the fresh turn: its final event is the relay's to publish (NOTIFY tw_outbox).
     */
    int64_t t0 = tw_fx_now_ms(), fresh_ms = 0;
    char *result = tw_fx_sql_str(fx, "SELECT tw.cancel_turn($1::uuid)", 1, turn);
    ck_assert_str_eq(result, "cancelled");
    char *final_id = tw_fx_sql_str(
        fx, "SELECT event_id::text FROM state.outbox WHERE turn_id = $1::uuid AND kind = 'task'", 1, turn);
    ck_assert_ptr_nonnull(final_id);
    ck_assert_msg(tw_fx_events_wait(ev, "evt.agent.echo.task", final_id, 1, WD_WAIT_MS),
                  "the fresh final event was not published within %d s: it waits behind the flood",
                  WD_WAIT_MS / 1000);
    json_decref(tw_fx_events_get(ev, "evt.agent.echo.task", final_id, 0, NULL, &fresh_ms));

    /* Every event of the flood, published as it was written, long before the relay's next tick; the fresh
     * event went out with the relay's first batch after the NOTIFY, not behind the flood. */
    PwFlood f = {.fresh_event = final_id};
    int64_t drained_ms = pw_flood_drained(fx, ev, &f);
    ck_assert_msg(f.before_fresh < PW_FLOOD / 4,
                  "%zu flood events were published before the fresh final event", f.before_fresh);
    fprintf(
        stderr,
        "MEASURE relay flood: fresh final event after %lld ms (%zu flood events before it); %d flood events "
        "marked published after %lld ms, %zu messages (%zu duplicates)\n",
        (long long)(fresh_ms - t0), f.before_fresh, PW_FLOOD, (long long)(drained_ms - t0), f.messages,
        f.messages - json_object_size(f.seen));
    pw_cursor_passes(fx, flood_end);
    ck_assert(tw_fx_proc_alive(pmo));
    json_decref(f.expected);
    json_decref(f.seen);
    free(final_id);
    free(result);
    free(flood_end);
    free(turn);
    wd_done(fx);
}
END_TEST

/* Two PMOs drain one flood together (leases and SKIP LOCKED): every event published, as written, none left.
 */
START_TEST(test_outbox_relay_flood_two_pmos)
{
    TwFx *fx = wd_fixture("[pmo]\nwatchdog_interval_seconds = 1\n");
    TwFxEvents *ev = tw_fx_events_new(fx, "evt.agent.*.state");
    TwFxProc *pmo[2] = {tw_fx_start_pmo(fx, NULL), tw_fx_start_pmo(fx, NULL)};
    int64_t t0 = tw_fx_now_ms();
    char *flood_end = pw_flood_load(fx);
    PwFlood f = {.fresh_event = ""};
    int64_t drained_ms = pw_flood_drained(fx, ev, &f);
    fprintf(
        stderr,
        "MEASURE relay flood, two PMOs: %d flood events marked published after %lld ms, %zu messages (%zu "
        "duplicates)\n",
        PW_FLOOD, (long long)(drained_ms - t0), f.messages, f.messages - json_object_size(f.seen));
    ck_assert(wd_log_line_has(&(WdLogHas){pmo[0], "outbox relay: publishing", NULL}) ||
              wd_log_line_has(&(WdLogHas){pmo[1], "outbox relay: publishing", NULL}));
    pw_cursor_passes(fx, flood_end);
    ck_assert(tw_fx_proc_alive(pmo[0]) && tw_fx_proc_alive(pmo[1]));
    json_decref(f.expected);
    json_decref(f.seen);
    free(flood_end);
    wd_done(fx);
}
END_TEST

/* ---- turn deadlines due together: one run ends them all (tw.force_finish_set), each with the whole output
 * contract, and a turn whose agent row another transaction holds is left for the next run
 * ---------------------------------------------------------------------------------------------------------
 */

/* The rule run by hand: its answer's number of actions, and what to publish in *pub (each event id once). */
static size_t pw_deadlines_run(TwFx *fx, size_t *pub)
{
    char *text = tw_fx_sql_str(fx, "SELECT tw.wd_turn_deadlines(100)::text", 0);
    json_t *out = json_loads(text, 0, NULL), *ev;
    ck_assert_msg(out != NULL, "answer: %s", text);
    json_t *seen = json_object();
    size_t i, n = json_array_size(json_object_get(out, "actions"));
    *pub = 0;
    json_array_foreach(json_object_get(out, "publish"), i, ev)
    {
        const char *id = json_string_value(json_object_get(ev, "event_id"));
        if (!id)
            continue; /* a doorbell */
        ck_assert_msg(!json_object_get(seen, id), "event %s twice in %s", id, text);
        json_object_set_new(seen, id, json_true());
        (*pub)++;
    }
    json_decref(seen);
    json_decref(out);
    free(text);
    return n;
}

START_TEST(test_turn_deadlines_at_once)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    /* a01..a20: a running turn past its deadline and a next turn queued behind it; q: a running turn without
     * a deadline and 30 queued turns past theirs. Driven in SQL: no daemon runs. */
    tw_fx_sql_exec(fx,
                   "SELECT tw.submit_turn('a' || lpad(i::text, 2, '0'), 'c', '{}', 1, NULL, NULL, 'echo')"
                   "  FROM generate_series(1, 20) i",
                   0);
    tw_fx_sql_exec(fx, "SELECT tw.submit_turn('q', 'c', '{}', NULL, NULL, NULL, 'echo')", 0);
    free(tw_fx_sql_str(fx, "SELECT tw.claim('w1', '{echo}', '{}', 100, 30)::text", 0));
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns WHERE status = 'running'", 0), 21);
    tw_fx_sql_exec(
        fx,
        "SELECT tw.submit_turn('a' || lpad(i::text, 2, '0'), 'c', '{\"next\":true}', NULL, NULL, NULL,"
        " 'echo') FROM generate_series(1, 20) i",
        0);
    tw_fx_sql_exec(
        fx, "SELECT tw.submit_turn('q', 'c', '{}', 1, NULL, NULL, 'echo') FROM generate_series(1, 30)", 0);
    /* Another transaction holds a20's row. */
    PGconn *other = PQconnectdb(tw_fx_pg_dsn(fx));
    ck_assert(PQstatus(other) == CONNECTION_OK);
    PQclear(PQexec(other, "BEGIN"));
    PGresult *r = PQexec(other, "SELECT 1 FROM state.agents WHERE agent = 'a20' FOR UPDATE");
    ck_assert(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1);
    PQclear(r);
    ck_assert(tw_fx_sql_wait_count(
        fx, "SELECT count(*) FROM state.turn_timers WHERE kind = 'deadline' AND due_at < now()", 50, 10000));

    size_t pub, acted = pw_deadlines_run(fx, &pub);
    ck_assert_uint_eq(acted, 49);
    /* Every one ended with the output contract: the fallback deliverable, the force record, its final task
     * event, a history row; the agents' idle events with the error; a01..a19 on to their next turns,
     * dispatched. */
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turns t JOIN state.cards c"
                      " ON c.card_id = t.deliverable_card_id AND c.card_type = 'task.deliverable'"
                      " WHERE t.status = 'timeout' AND t.error = 'turn_deadline_exceeded'"
                      " AND (c.content ->> 'fallback')::boolean AND t.timeout_detail ->> 'kind' ="
                      " 'turn_deadline' AND t.error_message LIKE 'the turn did not end within its 1 "
                      "second deadline (it was %)' AND t.ended_at IS NOT NULL",
                      0),
        49);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(DISTINCT turn_id) FROM state.force_terminations"
                                   " WHERE reason = 'turn_deadline_exceeded'",
                                   0),
                     49);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.outbox o JOIN state.turns t USING (turn_id)"
                                   " WHERE o.kind = 'task' AND t.status = 'timeout'"
                                   " AND o.payload ->> 'error' = 'turn_deadline_exceeded'"
                                   " AND o.payload -> 'timeout' ->> 'kind' = 'turn_deadline'",
                                   0),
                     49);
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.outbox WHERE kind = 'state'"
                      " AND payload ->> 'status' = 'idle' AND payload ->> 'error' = 'turn_deadline_exceeded'",
                      0),
        19);
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turn_history h JOIN state.turns t USING (turn_id)"
                      " WHERE h.to_status = 'timeout' AND t.status = 'timeout'",
                      0),
        49);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turns t JOIN state.agents a"
                                   " ON a.active_agent_turn_id = t.turn_id AND a.status = 'dispatched'"
                                   " AND a.turn_epoch = t.turn_epoch"
                                   " WHERE t.status = 'dispatched' AND (t.input ->> 'next')::boolean",
                                   0),
                     19);
    /* 49 task events, 19 idle events, 19 dispatched events, each id once. */
    ck_assert_uint_eq(pub, 49 + 19 + 19);
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turn_timers x JOIN state.turns t USING (turn_id)"
                      " WHERE t.status = 'timeout'",
                      0),
        0);
    /* q's running turn runs on; a20's waits for its row. */
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turns WHERE status = 'running'"
                                   " AND agent IN ('q', 'a20')",
                                   0),
                     2);
    PQclear(PQexec(other, "COMMIT"));
    PQfinish(other);
    ck_assert_uint_eq(pw_deadlines_run(fx, &pub), 1);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turns WHERE agent = 'a20' AND status IN"
                                   " ('timeout', 'dispatched')",
                                   0),
                     2);
    ck_assert_uint_eq(pw_deadlines_run(fx, &pub), 0);
    tw_fx_free(fx);
}
END_TEST

TW_SUITE_DEFINE(pmo_watchdogs,
                {
                    {"dispatched_rering_then_reap", test_dispatched_rering_then_reap, 120},
                    {"running_reap_frozen_worker", test_running_reap_frozen_worker, 120},
                    {"pending_rering_and_missing_channel", test_pending_rering_and_missing_channel, 120},
                    {"pending_rering_log_summarised", test_pending_rering_log_summarised, 120},
                    {"turn_deadlines", test_turn_deadlines, 120},
                    {"turn_deadlines_at_once", test_turn_deadlines_at_once, 60},
                    {"outbox_relay", test_outbox_relay, 120},
                    {"outbox_relay_late_commit", test_outbox_relay_late_commit, 120},
                    {"outbox_relay_flood", test_outbox_relay_flood, 180},
                    {"outbox_relay_flood_two_pmos", test_outbox_relay_flood_two_pmos, 180},
                    {"two_pmos_200_turns_with_faults", test_two_pmos_200_turns_with_faults, 120},
                    {"rule_delays", test_rule_delays, 120},
                    {"dispatch_server_error_is_logged", test_dispatch_server_error_is_logged, 120},
                })
