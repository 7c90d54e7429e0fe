/* tw-echo-agent — example agent: completes at once with its input echoed back. */
#include "exio.h"

int main(void)
{
    json_t *req = ex_read_request();
    json_t *input = json_object_get(req, "input");
    json_t *output = json_pack("{s:O,s:I}", "echo", input ? input : json_null(), "step",
                               json_integer_value(json_object_get(req, "step")));
    json_decref(req);
    return ex_reply(ex_complete(output));
}
