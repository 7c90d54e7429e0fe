/* tw-test-agent — agent for the tests, in exec and serve mode: input.mode picks one behaviour (complete,
 * fail (input.code: the reply's own code), echo (completes with the step document), exit, garbage, oversize,
 * big_reply, pid, sleep, flood, hang, tools, reply_exit, stray) so a test can provoke each outcome of
 * docs/protocol.md (and each way a serve process fails, section 10) on purpose. With the arguments
 * `--exit-at-start-if FILE` it exits 3 at once, before reading anything, whenever FILE exists.
 * input.on_attempt {"2": {...}} replaces the input for that attempt of a retried turn (the step document's
 * "attempt"). Mode tools takes input.calls (ids get
 * "-<round>" after round 1), input.wait, input.rounds and input.resume_sleep[_once], and completes with
 * {"tool_results": [what each resumed step saw]}. */
#include "exio.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Steps this process has served (more than one in serve mode). */
static int served;

/* Calls for round `round` (1-based): round 1 uses the ids as given, later rounds suffix them with "-<round>"
 * so every tool_call_id of a turn stays unique. */
static json_t *test_round_calls(json_t *calls, json_int_t round)
{
    json_t *out = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c)
    {
        json_t *copy = json_deep_copy(c);
        if (round > 1) {
            char id[512];
            const char *base = json_string_value(json_object_get(c, "id"));
            snprintf(id, sizeof id, "%s-%lld", base ? base : "call", (long long)round);
            json_object_set_new(copy, "id", json_string(id));
        }
        json_array_append_new(out, copy);
    }
    return out;
}

/* `wait` is borrowed: input.wait as the test gave it (a string or a number), or NULL for "all". */
static json_t *test_tool_calls(json_t *calls, json_t *wait, json_t *state)
{
    return json_pack("{s:o,s:o,s:o}", "tool_calls", calls, "wait",
                     wait ? json_incref(wait) : json_string("all"), "state", state);
}

/* input.resume_sleep: seconds each resumed step (step > 0) sleeps before it replies, so a test can catch the
 * worker while it holds a resume ledger entry. With input.resume_sleep_once (a file path) only the step that
 * creates that file sleeps, and it writes its pid there first (so a test that kills the worker can stop this
 * orphan too). */
static void test_resume_sleep(json_t *input)
{
    double s = ex_number(input, "resume_sleep", 0);
    const char *once = json_string_value(json_object_get(input, "resume_sleep_once"));

    if (!(s > 0))
        return;
    if (once) {
        int fd = open(once, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd < 0)
            return; /* an earlier run of this step already slept */
        dprintf(fd, "%d\n", (int)getpid());
        close(fd);
    }
    fprintf(stderr, "tw-test-agent: resumed step sleeps %.1f s as asked\n", s);
    ex_sleep_sec(s);
}

/* mode "tools": step 0 issues round 1; each later step records the results it saw and either issues the next
 * round or completes with everything seen, one array per step. */
static json_t *test_tools(json_t *req, json_t *input)
{
    json_t *calls = json_object_get(input, "calls");
    json_t *wait = json_object_get(input, "wait");
    json_int_t rounds = (json_int_t)ex_number(input, "rounds", 1);
    json_t *state = json_object_get(req, "state");

    if (!json_is_array(calls))
        return ex_fail("mode tools needs input.calls (an array)");
    if (!json_is_object(state))
        return test_tool_calls(test_round_calls(calls, 1), wait, json_pack("{s:i,s:[]}", "round", 1, "seen"));
    test_resume_sleep(input);

    json_int_t round = json_integer_value(json_object_get(state, "round"));
    json_t *seen = json_deep_copy(json_object_get(state, "seen"));
    if (!json_is_array(seen)) {
        json_decref(seen);
        seen = json_array();
    }
    json_t *results = json_object_get(req, "tool_results");
    json_array_append(seen, results ? results : json_null());
    if (round < rounds)
        return test_tool_calls(test_round_calls(calls, round + 1), wait,
                               json_pack("{s:I,s:o}", "round", round + 1, "seen", seen));
    return ex_complete(json_pack("{s:o}", "tool_results", seen));
}

/* One step; NULL when the reply was written here (garbage). */
static json_t *test_step(json_t *req)
{
    json_t *input = json_object_get(req, "input");
    json_int_t step = json_integer_value(json_object_get(req, "step"));
    json_t *reply;
    char attempt[24];

    snprintf(attempt, sizeof attempt, "%lld", (long long)json_integer_value(json_object_get(req, "attempt")));
    if (json_is_object(json_object_get(json_object_get(input, "on_attempt"), attempt)))
        input = json_object_get(json_object_get(input, "on_attempt"), attempt);
    const char *mode = json_string_value(json_object_get(input, "mode"));

    served++;
    if (!mode)
        mode = "complete";
    /* input.hold (a file path): whatever the mode, wait for that file first (at most input.hold_seconds, 60
     * by default), so that a test can keep a step in flight until its fault is in place. */
    const char *hold = json_string_value(json_object_get(input, "hold"));
    double hold_most = ex_number(input, "hold_seconds", 60);
    if (hold && access(hold, F_OK) != 0)
        fprintf(stderr, "tw-test-agent: holding until %s exists\n", hold);
    for (double waited = 0; hold && waited < hold_most && access(hold, F_OK) != 0; waited += 0.02)
        ex_sleep_sec(0.02);
    if (strcmp(mode, "complete") == 0) {
        json_t *out = json_object_get(input, "output");
        reply = ex_complete(out ? json_incref(out) : json_pack("{s:s,s:I}", "mode", mode, "step", step));
    } else if (strcmp(mode, "fail") == 0) {
        const char *err = json_string_value(json_object_get(input, "error"));
        reply = ex_fail(err ? err : "the test agent was asked to fail");
        /* input.code, whatever it is (a test sends invalid ones too), as the reply's own code
         * (docs/python.md).
         */
        if (reply && json_object_get(input, "code"))
            json_object_set(json_object_get(reply, "fail"), "code", json_object_get(input, "code"));
    } else if (strcmp(mode, "echo") == 0) {
        /* The step document as the program got it: a test reads deadline_at, attempt, step, ... from it. */
        reply = ex_complete(json_pack("{s:s,s:O}", "mode", mode, "doc", req));
    } else if (strcmp(mode, "exit") == 0) {
        int code = (int)ex_number(input, "code", 1);
        fprintf(stderr, "tw-test-agent: exiting with code %d as asked\n", code);
        json_decref(req);
        exit(code);
    } else if (strcmp(mode, "garbage") == 0) {
        json_decref(req);
        fputs("this is not json\n", stdout);
        fflush(stdout);
        return NULL;
    } else if (strcmp(mode, "big_reply") == 0) {
        /* A valid complete reply whose line, newline included, is exactly input.bytes long (at least 27). */
        long bytes = (long)ex_number(input, "bytes", 1024 * 1024);
        json_decref(req);
        fputs("{\"complete\":{\"output\":\"", stdout);
        for (long i = 27; i < bytes; i++)
            putchar('x');
        fputs("\"}}\n", stdout);
        fflush(stdout);
        return NULL;
    } else if (strcmp(mode, "oversize") == 0) {
        /* input.bytes bytes of 'x' and a newline: one line longer than the worker takes. */
        long bytes = (long)ex_number(input, "bytes", 2 * 1024 * 1024);
        json_decref(req);
        for (long i = 0; i < bytes; i++)
            putchar('x');
        putchar('\n');
        fflush(stdout);
        return NULL;
    } else if (strcmp(mode, "pid") == 0) {
        /* Which process served this step, how many steps it has served (serve mode reuses it), and whether
         * the per-step variables came in the environment (exec mode only). */
        reply = ex_complete(json_pack("{s:s,s:i,s:i,s:I,s:b,s:b}", "mode", mode, "pid", (int)getpid(),
                                      "served", served, "step", step, "serving", ex_serving(), "turn_env",
                                      getenv("TURNWATCH_TURN_ID") != NULL));
    } else if (strcmp(mode, "sleep") == 0) {
        /* With input.gate (a file path) it returns once that file exists, `seconds` being only the longest
         * wait: a test holds steps in flight until its fault is in place, whatever the machine's speed. */
        double s = ex_number(input, "seconds", 1);
        const char *gate = json_string_value(json_object_get(input, "gate"));
        /* input.ignore_term: SIGTERM does not stop the sleep, so the reply comes after a time limit. */
        if (json_is_true(json_object_get(input, "ignore_term")))
            signal(SIGTERM, SIG_IGN);
        if (gate) {
            for (double waited = 0; waited < s && access(gate, F_OK) != 0; waited += 0.02)
                ex_sleep_sec(0.02);
        } else {
            ex_sleep_sec(s);
        }
        reply = ex_complete(json_pack("{s:s,s:f}", "mode", mode, "slept", s));
    } else if (strcmp(mode, "flood") == 0) {
        /* input.lines lines of input.line_bytes bytes on stderr (the worker must not log them all), then a
         * last line; with input.code it then exits with that code, so the turn's error quotes the last line.
         */
        long lines = (long)ex_number(input, "lines", 100000);
        long width = (long)ex_number(input, "line_bytes", 100);
        int code = (int)ex_number(input, "code", 0);
        char *line = malloc((size_t)(width > 0 ? width : 0) + 2);
        if (!line) {
            json_decref(req);
            exit(1);
        }
        memset(line, 'f', (size_t)(width > 0 ? width : 0));
        line[width > 0 ? width : 0] = '\n';
        line[(width > 0 ? width : 0) + 1] = '\0';
        for (long i = 0; i < lines; i++)
            fputs(line, stderr);
        free(line);
        fprintf(stderr, "tw-test-agent: flood of %ld lines ends\n", lines);
        fflush(stderr);
        if (code) {
            json_decref(req);
            exit(code);
        }
        reply = ex_complete(json_pack("{s:s,s:I}", "mode", mode, "lines", (json_int_t)lines));
    } else if (strcmp(mode, "hang") == 0) {
        /* Only SIGKILL ends this: it is how tests prove the worker escalates after kill_grace_seconds. */
        json_decref(req);
        signal(SIGTERM, SIG_IGN);
        fprintf(stderr, "tw-test-agent: hanging, ignoring SIGTERM\n");
        for (;;)
            pause();
    } else if (strcmp(mode, "tools") == 0) {
        reply = test_tools(req, input);
    } else if (strcmp(mode, "reply_exit") == 0 || strcmp(mode, "stray") == 0) {
        /* A good reply, then what a serve program must not do between requests: after input.linger seconds
         * (0: at once) exit 0 without reading the next request (reply_exit), or write input.line (any JSON,
         * {"unsolicited": true} by default) as one more line, wait input.pause seconds (1 by default) and go
         * on serving (stray). The pause keeps the next request unread in its stdin for a while: a line that
         * comes after the worker gave it a request can only be told from a reply to that request while the
         * request is not read yet. The reply echoes input.n, so a test sees which request each reply
         * answered. */
        double linger = ex_number(input, "linger", 0), then_wait = ex_number(input, "pause", 1);
        json_t *line = json_object_get(input, "line");
        bool exits = strcmp(mode, "reply_exit") == 0;
        line = line ? json_incref(line) : json_pack("{s:b}", "unsolicited", 1);
        reply = ex_complete(json_pack("{s:s,s:O?,s:i,s:i}", "mode", mode, "n", json_object_get(input, "n"),
                                      "pid", (int)getpid(), "served", served));
        json_decref(req);
        if (ex_reply(reply) != 0 || !ex_serving()) {
            json_decref(line);
            return NULL;
        }
        ex_sleep_sec(linger);
        if (exits) {
            json_decref(line);
            exit(0);
        }
        ex_reply(line);
        ex_sleep_sec(then_wait);
        return NULL;
    } else {
        reply = ex_fail("unknown input.mode");
    }
    json_decref(req);
    return reply;
}

int main(int argc, char **argv)
{
    /* A program that dies before it reads anything, when a test wants it to (serve mode's new processes). */
    if (argc == 3 && strcmp(argv[1], "--exit-at-start-if") == 0 && access(argv[2], F_OK) == 0) {
        fprintf(stderr, "tw-test-agent: %s exists: exiting with code 3 before reading anything\n", argv[2]);
        return 3;
    }
    return ex_main(test_step);
}
