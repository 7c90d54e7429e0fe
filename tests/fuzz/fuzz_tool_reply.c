/* Fuzz target tool-reply: wrk_tool_outcome on any exit, stdout and stderr a tool program can produce. The
 * result goes to tw.deliver_result as JSON, so it must always be one well-formed, valid-UTF-8 object. */
#include <stdint.h>
#include <string.h>

#include "fuzz_check.h"
#include "fuzz_reply.h"
#include "names.h"
#include "steps.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    WrkProcResult r;
    json_t *o;
    const char *status;

    fz_result_make(data, size, &r);
    o = wrk_tool_outcome(30, &r);
    fz_check(json_is_object(o), "the result is not a JSON object");
    fz_check_json(o);
    status = fz_check_string(o, "status");
    fz_check(json_object_size(o) == 2, "the result has other keys");
    if (strcmp(status, "ok") == 0) {
        fz_check(r.outcome == WRK_PROC_OK, "ok from a program that failed");
        fz_check(json_object_get(o, "output") != NULL, "ok without output");
    } else {
        json_t *e = json_object_get(o, "error");
        fz_check(strcmp(status, "error") == 0 || strcmp(status, "timeout") == 0,
                 "status not ok|error|timeout");
        fz_check((strcmp(status, "timeout") == 0) == (r.outcome == WRK_PROC_TIMEOUT),
                 "timeout iff it timed out");
        fz_check(tw_ident_valid(fz_check_string(e, "code")), "error.code is not an identifier");
        fz_check_string(e, "message");
    }
    json_decref(o);
    fz_result_free(&r);
    return 0;
}
