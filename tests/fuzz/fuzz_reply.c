/* Building a WrkProcResult from fuzz input (see fuzz_reply.h). */
#include "fuzz_reply.h"

#include <stdlib.h>
#include <string.h>

void fz_result_make(const uint8_t *data, size_t size, WrkProcResult *r)
{
    const uint8_t *rest = size > 2 ? data + 2 : data + size, *nul;
    size_t n = size > 2 ? size - 2 : 0, out_len;
    char *out, *err = NULL;

    memset(r, 0, sizeof *r);
    r->outcome = (WrkProcOutcome)((size ? data[0] & 0x7f : 0) % (WRK_PROC_LIMIT + 1));
    r->killed_hard = size && (data[0] & 0x80);
    r->exit_code = size > 1 ? data[1] : 0;
    r->term_signal = size > 1 ? data[1] : 0;
    /* A stop by a limit (child.c sets these with WRK_PROC_LIMIT): which one comes from the same bit. */
    r->limit =
        r->outcome == WRK_PROC_LIMIT ? (r->killed_hard ? "cpu_limit_seconds" : "memory_limit_mb") : NULL;
    r->limit_value = size > 1 ? data[1] : 0;
    r->maxrss_kb = (long)(size > 1 ? data[1] : 0) * 1024;
    r->cpu_sec = size > 1 ? data[1] : 0;
    nul = n ? memrchr(rest, 0, n) : NULL;
    out_len = nul ? (size_t)(nul - rest) : n;
    /* malloc(0) may return NULL; the parsers must not read output when output_len is 0 anyway. */
    out = malloc(out_len ? out_len : 1);
    if (out_len)
        memcpy(out, rest, out_len);
    if (nul) {
        size_t err_len = n - out_len - 1;
        err = malloc(err_len + 1);
        memcpy(err, nul + 1, err_len);
        err[err_len] = '\0';
    }
    r->output = out;
    r->output_len = out_len;
    r->stderr_tail = err;
    r->elapsed_sec = 1.0;
}

void fz_result_free(WrkProcResult *r)
{
    free((char *)r->output);
    free((char *)r->stderr_tail);
}
