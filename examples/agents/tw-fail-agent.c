/* tw-fail-agent — example agent: every turn fails, to show how a failed turn looks. */
#include "exio.h"

int main(void)
{
    /* The step is read anyway so the worker never sees a broken pipe on a large input. */
    json_decref(ex_read_request());
    return ex_reply(ex_fail("the fail agent always fails"));
}
