/* tw-echo-tool — example tool: replies with its args unchanged. */
#include "exio.h"

int main(void)
{
    json_t *req = ex_read_request();
    json_t *args = json_object_get(req, "args");
    json_t *reply = ex_tool_output(args ? json_incref(args) : json_object());
    json_decref(req);
    return ex_reply(reply);
}
