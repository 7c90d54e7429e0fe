/* tw-fail-tool — example tool: always crashes out (stderr line, exit 3), to show a failed tool result. */
#include "exio.h"

#include <stdio.h>

int main(void)
{
    json_decref(ex_read_request());
    fputs("something broke\n", stderr);
    return 3;
}
