/* tw-echo-agent — example agent: completes at once with its input echoed back. Runs in exec and serve mode
 * (the bench's no-op agent in both). */
#include "exio.h"

static json_t *echo_step(json_t *req)
{
    json_t *input = json_object_get(req, "input");
    json_t *output = json_pack("{s:O,s:I}", "echo", input ? input : json_null(), "step",
                               json_integer_value(json_object_get(req, "step")));
    json_decref(req);
    return ex_complete(output);
}

int main(void)
{
    return ex_main(echo_step);
}
