/* Serve mode: pools of long-lived programs, one JSON line per request. */
#include "serve.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "names.h"

/* After the program exits, how long its pipes may stay open (a grandchild holding them). */
#define DRAIN_AFTER_EXIT_MS 1000

/* A process's life:
 *   IDLE     --wrk_serve_call-->                 BUSY (take_idle first makes sure it has not exited, written
 *                                                anything or closed a pipe since its last reply)
 *   BUSY     --reply line-->                     IDLE, or RETIRING (max_requests, a bad or extra line,
 *                                                more processes than slots)
 *   BUSY     --time limit, cancel, > 1 MiB-->    BUSY and stopping: SIGTERM, SIGKILL after the grace; the
 *                                                request ends when the process has exited
 *   BUSY     --exit, output, EOF on stdout or    RETIRING, and the request goes to a new process (pass_on),
 *              EPIPE on stdin before it read a   when the process had served a request before: it ended
 *              byte of the request-->            between requests, the request is not its
 *   IDLE     --exit, output, EOF on stdout-->    RETIRING
 *   RETIRING --EOF on stdin; after the grace SIGTERM, after another SIGKILL--> freed once exited and drained
 * Whatever the state, a process is freed only after it has exited and its pipes are drained, and a request
 * ends only then too unless its reply line came first: a late reply of a stopped request is discarded with
 * its process.
 *
 * Between a reply and the next request the process may be on its way out (it exits, or writes a stray line,
 * right after its reply) while the worker, the reply applied, already hands it the next request. take_idle
 * looks at an idle process before choosing it, and in_cb again before the request's first byte goes; what is
 * still in flight after that is told apart by its stdin pipe: a correct program reads the whole request (the
 * pipe is empty, FIONREAD) before it writes a byte of the reply, so a process that exits, closes a pipe or
 * writes while all of the request it was given still sits unread in its stdin did so between requests. A new
 * process then serves the request (pass_on); one that was new already fails it as exec mode would, so a
 * request is passed on once at most. What cannot be told: a stray line written after the request was, by a
 * process that then reads the request before the worker has seen the line. That line is taken as the reply,
 * and the process, out of step, is replaced when its next line comes. */
typedef enum { SRV_IDLE, SRV_BUSY, SRV_RETIRING } SrvState;

/* How far a stop has gone; each grace period moves it one further. */
typedef enum { STOP_NONE, STOP_EOF, STOP_TERM, STOP_KILL } SrvStop;

struct WrkServeProc {
    struct WrkServeProc *next, *prev;
    WrkServe *s;
    char *key; /* kind, grace, max_requests and exec line: which requests it may serve */
    pid_t pid;
    SrvState state;
    SrvStop stop;
    bool exited, killed_hard;
    int status;
    struct rusage ru;
    bool have_ru;
    TwLimitsConf limits; /* the numbers (run_as_user is needed at the start only) */
    long cpu_window;     /* the CPU seconds its RLIMIT_CPU allows now, moved for each request */
    int grace_sec, max_requests, served;
    uint64_t last_used;
    char name[64]; /* "agent serve pid=N" */
    WrkPipe in_pipe, out_pipe, err_pipe;
    struct event *deadline, *grace, *drain;
    size_t woff; /* how much of the request line is written */
    char *rbuf;  /* stdout since the request began */
    size_t rlen, rcap;
    WrkStderr err;
    /* The request being served (BUSY), until its done runs. */
    WrkServeReq *req;
    char label[160]; /* its label */
    bool timed_out, oversize, cancelled;
};

/* A request, apart from the process that serves it, which may change once (pass_on). */
struct WrkServeReq {
    WrkServeProc *p;
    WrkServeProgram prog; /* the caller's strings and argv, which outlive the request */
    char *key;
    char *line; /* the document and its newline */
    size_t len;
    char label[160];
    struct timespec started;
    int64_t timeout_ms;
    WrkServeDone done;
    void *arg;
};

struct WrkServe {
    struct event_base *base;
    int max_procs;
    bool stopping;
    uint64_t clock; /* for least recently used */
    WrkServeProc *head;
};

static void proc_maybe_done(WrkServeProc *p);
static void pass_on(WrkServeProc *p, const char *why);
static bool out_read(WrkServeProc *p);
static void out_closed(WrkServeProc *p);

static void req_free(WrkServeReq *q)
{
    if (!q)
        return;
    free(q->key);
    free(q->line);
    free(q);
}

WrkServe *wrk_serve_new(struct event_base *base, int max_procs)
{
    WrkServe *s = calloc(1, sizeof *s);

    if (!s)
        return NULL;
    s->base = base;
    s->max_procs = max_procs;
    return s;
}

static void proc_free(WrkServeProc *p)
{
    WrkServe *s = p->s;

    if (p->prev)
        p->prev->next = p->next;
    else if (s->head == p)
        s->head = p->next;
    if (p->next)
        p->next->prev = p->prev;
    wrk_pipe_close(&p->in_pipe, p->name);
    wrk_pipe_close(&p->out_pipe, p->name);
    wrk_pipe_close(&p->err_pipe, p->name);
    struct event *timers[] = {p->deadline, p->grace, p->drain};
    for (size_t i = 0; i < 3; i++)
        if (timers[i])
            event_free(timers[i]);
    req_free(p->req); /* at teardown only: a request otherwise ends, or moves, before its process goes */
    free(p->rbuf);
    free(p->key);
    free(p);
}

void wrk_serve_free(WrkServe *s)
{
    if (!s)
        return;
    while (s->head) {
        if (!s->head->exited)
            wrk_signal_group(s->head->pid, SIGKILL);
        proc_free(s->head);
    }
    free(s);
}

/* One step further towards the end: EOF on stdin (a polite program exits), SIGTERM, SIGKILL. */
static void stop_to(WrkServeProc *p, SrvStop to)
{
    struct timeval tv = {p->grace_sec, 0};

    if (p->exited || to <= p->stop)
        return;
    p->stop = to;
    wrk_pipe_close(&p->in_pipe, p->name);
    if (to == STOP_TERM)
        wrk_signal_group(p->pid, SIGTERM);
    if (to == STOP_KILL) {
        log_warn("%s: still running %ds after SIGTERM; sending SIGKILL", p->name, p->grace_sec);
        p->killed_hard = true;
        wrk_signal_group(p->pid, SIGKILL);
        return;
    }
    evtimer_add(p->grace, &tv);
}

static void grace_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkServeProc *p = arg;

    stop_to(p, (SrvStop)(p->stop + 1));
}

/* Replace it: it serves no more requests. polite: EOF first (it did nothing wrong). */
static void retire(WrkServeProc *p, bool polite, const char *why)
{
    if (p->state == SRV_RETIRING)
        return;
    log_info("%s: replaced after %d request(s): %s", p->name, p->served, why);
    p->state = SRV_RETIRING;
    stop_to(p, polite ? STOP_EOF : STOP_TERM);
}

static size_t live_procs(const WrkServe *s)
{
    size_t n = 0;

    for (const WrkServeProc *p = s->head; p; p = p->next)
        n += p->state != SRV_RETIRING;
    return n;
}

/* Bytes written to its stdin that it has not read (0 when that cannot be told). */
static size_t stdin_unread(WrkServeProc *p)
{
    int n = 0;

    if (!wrk_pipe_intact(&p->in_pipe, p->name) || ioctl(p->in_pipe.fd, FIONREAD, &n) != 0 || n < 0)
        return 0;
    return (size_t)n;
}

/* It was given a request but has read none of it, and wrote nothing since: whatever it does now (exit, close
 * a pipe, write) it did between requests. Only a process that served a request before: a new one that fails
 * before reading its first request fails that request, as exec mode would. */
static bool not_started(WrkServeProc *p)
{
    if (p->state != SRV_BUSY || !p->req || p->served == 0 || p->stop != STOP_NONE || p->rlen > 0)
        return false;
    return p->woff == 0 || stdin_unread(p) >= p->woff;
}

/* The reply line came: the request ends well (for the process), whatever the job makes of it. */
static void reply_line(WrkServeProc *p, size_t line_len, bool extra)
{
    WrkProcResult r = {.outcome = WRK_PROC_OK, .output = p->rbuf, .output_len = line_len};
    WrkServeReq *q = p->req;
    bool usable;

    evtimer_del(p->deadline);
    if (p->in_pipe.ev)
        event_del(p->in_pipe.ev); /* a reply came, so the request was read: whatever is left unwritten goes */
    /* A reply before all of the request was read: out of step (what is left would start the next request). */
    extra = extra || p->woff < q->len || stdin_unread(p) > 0;
    p->rbuf[line_len] = '\0';
    r.stderr_tail = p->err.tail;
    r.elapsed_sec = wrk_elapsed_sec(&q->started);
    /* Late, as if the deadline had stopped it first; the process answered, so it may serve again. */
    if (wrk_reply_late(p->label, r.elapsed_sec, q->timeout_ms))
        r.outcome = WRK_PROC_TIMEOUT;
    wrk_stderr_end_run(&p->err);
    p->err.label = p->name;
    p->served++;
    p->req = NULL;
    p->state = SRV_RETIRING; /* neither idle nor busy while the job reads the reply */
    usable = q->done(&r, q->arg);
    req_free(q);
    p->rlen = 0;
    p->state = SRV_BUSY;
    if (!usable)
        retire(p, false, "its reply was not a valid reply object");
    else if (extra)
        retire(p, false, "it wrote more than one line for one request, or replied before reading all of it");
    else if (p->served >= p->max_requests)
        retire(p, true, "max_requests reached");
    else if (p->s->stopping)
        retire(p, true, "the worker is stopping");
    else if (p->exited)
        p->state = SRV_RETIRING; /* it replied, then exited: freed once its pipes are drained */
    else if (live_procs(p->s) > (size_t)p->s->max_procs)
        retire(p, true, "more serve processes than slots");
    else {
        p->state = SRV_IDLE;
        p->last_used = ++p->s->clock;
    }
}

static void in_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkServeProc *p = arg;
    WrkServeReq *q = p->req;

    if (q && p->woff == 0 && p->served > 0) {
        /* A last look before the first byte goes: whatever it wrote or closed by now, it did between
         * requests. */
        if (wrk_pipe_intact(&p->out_pipe, p->name) && out_read(p))
            out_closed(p);
        if (p->req != q)
            return; /* passed on, and its stdin is closed */
    }
    while (q && p->woff < q->len) {
        ssize_t n = write(p->in_pipe.fd, q->line + p->woff, q->len - p->woff);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return;
            /* EPIPE: it closed stdin; it is on its way out. Before it read any of the request, the request
             * goes to a new process; else its end decides. */
            if (not_started(p)) {
                pass_on(p, "it closed its stdin");
                return; /* its stdin is closed now */
            }
            break;
        }
        p->woff += (size_t)n;
    }
    event_del(p->in_pipe.ev);
}

/* Reads what stdout holds now, without waiting, handing a reply line on; true at its end (or on an error). */
static bool out_read(WrkServeProc *p)
{
    for (;;) {
        if (p->rcap - p->rlen < 4096) {
            size_t cap = p->rcap ? p->rcap * 2 : 16384;
            char *g = realloc(p->rbuf, cap + 1);
            if (!g)
                return false;
            p->rbuf = g;
            p->rcap = cap;
        }
        size_t scan = p->rlen;
        ssize_t n = read(p->out_pipe.fd, p->rbuf + p->rlen, p->rcap - p->rlen);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return false;
        if (n <= 0)
            return true;
        if (not_started(p)) {
            /* Written before it read the request: it answers nothing. */
            pass_on(p, "it wrote on stdout between requests");
            continue;
        }
        p->rlen += (size_t)n;
        if (p->state != SRV_BUSY || p->req == NULL || p->stop != STOP_NONE) {
            /* Nobody asked (idle), or too late: the request was stopped and its reply, if this is one, goes
             * with the process. */
            if (p->state == SRV_IDLE)
                retire(p, false, "it wrote on stdout between requests");
            p->rlen = 0;
            continue;
        }
        char *nl = memchr(p->rbuf + scan, '\n', p->rlen - scan);
        if (nl && (size_t)(nl - p->rbuf) + 1 > TW_DOC_MAX)
            nl = NULL; /* over the limit with its newline, as exec mode counts: no reply */
        if (nl) {
            size_t line_len = (size_t)(nl - p->rbuf);
            /* Anything after the line: out of step (so is a reply before the whole request was read). */
            reply_line(p, line_len, p->rlen > line_len + 1);
            return false; /* the process may be retiring now; later bytes are read by the next callback */
        }
        if (p->rlen > TW_DOC_MAX) {
            log_warn("%s: wrote a line of more than %d bytes; stopping it", p->label, TW_DOC_MAX);
            p->oversize = true;
            p->rlen = 0;
            stop_to(p, STOP_TERM);
        }
    }
}

/* EOF on its stdout: it can never answer again. */
static void out_closed(WrkServeProc *p)
{
    wrk_pipe_close(&p->out_pipe, p->name);
    if (not_started(p))
        pass_on(p, "it closed its stdout");
    else if (p->state == SRV_IDLE)
        retire(p, true, "it closed its stdout");
}

static void out_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkServeProc *p = arg;

    if (out_read(p)) {
        out_closed(p);
        proc_maybe_done(p);
    }
}

static void err_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkServeProc *p = arg;

    if (wrk_stderr_read(&p->err, p->err_pipe.fd)) {
        wrk_pipe_close(&p->err_pipe, p->name);
        proc_maybe_done(p);
    }
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkServeProc *p = arg;

    if (!p->req || wrk_deadline_early(p->deadline, &p->req->started, p->req->timeout_ms))
        return;
    log_warn("%s: time limit reached; sending SIGTERM to serve pid=%d", p->label, (int)p->pid);
    p->timed_out = true;
    stop_to(p, STOP_TERM);
}

/* Read what its stdout and stderr hold now, without waiting to be told they are readable, and close those at
 * their end. */
static void take_pipes(WrkServeProc *p)
{
    if (wrk_pipe_intact(&p->out_pipe, p->name) && out_read(p))
        wrk_pipe_close(&p->out_pipe, p->name);
    if (wrk_pipe_intact(&p->err_pipe, p->name) && wrk_stderr_read(&p->err, p->err_pipe.fd))
        wrk_pipe_close(&p->err_pipe, p->name);
}

static void drain_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkServeProc *p = arg;

    /* It exited but something still holds its pipes open (a grandchild): take what they hold now and stop
     * waiting for them. */
    take_pipes(p);
    wrk_pipe_close(&p->out_pipe, p->name);
    wrk_pipe_close(&p->err_pipe, p->name);
    proc_maybe_done(p);
}

/* It has exited and its pipes are drained: end the request it was serving, as exec mode would, and free it.
 */
static void proc_maybe_done(WrkServeProc *p)
{
    WrkProcResult r = {0};
    WrkServeReq *q = p->req;

    if (!p->exited || p->out_pipe.fd >= 0 || p->err_pipe.fd >= 0)
        return;
    wrk_stderr_end_run(&p->err);
    if (p->state == SRV_BUSY && q) {
        r.elapsed_sec = wrk_elapsed_sec(&q->started);
        r.killed_hard = p->killed_hard;
        r.stderr_tail = p->err.tail;
        if (p->rbuf)
            p->rbuf[p->rlen] = '\0';
        r.output = p->rbuf ? p->rbuf : "";
        r.output_len = p->rlen;
        /* Exited 0 without a reply line: OK with what it wrote, which steps.c finds is no reply. */
        wrk_result_outcome(&r, p->cancelled, p->oversize, p->timed_out, p->status, p->have_ru ? &p->ru : NULL,
                           &p->limits, p->cpu_window);
        log_info("%s: serve pid=%d ended after %d request(s) while serving this one", p->label, (int)p->pid,
                 p->served);
        p->req = NULL;
        q->done(&r, q->arg);
        req_free(q);
    } else if (p->state != SRV_RETIRING) {
        log_info("%s: exited between requests (status 0x%x) after %d request(s); the next request starts a "
                 "new one",
                 p->name, (unsigned)p->status, p->served);
    } else {
        log_debug("%s: exited", p->name);
    }
    proc_free(p);
}

static void proc_exited(WrkServeProc *p, int status, const struct rusage *ru)
{
    struct timeval tv = {0, DRAIN_AFTER_EXIT_MS * 1000};

    p->exited = true;
    p->status = status;
    if (ru) {
        p->ru = *ru;
        p->have_ru = true;
    }
    if (not_started(p)) /* before its stdin is closed: what it holds unread tells */
        pass_on(p, "it exited");
    if (p->state == SRV_IDLE)
        p->state = SRV_RETIRING;
    evtimer_del(p->deadline);
    evtimer_del(p->grace);
    wrk_pipe_close(&p->in_pipe, p->name);
    evtimer_add(p->drain, &tv);
    /* What it wrote before exiting is in its pipes now: take it here rather than trust their events alone
     * (see WrkPipe in runner.h). */
    take_pipes(p);
    proc_maybe_done(p);
}

/* Nothing came from an idle process since its last reply, and it can still take a request: what its stdout
 * holds now is read here rather than when the loop reports it (a stray byte, EOF), and a stdin with no reader
 * left shows as an error. */
static bool idle_sound(WrkServeProc *p)
{
    struct pollfd in = {.fd = p->in_pipe.fd, .events = POLLOUT};

    if (wrk_pipe_intact(&p->out_pipe, p->name) && out_read(p))
        out_closed(p);
    if (p->state != SRV_IDLE)
        return false;
    if (p->out_pipe.fd < 0) {
        retire(p, true, "it closed its stdout");
    } else if (!wrk_pipe_intact(&p->in_pipe, p->name) ||
               (poll(&in, 1, 0) == 1 && (in.revents & (POLLERR | POLLHUP | POLLNVAL)))) {
        retire(p, true, "it closed its stdin");
    }
    return p->state == SRV_IDLE;
}

bool wrk_serve_exited(WrkServe *s, pid_t pid, int status, const struct rusage *ru)
{
    for (WrkServeProc *p = s->head; p; p = p->next) {
        if (p->pid == pid && !p->exited) {
            proc_exited(p, status, ru);
            return true;
        }
    }
    return false;
}

static WrkServeProc *proc_start(WrkServe *s, const WrkServeProgram *prog, const char *key)
{
    static char mode_env[] = "TURNWATCH_MODE=serve";
    char *env[] = {mode_env, NULL};
    WrkServeProc *p = calloc(1, sizeof *p);

    if (!p)
        return NULL;
    p->s = s;
    p->grace_sec = prog->grace_sec;
    p->max_requests = prog->max_requests;
    if (prog->limits) {
        p->limits = *prog->limits;
        p->limits.run_as_user = NULL;
    }
    p->cpu_window = p->limits.cpu_limit_sec;
    if (!(p->key = strdup(key)) || wrk_spawn(prog->argv, env, prog->limits, true, &p->pid, &p->in_pipe,
                                             &p->out_pipe, &p->err_pipe) != 0) {
        int err = errno;
        log_error("%s serve: cannot start %s: %s", prog->kind, prog->exec, strerror(err));
        free(p->key);
        free(p);
        errno = err; /* for the step's error message (wrk_serve_call) */
        return NULL;
    }
    snprintf(p->name, sizeof p->name, "%s serve pid=%d", prog->kind, (int)p->pid);
    p->err.label = p->name;
    wrk_pipe_watch(&p->in_pipe, s->base, EV_WRITE, in_cb, p);
    wrk_pipe_watch(&p->out_pipe, s->base, EV_READ, out_cb, p);
    wrk_pipe_watch(&p->err_pipe, s->base, EV_READ, err_cb, p);
    p->deadline = evtimer_new(s->base, deadline_cb, p);
    p->grace = evtimer_new(s->base, grace_cb, p);
    p->drain = evtimer_new(s->base, drain_cb, p);
    p->next = s->head;
    if (s->head)
        s->head->prev = p;
    s->head = p;
    if (!p->in_pipe.ev || !p->out_pipe.ev || !p->err_pipe.ev || !p->deadline || !p->grace || !p->drain) {
        log_error("%s: out of memory", p->name);
        wrk_signal_group(p->pid, SIGKILL);
        while (waitpid(p->pid, NULL, 0) < 0 && errno == EINTR)
            ; /* SIGKILL: at once */
        proc_free(p);
        return NULL;
    }
    event_add(p->out_pipe.ev, NULL);
    event_add(p->err_pipe.ev, NULL);
    log_info("%s: started (%s)", p->name, prog->exec);
    return p;
}

/* An idle process of this program, making sure it has not died unnoticed meanwhile. */
static WrkServeProc *take_idle(WrkServe *s, const char *key)
{
    for (WrkServeProc *p = s->head, *next; p; p = next) {
        int status;
        struct rusage ru;
        next = p->next;
        if (p->state != SRV_IDLE || p->exited || strcmp(p->key, key) != 0)
            continue;
        if (wait4(p->pid, &status, WNOHANG, &ru) == p->pid) {
            proc_exited(p, status, &ru);
            continue;
        }
        if (idle_sound(p))
            return p;
    }
    return NULL;
}

/* Room for one more: the least recently used idle process of another program makes way. */
static void make_room(WrkServe *s)
{
    WrkServeProc *lru = NULL;

    if (live_procs(s) < (size_t)s->max_procs)
        return;
    for (WrkServeProc *p = s->head; p; p = p->next)
        if (p->state == SRV_IDLE && (!lru || p->last_used < lru->last_used))
            lru = p;
    if (lru)
        retire(lru, true, "its slot is needed by another program");
}

/* p (idle, or new) serves q now. The time limit runs from the request's start, not from this process's. */
static void proc_take(WrkServeProc *p, WrkServeReq *q)
{
    int64_t left = q->timeout_ms - (int64_t)(wrk_elapsed_sec(&q->started) * 1000.0);
    struct timeval tv;

    if (left < 0)
        left = 0;
    tv = (struct timeval){(time_t)(left / 1000), (suseconds_t)((left % 1000) * 1000)};
    q->p = p;
    p->req = q;
    p->woff = 0;
    p->rlen = 0;
    p->state = SRV_BUSY;
    p->timed_out = p->oversize = p->cancelled = false;
    snprintf(p->label, sizeof p->label, "%s", q->label);
    /* Its CPU limit is per request: from what it has used so far. */
    if (p->limits.cpu_limit_sec > 0 && p->served > 0) {
        long w = wrk_cpu_window(p->pid, p->limits.cpu_limit_sec);
        if (w < 0)
            log_warn("%s: cannot move the CPU limit of serve pid=%d: %s", q->label, (int)p->pid,
                     strerror(errno));
        else
            p->cpu_window = w;
    }
    wrk_stderr_clear_tail(&p->err);
    p->err.label = p->label;
    event_add(p->in_pipe.ev, NULL);
    evtimer_add(p->deadline, &tv);
    log_debug("%s: sent to serve pid=%d (request %d)", q->label, (int)p->pid, p->served + 1);
}

/* An idle process of q's program, or a new one; NULL when none could be started. */
static WrkServeProc *proc_for(WrkServe *s, WrkServeReq *q)
{
    WrkServeProc *p = take_idle(s, q->key);

    if (!p) {
        make_room(s);
        p = proc_start(s, &q->prog, q->key);
    }
    return p;
}

/* p was given its request but did not read any of it: it exited, closed a pipe or wrote between requests.
 * It serves no more, and a new process serves the request (one that cannot start fails it as in exec mode).
 */
static void pass_on(WrkServeProc *p, const char *why)
{
    WrkServeReq *q = p->req;
    WrkServeProc *np;

    p->req = NULL;
    evtimer_del(p->deadline);
    if (p->in_pipe.ev)
        event_del(p->in_pipe.ev);
    p->rlen = 0;
    p->err.label = p->name;
    log_info("%s: serve pid=%d did not read this request (%s after %d request(s)); a new process serves it",
             q->label, (int)p->pid, why, p->served);
    retire(p, false, why); /* nothing more to stop when it has exited */
    make_room(p->s);
    if ((np = proc_start(p->s, &q->prog, q->key))) {
        proc_take(np, q);
        return;
    }
    WrkProcResult r = {.outcome = WRK_PROC_SPAWN, .stderr_tail = "", .output = "", .spawn_errno = errno};
    r.elapsed_sec = wrk_elapsed_sec(&q->started);
    q->done(&r, q->arg);
    req_free(q);
}

WrkServeReq *wrk_serve_call(WrkServe *s, const WrkServeProgram *prog, const char *doc, size_t len,
                            int timeout_sec, const char *label, WrkServeDone done, void *arg)
{
    WrkServeReq *q = calloc(1, sizeof *q);
    WrkServeProc *p;

    if (!q)
        return NULL;
    /* Processes are shared by the same program with the same limits only. */
    const TwLimitsConf *l = prog->limits;
    if (asprintf(&q->key, "%s %d %d %d %d %d %d %s %s", prog->kind, prog->grace_sec, prog->max_requests,
                 l ? l->memory_limit_mb : 0, l ? l->cpu_limit_sec : 0, l ? l->max_open_files : 0,
                 l ? l->max_processes : 0, l && l->run_as_user ? l->run_as_user : "", prog->exec) < 0)
        q->key = NULL;
    if (!q->key || !(q->line = malloc(len + 1))) {
        req_free(q);
        return NULL;
    }
    memcpy(q->line, doc, len);
    q->line[len] = '\n';
    q->len = len + 1;
    q->prog = *prog;
    q->done = done;
    q->arg = arg;
    snprintf(q->label, sizeof q->label, "%s", label);
    clock_gettime(CLOCK_MONOTONIC, &q->started);
    q->timeout_ms = (int64_t)timeout_sec * 1000;
    if (!(p = proc_for(s, q))) {
        int err = errno;
        req_free(q);
        errno = err; /* for the step's error message */
        return NULL;
    }
    proc_take(p, q);
    return q;
}

void wrk_serve_cancel(WrkServeReq *q, const char *why)
{
    WrkServeProc *p = q->p;

    if (p->state != SRV_BUSY || p->req != q || p->cancelled)
        return;
    log_info("%s: stopping serve pid=%d (%s)", p->label, (int)p->pid, why);
    p->cancelled = true;
    stop_to(p, STOP_TERM);
}

void wrk_serve_stop_idle(WrkServe *s)
{
    s->stopping = true;
    for (WrkServeProc *p = s->head; p; p = p->next)
        if (p->state == SRV_IDLE)
            retire(p, true, "the worker is stopping");
}

size_t wrk_serve_count(const WrkServe *s)
{
    size_t n = 0;

    for (const WrkServeProc *p = s ? s->head : NULL; p; p = p->next)
        n++;
    return n;
}
