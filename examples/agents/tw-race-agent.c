/* tw-race-agent — example agent: races several sleep calls with wait "any" and completes with the first to
 * finish. */
#include "exio.h"

#include <stdio.h>
#include <string.h>

int main(void)
{
    json_t *req = ex_read_request();
    json_t *input = json_object_get(req, "input");
    json_t *reply = NULL;

    if (json_integer_value(json_object_get(req, "step")) == 0) {
        json_t *durations = json_object_get(input, "durations");
        json_t *calls = json_array();
        if (json_is_array(durations) && json_array_size(durations) > 0) {
            size_t i;
            json_t *d;
            json_array_foreach(durations, i, d)
            {
                char id[32];
                snprintf(id, sizeof id, "r%zu", i);
                json_array_append_new(calls, ex_tool_call(id, "sleep", json_pack("{s:O}", "seconds", d), 0));
            }
        } else {
            /* The slow ones outlast the race on purpose: the turn must end without waiting for them. */
            static const double dflt[] = {2.0, 0.2, 1.0};
            for (size_t i = 0; i < sizeof dflt / sizeof dflt[0]; i++) {
                char id[32];
                snprintf(id, sizeof id, "r%zu", i);
                json_array_append_new(calls,
                                      ex_tool_call(id, "sleep", json_pack("{s:f}", "seconds", dflt[i]), 0));
            }
        }
        reply = json_pack("{s:o,s:s,s:{}}", "tool_calls", calls, "wait", "any", "state");
    } else {
        size_t i;
        json_t *r;
        json_array_foreach(json_object_get(req, "tool_results"), i, r)
        {
            const char *status = json_string_value(json_object_get(r, "status"));
            if (status && strcmp(status, "ok") == 0) {
                reply = ex_complete(json_pack("{s:{s:O?,s:O?}}", "winner", "id",
                                              json_object_get(r, "tool_call_id"), "output",
                                              json_object_get(r, "output")));
                break;
            }
        }
        if (!reply)
            reply = ex_fail("no sleep call finished ok");
    }
    json_decref(req);
    return ex_reply(reply);
}
