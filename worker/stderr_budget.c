/* The stderr budget of a program: its lines to the log, up to a budget per run, and a tail for error
 * messages. */
#include "stderr_budget.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "utf8.h"

/* What one run of a program may put in the worker's log from its stderr, whichever budget runs out first: a
 * program that floods stderr (50 MB would be 100,000 log lines of up to WRK_STDERR_LINE - 1 bytes) must not
 * drown the log or hold the loop writing it. Past the budget its lines are counted, not logged, and one
 * line at the end of the run says how many were dropped; the tail kept for error messages still sees
 * everything. The byte budget binds for lines longer than 163 bytes, the line budget for shorter ones. */
#define STDERR_LOG_LINES 100
#define STDERR_LOG_BYTES (16 * 1024)
static void err_append_tail(WrkStderr *e, const char *s, size_t n)
{
    if (n >= WRK_STDERR_TAIL) {
        s += n - (WRK_STDERR_TAIL - 1);
        n = WRK_STDERR_TAIL - 1;
    }
    if (e->tail_len + n >= WRK_STDERR_TAIL) {
        size_t drop = e->tail_len + n - (WRK_STDERR_TAIL - 1);
        memmove(e->tail, e->tail + drop, e->tail_len - drop);
        e->tail_len -= drop;
    }
    memcpy(e->tail + e->tail_len, s, n);
    e->tail_len += n;
    e->tail[e->tail_len] = '\0';
}

static void err_flush_line(WrkStderr *e)
{
    if (e->line_len == 0)
        return;
    e->line[e->line_len] = '\0';
    if (e->dropped_lines == 0 && e->logged_lines < STDERR_LOG_LINES &&
        e->logged_bytes + e->line_len <= STDERR_LOG_BYTES) {
        /* Escaped here with its length: a NUL in it would otherwise end the message (the log escapes the
         * rest of the control characters of every line anyway). */
        char escaped[4 * WRK_STDERR_LINE];
        tw_text_escape(escaped, sizeof escaped, e->line, e->line_len);
        log_info("%s stderr: %s", e->label, escaped);
        e->logged_lines++;
        e->logged_bytes += e->line_len;
    } else {
        e->dropped_lines++;
        e->dropped_bytes += e->line_len;
    }
    err_append_tail(e, e->line, e->line_len);
    err_append_tail(e, "\n", 1);
    e->line_len = 0;
}

void wrk_stderr_feed(WrkStderr *e, const char *buf, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (buf[i] == '\n' || e->line_len >= WRK_STDERR_LINE - 1)
            err_flush_line(e);
        if (buf[i] != '\n')
            e->line[e->line_len++] = buf[i];
    }
}

void wrk_stderr_end_run(WrkStderr *e)
{
    err_flush_line(e);
    if (e->dropped_lines)
        log_warn(
            "%s stderr: %zu more lines (%zu bytes) dropped, not logged: the log takes at most %d lines or "
            "%d bytes of stderr per run",
            e->label, e->dropped_lines, e->dropped_bytes, STDERR_LOG_LINES, STDERR_LOG_BYTES);
    e->logged_lines = e->logged_bytes = e->dropped_lines = e->dropped_bytes = 0;
}

void wrk_stderr_clear_tail(WrkStderr *e)
{
    e->tail_len = 0;
    e->tail[0] = '\0';
}

bool wrk_stderr_read(WrkStderr *e, int fd)
{
    char buf[4096];

    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return false;
        if (n <= 0)
            return true;
        wrk_stderr_feed(e, buf, (size_t)n);
    }
}
