/* tw-soak-tool — the tool of tools/soak: sleeps args.seconds, then answers {"call","turn","slept"} (the call
 * it ran for, so the soak's checker can tell a result that reached the wrong call), or, with args.fail, an
 * error. A TURNWATCH_TOOL_CALL_ID that differs from the document's tool_call_id is reported as an error. */
#include "exio.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void)
{
    json_t *req = ex_read_request();
    json_t *args = json_object_get(req, "args");
    const char *call = json_string_value(json_object_get(req, "tool_call_id"));
    const char *turn = json_string_value(json_object_get(req, "turn_id"));
    const char *env_call = getenv("TURNWATCH_TOOL_CALL_ID");
    json_t *reply;

    if (!call || !turn || !env_call || strcmp(env_call, call) != 0) {
        reply =
            ex_tool_error("soak_mismatch", "TURNWATCH_TOOL_CALL_ID differs from the document's tool_call_id");
    } else {
        double s = ex_number(args, "seconds", 0);
        ex_sleep_sec(s);
        if (json_is_true(json_object_get(args, "fail")))
            reply = ex_tool_error("soak_error", "this call was asked to fail");
        else
            reply = ex_tool_output(json_pack("{s:s,s:s,s:f}", "call", call, "turn", turn, "slept", s));
    }
    json_decref(req);
    return ex_reply(reply);
}
