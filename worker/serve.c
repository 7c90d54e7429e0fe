/* Serve mode: pools of long-lived programs, one JSON line per request. */
#include "serve.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "names.h"

/* The state diagram of a serve process is in serve.h. */
typedef enum { SRV_IDLE, SRV_BUSY, SRV_REPLYING, SRV_RETIRING } SrvState;

static const char *const srv_state_names[] = {"IDLE", "BUSY", "REPLYING", "RETIRING"};

/* The moves the diagram above draws, [from][to]. A new process (calloc: IDLE) is taken at once. */
static const bool srv_moves[4][4] = {
    [SRV_IDLE] = {[SRV_BUSY] = true, [SRV_RETIRING] = true},
    [SRV_BUSY] = {[SRV_REPLYING] = true, [SRV_RETIRING] = true},
    [SRV_REPLYING] = {[SRV_IDLE] = true, [SRV_RETIRING] = true},
    [SRV_RETIRING] = {[SRV_RETIRING] = true},
};

struct WrkServeProc {
    struct WrkServeProc *next, *prev;
    WrkServe *s;
    char *key;  /* kind, grace, max_requests and exec line: which requests it may serve */
    WrkChild c; /* its pipes, timers, stderr, stop and end (child.h) */
    SrvState state;
    long cpu_window; /* the CPU seconds its RLIMIT_CPU allows now, moved for each request */
    int max_requests, served;
    uint64_t last_used;
    char name[64]; /* "agent serve pid=N" */
    size_t woff;   /* how much of the request line is written */
    char *rbuf;    /* stdout since the request began */
    size_t rlen, rcap;
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

static void proc_maybe_done(void *arg);
static void pass_on(WrkServeProc *p, const char *why);
static bool out_read(void *arg);
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
    wrk_child_free(&p->c);
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
        if (!s->head->c.exited)
            wrk_signal_group(s->head->c.pid, SIGKILL);
        proc_free(s->head);
    }
    free(s);
}

/* Every change of a process's state goes through here (as job_set_state): a move the diagram does not draw is
 * logged, so that the diagram stays true. */
static void srv_set_state(WrkServeProc *p, SrvState to)
{
    if (!srv_moves[p->state][to])
        log_error("%s: serve state %s -> %s is not a move of the diagram (worker/serve.c)", p->name,
                  srv_state_names[p->state], srv_state_names[to]);
    p->state = to;
}

/* Not serving and never to serve again for now: retiring, or reading its reply. */
static bool srv_out(const WrkServeProc *p)
{
    return p->state == SRV_RETIRING || p->state == SRV_REPLYING;
}

/* Replace it: it serves no more requests. polite: EOF first (it did nothing wrong). */
static void retire(WrkServeProc *p, bool polite, const char *why)
{
    if (p->state == SRV_RETIRING)
        return;
    log_info("%s: replaced after %d request(s): %s", p->name, p->served, why);
    srv_set_state(p, SRV_RETIRING);
    wrk_child_stop(&p->c, polite ? WRK_STOP_EOF : WRK_STOP_TERM);
}

static size_t live_procs(const WrkServe *s)
{
    size_t n = 0;

    for (const WrkServeProc *p = s->head; p; p = p->next)
        n += !srv_out(p);
    return n;
}

/* It was given a request but has read none of it, and wrote nothing since: whatever it does now (exit, close
 * a pipe, write) it did between requests. Only a process that served a request before: a new one that fails
 * before reading its first request fails that request, as exec mode would. */
static bool not_started(WrkServeProc *p)
{
    if (p->state != SRV_BUSY || !p->req || p->served == 0 || p->c.stop != WRK_STOP_NONE || p->rlen > 0)
        return false;
    return p->woff == 0 || wrk_pipe_unread(&p->c.in_pipe, p->name) >= p->woff;
}

/* The reply line came: the request ends well (for the process), whatever the job makes of it. */
static void reply_line(WrkServeProc *p, size_t line_len, bool extra)
{
    WrkProcResult r = {.outcome = WRK_PROC_OK, .output = p->rbuf, .output_len = line_len};
    WrkServeReq *q = p->req;
    bool usable;

    evtimer_del(p->c.deadline);
    /* A reply came, so the request was read: whatever is left unwritten goes. */
    if (p->c.in_pipe.ev)
        event_del(p->c.in_pipe.ev);
    /* A reply before all of the request was read: out of step (what is left would start the next request). */
    extra = extra || p->woff < q->len || wrk_pipe_unread(&p->c.in_pipe, p->name) > 0;
    p->rbuf[line_len] = '\0';
    r.stderr_tail = p->c.err.tail;
    r.elapsed_sec = wrk_elapsed_sec(&q->started);
    /* Late, as if the deadline had stopped it first; the process answered, so it may serve again. */
    if (wrk_reply_late(p->label, r.elapsed_sec, q->timeout_ms))
        r.outcome = WRK_PROC_TIMEOUT;
    wrk_stderr_end_run(&p->c.err);
    p->c.err.label = p->name;
    p->served++;
    p->req = NULL;
    srv_set_state(p, SRV_REPLYING);
    usable = q->done(&r, q->arg);
    req_free(q);
    p->rlen = 0;
    if (!usable)
        retire(p, false, "its reply was not a valid reply object");
    else if (extra)
        retire(p, false, "it wrote more than one line for one request, or replied before reading all of it");
    else if (p->served >= p->max_requests)
        retire(p, true, "max_requests reached");
    else if (p->s->stopping)
        retire(p, true, "the worker is stopping");
    else if (p->c.exited)
        srv_set_state(p, SRV_RETIRING); /* it replied, then exited: freed once its pipes are drained */
    else if (live_procs(p->s) > (size_t)p->s->max_procs)
        retire(p, true, "more serve processes than slots");
    else {
        srv_set_state(p, SRV_IDLE);
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
        if (wrk_pipe_intact(&p->c.out_pipe, p->name) && out_read(p))
            out_closed(p);
        if (p->req != q)
            return; /* passed on, and its stdin is closed */
    }
    int w = q ? wrk_pipe_write(&p->c.in_pipe, q->line, q->len, &p->woff) : 0;
    if (w > 0)
        return;
    /* EPIPE: it closed stdin; it is on its way out. Before it read any of the request, the request goes to a
     * new process; else its end decides. */
    if (w < 0 && not_started(p)) {
        pass_on(p, "it closed its stdin");
        return; /* its stdin is closed now */
    }
    event_del(p->c.in_pipe.ev);
}

/* Reads what stdout holds now, without waiting, handing a reply line on; true at its end (or on an error). */
static bool out_read(void *arg)
{
    WrkServeProc *p = arg;

    for (;;) {
        if (!wrk_buf_room(&p->rbuf, p->rlen, &p->rcap))
            return false;
        size_t scan = p->rlen;
        ssize_t n = read(p->c.out_pipe.fd, p->rbuf + p->rlen, p->rcap - p->rlen);
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
        if (p->state != SRV_BUSY || p->req == NULL || p->c.stop != WRK_STOP_NONE) {
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
            wrk_child_stop(&p->c, WRK_STOP_TERM);
        }
    }
}

/* EOF on its stdout: it can never answer again. */
static void out_closed(WrkServeProc *p)
{
    wrk_pipe_close(&p->c.out_pipe, p->name);
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

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkServeProc *p = arg;

    if (!p->req || wrk_deadline_early(p->c.deadline, &p->req->started, p->req->timeout_ms))
        return;
    log_warn("%s: time limit reached; sending SIGTERM to serve pid=%d", p->label, (int)p->c.pid);
    p->timed_out = true;
    wrk_child_stop(&p->c, WRK_STOP_TERM);
}

/* It has exited and its pipes are drained: end the request it was serving, as exec mode would, and free it.
 */
static void proc_maybe_done(void *arg)
{
    WrkServeProc *p = arg;
    WrkProcResult r = {0};
    WrkServeReq *q = p->req;

    if (!wrk_child_drained(&p->c))
        return;
    wrk_stderr_end_run(&p->c.err);
    if (p->state == SRV_BUSY && q) {
        r.elapsed_sec = wrk_elapsed_sec(&q->started);
        /* Exited 0 without a reply line: OK with what it wrote, which steps.c finds is no reply. */
        wrk_child_result(&p->c, &r, p->rbuf, p->rlen, p->cancelled, p->oversize, p->timed_out, p->cpu_window);
        log_info("%s: serve pid=%d ended after %d request(s) while serving this one", p->label, (int)p->c.pid,
                 p->served);
        p->req = NULL;
        q->done(&r, q->arg);
        req_free(q);
    } else if (!srv_out(p)) {
        log_info("%s: exited between requests (status 0x%x) after %d request(s); the next request starts a "
                 "new one",
                 p->name, (unsigned)p->c.status, p->served);
    } else {
        log_debug("%s: exited", p->name);
    }
    proc_free(p);
}

/* It has exited (wrk_child_exited): its request, if it had not read it, goes to a new process. */
static void proc_settle(WrkServeProc *p)
{
    if (not_started(p)) /* before its stdin is closed: what it holds unread tells */
        pass_on(p, "it exited");
    if (p->state == SRV_IDLE)
        srv_set_state(p, SRV_RETIRING);
    wrk_child_wind_up(&p->c);
    proc_maybe_done(p);
}

/* Nothing came from an idle process since its last reply, and it can still take a request: what its stdout
 * holds now is read here rather than when the loop reports it (a stray byte, EOF), and a stdin with no reader
 * left shows as an error. */
static bool idle_sound(WrkServeProc *p)
{
    if (wrk_pipe_intact(&p->c.out_pipe, p->name) && out_read(p))
        out_closed(p);
    if (p->state != SRV_IDLE)
        return false;
    if (p->c.out_pipe.fd < 0) {
        retire(p, true, "it closed its stdout");
    } else if (wrk_pipe_hung_up(&p->c.in_pipe, p->name)) {
        retire(p, true, "it closed its stdin");
    }
    return p->state == SRV_IDLE;
}

bool wrk_serve_running(const WrkServe *s, pid_t pid)
{
    for (const WrkServeProc *p = s ? s->head : NULL; p; p = p->next)
        if (p->c.pid == pid && !p->c.exited)
            return true;
    return false;
}

bool wrk_serve_exited(WrkServe *s, pid_t pid, int status, const struct rusage *ru)
{
    for (WrkServeProc *p = s->head; p; p = p->next) {
        if (p->c.pid == pid && !p->c.exited) {
            wrk_child_exited(&p->c, status, ru);
            proc_settle(p);
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
    p->c.grace_sec = prog->grace_sec;
    p->max_requests = prog->max_requests;
    snprintf(p->name, sizeof p->name, "%s serve", prog->kind);
    p->c.label = p->c.err.label = p->name;
    p->c.out_read = out_read;
    p->c.maybe_done = proc_maybe_done;
    p->c.owner = p;
    p->c.stop_closes_stdin = true;
    if (!(p->key = strdup(key)) || wrk_child_spawn(&p->c, s->base, prog->argv, env, prog->limits, true, in_cb,
                                                   out_cb, deadline_cb) != 0) {
        int err = errno;
        log_error("%s serve: cannot start %s: %s", prog->kind, prog->exec, strerror(err));
        free(p->key);
        free(p);
        errno = err; /* for the step's error message (wrk_serve_call) */
        return NULL;
    }
    p->cpu_window = p->c.limits.cpu_limit_sec;
    snprintf(p->name, sizeof p->name, "%s serve pid=%d", prog->kind, (int)p->c.pid);
    p->next = s->head;
    if (s->head)
        s->head->prev = p;
    s->head = p;
    event_add(p->c.out_pipe.ev, NULL);
    event_add(p->c.err_pipe.ev, NULL);
    log_info("%s: started (%s)", p->name, prog->exec);
    return p;
}

/* An idle process of this program, making sure it has not died unnoticed meanwhile. */
static WrkServeProc *take_idle(WrkServe *s, const char *key)
{
    for (WrkServeProc *p = s->head, *next; p; p = next) {
        next = p->next;
        if (p->state != SRV_IDLE || p->c.exited || strcmp(p->key, key) != 0)
            continue;
        if (wrk_child_reaped(&p->c)) {
            proc_settle(p);
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
    srv_set_state(p, SRV_BUSY);
    p->timed_out = p->oversize = p->cancelled = false;
    snprintf(p->label, sizeof p->label, "%s", q->label);
    /* Its CPU limit is per request: from what it has used so far. */
    if (p->c.limits.cpu_limit_sec > 0 && p->served > 0) {
        long w = wrk_cpu_window(p->c.pid, p->c.limits.cpu_limit_sec);
        if (w < 0)
            log_warn("%s: cannot move the CPU limit of serve pid=%d: %s", q->label, (int)p->c.pid,
                     strerror(errno));
        else
            p->cpu_window = w;
    }
    wrk_stderr_clear_tail(&p->c.err);
    p->c.err.label = p->label;
    event_add(p->c.in_pipe.ev, NULL);
    evtimer_add(p->c.deadline, &tv);
    log_debug("%s: sent to serve pid=%d (request %d)", q->label, (int)p->c.pid, p->served + 1);
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
    evtimer_del(p->c.deadline);
    if (p->c.in_pipe.ev)
        event_del(p->c.in_pipe.ev);
    p->rlen = 0;
    p->c.err.label = p->name;
    log_info("%s: serve pid=%d did not read this request (%s after %d request(s)); a new process serves it",
             q->label, (int)p->c.pid, why, p->served);
    retire(p, false, why); /* nothing more to stop when it has exited */
    make_room(p->s);
    if ((np = proc_start(p->s, &q->prog, q->key))) {
        proc_take(np, q);
        return;
    }
    WrkProcResult r = wrk_spawn_result(errno);
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
    log_info("%s: stopping serve pid=%d (%s)", p->label, (int)p->c.pid, why);
    p->cancelled = true;
    wrk_child_stop(&p->c, WRK_STOP_TERM);
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
