/* test_roster.c — the agent roster and delegation (issue 17, contract section 14), against the real servers
 * and daemons: adding, retiring and showing agents through the CLI and SQL (errors with SQLSTATE 22023); many
 * agents of one profile running at once while each agent stays serial; a backlog of ten times the worker's
 * slots lasting ten times dispatched_timeout_seconds ending with every turn done, while a turn no worker
 * serves still ends dispatch_timeout; delegation done, failed, timed out, cancelled through two levels, the
 * depth limit; and a delegation tree under killed workers and PMOs, every turn ending once. */
#include "turn_helpers.h"
#include "suite.h"

#include <sys/wait.h>

/* The fixture's agents and tools plus delegating tools: `child` runs calls as turns of profile tester, `slow`
 * the same with a short call deadline (2 s at most: worker and tool suspend timeouts 2, timeout 2). */
static const char ro_overrides[] = "[pmo]\ndispatched_retry_seconds = 1\ndispatched_timeout_seconds = 3\n"
                                   "[worker]\nsuspend_timeout_seconds = 2\n"
                                   "[tool.child]\nagent_profile = tester\nsuspend_timeout_seconds = 30\n"
                                   "timeout_seconds = 30\n"
                                   "[tool.slow]\nagent_profile = tester\nsuspend_timeout_seconds = 2\n"
                                   "timeout_seconds = 2\n";

static char *ro_cli(TwFx *fx, int want_rc, const char *a1, const char *a2, const char *a3, const char *a4,
                    const char *a5, const char *a6)
{
    char *out = NULL, *err = NULL;
    int rc = tw_fx_cli(fx, &out, &err, a1, a2, a3, a4, a5, a6, NULL);
    ck_assert_msg(rc == want_rc, "turnwatch %s %s %s: exit %d (wanted %d): %s%s", a1, a2 ? a2 : "",
                  a3 ? a3 : "", rc, want_rc, out, err);
    char *both = wd_fmt("%s%s", out ? out : "", err ? err : "");
    free(out);
    free(err);
    return both;
}

/* The statement raises SQLSTATE 22023 (invalid_parameter_value). */
static bool ro_sql_22023(TwFx *fx, const char *stmt)
{
    char *err = NULL;
    char *sql =
        wd_fmt("DO $$ BEGIN %s; RAISE EXCEPTION 'no error'; EXCEPTION WHEN invalid_parameter_value THEN "
               "NULL; END $$",
               stmt);
    bool ok = tw_fx_sql_try(fx, &err, sql, 0);
    if (!ok)
        fprintf(stderr, "%s: %s\n", stmt, err);
    free(err);
    free(sql);
    return ok;
}

/* The task events of exactly this turn (a child's event names its parent too). */
static bool ro_is_task_of(const char *subject, const json_t *data, void *arg)
{
    const char *id = json_string_value(json_object_get(data, "turn_id"));
    size_t n = strlen(subject);
    return id && strcmp(id, arg) == 0 && n > 5 && strcmp(subject + n - 5, ".task") == 0;
}

static size_t ro_task_events(TwFxEvents *ev, const char *turn)
{
    return tw_fx_events_count_if(ev, ro_is_task_of, (void *)turn);
}

/* `turnwatch submit` of `agent` with `profile` (NULL for none). */
static char *ro_submit_as(TwFx *fx, const char *agent, const char *profile, const char *input)
{
    return wd_submit_with(fx, agent, input, NULL, NULL, profile);
}

/* ---- the roster through the CLI and SQL -------------------------------------------------------------------
 */

START_TEST(test_roster_cli_and_sql)
{
    TwFx *fx = wd_fixture(ro_overrides);
    char *s;

    /* migrate published the profiles of the config, each also an agent of its name. */
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.profiles WHERE profile IN ('echo', 'tester')", 0), 2);
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.agents WHERE agent = 'echo' AND profile = 'echo'", 0),
        1);
    s = ro_cli(fx, 0, "--json", "agent", "add", "alice", "--profile", "echo");
    ck_assert_msg(strstr(s, "\"created\":true"), "%s", s);
    free(s);
    /* Idempotent for the same profile; an error for another, a bad id, an unknown profile. */
    s = ro_cli(fx, 0, "--json", "agent", "add", "alice", "--profile", "echo");
    ck_assert_msg(strstr(s, "\"created\":false"), "%s", s);
    free(s);
    s = ro_cli(fx, 2, "agent", "add", "alice", "--profile", "tester", NULL);
    ck_assert_msg(strstr(s, "bound to profile echo"), "%s", s);
    free(s);
    s = ro_cli(fx, 2, "agent", "add", "bad.id", "--profile", "echo", NULL);
    ck_assert_msg(strstr(s, "invalid agent id"), "%s", s);
    free(s);
    s = ro_cli(fx, 2, "agent", "add", "bob", "--profile", "nosuch", NULL);
    ck_assert_msg(strstr(s, "unknown profile nosuch"), "%s", s);
    free(s);
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.agents WHERE agent IN ('bad.id', 'bob')", 0), 0);
    ck_assert_int_eq(tw_fx_cli(fx, NULL, NULL, "agent", "add", "carol", "--profile", "tester", "--metadata",
                               "{\"team\":\"x\"}", NULL),
                     0);
    s = ro_cli(fx, 0, "--json", "agent", "show", "carol", NULL, NULL);
    ck_assert_msg(strstr(s, "\"profile\":\"tester\"") && strstr(s, "\"team\":\"x\""), "%s", s);
    free(s);
    s = ro_cli(fx, 2, "agent", "show", "nobody", NULL, NULL, NULL);
    free(s);
    s = ro_cli(fx, 0, "--json", "agents", "list", "--profile", "echo", NULL);
    ck_assert_msg(strstr(s, "\"agent\":\"alice\"") && !strstr(s, "carol"), "%s", s);
    free(s);

    /* The SQL functions: created / not, and every refusal as SQLSTATE 22023. */
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT tw.add_agent('dave', 'echo')::int", 0), 1);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT tw.add_agent(agent => 'dave', profile => 'echo')::int", 0), 0);
    ck_assert(ro_sql_22023(fx, "PERFORM tw.add_agent('dave', 'tester')"));
    ck_assert(ro_sql_22023(fx, "PERFORM tw.add_agent('no way', 'echo')"));
    ck_assert(ro_sql_22023(fx, "PERFORM tw.add_agent('erin', 'nosuch')"));
    ck_assert(ro_sql_22023(fx, "PERFORM tw.retire_agent('nosuch')"));
    ck_assert(ro_sql_22023(fx, "PERFORM tw.submit_turn('nosuch', 'c', '{}')"));
    ck_assert(ro_sql_22023(fx, "PERFORM tw.submit_turn('frank', 'c', '{}', profile => 'nosuch')"));
    ck_assert(ro_sql_22023(fx, "PERFORM tw.submit_turn('dave', 'c', '{}', profile => 'tester')"));
    ck_assert(ro_sql_22023(fx, "PERFORM tw.submit_turn('dave', E'bad\\nchannel', '{}')"));
    /* submit with a profile adds the agent in the submit's transaction; rolled back, neither exists. */
    ck_assert(ro_sql_22023(fx, "PERFORM tw.submit_turn('gina', 'c', '{}', profile => 'echo'); "
                               "RAISE invalid_parameter_value"));
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.agents WHERE agent = 'gina'", 0), 0);

    /* Retire with a turn pending (no daemon runs yet): submits fail, the pending turn still runs. */
    char *pending = ro_submit_as(fx, "alice", NULL, "{\"text\":\"before\"}");
    s = ro_cli(fx, 0, "agent", "retire", "alice", NULL, NULL, NULL);
    free(s);
    s = ro_cli(fx, 2, "submit", "--agent", "alice", "--channel", "c1", NULL);
    ck_assert_msg(strstr(s, "agent_retired"), "%s", s);
    free(s);
    ck_assert(ro_sql_22023(fx, "PERFORM tw.submit_turn('alice', 'c', '{}')"));
    s = ro_cli(fx, 0, "--json", "agents", "list", "--retired", NULL, NULL);
    ck_assert_msg(strstr(s, "alice") && !strstr(s, "dave"), "%s", s);
    free(s);

    /* submit --profile adds the agent; its turn runs the profile's program with the agent id and profile. */
    TwFxEvents *evt = tw_fx_events_new(fx, "evt.>");
    tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, NULL);
    char *t = ro_submit_as(fx, "henry-1", "echo", "{\"text\":\"hi\"}");
    WD_STATUS_IS(fx, pending, "done");
    WD_STATUS_IS(fx, t, "done");
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.agents WHERE agent = 'henry-1' AND profile = 'echo'",
                      0),
        1);
    ck_assert(tw_fx_events_wait(evt, "evt.agent.henry-1.task", t, 1, WD_WAIT_MS));
    json_t *ev = tw_fx_events_get(evt, "evt.agent.henry-1.task", t, 0, NULL, NULL);
    ck_assert_ptr_nonnull(ev);
    ck_assert_str_eq(json_string_value(json_object_get(ev, "profile")), "echo");
    json_decref(ev);
    s = ro_cli(fx, 0, "--json", "profiles", NULL, NULL, NULL, NULL);
    ck_assert_msg(strstr(s, "\"profile\":\"echo\"") && strstr(s, "\"workers\":[\""), "%s", s);
    free(s);
    free(t);
    free(pending);
    tw_fx_free(fx);
}
END_TEST

/* ---- many agents of one profile at once, each agent serial
 * ------------------------------------------------- */

START_TEST(test_roster_parallel_and_serial)
{
    TwFx *fx = wd_fixture("[worker]\nconcurrency = 8\n");
    char *ids[11];
    tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, NULL);
    /* All eight in one transaction, so that they are ready at once whatever the machine's speed. */
    tw_fx_sql_exec(fx,
                   "SELECT tw.submit_turn('par-' || i, 'chan-1', '{\"mode\":\"sleep\",\"seconds\":4}', "
                   "profile => 'tester') FROM generate_series(0, 7) i",
                   0);
    for (int i = 0; i < 8; i++)
        ids[i] = tw_fx_sql_str(fx, "SELECT turn_id::text FROM state.turns WHERE agent = 'par-' || $1", 1,
                               (const char *[]){"0", "1", "2", "3", "4", "5", "6", "7"}[i]);
    for (int i = 8; i < 11; i++)
        ids[i] = ro_submit_as(fx, "solo", "tester", "{\"mode\":\"sleep\",\"seconds\":0.3}");
    for (int i = 0; i < 11; i++)
        WD_STATUS_IS(fx, ids[i], "done");
    /* The eight ran at once: each started before any of them ended. */
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turns WHERE agent LIKE 'par-%' "
                      "AND started_at < (SELECT min(ended_at) FROM state.turns WHERE agent LIKE 'par-%')",
                      0),
        8);
    /* One agent, one turn at a time, in submit order. */
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM (SELECT started_at, lag(ended_at) OVER (ORDER BY seq) AS prev "
                      "FROM state.turns WHERE agent = 'solo') x WHERE prev IS NOT NULL "
                      "AND started_at >= prev",
                      0),
        2);
    for (int i = 0; i < 11; i++)
        free(ids[i]);
    wd_done(fx);
}
END_TEST

/* ---- one slot, two agents: ready turns start in submit order
 * ------------------------------------------------ */

START_TEST(test_roster_submit_order)
{
    TwFxStack st = tw_fx_stack_start_events("[worker]\nconcurrency = 1\n", NULL);
    /* a1 runs; a2 (submitted before b1) becomes ready when a1 ends, while b1 has waited for the slot since
     * its submit: a2 goes first, then b1, then a3. */
    char *a1 = ro_submit_as(st.fx, "ord-a", "tester", "{\"mode\":\"sleep\",\"seconds\":1}");
    WD_STATUS_IS(st.fx, a1, "running");
    tw_fx_sql_exec(
        st.fx,
        "SELECT tw.submit_turn(a, 'chan-1', '{\"mode\":\"sleep\",\"seconds\":0.2}', profile => 'tester') "
        "FROM unnest(ARRAY['ord-a', 'ord-b', 'ord-a']) WITH ORDINALITY u(a, n) ORDER BY n",
        0);
    ck_assert(tw_fx_sql_wait(
        st.fx, 30000, "0",
        "SELECT count(*)::text FROM state.turns WHERE agent LIKE 'ord-%' AND status <> 'done'", 0));
    char *order = tw_fx_sql_str(st.fx,
                                "SELECT string_agg(seq::text, ',' ORDER BY started_at) FROM state.turns "
                                "WHERE agent LIKE 'ord-%'",
                                0);
    char *want = tw_fx_sql_str(st.fx,
                               "SELECT string_agg(seq::text, ',' ORDER BY seq) FROM state.turns "
                               "WHERE agent LIKE 'ord-%'",
                               0);
    ck_assert_str_eq(order, want);
    free(order);
    free(want);
    free(a1);
    tw_fx_free(st.fx);
}
END_TEST

/* ---- a backlog is not a failure
 * ---------------------------------------------------------------------------- */

START_TEST(test_roster_backlog)
{
    /* Two slots, twenty 3 s turns on twenty agents: a 30 s backlog, ten times dispatched_timeout_seconds. The
     * worker serves tester only: a turn of echo waits for nobody and must still end dispatch_timeout. */
    TwFx *fx = wd_fixture("[pmo]\ndispatched_retry_seconds = 1\ndispatched_timeout_seconds = 3\n"
                          "[worker]\nconcurrency = 2\nagents = tester\n");
    TwFxEvents *evt = tw_fx_events_new(fx, "evt.agent.*.task");
    char *ids[20];
    tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, NULL);
    for (int i = 0; i < 20; i++) {
        char agent[32];
        snprintf(agent, sizeof agent, "bl-%02d", i);
        ids[i] = ro_submit_as(fx, agent, "tester", "{\"mode\":\"sleep\",\"seconds\":3}");
    }
    char *orphan = ro_submit_as(fx, "echo", NULL, "{\"text\":\"nobody serves echo\"}");
    WD_STATUS_IS(fx, orphan, "timeout");
    char *why = tw_fx_sql_str(fx, "SELECT error FROM state.turns WHERE turn_id = $1", 1, orphan);
    ck_assert_str_eq(why, "dispatch_timeout");
    free(why);
    for (int i = 0; i < 20; i++)
        WD_STATUS_WITHIN(fx, ids[i], "done", 90000);
    /* It really was a backlog: the last turn started ten timeouts after the first was dispatched. */
    ck_assert_int_ge(tw_fx_sql_int(fx,
                                   "SELECT extract(epoch FROM max(started_at) - min(dispatched_at))::int "
                                   "FROM state.turns WHERE agent LIKE 'bl-%'",
                                   0),
                     25);
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.force_terminations WHERE agent LIKE 'bl-%'", 0), 0);
    wd_finals_then_free(evt, ids, 20);
    free(orphan);
    tw_fx_free(fx);
}
END_TEST

/* A burst of submits on many agents at once (one statement: 200 NOTIFYs at its commit). The PMO queues a
 * bounded number of one-agent dispatches and leaves the rest to its scan, which takes 100 agents at a time
 * and runs again until it finds nothing left. The periodic scan is 60 s away, so every turn that ends within
 * the test was dispatched by the burst's own path. */
START_TEST(test_roster_submit_burst)
{
    char *echo = tw_fx_build_path("examples/agents/tw-echo-agent");
    char *ovr =
        wd_fmt("[pmo]\nwatchdog_interval_seconds = 600\n[agent.quick]\nexec = %s\nmode = serve\n", echo);
    TwFx *fx = wd_fixture(ovr);
    free(ovr);
    free(echo);
    tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, NULL);
    tw_fx_sql_exec(fx,
                   "SELECT tw.submit_turn('burst-' || g, 'chan-1', '{\"text\":\"hi\"}'::jsonb, "
                   "profile => 'quick') FROM generate_series(1, 200) g",
                   0);
    if (!tw_fx_sql_wait(
            fx, 80000, "200 done",
            "SELECT count(*) || ' done' FROM state.turns WHERE agent LIKE 'burst-%' AND status = 'done'",
            0)) {
        char *left =
            tw_fx_sql_str(fx,
                          "SELECT string_agg(status || ' ' || n, ', ') FROM (SELECT status, count(*) n "
                          "FROM state.turns WHERE agent LIKE 'burst-%' GROUP BY status) x",
                          0);
        ck_abort_msg("the burst's turns: %s", left);
    }
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.force_terminations", 0), 0);
    wd_done(fx);
}
END_TEST

/* ---- delegation
 * --------------------------------------------------------------------------------------------- */

/* A parent of profile tester whose one call c1 goes to tool `tool` with args. */
static char *ro_parent(TwFx *fx, const char *agent, const char *tool, const char *args)
{
    char *input =
        wd_fmt("{\"mode\":\"tools\",\"calls\":[{\"id\":\"c1\",\"tool\":\"%s\",\"args\":%s}]}", tool, args);
    char *id = ro_submit_as(fx, agent, "tester", input);
    free(input);
    return id;
}

static char *ro_child_of(TwFx *fx, const char *parent)
{
    ck_assert(tw_fx_sql_wait(fx, WD_WAIT_MS, "1",
                             "SELECT count(*)::text FROM state.turns WHERE parent_turn_id = $1", 1, parent));
    return tw_fx_sql_str(fx, "SELECT turn_id::text FROM state.turns WHERE parent_turn_id = $1", 1, parent);
}

START_TEST(test_delegation_done_and_failed)
{
    TwFxStack st = tw_fx_stack_start_events(ro_overrides, "evt.agent.*.task");

    char *p1 =
        ro_parent(st.fx, "boss-1", "child", "{\"input\":{\"mode\":\"complete\",\"output\":{\"x\":42}}}");
    char *p2 = ro_parent(st.fx, "boss-2", "child", "{\"input\":{\"mode\":\"fail\"}}");
    WD_STATUS_IS(st.fx, p1, "done");
    WD_STATUS_IS(st.fx, p2, "done");
    char *c1 = ro_child_of(st.fx, p1), *c2 = ro_child_of(st.fx, p2);
    WD_STATUS_IS(st.fx, c1, "done");
    WD_STATUS_IS(st.fx, c2, "failed");
    /* The child ran on a new agent of the profile, one level down. */
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.turns t JOIN state.agents a USING (agent) "
                                   "WHERE t.turn_id = $1 AND t.depth = 1 AND t.parent_tool_call_id = 'c1' "
                                   "AND a.profile = 'tester' AND a.agent ~ '^tester-[0-9a-f]{12}$'",
                                   1, c1),
                     1);
    /* The child's result became the call's: ok with its output; error child_failed with its error. */
    ck_assert_int_eq(
        tw_fx_sql_int(st.fx,
                      "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1 "
                      "AND result_status = 'ok' AND output = '{\"x\":42}' AND child_turn_id = $2",
                      2, p1, c1),
        1);
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1 "
                                   "AND result_status = 'error' AND error ->> 'code' = 'child_failed'",
                                   1, p2),
                     1);
    /* The child's final event names its parent and call. */
    ck_assert(tw_fx_events_wait(st.ev, "evt.agent.*.task", c1, 1, WD_WAIT_MS));
    json_t *ev = tw_fx_events_get(st.ev, "evt.agent.*.task", c1, 0, NULL, NULL);
    ck_assert_str_eq(json_string_value(json_object_get(ev, "parent_turn_id")), p1);
    ck_assert_str_eq(json_string_value(json_object_get(ev, "parent_tool_call_id")), "c1");
    json_decref(ev);
    /* turn tree from the child shows the whole tree; turn show lists the child. */
    char *s = ro_cli(st.fx, 0, "--json", "turn", "tree", c1, NULL, NULL);
    json_t *tree = json_loads(s, 0, NULL);
    ck_assert_msg(tree, "%s", s);
    ck_assert_str_eq(json_string_value(json_object_get(tree, "turn_id")), p1);
    ck_assert_str_eq(
        json_string_value(json_object_get(json_array_get(json_object_get(tree, "children"), 0), "turn_id")),
        c1);
    json_decref(tree);
    free(s);
    s = ro_cli(st.fx, 0, "turn", "show", p1, NULL, NULL, NULL);
    ck_assert_msg(strstr(s, "child turn") && strstr(s, c1), "%s", s);
    free(s);
    ck_assert(tw_fx_events_wait(st.ev, "evt.agent.*.task", p2, 1, WD_WAIT_MS));
    ck_assert_uint_eq(ro_task_events(st.ev, c1), 1);
    ck_assert_uint_eq(ro_task_events(st.ev, p1), 1);
    free(p1);
    free(p2);
    free(c1);
    free(c2);
    wd_done(st.fx);
}
END_TEST

START_TEST(test_delegation_call_timeout_cancels_child)
{
    TwFxStack st = tw_fx_stack_start_events(ro_overrides, NULL);
    /* The call may wait 2 s; the child sleeps 60 s. */
    char *p = ro_parent(st.fx, "boss-t", "slow", "{\"input\":{\"mode\":\"sleep\",\"seconds\":60}}");
    char *c = ro_child_of(st.fx, p);
    WD_STATUS_IS(st.fx, c, "running");
    /* The call's result comes from its child turn: one posted from outside is refused (issue 23), and the
     * child goes on. */
    char *r =
        tw_fx_sql_str(st.fx, "SELECT tw.post_tool_result($1::uuid, 'c1', 'ok', '{\"forged\": true}')", 1, p);
    ck_assert_str_eq(r, "not_external");
    free(r);
    ck_assert_int_eq(
        tw_fx_sql_int(st.fx, "SELECT count(*) FROM state.turns WHERE turn_id = $1 AND status = 'running'", 1,
                      c),
        1);
    WD_STATUS_IS(st.fx, p, "done");
    WD_STATUS_IS(st.fx, c, "cancelled");
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1 "
                                   "AND wait_status = 'timeout' AND error ->> 'code' = 'tool_timeout'",
                                   1, p),
                     1);
    /* The child's program is gone: the worker stopped it when its claim was lost. */
    pid_t wpid = tw_fx_proc_pid(st.worker);
    ck_assert_msg(tw_fx_wait_until(wd_children_exited, &wpid, WD_WAIT_MS), "the child's program still runs");
    free(p);
    free(c);
    wd_done(st.fx);
}
END_TEST

START_TEST(test_delegation_cancel_two_levels_and_depth)
{
    /* max_delegation_depth = 2: parent (0) -> child (1) -> grandchild (2) may exist; the grandchild's own
     * delegating call fails with delegation_depth. */
    char *ov = wd_fmt("%s[worker]\nmax_delegation_depth = 2\nconcurrency = 4\n", ro_overrides);
    TwFxStack st = tw_fx_stack_start_events(ov, "evt.agent.*.task");

    const char *sleeper = "{\"mode\":\"sleep\",\"seconds\":60}";
    char *mid = wd_fmt("{\"input\":{\"mode\":\"tools\",\"calls\":[{\"id\":\"g1\",\"tool\":\"child\",\"args\":"
                       "{\"input\":%s}}]}}",
                       sleeper);
    char *p = ro_parent(st.fx, "top", "child", mid);
    char *c = ro_child_of(st.fx, p);
    char *g = ro_child_of(st.fx, c);
    WD_STATUS_IS(st.fx, g, "running");
    char *s = ro_cli(st.fx, 0, "cancel", p, NULL, NULL, NULL, NULL);
    free(s);
    WD_STATUS_IS(st.fx, p, "cancelled");
    WD_STATUS_IS(st.fx, c, "cancelled");
    WD_STATUS_IS(st.fx, g, "cancelled");
    pid_t wpid = tw_fx_proc_pid(st.worker);
    ck_assert_msg(tw_fx_wait_until(wd_children_exited, &wpid, WD_WAIT_MS),
                  "a cancelled turn's program still runs");
    ck_assert(tw_fx_events_wait(st.ev, "evt.agent.*.task", g, 1, WD_WAIT_MS));
    ck_assert_uint_eq(ro_task_events(st.ev, p), 1);
    ck_assert_uint_eq(ro_task_events(st.ev, c), 1);

    /* Depth: the grandchild (depth 2) delegates again; that call fails at once with delegation_depth. */
    char *deep =
        wd_fmt("{\"input\":{\"mode\":\"tools\",\"calls\":[{\"id\":\"g1\",\"tool\":\"child\",\"args\":"
               "{\"input\":{\"mode\":\"tools\",\"calls\":[{\"id\":\"x1\",\"tool\":\"child\",\"args\":"
               "{\"input\":{\"mode\":\"complete\"}}}]}}}]}}");
    char *p2 = ro_parent(st.fx, "top2", "child", deep);
    WD_STATUS_IS(st.fx, p2, "done");
    ck_assert_int_eq(
        tw_fx_sql_int(st.fx,
                      "SELECT count(*) FROM state.turn_waiting_tools w JOIN state.turns t USING (turn_id) "
                      "WHERE t.depth = 2 AND w.tool_call_id = 'x1' AND w.error ->> 'code' = "
                      "'delegation_depth'",
                      0),
        1);
    ck_assert_int_eq(tw_fx_sql_int(st.fx, "SELECT count(*) FROM state.turns WHERE depth > 2", 0), 0);
    free(deep);
    free(p2);
    free(mid);
    free(ov);
    free(p);
    free(c);
    free(g);
    wd_done(st.fx);
}
END_TEST

/* args.timeout_seconds = 1.4 (issue 23): the child's deadline is 1.4 s, and its end says so (it said "1
 * second deadline"): the message, the timeout details, and the deadline itself. */
START_TEST(test_delegation_fractional_timeout)
{
    TwFxStack st = tw_fx_stack_start_events(ro_overrides, NULL);
    char *p = ro_parent(st.fx, "boss-f", "child",
                        "{\"timeout_seconds\":1.4,\"input\":{\"mode\":\"sleep\",\"seconds\":60}}");
    char *c = ro_child_of(st.fx, p);
    WD_STATUS_IS(st.fx, c, "timeout");
    char *msg = tw_fx_sql_str(
        st.fx, "SELECT error || ': ' || error_message FROM state.turns WHERE turn_id = $1", 1, c);
    ck_assert_msg(strstr(msg, "turn_deadline_exceeded") && strstr(msg, "within its 1.4 second deadline"),
                  "%s", msg);
    free(msg);
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.turns WHERE turn_id = $1"
                                   " AND deadline_at - created_at = interval '1.4 seconds'"
                                   " AND (timeout_detail ->> 'limit_seconds')::numeric = 1.4",
                                   1, c),
                     1);
    /* The parent's call took the child's end as its error. */
    WD_STATUS_IS(st.fx, p, "done");
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1 "
                                   "AND error ->> 'code' = 'child_timeout'",
                                   1, p),
                     1);
    free(p);
    free(c);
    wd_done(st.fx);
}
END_TEST

/* The turns of the tree of turn `root` (the root included). */
static int64_t ro_tree_count(TwFx *fx, const char *root, const char *where)
{
    char *sql = wd_fmt("WITH RECURSIVE tr AS (SELECT * FROM state.turns WHERE turn_id = $1::uuid UNION ALL "
                       "SELECT c.* FROM state.turns c JOIN tr ON c.parent_turn_id = tr.turn_id) "
                       "SELECT count(*) FROM tr WHERE %s",
                       where);
    int64_t n = tw_fx_sql_int(fx, sql, 1, root);
    free(sql);
    return n;
}

/* [worker] max_tree_turns (issue 23): a tree that would grow to 31 turns (a root with 5 children, each with 5
 * of its own) stops at 20; the 11 delegating calls past the bound fail at once with delegation_limit, which
 * the calling turns see as their tool results and which names the numbers; every turn still ends. */
START_TEST(test_delegation_tree_limit)
{
    char *ov = wd_fmt("%s[worker]\nmax_tree_turns = 20\nconcurrency = 4\n", ro_overrides);
    TwFxStack st = tw_fx_stack_start_events(ov, NULL);
    char *leaf = wd_fmt("{\"input\":{\"mode\":\"complete\"}}");
    char *mid = wd_fmt(
        "{\"input\":{\"mode\":\"tools\",\"calls\":[{\"id\":\"g1\",\"tool\":\"child\",\"args\":%s},"
        "{\"id\":\"g2\",\"tool\":\"child\",\"args\":%s},{\"id\":\"g3\",\"tool\":\"child\",\"args\":%s},"
        "{\"id\":\"g4\",\"tool\":\"child\",\"args\":%s},{\"id\":\"g5\",\"tool\":\"child\",\"args\":%s}]}}",
        leaf, leaf, leaf, leaf, leaf);
    char *input = wd_fmt(
        "{\"mode\":\"tools\",\"calls\":[{\"id\":\"c1\",\"tool\":\"child\",\"args\":%s},"
        "{\"id\":\"c2\",\"tool\":\"child\",\"args\":%s},{\"id\":\"c3\",\"tool\":\"child\",\"args\":%s},"
        "{\"id\":\"c4\",\"tool\":\"child\",\"args\":%s},{\"id\":\"c5\",\"tool\":\"child\",\"args\":%s}]}",
        mid, mid, mid, mid, mid);
    char *root = ro_submit_as(st.fx, "forest", "tester", input);
    WD_STATUS_IS(st.fx, root, "done");
    ck_assert_int_eq(ro_tree_count(st.fx, root, "true"), 20);
    ck_assert_int_eq(ro_tree_count(st.fx, root, "status <> 'done'"), 0);
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.turn_waiting_tools WHERE error ->> 'code' = "
                                   "'delegation_limit' AND error ->> 'message' LIKE '%max_tree_turns = 20%'",
                                   0),
                     11);
    /* The calling turns saw the refusals as their tool results. */
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.cards WHERE card_type = 'tool.result' AND "
                                   "content -> 'error' ->> 'code' = 'delegation_limit'",
                                   0),
                     11);
    /* Each middle step's calls are counted in one transaction: 5 + 5 + 4 children, then none; three middle
     * turns saw refusals (the root's deliverable holds theirs). */
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.cards c JOIN state.turns t USING (turn_id) "
                                   "WHERE c.card_type = 'task.deliverable' AND t.depth = 1 "
                                   "AND c.content::text LIKE '%delegation_limit%'",
                                   0),
                     3);
    free(root);
    free(input);
    free(mid);
    free(leaf);
    free(ov);
    wd_done(st.fx);
}
END_TEST

#define RO_STR_(x) #x
#define RO_STR(x) RO_STR_(x)
#define RO_KIDS 40          /* children of the root */
#define RO_GRANDKIDS 49     /* children of each child */
#define RO_CANCEL_BATCH 500 /* tw.cancel_batch() */

/* A cancel of a root with 2,000 descendants (issue 23: one of 96,513 was one transaction of minutes) cancels
 * the root and at most one batch of them in its own transaction and answers `cancelled`; the PMO cancels the
 * rest in batches, one transaction each; every turn ends cancelled with exactly one final event, and nothing
 * is left open. The tree is written straight into the tables (pending turns, no daemon yet). */
START_TEST(test_delegation_cancel_large_tree)
{
    TwFx *fx = wd_fixture(ro_overrides);
    char *root = ro_submit_as(fx, "bigroot", "tester", "{}");
    tw_fx_sql_exec(fx,
                   "INSERT INTO state.agents (agent, profile) "
                   "SELECT 'big-' || g, 'tester' FROM generate_series(1, 2000) g",
                   0);
    tw_fx_sql_exec(fx,
                   "INSERT INTO state.turns (agent, profile, channel_id, input, depth, parent_turn_id, "
                   "parent_step, parent_tool_call_id) "
                   "SELECT 'big-' || g, 'tester', 'big', '{}', 1, $1::uuid, 0, 'c' || g "
                   "FROM generate_series(1, " RO_STR(RO_KIDS) ") g",
                   1, root);
    tw_fx_sql_exec(fx,
                   "INSERT INTO state.turns (agent, profile, channel_id, input, depth, parent_turn_id, "
                   "parent_step, parent_tool_call_id) "
                   "SELECT 'big-' || (" RO_STR(RO_KIDS) " + (k - 1) * " RO_STR(
                       RO_GRANDKIDS) " + j), 'tester', "
                                     "'big', '{}', 2, p.turn_id, 0, 'g' || j "
                                     "FROM generate_series(1, " RO_STR(
                                         RO_KIDS) ") k "
                                                  "JOIN state.turns p ON p.agent = 'big-' || k AND "
                                                  "p.parent_turn_id = $1::uuid, "
                                                  "generate_series(1, " RO_STR(RO_GRANDKIDS) ") j",
                   1, root);
    const int all = 1 + RO_KIDS + RO_KIDS * RO_GRANDKIDS;
    /* The root's idle agent took it at its submit (dispatched); the rest waits. */
    ck_assert_int_eq(ro_tree_count(fx, root, "status IN ('pending', 'dispatched')"), all);

    TwFxEvents *evt = tw_fx_events_new(fx, "evt.agent.*.task");
    char *s = ro_cli(fx, 0, "cancel", root, NULL, NULL, NULL, NULL);
    ck_assert_msg(strstr(s, "cancelled"), "%s", s);
    free(s);
    /* No daemon runs yet: what is cancelled now is what the cancel's own transaction did. */
    int64_t first = ro_tree_count(fx, root, "status = 'cancelled'");
    ck_assert_msg(first >= 2 && first <= 1 + RO_CANCEL_BATCH,
                  "the cancel's transaction ended %lld turns of the tree (root and at most %d wanted)",
                  (long long)first, RO_CANCEL_BATCH);
    ck_assert_int_eq(ro_tree_count(fx, root, "status = 'pending'"), all - first);

    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    if (!tw_fx_sql_wait(fx, 60000, "0",
                        "WITH RECURSIVE tr AS (SELECT * FROM state.turns WHERE turn_id = $1::uuid UNION ALL "
                        "SELECT c.* FROM state.turns c JOIN tr ON c.parent_turn_id = tr.turn_id) "
                        "SELECT count(*)::text FROM tr WHERE status <> 'cancelled'",
                        1, root)) {
        tw_fx_proc_dump(pmo);
        ck_abort_msg("turns of the cancelled tree are still open");
    }
    ck_assert_int_eq(ro_tree_count(fx, root, "status = 'cancelled'"), all);
    /* Exactly one final event each, in the outbox and on NATS (the PMO's rule published those it wrote). */
    ck_assert_int_eq(ro_tree_count(fx, root,
                                   "(SELECT count(*) FROM state.outbox o WHERE o.turn_id = tr.turn_id"
                                   " AND o.kind = 'task' AND o.payload ->> 'status' = 'cancelled') <> 1"),
                     0);
    ck_assert_int_eq(
        ro_tree_count(fx, root,
                      "(SELECT count(*) FROM state.force_terminations f WHERE f.turn_id = tr.turn_id)"
                      " <> 1"),
        0);
    if (!tw_fx_events_wait(evt, "evt.agent.*.task", "\"cancelled\"", (size_t)all, 60000)) {
        tw_fx_proc_dump(pmo);
        ck_abort_msg("only %zu of %d final events on NATS", tw_fx_events_count(evt, "evt.agent.*.task", NULL),
                     all);
    }
    /* Bounded batches: no transaction ended more than the root and one batch; several were needed. */
    ck_assert_int_le(
        tw_fx_sql_int(fx,
                      "SELECT max(n) FROM (SELECT count(*) AS n FROM state.outbox WHERE kind = 'task' "
                      "AND (payload ->> 'channel_id' = 'big' OR turn_id = $1::uuid) GROUP BY xid) x",
                      1, root),
        1 + RO_CANCEL_BATCH);
    ck_assert_int_ge(tw_fx_sql_int(fx,
                                   "SELECT count(DISTINCT xid) FROM state.outbox WHERE kind = 'task' "
                                   "AND payload ->> 'channel_id' = 'big'",
                                   0),
                     (all - 1 + RO_CANCEL_BATCH - 1) / RO_CANCEL_BATCH);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.tree_cancels", 0), 0);
    free(root);
    wd_done(fx);
}
END_TEST

/* A profile whose name the roster already binds, as an agent, to another profile (issue 23: submits to it
 * ran the other profile's program, with a warning in the log): publishing it is an error. tw.publish_profiles
 * raises 22023; `turnwatch migrate` with such a config fails naming both; a daemon started with it refuses to
 * run (exit 1, an error line naming both and what to do); a reload to it is refused and the running
 * configuration kept. */
START_TEST(test_roster_profile_name_conflict)
{
    TwFx *fx = wd_fixture(ro_overrides);
    char *s = ro_cli(fx, 0, "agent", "add", "clash", "--profile", "tester", NULL);
    free(s);
    char *clash_ov = wd_fmt("%s[agent.clash]\nexec = /bin/true\n", ro_overrides);
    const char *clash_ini = tw_fx_write_config(fx, "clash.ini", clash_ov);

    ck_assert(ro_sql_22023(fx, "PERFORM tw.publish_profiles('{echo,clash}')"));
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.profiles WHERE profile = 'clash'", 0), 0);

    char *out = NULL, *err = NULL;
    const char *migrate[] = {tw_fx_cli_path(), "-c", clash_ini, "migrate", NULL};
    int rc = tw_fx_run(migrate, &out, &err);
    ck_assert_msg(rc != 0 && strstr(err, "clash") && strstr(err, "tester"), "migrate: exit %d: %s%s", rc, out,
                  err);
    free(out);
    free(err);

    /* At start: each daemon refuses the configuration once the database has answered. */
    TwFxProc *bad[] = {tw_fx_start_worker(fx, clash_ini), tw_fx_start_pmo(fx, clash_ini)};
    for (size_t i = 0; i < 2; i++) {
        int status = 0;
        if (!tw_fx_proc_wait(bad[i], WD_WAIT_MS, &status)) {
            tw_fx_proc_dump(bad[i]);
            ck_abort_msg("a daemon started with a conflicting profile still runs");
        }
        char *log = tw_fx_proc_log(bad[i]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 1, "exit status %d: %s", status, log);
        ck_assert_msg(strstr(log, "profile clash") && strstr(log, "profile tester") && strstr(log, "rename"),
                      "%s", log);
        free(log);
    }
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.profiles WHERE profile = 'clash'", 0), 0);

    /* A reload to it: refused, the daemon goes on with the configuration it had; a good file later applies.
     */
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL), *worker = tw_fx_start_worker(fx, NULL);
    char *t1 = wd_submit(fx, "echo", "{\"text\":\"before\"}");
    WD_STATUS_IS(fx, t1, "done");
    tw_fx_write_config(fx, NULL, clash_ov);
    TwFxProc *daemons[] = {pmo, worker};
    for (size_t i = 0; i < 2; i++) {
        ck_assert(tw_fx_proc_signal(daemons[i], SIGHUP));
        int64_t deadline = tw_fx_now_ms() + WD_WAIT_MS;
        for (;;) {
            char *log = tw_fx_proc_log(daemons[i]);
            bool refused = strstr(log, "reload refused") && strstr(log, "profile clash");
            free(log);
            if (refused)
                break;
            if (!tw_fx_poll(deadline)) {
                tw_fx_proc_dump(daemons[i]);
                ck_abort_msg("no 'reload refused' line naming profile clash");
            }
        }
        ck_assert(tw_fx_proc_alive(daemons[i]));
    }
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.profiles WHERE profile = 'clash'", 0), 0);
    char *t2 = wd_submit(fx, "echo", "{\"text\":\"after\"}");
    WD_STATUS_IS(fx, t2, "done");
    free(t1);
    free(t2);
    free(clash_ov);
    wd_done(fx);
}
END_TEST

/* ---- a delegation tree under kills
 * ---------------------------------------------------------------------------- */

START_TEST(test_delegation_tree_under_kills)
{
    TwFx *fx = wd_fixture(ro_overrides);
    TwFxEvents *evt = tw_fx_events_new(fx, "evt.agent.*.task");
    TwFxProc *pmo1 = tw_fx_start_pmo(fx, NULL);
    tw_fx_start_pmo(fx, NULL);
    TwFxProc *w1 = tw_fx_start_worker(fx, NULL);
    tw_fx_start_worker(fx, NULL);
    /* Ten parents, each fanning out to three children that sleep a little, joined with wait all. */
    const char *args = "{\"input\":{\"mode\":\"sleep\",\"seconds\":3}}";
    char *input = wd_fmt(
        "{\"mode\":\"tools\",\"calls\":[{\"id\":\"a\",\"tool\":\"child\",\"args\":%s},"
        "{\"id\":\"b\",\"tool\":\"child\",\"args\":%s},{\"id\":\"c\",\"tool\":\"child\",\"args\":%s}]}",
        args, args, args);
    char *ids[10];
    for (int i = 0; i < 10; i++) {
        char agent[32];
        snprintf(agent, sizeof agent, "tree-%d", i);
        ids[i] = ro_submit_as(fx, agent, "tester", input);
    }
    /* Kill a worker and a PMO while children run; start a fresh worker. */
    ck_assert(tw_fx_sql_wait(
        fx, WD_WAIT_MS, "true",
        "SELECT (count(*) >= 3)::text FROM state.turns WHERE depth = 1 AND status = 'running'", 0));
    tw_fx_proc_kill9(w1);
    tw_fx_proc_kill9(pmo1);
    tw_fx_start_worker(fx, NULL);
    for (int i = 0; i < 10; i++)
        WD_STATUS_WITHIN(fx, ids[i], "done", 60000);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns WHERE depth = 1", 0), 30);
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turns WHERE status NOT IN ('done', 'failed', 'timeout', "
                      "'cancelled')",
                      0),
        0);
    /* Every turn ended once: one task event each, one task outbox row each. */
    ck_assert(tw_fx_sql_wait(fx, WD_WAIT_MS, "0",
                             "SELECT count(*)::text FROM state.outbox WHERE published_at IS NULL", 0));
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turns t WHERE (SELECT count(*) FROM state.outbox o "
                      "WHERE o.turn_id = t.turn_id AND o.kind = 'task') <> 1",
                      0),
        0);
    wd_finals_then_free(evt, ids, 10);
    free(input);
    tw_fx_free(fx);
}
END_TEST

/* Metadata is measured as the user wrote it (compact JSON), not in PostgreSQL's text form, which adds a space
 * after every ':' and ','; metadata nested deeper than jansson reads (2048 levels) is still shown. */
START_TEST(test_roster_metadata_limits)
{
    TwFx *fx = wd_fixture(ro_overrides);

    /* 6,000 keys "kNNNN":1 make about 62 KB of compact JSON and 12,000 bytes more as PostgreSQL writes it. */
    size_t cap = 80000, len = 0;
    char *doc = malloc(cap);
    ck_assert_ptr_nonnull(doc);
    len += (size_t)snprintf(doc + len, cap - len, "{");
    for (int i = 0; i < 6000; i++)
        len += (size_t)snprintf(doc + len, cap - len, "%s\"k%04d\":1", i ? "," : "", i);
    len += (size_t)snprintf(doc + len, cap - len, "}");
    ck_assert_uint_lt(len, 65536);
    ck_assert_int_gt(tw_fx_sql_int(fx, "SELECT octet_length($1::jsonb::text)", 1, doc), 65536);
    char *out = NULL, *err = NULL;
    int rc =
        tw_fx_cli(fx, &out, &err, "agent", "add", "meta-ok2", "--profile", "echo", "--metadata", doc, NULL);
    ck_assert_msg(rc == 0, "a %zu-byte metadata document was refused: %s%s", len, out, err);
    free(out);
    free(err);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT tw.json_compact_length(metadata) FROM state.agents"
                                   " WHERE agent = 'meta-ok2'",
                                   0),
                     (int64_t)len);
    /* Over the limit as written: refused with the size the user gave, by the CLI and by SQL. */
    len -= 1;
    for (int i = 6000; len < 66000; i++)
        len += (size_t)snprintf(doc + len, cap - len, ",\"k%05d\":1", i);
    len += (size_t)snprintf(doc + len, cap - len, "}");
    out = err = NULL;
    rc = tw_fx_cli(fx, &out, &err, "agent", "add", "meta-big", "--profile", "echo", "--metadata", doc, NULL);
    char *want = wd_fmt("%zu bytes of compact JSON", len);
    ck_assert_msg(rc == 2 && strstr(err, want), "exit %d: %s", rc, err);
    free(want);
    free(out);
    free(err);
    char *sql = wd_fmt("PERFORM tw.add_agent('meta-big', 'echo', '%s')", doc);
    ck_assert(ro_sql_22023(fx, sql));
    free(sql);

    /* 3,000 levels of nesting, added through SQL (PostgreSQL reads it), shown by the CLI in both forms. */
    tw_fx_sql_exec(fx,
                   "SELECT tw.add_agent('meta-deep', 'echo', jsonb_build_object('deep',"
                   " (repeat('[', 3000) || repeat(']', 3000))::jsonb))",
                   0);
    out = err = NULL;
    rc = tw_fx_cli(fx, &out, &err, "agent", "show", "meta-deep", NULL);
    ck_assert_msg(rc == 0 && strstr(out, "profile          echo") && strstr(out, "[[[[[[[["), "exit %d: %s%s",
                  rc, out, err);
    free(out);
    free(err);
    out = err = NULL;
    rc = tw_fx_cli(fx, &out, &err, "--json", "agent", "show", "meta-deep", NULL);
    ck_assert_msg(rc == 0 && strstr(out, "\"profile\": \"echo\"") && strstr(out, "[[[[[[[["), "exit %d: %s%s",
                  rc, out, err);
    free(out);
    free(err);
    free(doc);
    tw_fx_free(fx);
}
END_TEST

TW_SUITE_DEFINE(roster,
                {
                    {"roster_cli_and_sql", test_roster_cli_and_sql, 90},
                    {"roster_metadata_limits", test_roster_metadata_limits, 90},
                    {"roster_parallel_and_serial", test_roster_parallel_and_serial, 90},
                    {"roster_submit_order", test_roster_submit_order, 90},
                    {"roster_backlog", test_roster_backlog, 180},
                    {"roster_submit_burst", test_roster_submit_burst, 120},
                    {"delegation_done_and_failed", test_delegation_done_and_failed, 90},
                    {"delegation_call_timeout_cancels_child", test_delegation_call_timeout_cancels_child, 90},
                    {"delegation_cancel_two_levels_and_depth", test_delegation_cancel_two_levels_and_depth,
                     120},
                    {"delegation_tree_under_kills", test_delegation_tree_under_kills, 180},
                    {"delegation_fractional_timeout", test_delegation_fractional_timeout, 90},
                    {"delegation_tree_limit", test_delegation_tree_limit, 120},
                    {"delegation_cancel_large_tree", test_delegation_cancel_large_tree, 240},
                    {"roster_profile_name_conflict", test_roster_profile_name_conflict, 120},
                })
