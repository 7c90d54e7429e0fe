/* tw-echo-tool — example tool: replies with its args unchanged. Runs in exec and serve mode. */
#include "exio.h"

static json_t *echo_call(json_t *req)
{
    json_t *args = json_object_get(req, "args");
    json_t *reply = ex_tool_output(args ? json_incref(args) : json_object());
    json_decref(req);
    return reply;
}

int main(void)
{
    return ex_main(echo_call);
}
