/* A program's result (worker/runner.h) made from fuzz input, for the agent-reply and tool-reply targets. */
#ifndef FZ_REPLY_H
#define FZ_REPLY_H

#include <stddef.h>
#include <stdint.h>

#include "runner.h"

/** Byte 0 picks the outcome (and killed_hard), byte 1 the exit status or signal; the rest is stdout up
 *  to its last NUL byte and the stderr tail after it (no NUL: all stdout, stderr_tail NULL). The
 *  buffers are exactly as long as the data, so ASan sees any read past them; free with fz_result_free. */
void fz_result_make(const uint8_t *data, size_t size, WrkProcResult *r);
void fz_result_free(WrkProcResult *r);

#endif
