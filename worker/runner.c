/* Child processes for agent and tool programs. */
#include "runner.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "names.h"

/* What one run of a program may put in the worker's log from its stderr, whichever budget runs out first: a
 * program that floods stderr (50 MB would be 100,000 log lines of up to WRK_STDERR_LINE - 1 bytes) must not
 * drown the log or hold the loop writing it. Past the budget its lines are counted, not logged, and one
 * line at the end of the run says how many were dropped; the tail kept for error messages still sees
 * everything. The byte budget binds for lines longer than 163 bytes, the line budget for shorter ones. */
#define STDERR_LOG_LINES 100
#define STDERR_LOG_BYTES (16 * 1024)
/* After the program exits, how long its pipes may stay open (a grandchild holding them). */
#define DRAIN_AFTER_EXIT_MS 1000

struct WrkProc {
    struct WrkProc *next, *prev;
    struct event_base *base;
    pid_t pid;
    char label[160];
    WrkPipe in_pipe, out_pipe, err_pipe;
    struct event *deadline, *grace, *drain;
    char *input;
    size_t input_len, input_off;
    char *out;
    size_t out_len, out_cap;
    WrkStderr err;
    int grace_sec;
    int64_t timeout_ms;
    int status;
    struct rusage ru;
    bool have_ru;
    TwLimitsConf limits; /* the numbers only (run_as_user is not needed after the start) */
    bool exited, stopping, killed_hard, oversize, timed_out, stop_requested;
    struct timespec started;
    WrkProcDone done;
    void *arg;
};

static WrkProc *procs; /* all live procs, for SIGCHLD */

static void proc_maybe_done(WrkProc *p);
static bool out_read(WrkProc *p);

bool wrk_pipe_watch(WrkPipe *pp, struct event_base *base, short what, event_callback_fn cb, void *arg)
{
    pp->ev = event_new(base, pp->fd, what | EV_PERSIST, cb, arg);
    return pp->ev != NULL;
}

bool wrk_pipe_intact(WrkPipe *pp, const char *label)
{
    struct stat st;

    if (pp->fd < 0)
        return false;
    bool gone = fstat(pp->fd, &st) != 0;
    if (!gone && st.st_dev == pp->dev && st.st_ino == pp->ino)
        return true;
    log_error(
        "%s: its %s pipe (descriptor %d) was closed behind the worker's back (%s): something in this "
        "process closed a descriptor twice; whatever the program wrote there is lost, and the descriptor "
        "is left to its new owner",
        label, pp->name, pp->fd, gone ? "now unused" : "now another file");
    if (pp->ev) {
        event_free(pp->ev);
        pp->ev = NULL;
    }
    pp->fd = -1;
    return false;
}

void wrk_pipe_close(WrkPipe *pp, const char *label)
{
    bool ours = wrk_pipe_intact(pp, label);

    if (pp->ev) {
        event_free(pp->ev);
        pp->ev = NULL;
    }
    if (ours)
        close(pp->fd);
    pp->fd = -1;
}

void wrk_signal_group(pid_t pid, int sig)
{
    /* The program runs in its own process group: stop what it started too. */
    if (kill(-pid, sig) != 0)
        kill(pid, sig);
}

static void signal_group(WrkProc *p, int sig)
{
    if (!p->exited)
        wrk_signal_group(p->pid, sig);
}

static void grace_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkProc *p = arg;

    if (!p->exited) {
        log_warn("%s: still running %ds after SIGTERM; sending SIGKILL", p->label, p->grace_sec);
        p->killed_hard = true;
        signal_group(p, SIGKILL);
    }
}

static void begin_stop(WrkProc *p)
{
    struct timeval tv = {p->grace_sec, 0};

    if (p->stopping || p->exited)
        return;
    p->stopping = true;
    signal_group(p, SIGTERM);
    evtimer_add(p->grace, &tv);
}

bool wrk_deadline_early(struct event *deadline, const struct timespec *started, int64_t timeout_ms)
{
    int64_t left = timeout_ms - (int64_t)(wrk_elapsed_sec(started) * 1000.0);

    if (left <= 0)
        return false;
    struct timeval tv = {(time_t)(left / 1000), (suseconds_t)((left % 1000) * 1000)};
    evtimer_add(deadline, &tv);
    return true;
}

bool wrk_reply_late(const char *label, double elapsed_sec, int64_t timeout_ms)
{
    if (elapsed_sec * 1000.0 < (double)timeout_ms)
        return false;
    log_warn("%s: its reply came after the time limit (%.3f s); counted as a timeout", label, elapsed_sec);
    return true;
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkProc *p = arg;

    if (wrk_deadline_early(p->deadline, &p->started, p->timeout_ms))
        return;
    log_warn("%s: time limit reached; sending SIGTERM", p->label);
    p->timed_out = true;
    begin_stop(p);
}

/* Read what its stdout and stderr hold now, without waiting to be told they are readable, and close those at
 * their end. */
static void take_pipes(WrkProc *p)
{
    if (wrk_pipe_intact(&p->out_pipe, p->label) && out_read(p))
        wrk_pipe_close(&p->out_pipe, p->label);
    if (wrk_pipe_intact(&p->err_pipe, p->label) && wrk_stderr_read(&p->err, p->err_pipe.fd))
        wrk_pipe_close(&p->err_pipe, p->label);
}

static void drain_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkProc *p = arg;

    /* It exited but something still holds its pipes open (a grandchild): take what they hold now and stop
     * waiting for them. */
    take_pipes(p);
    wrk_pipe_close(&p->out_pipe, p->label);
    wrk_pipe_close(&p->err_pipe, p->label);
    proc_maybe_done(p);
}

static void in_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkProc *p = arg;

    while (p->input_off < p->input_len) {
        ssize_t n = write(p->in_pipe.fd, p->input + p->input_off, p->input_len - p->input_off);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return;
            break; /* EPIPE: it closed stdin; what it replies decides */
        }
        p->input_off += (size_t)n;
    }
    wrk_pipe_close(&p->in_pipe, p->label);
}

/* Reads what stdout holds now, without waiting; true at its end (or on an error). */
static bool out_read(WrkProc *p)
{
    for (;;) {
        if (p->out_cap - p->out_len < 4096) {
            size_t cap = p->out_cap ? p->out_cap * 2 : 16384;
            char *g = realloc(p->out, cap + 1);
            if (!g)
                return false;
            p->out = g;
            p->out_cap = cap;
        }
        ssize_t n = read(p->out_pipe.fd, p->out + p->out_len, p->out_cap - p->out_len);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return false;
        if (n <= 0)
            return true;
        p->out_len += (size_t)n;
        if (p->out_len > TW_DOC_MAX && !p->oversize) {
            log_warn("%s: wrote more than %d bytes to stdout; stopping it", p->label, TW_DOC_MAX);
            p->oversize = true;
            begin_stop(p);
        }
        if (p->oversize)
            p->out_len = 0; /* keep reading so it never blocks, but keep nothing */
    }
}

static void out_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkProc *p = arg;

    if (out_read(p)) {
        wrk_pipe_close(&p->out_pipe, p->label);
        proc_maybe_done(p);
    }
}

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
        log_info("%s stderr: %s", e->label, e->line);
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

static void err_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkProc *p = arg;

    if (wrk_stderr_read(&p->err, p->err_pipe.fd)) {
        wrk_pipe_close(&p->err_pipe, p->label);
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
    wrk_pipe_close(&p->in_pipe, p->label);
    wrk_pipe_close(&p->out_pipe, p->label);
    wrk_pipe_close(&p->err_pipe, p->label);
    if (p->deadline)
        event_free(p->deadline);
    if (p->grace)
        event_free(p->grace);
    if (p->drain)
        event_free(p->drain);
    free(p->input);
    free(p->out);
    free(p);
}

static void proc_maybe_done(WrkProc *p)
{
    WrkProcResult r = {0};

    if (!p->exited || p->out_pipe.fd >= 0 || p->err_pipe.fd >= 0)
        return;
    r.elapsed_sec = wrk_elapsed_sec(&p->started);
    if (!p->stopping && !p->stop_requested && wrk_reply_late(p->label, r.elapsed_sec, p->timeout_ms))
        p->timed_out = true;
    wrk_stderr_end_run(&p->err);
    r.killed_hard = p->killed_hard;
    r.stderr_tail = p->err.tail;
    if (p->out)
        p->out[p->out_len] = '\0';
    r.output = p->out ? p->out : "";
    r.output_len = p->out_len;
    wrk_result_outcome(&r, p->stop_requested, p->oversize, p->timed_out, p->status,
                       p->have_ru ? &p->ru : NULL, &p->limits, p->limits.cpu_limit_sec);
    p->done(p, &r, p->arg);
    proc_free(p);
}

/* Whether a program that ended on its own was stopped by a limit, or ended badly at its memory limit. */
static bool limit_hit(WrkProcResult *r, int status, const struct rusage *ru, const TwLimitsConf *l,
                      long cpu_window)
{
    bool signaled = WIFSIGNALED(status), bad = signaled || WEXITSTATUS(status) != 0;

    if (!l || !bad)
        return false;
    if (l->cpu_limit_sec > 0 && signaled &&
        (WTERMSIG(status) == SIGXCPU ||
         (WTERMSIG(status) == SIGKILL && ru && r->cpu_sec >= (double)cpu_window))) {
        r->limit = "cpu_limit_seconds";
        r->limit_value = l->cpu_limit_sec;
        return true;
    }
    if (l->memory_limit_mb > 0 && ru &&
        r->maxrss_kb * 100 >= (long)l->memory_limit_mb * 1024 * WRK_MEMORY_LIMIT_PERCENT) {
        r->limit = "memory_limit_mb";
        r->limit_value = l->memory_limit_mb;
        return true;
    }
    return false;
}

void wrk_result_outcome(WrkProcResult *r, bool stopped, bool oversize, bool timed_out, int status,
                        const struct rusage *ru, const TwLimitsConf *limits, long cpu_window)
{
    if (ru) {
        r->cpu_sec = (double)(ru->ru_utime.tv_sec + ru->ru_stime.tv_sec) +
                     (double)(ru->ru_utime.tv_usec + ru->ru_stime.tv_usec) / 1e6;
        r->maxrss_kb = ru->ru_maxrss;
    }
    if (stopped) {
        r->outcome = WRK_PROC_STOPPED;
    } else if (oversize) {
        r->outcome = WRK_PROC_OVERSIZE;
    } else if (timed_out) {
        r->outcome = WRK_PROC_TIMEOUT;
    } else if (limit_hit(r, status, ru, limits, cpu_window)) {
        r->outcome = WRK_PROC_LIMIT;
        r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
        r->term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    } else if (WIFSIGNALED(status)) {
        r->outcome = WRK_PROC_SIGNAL;
        r->term_signal = WTERMSIG(status);
    } else if (WEXITSTATUS(status) == 0) {
        r->outcome = WRK_PROC_OK;
    } else {
        r->outcome = WRK_PROC_EXIT;
        r->exit_code = WEXITSTATUS(status);
    }
}

double wrk_elapsed_sec(const struct timespec *t0)
{
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) / 1e9;
}

bool wrk_proc_exited(pid_t pid, int status, const struct rusage *ru)
{
    for (WrkProc *p = procs; p; p = p->next) {
        if (p->pid != pid)
            continue;
        struct timeval tv = {0, DRAIN_AFTER_EXIT_MS * 1000};
        p->exited = true;
        p->status = status;
        if (ru) {
            p->ru = *ru;
            p->have_ru = true;
        }
        evtimer_del(p->deadline);
        evtimer_del(p->grace);
        wrk_pipe_close(&p->in_pipe, p->label);
        evtimer_add(p->drain, &tv);
        /* What it wrote before exiting is in its pipes now: take it here rather than trust their events alone
         * (see WrkPipe). */
        take_pipes(p);
        proc_maybe_done(p);
        return true;
    }
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
    if (proc->exited || proc->stop_requested)
        return;
    log_info("%s: stopping (%s)", proc->label, why);
    proc->stop_requested = true;
    begin_stop(proc);
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
    p->base = base;
    p->grace_sec = grace_sec;
    p->timeout_ms = (int64_t)timeout_sec * 1000;
    p->done = done;
    p->arg = arg;
    snprintf(p->label, sizeof p->label, "%s", label);
    p->err.label = p->label;
    if (!(p->input = malloc(input_len + 1)))
        goto fail;
    memcpy(p->input, input, input_len);
    p->input_len = input_len;
    clock_gettime(CLOCK_MONOTONIC, &p->started);
    if (limits) {
        p->limits = *limits;
        p->limits.run_as_user = NULL;
    }
    if (wrk_spawn(argv, env_extra, limits, false, &p->pid, &p->in_pipe, &p->out_pipe, &p->err_pipe) != 0)
        goto fail;
    wrk_pipe_watch(&p->in_pipe, base, EV_WRITE, in_cb, p);
    wrk_pipe_watch(&p->out_pipe, base, EV_READ, out_cb, p);
    wrk_pipe_watch(&p->err_pipe, base, EV_READ, err_cb, p);
    p->deadline = evtimer_new(base, deadline_cb, p);
    p->grace = evtimer_new(base, grace_cb, p);
    p->drain = evtimer_new(base, drain_cb, p);
    event_add(p->in_pipe.ev, NULL);
    event_add(p->out_pipe.ev, NULL);
    event_add(p->err_pipe.ev, NULL);
    evtimer_add(p->deadline, &tv);
    p->next = procs;
    if (procs)
        procs->prev = p;
    procs = p;
    log_debug("%s: started pid=%d", p->label, (int)p->pid);
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
