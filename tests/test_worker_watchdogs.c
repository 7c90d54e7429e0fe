/* test_worker_watchdogs.c — the worker half of the safety net (issue 4, contract section 7 rules 2.1-2.3):
 * reclaims after a killed or frozen worker, tool timeout reports at each call's own deadline, resume ledger
 * leases, heartbeats of slow but live workers, and several workers running the watchdogs at once. Real
 * PostgreSQL, nats-server, turnwatch-pmo and turnwatch-worker; short configured timeouts. The measured delays
 * between a rule's due time and its action are printed as "MEASURE ..." lines on stderr. */
#include "turn_helpers.h"
#include "suite.h"

#define WD_MANY 20

static const char wd_base_overrides[] =
    "[pmo]\n"
    /* Keep the PMO's own watchdogs out of the way: these tests are about the worker's. */
    "dispatched_retry_seconds = 60\ndispatched_timeout_seconds = 120\n"
    "pending_wakeup_seconds = 60\npending_wakeup_skip_seconds = 300\nactive_reap_seconds = 120\n"
    "[worker]\ninbox_processing_timeout_seconds = 3\nheartbeat_seconds = 1\nwatchdog_interval_seconds = 1\n";

/* Agents on the real test agent in the fixture's default config; for the reclaim and lease tests, a worker A
 * that runs them with a script of the test's instead (split_start). */
typedef struct Split {
    TwFx *fx;
    char *real;     /* the real test agent */
    char *base_a;   /* worker A's overrides, without its agents */
    char *pids;     /* "<dir>/<name>.pids": where the script writes "agent pid" lines */
    char *script;   /* "/bin/sh <dir>/<name>.sh" */
    TwFxEvents *ev; /* evt.agent.*.task */
    TwFxProc *pmo, *a;
} Split;

/* The fixture, with agents <prefix>01..<prefix>NN on the real agent in the default config; `extra` (or NULL)
 * is appended to both configs' overrides, `extra_a` (or NULL) to worker A's alone. */
static Split split_fixture(const char *prefix, int n, const char *extra, const char *extra_a)
{
    Split s = {0};
    char *real = tw_fx_build_path("examples/agents/tw-test-agent");
    char *ovr = wd_fmt("%s%s", wd_base_overrides, extra ? extra : "");
    char *base_a = wd_fmt("%s%s", ovr, extra_a ? extra_a : "");
    wd_agents(&ovr, prefix, n, real);
    s.fx = wd_fixture(ovr);
    free(ovr);
    s.real = tw_fx_keep(s.fx, real);
    s.base_a = tw_fx_keep(s.fx, base_a);
    return s;
}

/* Writes worker A's script `body` (it writes "agent pid" lines to "${0%.sh}.pids", which is s->pids) and its
 * agents' sections with `step_timeout` seconds, then starts the event collector, a PMO and worker A. */
static void split_start(Split *s, const char *name, const char *prefix, int n, int step_timeout,
                        const char *body)
{
    s->pids = tw_fx_keep(s->fx, wd_fmt("%s/%s.pids", tw_fx_dir(s->fx), name));
    char *file = wd_fmt("%s.sh", name);
    s->script = tw_fx_keep(s->fx, wd_script(s->fx, file, body));
    free(file);
    char *ovr_a = wd_fmt("%s", s->base_a);
    for (int i = 1; i <= n; i++)
        wd_append(&ovr_a, "[agent.%s%02d]\nexec = %s\nstep_timeout_seconds = %d\nkill_grace_seconds = 1\n",
                  prefix, i, s->script, step_timeout);
    const char *cfg_a = tw_fx_write_config(s->fx, "a.ini", ovr_a);
    free(ovr_a);
    s->ev = tw_fx_events_new(s->fx, "evt.agent.*.task");
    s->pmo = tw_fx_start_pmo(s->fx, NULL);
    s->a = tw_fx_start_worker(s->fx, cfg_a);
}

/* ---- liveness: a worker killed with SIGKILL in the middle of agent steps
 * ------------------------------------------- */

START_TEST(test_reclaim_after_sigkill)
{
    /* A renews nothing before it dies (its first heartbeat would be 5 s after its start), and its 11 s leases
     * would hand the items back only after they expire: the liveness check must do it first. */
    Split sp = split_fixture("w", WD_MANY, "[worker]\nconcurrency = 25\n",
                             "[worker]\nheartbeat_seconds = 5\ninbox_processing_timeout_seconds = 11\n");
    /* Worker A runs a program that never answers, so that each step is in progress when A dies. Its steps
     * must still be running when it dies, however long the 20 submissions take: no step limit within the
     * test (wd_agents' 10 s ended the first ones on a loaded machine). */
    split_start(&sp, "hang", "w", WD_MANY, 300,
                "echo \"$TURNWATCH_AGENT $$\" >> \"${0%.sh}.pids\"\nexec sleep 120\n");
    TwFx *fx = sp.fx;
    TwFxEvents *ev = sp.ev;
    TwFxProc *pmo = sp.pmo, *a = sp.a;
    const char *pids = sp.pids;
    char *turns[WD_MANY];
    for (int i = 0; i < WD_MANY; i++) {
        char agent[16], input[96];
        snprintf(agent, sizeof agent, "w%02d", i + 1);
        snprintf(input, sizeof input, "{\"mode\":\"complete\",\"output\":{\"n\":%d}}", i + 1);
        turns[i] = wd_submit(fx, agent, input);
    }
    ck_assert_msg(tw_fx_wait_until(wd_has_lines, &(WdLines){pids, WD_MANY}, WD_WAIT_MS),
                  "worker A did not start all %d steps", WD_MANY);
    char *apid = wd_fmt("%%:%d", (int)tw_fx_proc_pid(a));
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.agent_inbox WHERE message_type = 'turn' "
                                   "AND status = 'processing' AND claimed_by LIKE $1",
                                   1, apid),
                     WD_MANY);
    tw_fx_proc_kill9(a);
    wd_kill_listed(pids);

    /* Two workers, both running the watchdogs: each item is reclaimed once and each turn completes once. */
    TwFxProc *b[2] = {tw_fx_start_worker(fx, NULL), tw_fx_start_worker(fx, NULL)};
    for (int i = 0; i < WD_MANY; i++)
        WD_STATUS_IS(fx, turns[i], "done");
    for (int i = 0; i < WD_MANY; i++) {
        char n[16];
        snprintf(n, sizeof n, "%d", i + 1);
        /* The deliverable is the real agent's output: the turn was completed by B, not by A's program. */
        ck_assert_int_eq(
            tw_fx_sql_int(fx,
                          "SELECT count(*) FROM state.cards c JOIN state.turns t "
                          "ON t.deliverable_card_id = c.card_id WHERE t.turn_id = $1 "
                          "AND c.content -> 'output' ->> 'n' = $2 AND NOT (c.content ? 'fallback')",
                          2, turns[i], n),
            1);
        ck_assert_int_eq(tw_fx_sql_int(fx,
                                       "SELECT attempts FROM state.agent_inbox WHERE turn_id = $1 "
                                       "AND message_type = 'turn'",
                                       1, turns[i]),
                         2);
        ck_assert_int_eq(
            tw_fx_sql_int(fx, "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND kind = 'task'", 1,
                          turns[i]),
            1);
        ck_assert_msg(tw_fx_events_wait(ev, NULL, turns[i], 1, WD_WAIT_MS), "no final event for %s",
                      turns[i]);
    }
    /* A's session ended with it, so its claims came back through the liveness check (contract section 9), at
     * once, not when their 11 s leases ran out: every daemon polls for gone daemons, here the PMO (the
     * workers started after A died). */
    TwFxProc *all[3] = {pmo, b[0], b[1]};
    json_t *live = wd_actions_of(all, 3, "liveness reclaim_gone_daemons");
    json_t *reclaims = wd_actions_where(live, "fence", "inbox");
    json_t *gone = wd_actions_where(live, "action", "daemon_gone");
    ck_assert_uint_eq(json_array_size(reclaims), WD_MANY);
    ck_assert_uint_eq(json_array_size(gone), 1);
    ck_assert_ptr_nonnull(
        strstr(json_string_value(json_object_get(json_array_get(gone, 0), "daemon")), apid + 1));
    /* No item reclaimed twice, and every reclaim is one of A's claims. */
    size_t i;
    json_t *r;
    json_array_foreach(reclaims, i, r)
    {
        size_t dup = 0, k;
        json_t *o;
        json_array_foreach(reclaims, k, o) dup +=
            json_integer_value(json_object_get(o, "id")) == json_integer_value(json_object_get(r, "id"));
        ck_assert_uint_eq(dup, 1);
        ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(r, "daemon")), apid + 1));
        ck_assert_str_eq(json_string_value(json_object_get(r, "message_type")), "turn");
    }
    /* Nothing was left for rule 2.1. */
    ck_assert_uint_eq(wd_action_count(all, 3, "2.1 reclaim_inbox"), 0);
    json_decref(live);
    json_decref(gone);
    tw_fx_sleep_ms(300); /* late duplicates, if any, would show up now */
    for (int k = 0; k < WD_MANY; k++) {
        ck_assert_uint_eq(wd_task_events(ev, turns[k]), 1);
        free(turns[k]);
    }
    json_decref(reclaims);
    /* The counters each daemon logs when it stops agree with its action lines (those include the daemons
     * stopped here one after another, which the others see go). */
    long counted = 0;
    for (int k = 0; k < 3; k++) {
        ck_assert_int_eq(tw_fx_proc_terminate(all[k], 10000), 0);
        long c = wd_counter(all[k], "liveness reclaim_gone_daemons");
        ck_assert_int_ge(c, 0);
        counted += c;
    }
    json_t *lines = wd_actions_of(all, 3, "liveness reclaim_gone_daemons");
    ck_assert_int_ge(counted, WD_MANY + 1);
    ck_assert_int_eq(counted, (long)json_array_size(lines));
    json_decref(lines);
    free(apid);
    wd_done(sp.fx);
}
END_TEST

/* ---- 2.1 and fencing: a frozen worker wakes up after its work was reclaimed
 * ----------------------------------- */

START_TEST(test_sigstop_stale_worker)
{
    Split sp = split_fixture("s", 2, NULL, NULL);
    /* On the stale worker: s01's program runs until stopped; s02's answers (too late) while its worker is
     * frozen. */
    split_start(&sp, "stale", "s", 2, 10,
                "echo \"$TURNWATCH_AGENT $$\" >> \"${0%.sh}.pids\"\n"
                "if [ \"$TURNWATCH_AGENT\" = s02 ]; then sleep 1; "
                "echo '{\"complete\":{\"output\":{\"by\":\"stale\"}}}'; exit 0; fi\n"
                "exec sleep 120\n");
    TwFx *fx = sp.fx;
    TwFxEvents *ev = sp.ev;
    TwFxProc *a = sp.a;
    const char *pids = sp.pids;
    char *t1 = wd_submit(fx, "s01", "{\"mode\":\"complete\",\"output\":{\"by\":\"fresh\"}}");
    char *t2 = wd_submit(fx, "s02", "{\"mode\":\"complete\",\"output\":{\"by\":\"fresh\"}}");
    ck_assert(tw_fx_wait_until(wd_has_lines, &(WdLines){pids, 2}, WD_WAIT_MS));
    ck_assert(tw_fx_proc_freeze(a));
    pid_t hung = wd_listed_pid(pids, "s01");
    ck_assert_int_gt(hung, 1);

    /* Past the reclaim time another worker takes both turns over and completes them. */
    TwFxProc *b = tw_fx_start_worker(fx, NULL);
    WD_STATUS_IS(fx, t1, "done");
    WD_STATUS_IS(fx, t2, "done");
    ck_assert(tw_fx_events_wait(ev, NULL, t1, 1, WD_WAIT_MS));
    ck_assert(tw_fx_events_wait(ev, NULL, t2, 1, WD_WAIT_MS));
    int64_t outbox_before =
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.outbox WHERE turn_id IN ($1, $2)", 2, t1, t2);
    int64_t cards_before =
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.cards WHERE turn_id IN ($1, $2)", 2, t1, t2);

    /* The stale worker wakes up: it learns it lost its claims, stops s01's program and drops s02's output. */
    ck_assert(tw_fx_proc_thaw(a));
    ck_assert_msg(tw_fx_wait_until(wd_log_line_has, &(WdLogHas){a, "lost its claim", t1}, WD_WAIT_MS),
                  "the stale worker never noticed it lost turn %s", t1);
    ck_assert_msg(tw_fx_wait_until(wd_pid_gone, &hung, WD_WAIT_MS), "the stale program %d is still running",
                  (int)hung);
    ck_assert(tw_fx_wait_until(wd_log_line_has, &(WdLogHas){a, t2, "dropped"}, WD_WAIT_MS) ||
              tw_fx_wait_until(wd_log_line_has, &(WdLogHas){a, t2, "lost its claim"}, 100));
    ck_assert(tw_fx_proc_alive(a));
    /* Nothing it did afterwards had any effect. */
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.outbox WHERE turn_id IN ($1, $2)", 2, t1, t2),
        outbox_before);
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.cards WHERE turn_id IN ($1, $2)", 2, t1, t2),
        cards_before);
    for (int k = 0; k < 2; k++) {
        const char *t = k ? t2 : t1;
        char *by =
            tw_fx_sql_str(fx,
                          "SELECT c.content -> 'output' ->> 'by' FROM state.cards c JOIN state.turns t "
                          "ON t.deliverable_card_id = c.card_id WHERE t.turn_id = $1",
                          1, t);
        ck_assert_str_eq(by, "fresh");
        free(by);
        char *st = tw_fx_sql_str(fx, "SELECT status FROM state.turns WHERE turn_id = $1", 1, t);
        ck_assert_str_eq(st, "done");
        free(st);
        ck_assert_uint_eq(wd_task_events(ev, t), 1);
    }
    wd_assert_acted(&b, 1, "2.1 reclaim_inbox", 2, "2.1 reclaim, frozen worker", 5000);
    free(t1);
    free(t2);
    wd_done(sp.fx);
}
END_TEST

/* ---- 2.2: three calls, three deadlines, reported one by one
 * ---------------------------------------------------- */

START_TEST(test_tool_timeouts_in_deadline_order)
{
    /* Deadline = suspended_at + max(worker suspend_timeout_seconds, tool suspend_timeout_seconds, tool
     * timeout_seconds): xa 2 s (the worker's default wins), xb 5 s (the tool's timeout), xc 8 s (the tool's
     * suspend timeout). */
    TwFxStack st = tw_fx_stack_start_events(
        "[worker]\nsuspend_timeout_seconds = 2\nheartbeat_seconds = 1\n"
        "[pmo]\ndispatched_retry_seconds = 60\ndispatched_timeout_seconds = 120\n"
        "pending_wakeup_seconds = 60\npending_wakeup_skip_seconds = 300\n"
        "[tool.xa]\nexternal = true\ntimeout_seconds = 1\nsuspend_timeout_seconds = 1\n"
        "[tool.xb]\nexternal = true\ntimeout_seconds = 5\nsuspend_timeout_seconds = 1\n"
        "[tool.xc]\nexternal = true\ntimeout_seconds = 1\nsuspend_timeout_seconds = 8\n",
        "evt.agent.*.task");
    char *t =
        wd_submit(st.fx, "tester",
                  "{\"mode\":\"tools\",\"calls\":[{\"id\":\"c\",\"tool\":\"xc\",\"args\":{}},"
                  "{\"id\":\"a\",\"tool\":\"xa\",\"args\":{}},{\"id\":\"b\",\"tool\":\"xb\",\"args\":{}}]}");
    WD_STATUS_IS(st.fx, t, "suspended");
    static const struct {
        const char *id;
        int wait_s;
    } calls[] = {{"a", 2}, {"b", 5}, {"c", 8}};
    for (int k = 0; k < 3; k++) {
        char ws[8];
        snprintf(ws, sizeof ws, "%d", calls[k].wait_s);
        ck_assert_msg(tw_fx_sql_int(st.fx,
                                    "SELECT count(*) FROM state.turn_waiting_tools w JOIN state.turns t "
                                    "USING (turn_id) WHERE turn_id = $1 AND tool_call_id = $2 "
                                    "AND w.deadline_at = t.suspended_at + make_interval(secs => $3::int)",
                                    3, t, calls[k].id, ws) == 1,
                      "call %s: deadline is not suspended_at + %d s", calls[k].id, calls[k].wait_s);
    }
    ck_assert_int_eq(
        tw_fx_sql_int(st.fx,
                      "SELECT count(*) FROM state.turns t WHERE turn_id = $1 AND resume_deadline = "
                      "(SELECT deadline_at FROM state.turn_waiting_tools WHERE turn_id = $1 "
                      "AND tool_call_id = 'a')",
                      1, t),
        1);

    /* One by one: when a call is reported, the later ones are still waiting and resume_deadline moves on. */
    for (int k = 0; k < 3; k++) {
        ck_assert_msg(tw_fx_sql_wait(st.fx, WD_WAIT_MS, "timeout",
                                     "SELECT wait_status FROM state.turn_waiting_tools "
                                     "WHERE turn_id = $1 AND tool_call_id = $2",
                                     2, t, calls[k].id),
                      "call %s never timed out", calls[k].id);
        if (k == 0) {
            /* A real result after the report changes nothing: the CLI refuses it. */
            char *out = NULL, *err = NULL;
            int64_t inbox =
                tw_fx_sql_int(st.fx, "SELECT count(*) FROM state.agent_inbox WHERE turn_id = $1", 1, t);
            int rc = tw_fx_cli(st.fx, &out, &err, "tool-result", "--turn", t, "--call", "a", "--output",
                               "{\"late\":true}", NULL);
            ck_assert_msg(rc == 1, "late tool-result exited %d: %s", rc, err);
            ck_assert_ptr_nonnull(strstr(err, "timed out"));
            free(out);
            free(err);
            ck_assert_int_eq(
                tw_fx_sql_int(st.fx, "SELECT count(*) FROM state.agent_inbox WHERE turn_id = $1", 1, t),
                inbox);
            ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                           "SELECT count(*) FROM state.cards WHERE turn_id = $1 AND "
                                           "card_type = 'tool.result' AND tool_call_id = 'a'",
                                           1, t),
                             1);
        }
        if (k < 2) {
            ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                           "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1 "
                                           "AND wait_status = 'waiting'",
                                           1, t),
                             2 - k);
            ck_assert_int_eq(
                tw_fx_sql_int(st.fx,
                              "SELECT count(*) FROM state.turns t WHERE turn_id = $1 "
                              "AND status = 'suspended' AND resume_deadline = (SELECT deadline_at "
                              "FROM state.turn_waiting_tools WHERE turn_id = $1 AND tool_call_id = $2)",
                              2, t, calls[k + 1].id),
                1);
        }
    }
    WD_STATUS_IS(st.fx, t, "done");

    /* Each report came after its own deadline and before the next call was even due. */
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1 "
                                   "AND settled_at >= deadline_at",
                                   1, t),
                     3);
    ck_assert_int_eq(
        tw_fx_sql_int(st.fx,
                      "SELECT count(*) FROM state.turn_waiting_tools x JOIN state.turn_waiting_tools y"
                      " USING (turn_id) WHERE turn_id = $1 AND x.deadline_at < y.deadline_at "
                      "AND x.settled_at < y.deadline_at",
                      1, t),
        3);
    /* Per call: one tool.result card (status timeout, tool_timeout), one 'timeout' inbox message, consumed.
     */
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.cards WHERE turn_id = $1 AND card_type = "
                                   "'tool.result' AND content ->> 'status' = 'timeout' AND "
                                   "content -> 'error' ->> 'code' = 'tool_timeout'",
                                   1, t),
                     3);
    ck_assert_int_eq(
        tw_fx_sql_int(st.fx,
                      "SELECT count(DISTINCT tool_call_id) FROM state.agent_inbox WHERE turn_id = $1 "
                      "AND message_type = 'timeout' AND status = 'archived' AND outcome = 'applied'",
                      1, t),
        3);
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.agent_inbox WHERE turn_id = $1 "
                                   "AND message_type = 'timeout'",
                                   1, t),
                     3);
    /* The agent's next step saw the three timeouts. */
    char *seen = tw_fx_sql_str(st.fx,
                               "SELECT c.content -> 'output' -> 'tool_results' -> 0 FROM state.cards c "
                               "JOIN state.turns t ON t.deliverable_card_id = c.card_id WHERE t.turn_id = $1",
                               1, t);
    json_t *res = json_loads(seen, 0, NULL);
    ck_assert_msg(json_array_size(res) == 3, "the agent saw %s", seen);
    size_t i;
    json_t *r;
    json_array_foreach(res, i, r)
    {
        ck_assert_str_eq(json_string_value(json_object_get(r, "status")), "timeout");
        ck_assert_str_eq(json_string_value(json_object_get(json_object_get(r, "error"), "code")),
                         "tool_timeout");
    }
    json_decref(res);
    free(seen);
    json_t *reports = wd_actions_of(&st.worker, 1, "2.2 tool_timeouts");
    ck_assert_uint_eq(json_array_size(reports), 3);
    json_array_foreach(reports, i, r)
    {
        ck_assert_str_eq(json_string_value(json_object_get(r, "action")), "timeout_report");
        ck_assert_str_eq(json_string_value(json_object_get(r, "tool_call_id")), calls[i].id);
    }
    wd_report_delays("2.2 timeout report, three deadlines", reports, 5000);
    json_decref(reports);
    ck_assert(tw_fx_events_wait(st.ev, NULL, t, 1, WD_WAIT_MS));
    ck_assert_uint_eq(wd_task_events(st.ev, t), 1);
    free(t);
    wd_done(st.fx);
}
END_TEST

/* ---- 2.2 at scale: external tools that never answer, two workers' watchdogs
 * ----------------------------------- */

START_TEST(test_tool_timeouts_many)
{
    Split sp = split_fixture("t", WD_MANY,
                             "[worker]\nsuspend_timeout_seconds = 2\nconcurrency = 25\n"
                             "[tool.ext]\ntimeout_seconds = 1\nsuspend_timeout_seconds = 1\n",
                             NULL);
    TwFx *fx = sp.fx;
    TwFxEvents *ev = tw_fx_events_new(fx, "evt.agent.*.task");
    tw_fx_start_pmo(fx, NULL);
    TwFxProc *w[2] = {tw_fx_start_worker(fx, NULL), tw_fx_start_worker(fx, NULL)};
    char *turns[WD_MANY];
    for (int i = 0; i < WD_MANY; i++) {
        char agent[16];
        snprintf(agent, sizeof agent, "t%02d", i + 1);
        turns[i] = wd_submit(fx, agent,
                             "{\"mode\":\"tools\",\"calls\":[{\"id\":\"x\",\"tool\":\"ext\",\"args\":{}}]}");
    }
    for (int i = 0; i < WD_MANY; i++)
        WD_STATUS_IS(fx, turns[i], "done");
    for (int i = 0; i < WD_MANY; i++) {
        const char *t = turns[i];
        /* One report: the card, the 'timeout' message, the waiting row settled as timeout. */
        ck_assert_int_eq(tw_fx_sql_int(fx,
                                       "SELECT count(*) FROM state.cards WHERE turn_id = $1 AND card_type = "
                                       "'tool.result' AND content ->> 'status' = 'timeout' AND "
                                       "content -> 'error' ->> 'code' = 'tool_timeout'",
                                       1, t),
                         1);
        ck_assert_int_eq(tw_fx_sql_int(fx,
                                       "SELECT count(*) FROM state.agent_inbox WHERE turn_id = $1 AND "
                                       "message_type = 'timeout' AND tool_call_id = 'x'",
                                       1, t),
                         1);
        ck_assert_int_eq(tw_fx_sql_int(fx,
                                       "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1 AND "
                                       "wait_status = 'timeout' AND result_status = 'timeout'",
                                       1, t),
                         1);
        /* One resume: one ledger entry, claimed once. */
        ck_assert_int_eq(tw_fx_sql_int(fx,
                                       "SELECT count(*) FROM state.turn_resume_ledger WHERE turn_id = $1 AND "
                                       "attempts = 1 AND status = 'done' AND outcome = 'applied'",
                                       1, t),
                         1);
        char *r =
            tw_fx_sql_str(fx,
                          "SELECT c.content -> 'output' -> 'tool_results' -> 0 -> 0 FROM state.cards c "
                          "JOIN state.turns t ON t.deliverable_card_id = c.card_id WHERE t.turn_id = $1",
                          1, t);
        json_t *j = json_loads(r, 0, NULL);
        ck_assert_msg(j, "no tool result seen by the agent: %s", r);
        ck_assert_str_eq(json_string_value(json_object_get(j, "status")), "timeout");
        ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                         "tool_timeout");
        json_decref(j);
        free(r);
        ck_assert(tw_fx_events_wait(ev, NULL, t, 1, WD_WAIT_MS));
    }
    json_t *reports = wd_actions_of(w, 2, "2.2 tool_timeouts");
    ck_assert_uint_eq(json_array_size(reports), WD_MANY);
    size_t i, k;
    json_t *r, *o;
    json_array_foreach(reports, i, r)
    {
        size_t same = 0;
        json_array_foreach(reports, k, o) same +=
            strcmp(json_string_value(json_object_get(o, "turn_id")),
                   json_string_value(json_object_get(r, "turn_id"))) == 0;
        ck_assert_uint_eq(same, 1);
    }
    wd_report_delays("2.2 timeout report (due = the call's deadline_at)", reports, 5000);
    /* The same numbers from the database: settled_at - deadline_at. */
    char *db =
        tw_fx_sql_str(fx,
                      "SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY d))::text || ' ms / ' || "
                      "round(max(d))::text || ' ms' FROM (SELECT extract(epoch FROM settled_at - deadline_at)"
                      " * 1000 AS d FROM state.turn_waiting_tools WHERE wait_status = 'timeout') x",
                      0);
    fprintf(stderr, "MEASURE 2.2 timeout report, from settled_at - deadline_at: median / max = %s\n", db);
    free(db);
    tw_fx_sleep_ms(300);
    for (int n = 0; n < WD_MANY; n++) {
        ck_assert_uint_eq(wd_task_events(ev, turns[n]), 1);
        free(turns[n]);
    }
    json_decref(reports);
    wd_done(sp.fx);
}
END_TEST

/* ---- 2.3: a worker killed while holding a resume ledger lease
 * ---------------------------------------------------- */

START_TEST(test_ledger_lease_expiry)
{
    Split sp = split_fixture("l", 1, NULL, NULL);
    /* On worker A, step 0 is the real agent (it asks for a tool) and the resumed step never answers. */
    char *body = wd_fmt(
        "in=$(cat)\n"
        "case \"$in\" in *'\"step\": 0,'* | *'\"step\":0,'*) printf '%%s' \"$in\" | %s; exit $? ;; esac\n"
        "echo \"$TURNWATCH_AGENT $$\" >> \"${0%%.sh}.pids\"\nexec sleep 120\n",
        sp.real);
    split_start(&sp, "ledger", "l", 1, 10, body);
    free(body);
    TwFx *fx = sp.fx;
    TwFxEvents *ev = sp.ev;
    TwFxProc *a = sp.a;
    const char *pids = sp.pids;
    char *t =
        wd_submit(fx, "l01", "{\"mode\":\"tools\",\"calls\":[{\"id\":\"e1\",\"tool\":\"ext\",\"args\":{}}]}");
    WD_STATUS_IS(fx, t, "suspended");
    ck_assert_int_eq(wd_tool_result(fx, t, "e1", "{\"v\":1}"), 0);
    ck_assert(tw_fx_wait_until(wd_has_lines, &(WdLines){pids, 1}, WD_WAIT_MS));
    char *apid = wd_fmt("%%:%d", (int)tw_fx_proc_pid(a));
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turn_resume_ledger WHERE turn_id = $1 "
                                   "AND status = 'processing' AND claimed_by LIKE $2",
                                   2, t, apid),
                     1);
    /* Frozen, not killed: its session and liveness lock stay, so only the lease can hand the step back. */
    ck_assert(tw_fx_proc_freeze(a));
    wd_kill_listed(pids);

    TwFxProc *b[2] = {tw_fx_start_worker(fx, NULL), tw_fx_start_worker(fx, NULL)};
    WD_STATUS_IS(fx, t, "done");
    /* Resumed once more, after the lease expired, with the result that had arrived. */
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turn_resume_ledger WHERE turn_id = $1 "
                                   "AND attempts = 2 AND status = 'done' AND outcome = 'applied'",
                                   1, t),
                     1);
    char *seen = tw_fx_sql_str(fx,
                               "SELECT c.content -> 'output' -> 'tool_results' -> 0 -> 0 -> 'output' ->> 'v' "
                               "FROM state.cards c JOIN state.turns t ON t.deliverable_card_id = c.card_id "
                               "WHERE t.turn_id = $1",
                               1, t);
    ck_assert_str_eq(seen, "1");
    free(seen);
    json_t *requeues = wd_actions_of(b, 2, "2.3 requeue_expired_resume_ledgers");
    ck_assert_uint_eq(json_array_size(requeues), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(requeues, 0), "turn_id")), t);
    wd_report_delays("2.3 ledger requeue (due = lease_expires_at)", requeues, 5000);
    json_decref(requeues);
    ck_assert(tw_fx_events_wait(ev, NULL, t, 1, WD_WAIT_MS));
    tw_fx_sleep_ms(300);
    ck_assert_uint_eq(wd_task_events(ev, t), 1);
    free(t);
    free(apid);
    wd_done(sp.fx);
}
END_TEST

/* ---- heartbeats: a slow but live worker keeps its claim
 * ---------------------------------------------------------- */

START_TEST(test_slow_live_worker_keeps_claim)
{
    /* The step outlives both the reclaim time (3 s) and the PMO's 2.6 reap time (3 s): heartbeats keep it. */
    char *ovr = wd_fmt("%s[pmo]\nactive_reap_seconds = 3\n", wd_base_overrides);
    TwFx *fx = wd_fixture(ovr);
    TwFxEvents *ev = tw_fx_events_new(fx, "evt.agent.*.task");
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    TwFxProc *w[2] = {tw_fx_start_worker(fx, NULL), tw_fx_start_worker(fx, NULL)};
    /* Twice the reclaim time (3 s), heartbeated every second. */
    char *t = wd_submit(fx, "tester", "{\"mode\":\"sleep\",\"seconds\":6}");
    WD_STATUS_IS(fx, t, "running");
    WD_STATUS_IS(fx, t, "done");
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT attempts FROM state.agent_inbox WHERE turn_id = $1 "
                                   "AND message_type = 'turn'",
                                   1, t),
                     1);
    ck_assert_uint_eq(wd_action_count(w, 2, "2.1 reclaim_inbox"), 0);
    ck_assert_uint_eq(wd_action_count(&pmo, 1, "2.6 reap_running"), 0);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.force_terminations", 0), 0);
    ck_assert(tw_fx_events_wait(ev, NULL, t, 1, WD_WAIT_MS));
    ck_assert_uint_eq(wd_task_events(ev, t), 1);
    free(t);
    free(ovr);
    wd_done(fx);
}
END_TEST

/* ---- 2.2: a waiting call whose tool.call card is missing gets no report
 * ----------------------------------------- */

START_TEST(test_tool_timeout_missing_card)
{
    TwFxStack st =
        tw_fx_stack_start_events("[worker]\nsuspend_timeout_seconds = 2\nheartbeat_seconds = 1\n"
                                 "[pmo]\ndispatched_retry_seconds = 60\ndispatched_timeout_seconds = 120\n"
                                 "pending_wakeup_seconds = 60\npending_wakeup_skip_seconds = 300\n"
                                 "[tool.ext]\ntimeout_seconds = 1\nsuspend_timeout_seconds = 1\n",
                                 "evt.agent.*.task");
    char *t = wd_submit(st.fx, "tester",
                        "{\"mode\":\"tools\",\"calls\":[{\"id\":\"m1\",\"tool\":\"ext\",\"args\":{}},"
                        "{\"id\":\"m2\",\"tool\":\"ext\",\"args\":{}}]}");
    WD_STATUS_IS(st.fx, t, "suspended");
    /* m1's card disappears (a broken writer, a bad restore): the watchdog must not invent a report for it. */
    tw_fx_sql_exec(
        st.fx,
        "DELETE FROM state.cards WHERE turn_id = $1 AND card_type = 'tool.call' AND tool_call_id = 'm1'", 1,
        t);
    ck_assert(tw_fx_sql_wait(st.fx, WD_WAIT_MS, "timeout",
                             "SELECT wait_status FROM state.turn_waiting_tools WHERE "
                             "turn_id = $1 AND tool_call_id = 'm2'",
                             1, t));
    ck_assert(
        tw_fx_wait_until(wd_log_line_has, &(WdLogHas){st.worker, "skipped_missing_card", t}, WD_WAIT_MS));
    /* Logged once with the turn and the call; resume_deadline no longer points at it; the call still waits.
     */
    tw_fx_sleep_ms(2500);
    json_t *acts = wd_actions_of(&st.worker, 1, "2.2 tool_timeouts");
    json_t *skipped = wd_actions_where(acts, "action", "skipped_missing_card");
    ck_assert_uint_eq(json_array_size(skipped), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(skipped, 0), "tool_call_id")), "m1");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(skipped, 0), "turn_id")), t);
    ck_assert_int_eq(
        tw_fx_sql_int(st.fx,
                      "SELECT count(*) FROM state.turns WHERE turn_id = $1 AND status = 'suspended' "
                      "AND resume_deadline IS NULL",
                      1, t),
        1);
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.agent_inbox WHERE turn_id = $1 AND "
                                   "message_type = 'timeout'",
                                   1, t),
                     1);
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1 AND "
                                   "tool_call_id = 'm1' AND wait_status = 'waiting'",
                                   1, t),
                     1);
    /* A real answer for it still resumes the turn. */
    ck_assert_int_eq(wd_tool_result(st.fx, t, "m1", "{\"ok\":1}"), 0);
    WD_STATUS_IS(st.fx, t, "done");
    ck_assert(tw_fx_events_wait(st.ev, NULL, t, 1, WD_WAIT_MS));
    json_decref(acts);
    json_decref(skipped);
    free(t);
    wd_done(st.fx);
}
END_TEST

/* ---- 2.2 for many calls due together: one run reports them all, each as tw.deliver_result would, with one
 * doorbell per agent; a turn with a call still in time waits on for it. Driven in SQL: no daemon runs.
 * ---------------------------------------------------------------------------------------------------------
 */

START_TEST(test_tool_timeouts_at_once)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    tw_fx_sql_exec(fx,
                   "SELECT tw.submit_turn('t' || lpad(i::text, 2, '0'), 'c', '{}', NULL, NULL, NULL, 'echo')"
                   "  FROM generate_series(1, 20) i",
                   0);
    /* Each turn calls x (due in 1 s) and y: due in 1 s too for t11..t20, in 600 s for t01..t10. */
    ck_assert_int_eq(
        tw_fx_sql_int(
            fx,
            "WITH c AS (SELECT tw.claim('w1', '{echo}', '{}', 100, 30)::jsonb AS a)"
            " SELECT count(*) FROM (SELECT tw.apply_steps(jsonb_agg(jsonb_build_object('fence', j,"
            "   'reply', jsonb_build_object('wait', 'all', 'tool_calls', jsonb_build_array("
            "     jsonb_build_object('id', 'x', 'tool', 'ext', 'args', '{}'::jsonb, 'timeout_seconds', 1,"
            "                        'wait_seconds', 1, 'external', true),"
            "     jsonb_build_object('id', 'y', 'tool', 'ext', 'args', '{}'::jsonb, 'timeout_seconds', 1,"
            "                        'wait_seconds', CASE WHEN j ->> 'agent' > 't10' THEN 1 ELSE 600 END,"
            "                        'external', true))))), 'w1', '{echo}') AS r"
            "   FROM c, jsonb_array_elements(c.a -> 'jobs') j) x",
            0),
        1);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns WHERE status = 'suspended'", 0), 20);
    ck_assert(tw_fx_sql_wait_count(
        fx,
        "SELECT count(*) FROM state.turn_waiting_tools WHERE wait_status = 'waiting' AND deadline_at < now()",
        30, 10000));

    char *text = tw_fx_sql_str(fx, "SELECT tw.wd_tool_timeouts(200)::text", 0);
    json_t *out = json_loads(text, 0, NULL), *a;
    ck_assert_msg(out != NULL, "answer: %s", text);
    size_t i, reports = 0;
    json_array_foreach(json_object_get(out, "actions"), i, a)
    {
        ck_assert_str_eq(json_string_value(json_object_get(a, "action")), "timeout_report");
        ck_assert(json_is_integer(json_object_get(a, "lateness_ms")));
        reports++;
    }
    ck_assert_msg(reports == 30, "%zu reports: %s", reports, text);
    /* One doorbell per agent. */
    ck_assert_msg(json_array_size(json_object_get(out, "publish")) == 20, "%s", text);
    json_decref(out);
    free(text);
    /* What deliver_result writes for each: the tool.result card, the call settled, a timeout message. */
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turn_waiting_tools w JOIN state.cards c"
                      " ON c.card_id = w.result_card_id AND c.card_type = 'tool.result'"
                      " AND c.tool_call_id = w.tool_call_id AND c.content ->> 'status' = 'timeout'"
                      " AND c.content -> 'error' ->> 'code' = 'tool_timeout'"
                      " WHERE w.wait_status = 'timeout' AND w.result_status = 'timeout'"
                      " AND w.error ->> 'message' LIKE 'tool ext did not answer call _ within % seconds'"
                      " AND w.settled_at IS NOT NULL",
                      0),
        30);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.agent_inbox m JOIN state.turn_waiting_tools w"
                                   " ON w.turn_id = m.turn_id AND w.tool_call_id = m.tool_call_id"
                                   " AND (m.payload ->> 'card_id')::uuid = w.result_card_id"
                                   " WHERE m.message_type = 'timeout' AND m.status = 'pending'"
                                   " AND m.payload ->> 'status' = 'timeout'",
                                   0),
                     30);
    /* t01..t10 wait on for y; t11..t20 have nothing left to wait for. */
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turns t JOIN state.turn_waiting_tools w"
                                   " ON w.turn_id = t.turn_id AND w.tool_call_id = 'y'"
                                   " WHERE t.status = 'suspended' AND t.resume_deadline = w.deadline_at"
                                   " AND w.wait_status = 'waiting' AND t.agent <= 't10'",
                                   0),
                     10);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turns WHERE resume_deadline IS NULL"
                                   " AND agent > 't10'",
                                   0),
                     10);
    /* Nothing is reported twice. */
    text = tw_fx_sql_str(fx, "SELECT tw.wd_tool_timeouts(200) -> 'actions'", 0);
    ck_assert_str_eq(text, "[]");
    free(text);
    tw_fx_free(fx);
}
END_TEST

TW_SUITE_DEFINE(worker_watchdogs,
                {
                    {"reclaim_after_sigkill", test_reclaim_after_sigkill, 90},
                    {"sigstop_stale_worker", test_sigstop_stale_worker, 90},
                    {"tool_timeouts_in_deadline_order", test_tool_timeouts_in_deadline_order, 90},
                    {"tool_timeouts_many", test_tool_timeouts_many, 90},
                    {"ledger_lease_expiry", test_ledger_lease_expiry, 90},
                    {"slow_live_worker_keeps_claim", test_slow_live_worker_keeps_claim, 90},
                    {"tool_timeout_missing_card", test_tool_timeout_missing_card, 90},
                    {"tool_timeouts_at_once", test_tool_timeouts_at_once, 60},
                })
