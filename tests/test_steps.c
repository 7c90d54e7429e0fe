/* Unit tests for worker/steps.c: how a program's exit and stdout become a step outcome or a tool result. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "steps.h"
#include "steps_config.h"
#include "suite.h"

static TwConfig cfg;

static void setup(void)
{
    ck_assert_int_eq(tw_config_load_string(&cfg, "steps.ini", steps_config_text), 0);
}

static void teardown(void)
{
    tw_config_free(&cfg);
}

static json_t *step(WrkProcOutcome outcome, int code, const char *out, const char *err)
{
    WrkProcResult r = {
        .outcome = outcome, .exit_code = code, .output = out, .output_len = strlen(out), .stderr_tail = err};
    return wrk_step_outcome(&cfg, tw_config_agent(&cfg, "a"), &r);
}

static void assert_fail(json_t *o, const char *code, const char *in_message)
{
    json_t *f = json_object_get(o, "fail");
    ck_assert_msg(json_is_object(f), "expected a fail outcome");
    ck_assert_str_eq(json_string_value(json_object_get(f, "error")), code);
    ck_assert_msg(strstr(json_string_value(json_object_get(f, "message")), in_message),
                  "message '%s' lacks '%s'", json_string_value(json_object_get(f, "message")), in_message);
    json_decref(o);
}

START_TEST(complete_keeps_output)
{
    json_t *o = step(WRK_PROC_OK, 0, "{\"complete\":{\"output\":{\"x\":[1,2]}}}", "");
    ck_assert_int_eq(json_integer_value(json_array_get(
                         json_object_get(json_object_get(json_object_get(o, "complete"), "output"), "x"), 1)),
                     2);
    json_decref(o);
}
END_TEST

START_TEST(process_failures_have_their_codes)
{
    assert_fail(step(WRK_PROC_EXIT, 3, "", "boom happened\n"), "agent_exit",
                "status 3; stderr: boom happened");
    assert_fail(step(WRK_PROC_TIMEOUT, 0, "", ""), "step_timeout", "7 second limit");
    assert_fail(step(WRK_PROC_OVERSIZE, 0, "", ""), "bad_output", "more than 1048576 bytes");
    assert_fail(step(WRK_PROC_SPAWN, 0, "", ""), "agent_exit", "could not be started");
}
END_TEST

START_TEST(bad_replies_are_bad_output)
{
    assert_fail(step(WRK_PROC_OK, 0, "", ""), "bad_output", "printed nothing");
    assert_fail(step(WRK_PROC_OK, 0, "this is not json", ""), "bad_output", "it began: this is not json");
    assert_fail(step(WRK_PROC_OK, 0, "[1,2]", ""), "bad_output", "not an object");
    assert_fail(step(WRK_PROC_OK, 0, "{}", ""), "bad_output",
                "exactly one of complete, tool_calls, fail (it had 0)");
    assert_fail(step(WRK_PROC_OK, 0, "{\"complete\":{},\"fail\":{\"error\":\"x\"}}", ""), "bad_output",
                "it had 2");
    assert_fail(step(WRK_PROC_OK, 0, "{\"complete\":3}", ""), "bad_output", "complete must be an object");
}
END_TEST

START_TEST(fail_reply_is_agent_failed)
{
    assert_fail(step(WRK_PROC_OK, 0, "{\"fail\":{\"error\":\"no data\"}}", ""), "agent_failed", "no data");
    assert_fail(step(WRK_PROC_OK, 0, "{\"fail\":{\"error\":{\"why\":1}}}", ""), "agent_failed",
                "{\"why\":1}");
}
END_TEST

/* Contract 18: a fail reply's own code, [a-z0-9_]{1,64}, becomes the error; without one it is agent_failed.
 * A code that is no such name, or one turnwatch gives its own failures (a step timeout, a watchdog's reap, a
 * crash), is not taken: the step fails agent_failed and the message says why. */
START_TEST(fail_reply_carries_its_code)
{
    assert_fail(step(WRK_PROC_OK, 0, "{\"fail\":{\"error\":\"no quota left\",\"code\":\"my_code\"}}", ""),
                "my_code", "no quota left");
    assert_fail(
        step(WRK_PROC_OK, 0, "{\"fail\":{\"code\":\"agent_exception\",\"error\":\"KeyError: x\"}}", ""),
        "agent_exception", "KeyError: x");
    char longest[200];
    snprintf(longest, sizeof longest, "{\"fail\":{\"error\":\"e\",\"code\":\"%s\"}}",
             "abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0");
    assert_fail(step(WRK_PROC_OK, 0, longest, ""),
                "abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0", "e");
    assert_fail(step(WRK_PROC_OK, 0, "{\"fail\":{\"error\":\"plain\",\"code\":null}}", ""), "agent_failed",
                "plain");
    /* Not a code: the step fails agent_failed, saying what was wrong with it. */
    static const char *const bad[] = {"\"My_Code\"",    "\"\"", "\"a-b\"",   "\"a b\"",
                                      "\"caf\\u00e9\"", "42",   "{\"x\":1}", "\"a\\nb\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char reply[256];
        snprintf(reply, sizeof reply, "{\"fail\":{\"error\":\"it broke\",\"code\":%s}}", bad[i]);
        assert_fail(step(WRK_PROC_OK, 0, reply, ""), "agent_failed", "it broke");
        assert_fail(step(WRK_PROC_OK, 0, reply, ""), "agent_failed",
                    "is not an error code ([a-z0-9_]{1,64})");
    }
    snprintf(longest, sizeof longest, "{\"fail\":{\"error\":\"e\",\"code\":\"%s\"}}",
             "abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz01");
    assert_fail(step(WRK_PROC_OK, 0, longest, ""), "agent_failed", "is not an error code");
    /* turnwatch's own codes stay its own: an agent cannot make its failure look like a timeout or a crash. */
    static const char *const own[] = {"step_timeout",
                                      "timeout_reaped_by_watchdog",
                                      "dispatch_timeout",
                                      "queue_timeout",
                                      "turn_deadline_exceeded",
                                      "cancelled",
                                      "agent_exit",
                                      "bad_output",
                                      "bad_tool_call",
                                      "resource_limit"};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
        char reply[256];
        snprintf(reply, sizeof reply, "{\"fail\":{\"error\":\"spoof\",\"code\":\"%s\"}}", own[i]);
        json_t *o = step(WRK_PROC_OK, 0, reply, "");
        ck_assert_msg(!json_object_get(json_object_get(o, "fail"), "timeout"), "code %s got timeout details",
                      own[i]);
        assert_fail(o, "agent_failed", "is one turnwatch gives its own failures");
    }
}
END_TEST

START_TEST(tool_calls_are_normalised)
{
    json_t *o = step(WRK_PROC_OK, 0,
                     "{\"tool_calls\":[{\"id\":\"c1\",\"tool\":\"search\",\"args\":{}},"
                     "{\"id\":\"c2\",\"tool\":\"quick\",\"args\":{\"q\":1},\"timeout_seconds\":100},"
                     "{\"id\":\"c3\",\"tool\":\"ask\",\"args\":{}}],\"wait\":2,\"state\":{\"k\":1}}",
                     "");
    json_t *calls = json_object_get(o, "tool_calls");
    ck_assert_int_eq(json_array_size(calls), 3);
    /* search: run time 40, wait max(60, 90, 40) = 90 */
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(calls, 0), "timeout_seconds")), 40);
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(calls, 0), "wait_seconds")), 90);
    /* quick with its own 100 s: it may run 100 s, so the turn waits that long too */
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(calls, 1), "timeout_seconds")), 100);
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(calls, 1), "wait_seconds")), 100);
    /* ask: external, defaults 30 / 60, worker default 60 */
    ck_assert(json_is_true(json_object_get(json_array_get(calls, 2), "external")));
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(calls, 2), "wait_seconds")), 60);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "wait")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(o, "state"), "k")), 1);
    json_decref(o);

    o = step(WRK_PROC_OK, 0, "{\"tool_calls\":[{\"id\":\"c1\",\"tool\":\"search\",\"args\":{}}]}", "");
    ck_assert_str_eq(json_string_value(json_object_get(o, "wait")), "all");
    ck_assert(json_is_null(json_object_get(o, "state")));
    json_decref(o);
}
END_TEST

START_TEST(invalid_tool_calls_are_refused)
{
    assert_fail(step(WRK_PROC_OK, 0, "{\"tool_calls\":[]}", ""), "bad_tool_call", "array of 1 to");
    assert_fail(step(WRK_PROC_OK, 0, "{\"tool_calls\":[{\"id\":\"c1\",\"tool\":\"nope\",\"args\":{}}]}", ""),
                "bad_tool_call", "unknown tool 'nope'");
    assert_fail(step(WRK_PROC_OK, 0,
                     "{\"tool_calls\":[{\"id\":\"c1\",\"tool\":\"search\",\"args\":{}},"
                     "{\"id\":\"c1\",\"tool\":\"search\",\"args\":{}}]}",
                     ""),
                "bad_tool_call", "used twice");
    assert_fail(
        step(WRK_PROC_OK, 0, "{\"tool_calls\":[{\"id\":\"c1\",\"tool\":\"search\",\"args\":[1]}]}", ""),
        "bad_tool_call", "args must be a JSON object");
    assert_fail(step(WRK_PROC_OK, 0, "{\"tool_calls\":[{\"tool\":\"search\",\"args\":{}}]}", ""),
                "bad_tool_call", "no valid id");
    assert_fail(
        step(WRK_PROC_OK, 0, "{\"tool_calls\":[{\"id\":\"c1\",\"tool\":\"bad name\",\"args\":{}}]}", ""),
        "bad_tool_call", "names no valid tool");
    assert_fail(step(WRK_PROC_OK, 0,
                     "{\"tool_calls\":[{\"id\":\"c1\",\"tool\":\"search\",\"args\":{}}],\"wait\":2}", ""),
                "bad_tool_call", "wait must be");
    assert_fail(step(WRK_PROC_OK, 0,
                     "{\"tool_calls\":[{\"id\":\"c1\",\"tool\":\"search\",\"args\":{}}],\"wait\":\"some\"}",
                     ""),
                "bad_tool_call", "wait must be");
    assert_fail(
        step(WRK_PROC_OK, 0,
             "{\"tool_calls\":[{\"id\":\"c1\",\"tool\":\"search\",\"args\":{},\"timeout_seconds\":0}]}", ""),
        "bad_tool_call", "timeout_seconds must be");
}
END_TEST

static json_t *tool(WrkProcOutcome outcome, int code, const char *out, const char *err)
{
    WrkProcResult r = {
        .outcome = outcome, .exit_code = code, .output = out, .output_len = strlen(out), .stderr_tail = err};
    return wrk_tool_outcome(40, &r);
}

static void assert_tool(json_t *o, const char *status, const char *code, const char *in_message)
{
    ck_assert_str_eq(json_string_value(json_object_get(o, "status")), status);
    if (code) {
        json_t *e = json_object_get(o, "error");
        ck_assert_str_eq(json_string_value(json_object_get(e, "code")), code);
        ck_assert_msg(strstr(json_string_value(json_object_get(e, "message")), in_message),
                      "message '%s' lacks '%s'", json_string_value(json_object_get(e, "message")),
                      in_message);
    }
    json_decref(o);
}

START_TEST(tool_results)
{
    json_t *o = tool(WRK_PROC_OK, 0, "{\"output\":{\"hits\":3}}", "");
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(o, "output"), "hits")), 3);
    assert_tool(o, "ok", NULL, NULL);
    assert_tool(tool(WRK_PROC_OK, 0, "{\"error\":{\"code\":\"rate_limited\",\"message\":\"slow down\"}}", ""),
                "error", "rate_limited", "slow down");
    assert_tool(tool(WRK_PROC_EXIT, 3, "", "something broke\n"), "error", "tool_failed",
                "status 3; stderr: something broke");
    assert_tool(tool(WRK_PROC_TIMEOUT, 0, "", ""), "timeout", "tool_timeout", "40 second limit");
    assert_tool(tool(WRK_PROC_OK, 0, "this is not json", ""), "error", "bad_output", "not a JSON object");
    assert_tool(tool(WRK_PROC_OK, 0, "{\"result\":1}", ""), "error", "bad_output", "must be {\"output\"");
}
END_TEST

/* Every string in j is valid UTF-8: jansson checks it again when it reads the dump back. */
static void assert_clean_json(const json_t *o)
{
    char *dump;
    json_t *back;

    ck_assert_ptr_nonnull(o);
    dump = json_dumps(o, JSON_COMPACT);
    ck_assert_ptr_nonnull(dump);
    back = json_loads(dump, 0, NULL);
    ck_assert_msg(back && json_equal(back, o), "outcome does not survive a dump and load: %s", dump);
    json_decref(back);
    free(dump);
}

START_TEST(invalid_utf8_on_stderr_keeps_the_result)
{
    /* Regression: a program that wrote \xff\xfe to stderr and exited 1 got a NULL outcome (json_pack
     * refuses invalid UTF-8), so the worker left the item processing and ran the program again. */
    json_t *o = step(WRK_PROC_EXIT, 1, "", "\xff\xfe");
    assert_clean_json(o);
    assert_fail(o, "agent_exit", "status 1; stderr: \xef\xbf\xbd\xef\xbf\xbd");
    o = tool(WRK_PROC_EXIT, 1, "", "bad \xc3\x28 byte\n");
    assert_clean_json(o);
    assert_tool(o, "error", "tool_failed", "stderr: bad \xef\xbf\xbd( byte");
    /* A valid character survives; the stderr tail is cut to its last 400 bytes on a character boundary. */
    char err[1002];
    for (int i = 0; i < 500; i++)
        memcpy(err + 2 * i, "\xc3\xa9", 2);
    strcpy(err + 1000, "x");
    o = step(WRK_PROC_SIGNAL, 9, "", err); /* the last 400 bytes start inside a character */
    assert_clean_json(o);
    const char *m = json_string_value(json_object_get(json_object_get(o, "fail"), "message"));
    const char *t = strstr(m, "stderr: ");
    ck_assert_ptr_nonnull(t);
    ck_assert_str_eq(t + 8 + 398, "x"); /* 199 whole characters and the x */
    ck_assert_int_eq(strncmp(t + 8, "\xc3\xa9", 2), 0);
    json_decref(o);
}
END_TEST

static json_t *spawn_failed(int err, bool tool)
{
    WrkProcResult r = {.outcome = WRK_PROC_SPAWN, .output = "", .stderr_tail = "", .spawn_errno = err};
    return tool ? wrk_tool_outcome(5, &r) : wrk_step_outcome(&cfg, tw_config_agent(&cfg, "a"), &r);
}

/* A program the worker could not start for lack of descriptors or processes is not called a bad executable.
 */
START_TEST(spawn_failures_say_why)
{
    static const struct {
        int err;
        const char *says;
    } cases[] = {
        {EMFILE, "could not be started: the worker is out of file descriptors (EMFILE)"},
        {ENFILE, "could not be started: the system is out of file descriptors (ENFILE)"},
        {EAGAIN, "could not be started: the worker cannot create a process now"},
        {ENOENT, "could not be started (No such file or directory; is it configured on this worker"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *o = spawn_failed(cases[i].err, false);
        const char *msg = json_string_value(json_object_get(json_object_get(o, "fail"), "message"));
        ck_assert_msg(msg && (cases[i].err == ENOENT || !strstr(msg, "executable")), "errno %d: '%s'",
                      cases[i].err, msg);
        assert_fail(o, "agent_exit", cases[i].says);
    }
    assert_tool(spawn_failed(EMFILE, true), "error", "tool_failed",
                "the tool program could not be started: the worker is out of file descriptors (EMFILE)");
}
END_TEST

START_TEST(long_failure_is_cut_on_a_character)
{
    /* Regression: a fail.error longer than the 2,048-byte message limit, cut inside a multi-byte
     * character, made the outcome NULL. */
    static char reply[6000], err[5000] = "a";
    size_t k = 1;
    /* The message is "the agent reported failure: a" (29 bytes) and 4,800 bytes of three-byte characters:
     * the 2,047th byte falls inside one. */
    for (int i = 0; i < 1600; i++) {
        memcpy(err + k, "\xe2\x82\xac", 3);
        k += 3;
    }
    err[k] = '\0';
    snprintf(reply, sizeof reply, "{\"fail\":{\"error\":\"%s\"}}", err);
    json_t *o = step(WRK_PROC_OK, 0, reply, "");
    assert_clean_json(o);
    const char *m = json_string_value(json_object_get(json_object_get(o, "fail"), "message"));
    ck_assert_uint_eq(strlen(m), 29 + 3 * 672);
    ck_assert_int_eq(strncmp(m + strlen(m) - 3, "\xe2\x82\xac", 3), 0);
    assert_fail(o, "agent_failed", "the agent reported failure: a\xe2\x82\xac");

    /* The same for an error that is not a string (dumped as JSON), and for a tool's own message. */
    snprintf(reply, sizeof reply, "{\"fail\":{\"error\":[\"%s\"]}}", err);
    o = step(WRK_PROC_OK, 0, reply, "");
    assert_clean_json(o);
    assert_fail(o, "agent_failed", "[\"a\xe2\x82\xac");
    snprintf(reply, sizeof reply, "{\"error\":{\"code\":\"x\",\"message\":\"%s\"}}", err);
    o = tool(WRK_PROC_OK, 0, reply, "");
    assert_clean_json(o);
    m = json_string_value(json_object_get(json_object_get(o, "error"), "message"));
    ck_assert_uint_eq(strlen(m), 1 + 3 * 682); /* the 2,048-byte limit, less the NUL */
    ck_assert_int_eq(strncmp(m + strlen(m) - 3, "\xe2\x82\xac", 3), 0);
    json_decref(o);
}
END_TEST

START_TEST(tool_error_with_invalid_bytes)
{
    /* Invalid UTF-8 inside the tool's JSON reply: refused as bad_output, with a clean message. */
    json_t *o = tool(WRK_PROC_OK, 0, "{\"error\":{\"code\":\"x\",\"message\":\"\xff\xfe\"}}", "");
    assert_clean_json(o);
    assert_tool(o, "error", "bad_output", "not a JSON object (unable to decode byte 0xff");
    /* An empty message from the tool gets a sentence, and an invalid code the generic one. */
    o = tool(WRK_PROC_OK, 0, "{\"error\":{\"code\":\"bad\\ncode\",\"message\":\"\"}}", "");
    assert_clean_json(o);
    assert_tool(o, "error", "tool_error", "the tool reported an error");
    /* And a stdout excerpt stays printable ASCII whatever the bytes. */
    o = step(WRK_PROC_OK, 0, "\xe2\x82 not json", "");
    assert_clean_json(o);
    assert_fail(o, "bad_output", "it began: .. not json");
}
END_TEST

TW_SUITE_DEFINE_CHECKED(steps, setup, teardown,
                        {
                            {"outcomes", complete_keeps_output, 10},
                            {"outcomes", process_failures_have_their_codes, 10},
                            {"outcomes", spawn_failures_say_why, 10},
                            {"outcomes", bad_replies_are_bad_output, 10},
                            {"outcomes", fail_reply_is_agent_failed, 10},
                            {"outcomes", fail_reply_carries_its_code, 10},
                            {"outcomes", tool_calls_are_normalised, 10},
                            {"outcomes", invalid_tool_calls_are_refused, 10},
                            {"outcomes", tool_results, 10},
                            {"outcomes", invalid_utf8_on_stderr_keeps_the_result, 10},
                            {"outcomes", long_failure_is_cut_on_a_character, 10},
                            {"outcomes", tool_error_with_invalid_bytes, 10},
                        })
