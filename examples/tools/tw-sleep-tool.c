/* tw-sleep-tool — example tool: sleeps args.seconds (fractional allowed) and says how long. Runs in exec and
 * serve mode. */
#include "exio.h"

static json_t *sleep_call(json_t *req)
{
    json_t *secs = json_object_get(json_object_get(req, "args"), "seconds");
    json_t *reply;

    if (!json_is_number(secs) || json_number_value(secs) < 0 || json_number_value(secs) > 86400) {
        reply = ex_tool_error("bad_args", "args.seconds must be a number between 0 and 86400");
    } else {
        ex_sleep_sec(json_number_value(secs));
        reply = ex_tool_output(json_pack("{s:O}", "slept", secs));
    }
    json_decref(req);
    return reply;
}

int main(void)
{
    return ex_main(sleep_call);
}
