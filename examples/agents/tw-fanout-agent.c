/* tw-fanout-agent — example agent: fans out input.n calls to one tool, then completes with their outputs in
 * order (exec and serve mode). Each call's args carry "seconds" (for a sleep tool) and "input" {"part","of"}:
 * with a delegating tool ([tool.X] agent_profile = P) every call is a child turn of its own agent of profile
 * P, given that input, and the parent joins their deliverables (docs/roster.md). */
#include "exio.h"

#include <stdio.h>
#include <string.h>

/* Result for call id `id` from the step's tool_results, as {"id","status","output"|"error"}. */
static json_t *fanout_result_for(json_t *results, const char *id)
{
    size_t i;
    json_t *r;
    json_array_foreach(results, i, r)
    {
        const char *rid = json_string_value(json_object_get(r, "tool_call_id"));
        if (rid && strcmp(rid, id) == 0) {
            json_t *out = json_pack("{s:s,s:O?}", "id", id, "status", json_object_get(r, "status"));
            json_t *v = json_object_get(r, "output");
            if (v)
                json_object_set(out, "output", v);
            if ((v = json_object_get(r, "error")))
                json_object_set(out, "error", v);
            return out;
        }
    }
    return json_pack("{s:s,s:s}", "id", id, "status", "missing");
}

static json_t *fanout_step(json_t *req)
{
    json_t *input = json_object_get(req, "input");
    json_int_t n = (json_int_t)ex_number(input, "n", 3);
    const char *tool = json_string_value(json_object_get(input, "tool"));
    if (!tool)
        tool = "sleep";
    json_t *reply;

    if (n < 1 || n > 1000) {
        reply = ex_fail("input.n must be between 1 and 1000");
    } else if (json_integer_value(json_object_get(req, "step")) == 0) {
        json_t *calls = json_array();
        for (json_int_t i = 0; i < n; i++) {
            char id[32];
            snprintf(id, sizeof id, "f%lld", (long long)i);
            json_array_append_new(calls,
                                  ex_tool_call(id, tool,
                                               json_pack("{s:f,s:{s:I,s:I}}", "seconds", (double)i * 0.1,
                                                         "input", "part", i + 1, "of", n),
                                               0));
        }
        reply = json_pack("{s:o,s:s,s:{s:I}}", "tool_calls", calls, "wait", "all", "state", "n", n);
    } else {
        /* Results may arrive in any order; the output lists them in call order so a reader can compare runs.
         */
        json_t *results = json_object_get(req, "tool_results");
        json_t *outs = json_array();
        for (json_int_t i = 0; i < n; i++) {
            char id[32];
            snprintf(id, sizeof id, "f%lld", (long long)i);
            json_array_append_new(outs, fanout_result_for(results, id));
        }
        reply = ex_complete(json_pack("{s:s,s:o}", "tool", tool, "results", outs));
    }
    json_decref(req);
    return reply;
}

int main(void)
{
    return ex_main(fanout_step);
}
