/* Exec mode: one process of its own for each agent step or tool call (the child's plumbing is child.c). */
#include "runner.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "names.h"

struct WrkProc {
    struct WrkProc *next, *prev;
    WrkChild c;
    char label[160];
    char *input;
    size_t input_len, input_off;
    char *out;
    size_t out_len, out_cap;
    int64_t timeout_ms;
    bool oversize, timed_out, stop_requested;
    struct timespec started;
    WrkProcDone done;
    void *arg;
};

static WrkProc *procs; /* all live procs, for SIGCHLD */

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkProc *p = arg;

    if (wrk_deadline_early(p->c.deadline, &p->started, p->timeout_ms))
        return;
    log_warn("%s: time limit reached; sending SIGTERM", p->label);
    p->timed_out = true;
    wrk_child_stop(&p->c, WRK_STOP_TERM);
}

static void in_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkProc *p = arg;

    /* EPIPE: it closed stdin; what it replies decides. */
    if (wrk_pipe_write(&p->c.in_pipe, p->input, p->input_len, &p->input_off) > 0)
        return;
    wrk_pipe_close(&p->c.in_pipe, p->label);
}

/* Reads what stdout holds now, without waiting; true at its end (or on an error). */
static bool out_read(void *arg)
{
    WrkProc *p = arg;

    for (;;) {
        if (!wrk_buf_room(&p->out, p->out_len, &p->out_cap))
            return false;
        ssize_t n = read(p->c.out_pipe.fd, p->out + p->out_len, p->out_cap - p->out_len);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return false;
        if (n <= 0)
            return true;
        p->out_len += (size_t)n;
        if (p->out_len > TW_DOC_MAX && !p->oversize) {
            log_warn("%s: wrote more than %d bytes to stdout; stopping it", p->label, TW_DOC_MAX);
            p->oversize = true;
            wrk_child_stop(&p->c, WRK_STOP_TERM);
        }
        if (p->oversize)
            p->out_len = 0; /* keep reading so it never blocks, but keep nothing */
    }
}

static void proc_maybe_done(void *arg);

static void out_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkProc *p = arg;

    if (out_read(p)) {
        wrk_pipe_close(&p->c.out_pipe, p->label);
        proc_maybe_done(p);
    }
}

static void proc_free(WrkProc *p)
{
    if (p->prev)
        p->prev->next = p->next;
    else if (procs == p)
        procs = p->next;
    if (p->next)
        p->next->prev = p->prev;
    wrk_child_free(&p->c);
    free(p->input);
    free(p->out);
    free(p);
}

static void proc_maybe_done(void *arg)
{
    WrkProc *p = arg;
    WrkProcResult r = {0};

    if (!wrk_child_drained(&p->c))
        return;
    r.elapsed_sec = wrk_elapsed_sec(&p->started);
    if (p->c.stop == WRK_STOP_NONE && !p->stop_requested &&
        wrk_reply_late(p->label, r.elapsed_sec, p->timeout_ms))
        p->timed_out = true;
    wrk_stderr_end_run(&p->c.err);
    wrk_child_result(&p->c, &r, p->out, p->out_len, p->stop_requested, p->oversize, p->timed_out,
                     p->c.limits.cpu_limit_sec);
    p->done(p, &r, p->arg);
    proc_free(p);
}

bool wrk_proc_exited(pid_t pid, int status, const struct rusage *ru)
{
    for (WrkProc *p = procs; p; p = p->next) {
        if (p->c.pid != pid)
            continue;
        wrk_child_exited(&p->c, status, ru);
        wrk_child_wind_up(&p->c);
        proc_maybe_done(p);
        return true;
    }
    return false;
}

bool wrk_proc_running(pid_t pid)
{
    for (WrkProc *p = procs; p; p = p->next)
        if (p->c.pid == pid && !p->c.exited)
            return true;
    return false;
}

size_t wrk_proc_count(void)
{
    size_t n = 0;

    for (WrkProc *p = procs; p; p = p->next)
        n++;
    return n;
}

void wrk_proc_stop(WrkProc *proc, const char *why)
{
    if (proc->c.exited || proc->stop_requested)
        return;
    log_info("%s: stopping (%s)", proc->label, why);
    proc->stop_requested = true;
    wrk_child_stop(&proc->c, WRK_STOP_TERM);
}

WrkProc *wrk_proc_start(struct event_base *base, char *const argv[], char *const env_extra[],
                        const TwLimitsConf *limits, const char *input, size_t input_len, int timeout_sec,
                        int grace_sec, const char *label, WrkProcDone done, void *arg)
{
    struct timeval tv = {timeout_sec, 0};
    WrkProc *p = calloc(1, sizeof *p);
    int err;

    if (!p)
        goto fail;
    p->c.grace_sec = grace_sec;
    p->timeout_ms = (int64_t)timeout_sec * 1000;
    p->done = done;
    p->arg = arg;
    snprintf(p->label, sizeof p->label, "%s", label);
    p->c.label = p->label;
    p->c.err.label = p->label;
    p->c.out_read = out_read;
    p->c.maybe_done = proc_maybe_done;
    p->c.owner = p;
    if (!(p->input = malloc(input_len + 1)))
        goto fail;
    memcpy(p->input, input, input_len);
    p->input_len = input_len;
    clock_gettime(CLOCK_MONOTONIC, &p->started);
    if (wrk_child_spawn(&p->c, base, argv, env_extra, limits, false, in_cb, out_cb, deadline_cb) != 0)
        goto fail;
    event_add(p->c.in_pipe.ev, NULL);
    event_add(p->c.out_pipe.ev, NULL);
    event_add(p->c.err_pipe.ev, NULL);
    evtimer_add(p->c.deadline, &tv);
    p->next = procs;
    if (procs)
        procs->prev = p;
    procs = p;
    log_debug("%s: started pid=%d", p->label, (int)p->c.pid);
    return p;

fail:
    err = errno ? errno : ENOMEM;
    log_error("%s: cannot start %s: %s", label, argv[0], strerror(err));
    if (p) {
        free(p->input);
        free(p);
    }
    errno = err; /* for the step's error message: EMFILE is no bad executable */
    return NULL;
}
