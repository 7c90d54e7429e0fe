/* tw-soak-agent — the agent of tools/soak: input.kind picks what a turn does (done, slow, fail, exit,
 * overrun, tools, external), and every reply says which epoch and step produced it, so the soak's checker can
 * tell an effect of the current epoch from a stale one.
 *
 * Input: {"kind", "seconds"?, "step_sleep"?, "rounds"?, "calls"?: [{"id","tool","args"}], "wait"?}.
 *  - done: completes at once; slow: sleeps `seconds`, then completes; overrun: sleeps `seconds` (longer than
 *    the step timeout the soak configures), then completes if it is still alive;
 *  - fail: replies {"fail"}; exit: exits with status 3;
 *  - tools, external: `rounds` rounds of `calls` (ids get "-<round>" after round 1) with `wait`, each step
 *    sleeping `step_sleep` first; then completes.
 * Output: {"kind","epoch","step","saw"?: [[tool_call_id, status], ...]} where `saw` lists the results the
 * last step was resumed with, in call order. An epoch in TURNWATCH_EPOCH that differs from the document's is
 * reported as a failure, never hidden. */
#include "exio.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* [[id, status], ...] of the step document's tool_results, in the order given. */
static json_t *soak_saw(json_t *req)
{
    json_t *saw = json_array(), *r;
    size_t i;

    json_array_foreach(json_object_get(req, "tool_results"), i, r)
    {
        const char *id = json_string_value(json_object_get(r, "tool_call_id"));
        const char *st = json_string_value(json_object_get(r, "status"));
        json_array_append_new(saw, json_pack("[s?,s?]", id, st));
    }
    return saw;
}

/* The calls of round `round` (1-based): ids as given in round 1, suffixed "-<round>" later. */
static json_t *soak_round_calls(json_t *calls, json_int_t round)
{
    json_t *out = json_array(), *c;
    size_t i;

    json_array_foreach(calls, i, c)
    {
        const char *id = json_string_value(json_object_get(c, "id"));
        const char *tool = json_string_value(json_object_get(c, "tool"));
        char rid[300];

        if (round > 1)
            snprintf(rid, sizeof rid, "%s-%lld", id ? id : "call", (long long)round);
        else
            snprintf(rid, sizeof rid, "%s", id ? id : "call");
        json_t *args = json_object_get(c, "args");
        json_array_append_new(
            out, ex_tool_call(rid, tool ? tool : "work", args ? json_deep_copy(args) : json_object(), 0));
    }
    return out;
}

static json_t *soak_output(const char *kind, json_t *req, bool with_saw)
{
    json_t *out = json_pack("{s:s,s:O,s:O}", "kind", kind, "epoch", json_object_get(req, "epoch"), "step",
                            json_object_get(req, "step"));
    if (with_saw)
        json_object_set_new(out, "saw", soak_saw(req));
    return ex_complete(out);
}

static json_t *soak_tools(const char *kind, json_t *req, json_t *input, json_int_t step)
{
    json_t *calls = json_object_get(input, "calls"), *wait = json_object_get(input, "wait");
    json_int_t rounds = (json_int_t)ex_number(input, "rounds", 1);

    if (!json_is_array(calls) || json_array_size(calls) == 0)
        return ex_fail("soak: kind tools needs input.calls");
    ex_sleep_sec(ex_number(input, "step_sleep", 0));
    if (step < rounds)
        return json_pack("{s:o,s:O,s:{s:I}}", "tool_calls", soak_round_calls(calls, step + 1), "wait",
                         wait ? wait : json_string("all"), "state", "round", step + 1);
    return soak_output(kind, req, true);
}

int main(void)
{
    json_t *req = ex_read_request();
    json_t *input = json_object_get(req, "input");
    const char *kind = json_string_value(json_object_get(input, "kind"));
    json_int_t step = json_integer_value(json_object_get(req, "step"));
    json_int_t epoch = json_integer_value(json_object_get(req, "epoch"));
    const char *env_epoch = getenv("TURNWATCH_EPOCH");
    json_t *reply;
    char why[160];

    if (!kind)
        kind = "done";
    if (!env_epoch || strtoll(env_epoch, NULL, 10) != (long long)epoch) {
        snprintf(why, sizeof why, "soak: TURNWATCH_EPOCH %s differs from the document's epoch %lld",
                 env_epoch ? env_epoch : "(unset)", (long long)epoch);
        reply = ex_fail(why);
    } else if (strcmp(kind, "done") == 0) {
        reply = soak_output(kind, req, false);
    } else if (strcmp(kind, "slow") == 0 || strcmp(kind, "overrun") == 0) {
        ex_sleep_sec(ex_number(input, "seconds", 1));
        reply = soak_output(kind, req, false);
    } else if (strcmp(kind, "fail") == 0) {
        reply = ex_fail("soak: this turn was asked to fail");
    } else if (strcmp(kind, "exit") == 0) {
        fprintf(stderr, "tw-soak-agent: exiting with status 3 as asked\n");
        json_decref(req);
        return 3;
    } else if (strcmp(kind, "tools") == 0 || strcmp(kind, "external") == 0) {
        reply = soak_tools(kind, req, input, step);
    } else {
        snprintf(why, sizeof why, "soak: unknown input.kind '%.60s'", kind);
        reply = ex_fail(why);
    }
    json_decref(req);
    return ex_reply(reply);
}
