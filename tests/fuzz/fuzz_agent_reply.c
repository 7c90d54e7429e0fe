/* Fuzz target agent-reply: wrk_step_outcome on any exit, stdout and stderr an agent program can produce.
 * The outcome goes to tw.apply_step as JSON, so it must always be one well-formed, valid-UTF-8 object. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fuzz_check.h"
#include "fuzz_reply.h"
#include "names.h"
#include "steps.h"
#include "../steps_config.h"

static TwConfig cfg;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fz_check(tw_config_load_string(&cfg, "fuzz.ini", steps_config_text) == 0,
             "the fixed config does not load");
    return 0;
}

static void check_tool_calls(const json_t *o)
{
    json_t *calls = json_object_get(o, "tool_calls"), *wait = json_object_get(o, "wait"), *c;
    size_t n = json_array_size(calls), i;

    fz_check(n >= 1 && n <= 256, "tool_calls: 1 to 256 calls");
    fz_check(json_object_get(o, "state") != NULL, "tool_calls without state");
    fz_check(
        (json_is_string(wait) &&
         (strcmp(json_string_value(wait), "all") == 0 || strcmp(json_string_value(wait), "any") == 0)) ||
            (json_is_integer(wait) && json_integer_value(wait) >= 1 && (size_t)json_integer_value(wait) <= n),
        "wait is all, any or 1..n");
    json_array_foreach(calls, i, c)
    {
        const char *tool = fz_check_string(c, "tool");
        json_int_t t = json_integer_value(json_object_get(c, "timeout_seconds"));

        fz_check(tw_ident_valid(fz_check_string(c, "id")), "a call id that is not an identifier");
        fz_check(tw_config_tool(&cfg, tool) != NULL, "a call of an unknown tool");
        fz_check(json_is_object(json_object_get(c, "args")), "args not an object");
        fz_check(t >= 1 && t <= 604800, "timeout_seconds out of range");
        fz_check(json_integer_value(json_object_get(c, "wait_seconds")) >= t,
                 "wait_seconds < timeout_seconds");
        fz_check(json_is_boolean(json_object_get(c, "external")), "external not a boolean");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    WrkProcResult r;
    json_t *o, *f;

    fz_result_make(data, size, &r);
    /* The configured agent, and one whose program is not configured on this worker (agent NULL). */
    for (int k = 0; k < 2; k++) {
        o = wrk_step_outcome(&cfg, k == 0 ? tw_config_agent(&cfg, "a") : NULL, &r);
        fz_check(json_is_object(o), "the outcome is not a JSON object");
        /* tool_calls, wait, state, and max_delegation_depth and max_tree_turns for tw.delegate (contract
         * section 14, issue 23). */
        fz_check(json_object_size(o) == 1 || (json_object_get(o, "tool_calls") && json_object_size(o) == 5 &&
                                              json_is_integer(json_object_get(o, "max_delegation_depth")) &&
                                              json_is_integer(json_object_get(o, "max_tree_turns"))),
                 "the outcome has other keys");
        fz_check_json(o);
        if ((f = json_object_get(o, "fail"))) {
            fz_check(tw_ident_valid(fz_check_string(f, "error")), "fail.error is not an identifier");
            fz_check_string(f, "message");
        } else if (json_object_get(o, "complete")) {
            fz_check(r.outcome == WRK_PROC_OK, "complete from a program that failed");
            fz_check(json_object_get(json_object_get(o, "complete"), "output") != NULL,
                     "complete without output");
        } else {
            fz_check(r.outcome == WRK_PROC_OK, "tool_calls from a program that failed");
            check_tool_calls(o);
        }
        json_decref(o);
    }
    fz_result_free(&r);
    return 0;
}
