/* test_examples.c — the example agent and tool programs speak the protocol of contract §5 (run directly, no
 * daemons or servers). */
#include "fixture.h"
#include "suite.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A step document as the worker would send it. */
static json_t *ex_step(int step, json_t *input, json_t *state, json_t *results)
{
    return json_pack("{s:s,s:s,s:s,s:i,s:i,s:o,s:o,s:o}", "turn_id", "t-1", "agent", "tester", "channel_id",
                     "c-1", "epoch", 1, "step", step, "input", input ? input : json_object(), "state",
                     state ? state : json_null(), "tool_results", results ? results : json_array());
}

/* Runs <build>/<rel> with `req` (stolen) on stdin; returns its exit code and, through the pointers, stdout as
 * JSON (NULL if not JSON) and stderr. */
static int ex_run(const char *rel, json_t *req, json_t **reply, char **err)
{
    char *path = tw_fx_build_path(rel);
    char *in = json_dumps(req, JSON_COMPACT);
    char *out = NULL;
    const char *argv[] = {path, NULL};
    int rc = tw_fx_run_full(argv, in, &out, err, 10000);
    *reply = json_loads(out, 0, NULL);
    free(out);
    free(in);
    free(path);
    json_decref(req);
    return rc;
}

/* Like ex_run but the program must exit 0 and print a JSON object. */
static json_t *ex_ok(const char *rel, json_t *req)
{
    json_t *reply = NULL;
    char *err = NULL;
    int rc = ex_run(rel, req, &reply, &err);
    ck_assert_msg(rc == 0 && json_is_object(reply), "%s exited %d, stderr: %s", rel, rc, err);
    free(err);
    return reply;
}

static const char *ex_str(const json_t *j, const char *path)
{
    /* path like "complete.output.mode": walk objects */
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const json_t *cur = j;
    char *save = NULL;
    for (char *k = strtok_r(buf, ".", &save); k && cur; k = strtok_r(NULL, ".", &save))
        cur = json_object_get(cur, k);
    return json_string_value(cur);
}

START_TEST(test_echo_and_fail_agents)
{
    json_t *r =
        ex_ok("examples/agents/tw-echo-agent", ex_step(0, json_pack("{s:s}", "hello", "world"), NULL, NULL));
    ck_assert_str_eq(ex_str(r, "complete.output.echo.hello"), "world");
    ck_assert_int_eq(json_integer_value(
                         json_object_get(json_object_get(json_object_get(r, "complete"), "output"), "step")),
                     0);
    json_decref(r);

    r = ex_ok("examples/agents/tw-fail-agent", ex_step(0, NULL, NULL, NULL));
    ck_assert_str_eq(ex_str(r, "fail.error"), "the fail agent always fails");
    json_decref(r);
}
END_TEST

START_TEST(test_test_agent_modes)
{
    const char *agent = "examples/agents/tw-test-agent";
    json_t *r = ex_ok(agent, ex_step(0, NULL, NULL, NULL));
    ck_assert_str_eq(ex_str(r, "complete.output.mode"), "complete");
    json_decref(r);

    r = ex_ok(agent, ex_step(0, json_pack("{s:s,s:s}", "mode", "fail", "error", "asked"), NULL, NULL));
    ck_assert_str_eq(ex_str(r, "fail.error"), "asked");
    json_decref(r);

    char *err = NULL;
    ck_assert_int_eq(
        ex_run(agent, ex_step(0, json_pack("{s:s,s:i}", "mode", "exit", "code", 5), NULL, NULL), &r, &err),
        5);
    ck_assert_ptr_null(r);
    ck_assert_ptr_nonnull(strstr(err, "exiting with code 5"));
    free(err);

    ck_assert_int_eq(ex_run(agent, ex_step(0, json_pack("{s:s}", "mode", "garbage"), NULL, NULL), &r, NULL),
                     0);
    ck_assert_ptr_null(r);

    int64_t t0 = tw_fx_now_ms();
    r = ex_ok(agent, ex_step(0, json_pack("{s:s,s:f}", "mode", "sleep", "seconds", 0.3), NULL, NULL));
    ck_assert_int_ge(tw_fx_now_ms() - t0, 300);
    ck_assert_ptr_nonnull(json_object_get(r, "complete"));
    json_decref(r);

    /* Malformed input is the program's failure, said on stderr, not a reply. */
    char *path = tw_fx_build_path(agent);
    const char *argv[] = {path, NULL};
    ck_assert_int_eq(tw_fx_run_full(argv, "{not json", NULL, &err, 5000), 2);
    ck_assert_ptr_nonnull(strstr(err, "not a JSON object"));
    free(err);
    free(path);
}
END_TEST

START_TEST(test_test_agent_hang)
{
    /* hang ignores SIGTERM: only SIGKILL ends it. */
    TwFx *fx = tw_fx_new();
    char *step = NULL, *agent = tw_fx_build_path("examples/agents/tw-test-agent");
    json_t *req = ex_step(0, json_pack("{s:s}", "mode", "hang"), NULL, NULL);
    char *doc = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    ck_assert_int_gt(asprintf(&step, "%s/step.json", tw_fx_dir(fx)), 0);
    FILE *f = fopen(step, "w");
    fputs(doc, f);
    fclose(f);
    char *script = NULL;
    ck_assert_int_gt(asprintf(&script, "exec \"%s\" < \"%s\"", agent, step), 0);
    const char *argv[] = {"/bin/sh", "-c", script, NULL};
    TwFxProc *p = tw_fx_spawn(fx, "hang", argv);
    tw_fx_sleep_ms(300);
    ck_assert(tw_fx_proc_signal(p, SIGTERM));
    tw_fx_sleep_ms(300);
    ck_assert(tw_fx_proc_alive(p));
    tw_fx_proc_kill9(p);
    ck_assert(!tw_fx_proc_alive(p));
    free(script);
    free(doc);
    free(step);
    free(agent);
    tw_fx_free(fx);
}
END_TEST

START_TEST(test_test_agent_tools_rounds)
{
    const char *agent = "examples/agents/tw-test-agent";
    json_t *input = json_pack("{s:s,s:[{s:s,s:s,s:{s:i}}],s:s,s:i}", "mode", "tools", "calls", "id", "a",
                              "tool", "echo", "args", "x", 1, "wait", "any", "rounds", 2);

    json_t *r = ex_ok(agent, ex_step(0, json_incref(input), NULL, NULL));
    ck_assert_str_eq(ex_str(r, "wait"), "any");
    ck_assert_str_eq(
        json_string_value(json_object_get(json_array_get(json_object_get(r, "tool_calls"), 0), "id")), "a");
    json_t *state = json_incref(json_object_get(r, "state"));
    json_decref(r);

    json_t *res1 = json_pack("[{s:s,s:s,s:s,s:{s:i}}]", "tool_call_id", "a", "tool", "echo", "status", "ok",
                             "output", "x", 1);
    r = ex_ok(agent, ex_step(1, json_incref(input), state, json_incref(res1)));
    ck_assert_str_eq(
        json_string_value(json_object_get(json_array_get(json_object_get(r, "tool_calls"), 0), "id")), "a-2");
    state = json_incref(json_object_get(r, "state"));
    json_decref(r);

    json_t *res2 = json_pack("[{s:s,s:s,s:s}]", "tool_call_id", "a-2", "tool", "echo", "status", "timeout");
    r = ex_ok(agent, ex_step(2, input, state, json_incref(res2)));
    json_t *seen = json_object_get(json_object_get(json_object_get(r, "complete"), "output"), "tool_results");
    json_t *want = json_pack("[O,O]", res1, res2);
    ck_assert_msg(json_equal(seen, want), "tool_results per step do not match");
    json_decref(want);
    json_decref(r);
    json_decref(res1);
    json_decref(res2);
}
END_TEST

START_TEST(test_fanout_and_race_agents)
{
    json_t *r = ex_ok("examples/agents/tw-fanout-agent", ex_step(0, json_pack("{s:i}", "n", 2), NULL, NULL));
    json_t *calls = json_object_get(r, "tool_calls");
    ck_assert_uint_eq(json_array_size(calls), 2);
    ck_assert_str_eq(ex_str(json_array_get(calls, 1), "tool"), "sleep");
    ck_assert(json_real_value(json_object_get(json_object_get(json_array_get(calls, 1), "args"), "seconds")) >
              0.09);
    json_t *state = json_incref(json_object_get(r, "state"));
    json_decref(r);
    /* Results in reverse order still come out in call order. */
    json_t *results = json_pack("[{s:s,s:s,s:{s:i}},{s:s,s:s,s:{s:i}}]", "tool_call_id", "f1", "status", "ok",
                                "output", "v", 1, "tool_call_id", "f0", "status", "ok", "output", "v", 0);
    r = ex_ok("examples/agents/tw-fanout-agent", ex_step(1, json_pack("{s:i}", "n", 2), state, results));
    json_t *outs = json_object_get(json_object_get(json_object_get(r, "complete"), "output"), "results");
    ck_assert_str_eq(ex_str(json_array_get(outs, 0), "id"), "f0");
    ck_assert_str_eq(ex_str(json_array_get(outs, 1), "id"), "f1");
    json_decref(r);

    r = ex_ok("examples/agents/tw-race-agent", ex_step(0, NULL, NULL, NULL));
    ck_assert_str_eq(ex_str(r, "wait"), "any");
    ck_assert_uint_eq(json_array_size(json_object_get(r, "tool_calls")), 3);
    json_decref(r);
    results = json_pack("[{s:s,s:s,s:{s:f}}]", "tool_call_id", "r1", "status", "ok", "output", "slept", 0.2);
    r = ex_ok("examples/agents/tw-race-agent", ex_step(1, NULL, json_object(), results));
    ck_assert_str_eq(ex_str(r, "complete.output.winner.id"), "r1");
    json_decref(r);
}
END_TEST

static json_t *ex_tool_req(const char *tool, json_t *args)
{
    return json_pack("{s:s,s:s,s:o,s:s}", "tool_call_id", "c-1", "tool", tool, "args", args, "turn_id",
                     "t-1");
}

START_TEST(test_tools)
{
    json_t *r =
        ex_ok("examples/tools/tw-sleep-tool", ex_tool_req("sleep", json_pack("{s:f}", "seconds", 0.1)));
    ck_assert(json_number_value(json_object_get(json_object_get(r, "output"), "slept")) > 0.09);
    json_decref(r);
    r = ex_ok("examples/tools/tw-sleep-tool", ex_tool_req("sleep", json_pack("{s:s}", "seconds", "soon")));
    ck_assert_str_eq(ex_str(r, "error.code"), "bad_args");
    json_decref(r);

    r = ex_ok("examples/tools/tw-echo-tool", ex_tool_req("echo", json_pack("{s:[i,i]}", "list", 1, 2)));
    json_t *want = json_pack("{s:[i,i]}", "list", 1, 2);
    ck_assert(json_equal(json_object_get(r, "output"), want));
    json_decref(want);
    json_decref(r);

    char *err = NULL;
    ck_assert_int_eq(ex_run("examples/tools/tw-fail-tool", ex_tool_req("fail", json_object()), &r, &err), 3);
    ck_assert_str_eq(err, "something broke\n");
    free(err);
    ck_assert_int_eq(
        ex_run("examples/tools/tw-garbage-tool", ex_tool_req("garbage", json_object()), &r, NULL), 0);
    ck_assert_ptr_null(r);
}
END_TEST

/* Serve mode (contract section 10): each program answers one line per request line, in one process, until
 * EOF; a request it cannot read still gets its one reply line. */
static void ex_serve_three(const char *const argv[], const char *what)
{
    json_t *s0 = ex_step(0, json_pack("{s:s}", "mode", "pid"), NULL, NULL);
    json_t *s1 = ex_step(1, json_pack("{s:s}", "mode", "pid"), NULL, NULL);
    char *l0 = json_dumps(s0, JSON_COMPACT), *l1 = json_dumps(s1, JSON_COMPACT), *in = NULL, *out = NULL,
         *err = NULL;
    ck_assert_int_gt(asprintf(&in, "%s\n%s\nnot json\n", l0, l1), 0);
    ck_assert_int_eq(setenv("TURNWATCH_MODE", "serve", 1), 0);
    int rc = tw_fx_run_full(argv, in, &out, &err, 20000);
    unsetenv("TURNWATCH_MODE");
    ck_assert_msg(rc == 0, "%s exited %d: %s", what, rc, err);
    json_t *r[3] = {NULL, NULL, NULL};
    size_t n = 0;
    char *save = NULL;
    for (char *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        ck_assert_msg(n < 3, "%s: more than three reply lines: %s", what, line);
        r[n++] = json_loads(line, 0, NULL);
        ck_assert_msg(json_is_object(r[n - 1]), "%s: reply line %zu is not a JSON object: %s", what, n, line);
    }
    ck_assert_msg(n == 3, "%s: %zu reply lines, want 3", what, n);
    json_t *o0 = json_object_get(json_object_get(r[0], "complete"), "output");
    json_t *o1 = json_object_get(json_object_get(r[1], "complete"), "output");
    ck_assert_int_eq(json_integer_value(json_object_get(o0, "served")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(o1, "served")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(o1, "step")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(o0, "pid")),
                     json_integer_value(json_object_get(o1, "pid")));
    ck_assert_msg(json_object_get(r[2], "fail") != NULL, "%s: an unreadable request got no fail reply", what);
    for (size_t i = 0; i < n; i++)
        json_decref(r[i]);
    json_decref(s0);
    json_decref(s1);
    free(l0);
    free(l1);
    free(in);
    free(out);
    free(err);
}

START_TEST(test_serve_mode_examples)
{
    char *c = tw_fx_build_path("examples/agents/tw-serve-agent");
    char *t = tw_fx_build_path("examples/agents/tw-test-agent");
    char *py = NULL;
    ck_assert_int_gt(asprintf(&py, "%s/examples/agents/tw-serve-agent.py", tw_fx_source_dir()), 0);
    const char *argv_c[] = {c, NULL}, *argv_t[] = {t, NULL}, *argv_py[] = {"/usr/bin/python3", py, NULL};
    ex_serve_three(argv_c, "tw-serve-agent");
    ex_serve_three(argv_t, "tw-test-agent");
    ex_serve_three(argv_py, "tw-serve-agent.py");
    free(c);
    free(t);
    free(py);
}
END_TEST

TW_SUITE_DEFINE(examples, {
                              {"agents", test_echo_and_fail_agents, 30},
                              {"agents", test_test_agent_modes, 30},
                              {"agents", test_test_agent_hang, 30},
                              {"agents", test_test_agent_tools_rounds, 30},
                              {"agents", test_fanout_and_race_agents, 30},
                              {"agents", test_serve_mode_examples, 30},
                              {"tools", test_tools, 30},
                          })
