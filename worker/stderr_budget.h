/* The stderr budget of a program (an exec run, or one request of a serve process): its lines go to the
 * worker's log, at most STDERR_LOG_LINES lines or STDERR_LOG_BYTES bytes per run (stderr_budget.c); past the
 * budget they are counted, and one line at the end of the run says how many were dropped. The last
 * WRK_STDERR_TAIL bytes are kept for error messages whatever the budget. */
#ifndef WRK_STDERR_BUDGET_H
#define WRK_STDERR_BUDGET_H

#include <stdbool.h>
#include <stddef.h>

#define WRK_STDERR_TAIL 1024
#define WRK_STDERR_LINE 512
typedef struct WrkStderr {
    const char *label; /* prefixes the log lines; the caller's, may change between runs */
    char tail[WRK_STDERR_TAIL];
    size_t tail_len;
    char line[WRK_STDERR_LINE];
    size_t line_len;
    size_t logged_lines, logged_bytes;   /* against the budget */
    size_t dropped_lines, dropped_bytes; /* past the budget */
} WrkStderr;

/** Log the complete lines of n more bytes of stderr. */
void wrk_stderr_feed(WrkStderr *e, const char *buf, size_t n);
/** Read and feed what the non-blocking fd holds; true at EOF (or a read error): then close it. */
bool wrk_stderr_read(WrkStderr *e, int fd);
/** End of a run: log the last partial line and how many lines were dropped, then start a new budget (the
 *  tail stays until wrk_stderr_clear_tail). */
void wrk_stderr_end_run(WrkStderr *e);
void wrk_stderr_clear_tail(WrkStderr *e);

#endif
