/* tw-garbage-tool — example tool: answers with text that is not JSON, to show how a malformed reply is
 * reported. */
#include "exio.h"

#include <stdio.h>

int main(void)
{
    json_decref(ex_read_request());
    fputs("this is not json\n", stdout);
    return 0;
}
