/* MCP servers as tools: their lives and their calls (worker/mcp.h draws both). */
#include "mcp_int.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "mcp_proto.h"
#include "steps.h"
#include "utf8.h"

WrkMcp *wrk_mcp_new(struct event_base *base)
{
    WrkMcp *m = calloc(1, sizeof *m);

    if (m)
        m->base = base;
    return m;
}

static void sv_free(McpServer *sv)
{
    WrkMcp *m = sv->m;

    if (sv->prev)
        sv->prev->next = sv->next;
    else if (m->head == sv)
        m->head = sv->next;
    if (sv->next)
        sv->next->prev = sv->prev;
    for (McpList *l = &sv->waiting; l; l = l == &sv->waiting ? &sv->flight : NULL)
        while (l->head) { /* at teardown only: calls otherwise end, or move, before their server goes */
            WrkMcpCall *c = l->head;
            mcp_list_del(l, c);
            mcp_call_free(c);
        }
    wrk_child_free(&sv->c);
    if (sv->ping_timer)
        event_free(sv->ping_timer);
    free(sv->wbuf);
    free(sv->rbuf);
    free(sv->key);
    free(sv);
}

void wrk_mcp_free(WrkMcp *m)
{
    if (!m)
        return;
    while (m->head) {
        if (!m->head->c.exited)
            wrk_signal_group(m->head->c.pid, SIGKILL);
        sv_free(m->head);
    }
    free(m);
}

/* Queue line for its stdin (mcp_int.h). */
void mcp_sv_write(McpServer *sv, char *line)
{
    size_t len = line ? strlen(line) : 0;

    if (!line || sv->c.in_pipe.fd < 0) {
        free(line);
        return;
    }
    if (sv->woff == sv->wlen)
        sv->woff = sv->wlen = 0;
    if (sv->wlen + len + 1 > sv->wcap) {
        size_t cap = (sv->wlen + len + 1) * 2;
        char *nb = realloc(sv->wbuf, cap);
        if (!nb) {
            free(line);
            mcp_sv_stop(sv, "the worker is out of memory");
            return;
        }
        sv->wbuf = nb;
        sv->wcap = cap;
    }
    memcpy(sv->wbuf + sv->wlen, line, len);
    sv->wlen += len;
    free(line);
    event_add(sv->c.in_pipe.ev, NULL);
}

static void in_cb(evutil_socket_t fd, short what, void *arg)
{
    McpServer *sv = arg;
    int w = wrk_pipe_write(&sv->c.in_pipe, sv->wbuf, sv->wlen, &sv->woff);

    if (w > 0)
        return;
    event_del(sv->c.in_pipe.ev);
    sv->woff = sv->wlen = 0;
    if (w < 0)
        mcp_sv_stop(sv, "the MCP server closed its stdin (%s)", strerror(errno));
}

static const char *status_text(const WrkChild *ch, char *buf, size_t size)
{
    if (!ch->exited)
        snprintf(buf, size, "it was stopped");
    else if (WIFEXITED(ch->status))
        snprintf(buf, size, "it exited with status %d", WEXITSTATUS(ch->status));
    else if (WIFSIGNALED(ch->status))
        snprintf(buf, size, "it was killed by signal %d (%s)", WTERMSIG(ch->status),
                 strsignal(WTERMSIG(ch->status)));
    else
        snprintf(buf, size, "it ended (status 0x%x)", (unsigned)ch->status);
    return buf;
}

/* Stop it (SIGTERM, SIGKILL after the grace): no new calls; its calls end now. */
void mcp_sv_stop(McpServer *sv, const char *fmt, ...)
{
    va_list ap;

    if (sv->state == MCP_STOPPING)
        return;
    va_start(ap, fmt);
    vsnprintf(sv->why, sizeof sv->why, fmt, ap);
    va_end(ap);
    log_warn("%s: stopping it: %s", sv->name, sv->why);
    if (sv->ping_timer)
        evtimer_del(sv->ping_timer);
    evtimer_del(sv->c.deadline);
    sv->state = MCP_STOPPING;
    wrk_child_stop(&sv->c, WRK_STOP_TERM);
    char why[600];
    snprintf(why, sizeof why, "the MCP server %s", sv->why);
    mcp_sv_fail_calls(sv, "tool_exit", why);
}

static void init_answered(McpServer *sv, json_t *msg)
{
    const json_t *res = json_object_get(msg, "result");
    const char *v = json_string_value(json_object_get(res, "protocolVersion"));

    sv->init_id = 0;
    evtimer_del(sv->c.deadline);
    if (!json_is_object(res)) {
        const char *em = json_string_value(json_object_get(json_object_get(msg, "error"), "message"));
        mcp_sv_stop(sv, "refused initialize: %s", em ? em : "(no message)");
        return;
    }
    if (!wrk_mcp_version_ok(v)) {
        mcp_sv_stop(sv,
                    "answered initialize with protocol version %.40s, which the worker does not speak (it "
                    "speaks " WRK_MCP_PROTOCOL_LATEST " back to 2024-11-05)",
                    v ? v : "(none)");
        return;
    }
    log_info("%s: initialized (protocol %s)", sv->name, v);
    sv->state = MCP_READY;
    sv->was_ready = true;
    mcp_sv_write(sv, wrk_mcp_notification("notifications/initialized", NULL, NULL));
    mcp_sv_pump(sv);
}

/* A line it wrote that is no message of ours: logged (the first few, then one in a thousand), dropped. */
static void bad_line(McpServer *sv, const char *line, size_t len, const char *why)
{
    char quote[200];

    if (++sv->bad_lines > 5 && sv->bad_lines % 1000 != 0)
        return;
    tw_utf8_clean(quote, sizeof quote, line, len < 120 ? len : 120);
    log_warn("%s: dropped a line (%s; %ld so far): %s%s", sv->name, why, sv->bad_lines, quote,
             len > 120 ? "..." : "");
}

/* A line that is no valid message: when it is an answer to one of our requests (its id), that request fails
 * now with why; else it is only logged. */
static void bad_answer(McpServer *sv, long long id, const char *line, size_t len, const char *why)
{
    char quote[200];
    WrkMcpCall *c;

    if (id > 0 && id == sv->init_id) {
        mcp_sv_stop(sv, "answered initialize with a line that is no valid answer: %s", why);
    } else if (id > 0 && (c = mcp_in_flight(sv, id))) {
        tw_utf8_clean(quote, sizeof quote, line, len < 120 ? len : 120);
        log_warn("%s: its answer to %s (request %lld) is no valid JSON-RPC 2.0 answer (%s): %s%s", sv->name,
                 c->label, id, why, quote, len > 120 ? "..." : "");
        mcp_call_end(c,
                     wrk_mcp_error_outcome("error", "bad_output",
                                           "the MCP server's answer to tools/call is no valid JSON-RPC 2.0 "
                                           "answer: %s; it began: %s%s",
                                           why, quote, len > 120 ? "..." : ""));
    } else {
        bad_line(sv, line, len, why);
    }
}

static void on_response(McpServer *sv, json_t *msg, long long id, const char *line, size_t len)
{
    WrkMcpCall *c;

    if (id > 0 && id == sv->init_id) {
        init_answered(sv, msg);
    } else if (id > 0 && id == sv->ping_id) {
        sv->ping_id = 0;
        evtimer_del(sv->ping_timer);
        log_debug("%s: answered ping", sv->name);
    } else if (id > 0 && (c = mcp_in_flight(sv, id))) {
        mcp_call_end(c, wrk_mcp_call_outcome(msg));
    } else if (id > 0 && id <= sv->next_id) {
        log_info("%s: an answer to request %lld, which ended before it (timed out or cancelled): dropped",
                 sv->name, id);
    } else {
        bad_line(sv, line, len, "an answer to no request of ours");
    }
}

static void on_line(McpServer *sv, const char *line, size_t len)
{
    char why[200];
    long long id;
    json_t *msg;

    if (len == 0 || (len == 1 && line[0] == '\r'))
        return;
    clock_gettime(CLOCK_MONOTONIC, &sv->heard);
    switch (wrk_mcp_parse(line, len, &msg, &id, why, sizeof why)) {
    case WRK_MCP_BAD:
        bad_answer(sv, id, line, len, why);
        return;
    case WRK_MCP_RESPONSE:
        on_response(sv, msg, id, line, len);
        break;
    case WRK_MCP_REQUEST: {
        /* It asks us: ping is answered; sampling, roots, elicitation are not the worker's to give. */
        const char *method = json_string_value(json_object_get(msg, "method"));
        mcp_sv_write(sv, wrk_mcp_answer(json_object_get(msg, "id"),
                                        strcmp(method, "ping") == 0 ? json_object() : NULL, NULL));
        break;
    }
    case WRK_MCP_NOTIFICATION: {
        const char *method = json_string_value(json_object_get(msg, "method"));
        const json_t *params = json_object_get(msg, "params");
        const json_t *token = json_object_get(params, "progressToken");
        WrkMcpCall *c;
        if (strcmp(method, "notifications/progress") == 0 && json_is_integer(token) &&
            (c = mcp_in_flight(sv, (long long)json_integer_value(token)))) {
            if (c->progress && json_is_number(json_object_get(params, "progress")))
                c->progress(params, c->arg);
        } else if (strcmp(method, "notifications/progress") == 0) {
            log_debug("%s: progress of no call in flight: dropped", sv->name);
        }
        break;
    }
    }
    json_decref(msg);
}

/* Reads what stdout holds now, handing each line on; true at its end (or on an error). */
static bool out_read(void *arg)
{
    McpServer *sv = arg;

    for (;;) {
        if (!wrk_buf_room(&sv->rbuf, sv->rlen, &sv->rcap))
            return false;
        size_t from = sv->rlen, pos = 0;
        ssize_t n = read(sv->c.out_pipe.fd, sv->rbuf + sv->rlen, sv->rcap - sv->rlen);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return false;
        if (n <= 0)
            return true;
        sv->rlen += (size_t)n;
        for (char *nl; (nl = memchr(sv->rbuf + from, '\n', sv->rlen - from)); from = pos) {
            size_t end = (size_t)(nl - sv->rbuf);
            if (sv->skipping)
                sv->skipping = false;
            else
                on_line(sv, sv->rbuf + pos, end - pos);
            pos = end + 1;
        }
        memmove(sv->rbuf, sv->rbuf + pos, sv->rlen - pos);
        sv->rlen -= pos;
        if (sv->rlen > WRK_MCP_LINE_MAX) {
            if (!sv->skipping)
                bad_line(sv, sv->rbuf, sv->rlen, "a line longer than the limit");
            sv->skipping = true;
            sv->rlen = 0;
        }
    }
}

static void sv_maybe_done(void *arg)
{
    McpServer *sv = arg;
    char st[128], why[1400];

    if (!wrk_child_drained(&sv->c))
        return;
    if (sv->state != MCP_STOPPING || sv->fail_at_end) {
        bool ours =
            sv->fail_at_end && WIFSIGNALED(sv->c.status) &&
            (WTERMSIG(sv->c.status) == SIGTERM || (WTERMSIG(sv->c.status) == SIGKILL && sv->c.killed_hard));
        /* Stopped by a limit, told apart as for any program (child.c); its CPU limit counts its whole life.
         */
        WrkProcResult r = {0};
        wrk_child_result(&sv->c, &r, NULL, 0, ours, false, false, sv->c.limits.cpu_limit_sec);
        const char *code = "tool_exit";
        if (r.outcome == WRK_PROC_LIMIT)
            code = wrk_limit_failure(&r, "the MCP server", why, sizeof why);
        else
            snprintf(why, sizeof why, "the MCP server ended: %s%s%s%s", status_text(&sv->c, st, sizeof st),
                     ours ? " (the worker stopped it: it had closed its stdout)" : "",
                     *sv->c.err.tail ? "; stderr: " : "", sv->c.err.tail);
        log_warn("%s: %s", sv->name, why);
        sv->state = MCP_STOPPING;
        mcp_sv_fail_calls(sv, code, why);
    }
    sv_free(sv);
}

static void out_cb(evutil_socket_t fd, short what, void *arg)
{
    McpServer *sv = arg;

    if (out_read(sv)) {
        wrk_pipe_close(&sv->c.out_pipe, sv->name);
        /* It can answer nothing more. Mostly it is exiting (its end tells its calls how), else it is stopped
         * now. */
        if (sv->state != MCP_STOPPING && !sv->c.exited) {
            log_info("%s: closed its stdout; stopping it", sv->name);
            sv->state = MCP_STOPPING;
            sv->fail_at_end = true;
            if (sv->ping_timer)
                evtimer_del(sv->ping_timer);
            evtimer_del(sv->c.deadline);
            wrk_child_stop(&sv->c, WRK_STOP_TERM);
        }
        sv_maybe_done(sv);
    }
}

/* initialize was not answered in time. */
static void init_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    McpServer *sv = arg;

    if (sv->state == MCP_STARTING)
        mcp_sv_stop(sv, "did not answer initialize within %d s", sv->init_sec);
}

static void ping_cb(evutil_socket_t fd, short what, void *arg)
{
    McpServer *sv = arg;
    double quiet = wrk_elapsed_sec(&sv->heard);

    if (!sv->ping_id)
        return;
    /* Any line it wrote since (progress, an answer, even a bad line) says it is alive: wedged only once it
     * has been silent for a whole grace period with the ping unanswered. */
    if (quiet < sv->c.grace_sec) {
        double left = sv->c.grace_sec - quiet;
        struct timeval tv = {(time_t)left, (suseconds_t)((left - (double)(time_t)left) * 1e6)};
        log_debug("%s: has not answered ping, but wrote %.1f s ago: not wedged", sv->name, quiet);
        evtimer_add(sv->ping_timer, &tv);
        return;
    }
    mcp_sv_stop(sv,
                "is wedged: it did not answer ping within %d s (kill_grace_seconds) after a call timed out, "
                "and wrote nothing else in that time",
                sv->c.grace_sec);
}

/* After a call timed out: does it still answer at all? */
void mcp_sv_ping(McpServer *sv)
{
    struct timeval tv = {sv->c.grace_sec, 0};

    if (sv->state != MCP_READY || sv->ping_id)
        return;
    sv->ping_id = ++sv->next_id;
    mcp_sv_write(sv, wrk_mcp_request(sv->ping_id, "ping", NULL, NULL));
    evtimer_add(sv->ping_timer, &tv);
}

bool wrk_mcp_running(const WrkMcp *m, pid_t pid)
{
    for (const McpServer *sv = m ? m->head : NULL; sv; sv = sv->next)
        if (sv->c.pid == pid && !sv->c.exited)
            return true;
    return false;
}

bool wrk_mcp_exited(WrkMcp *m, pid_t pid, int status, const struct rusage *ru)
{
    for (McpServer *sv = m ? m->head : NULL; sv; sv = sv->next) {
        if (sv->c.pid == pid && !sv->c.exited) {
            wrk_child_exited(&sv->c, status, ru);
            if (sv->ping_timer)
                evtimer_del(sv->ping_timer);
            wrk_child_wind_up(&sv->c);
            sv_maybe_done(sv);
            return true;
        }
    }
    return false;
}

McpServer *mcp_sv_start(WrkMcp *m, const WrkMcpProgram *prog, const char *key, int init_sec)
{
    static char mode_env[] = "TURNWATCH_MODE=mcp";
    char *env[] = {mode_env, NULL};
    McpServer *sv = calloc(1, sizeof *sv);

    if (!sv)
        return NULL;
    sv->m = m;
    sv->c.grace_sec = prog->grace_sec;
    sv->max_inflight = prog->max_inflight > 0 ? prog->max_inflight : 1;
    sv->init_sec = init_sec;
    snprintf(sv->name, sizeof sv->name, "mcp tool=%s", prog->tool);
    sv->c.label = sv->c.err.label = sv->name;
    sv->c.out_read = out_read;
    sv->c.maybe_done = sv_maybe_done;
    sv->c.owner = sv;
    sv->c.stop_closes_stdin = true;
    if (!(sv->key = strdup(key)) || !(sv->ping_timer = evtimer_new(m->base, ping_cb, sv)) ||
        wrk_child_spawn(&sv->c, m->base, prog->argv, env, prog->limits, false, in_cb, out_cb,
                        init_deadline_cb) != 0) {
        int err = errno;
        log_error("%s: cannot start %s: %s", sv->name, prog->exec, strerror(err));
        if (sv->ping_timer)
            event_free(sv->ping_timer);
        free(sv->key);
        free(sv);
        errno = err;
        return NULL;
    }
    snprintf(sv->name, sizeof sv->name, "mcp tool=%s pid=%d", prog->tool, (int)sv->c.pid);
    sv->next = m->head;
    if (m->head)
        m->head->prev = sv;
    m->head = sv;
    event_add(sv->c.out_pipe.ev, NULL);
    event_add(sv->c.err_pipe.ev, NULL);
    log_info("%s: started (%s)", sv->name, prog->exec);
    sv->init_id = ++sv->next_id;
    mcp_sv_write(sv, wrk_mcp_request(sv->init_id, "initialize", wrk_mcp_initialize_params(), NULL));
    struct timeval tv = {init_sec, 0};
    evtimer_add(sv->c.deadline, &tv);
    return sv;
}

void wrk_mcp_stop_idle(WrkMcp *m)
{
    m->stopping = true;
    for (McpServer *sv = m->head; sv; sv = sv->next)
        if (sv->state != MCP_STOPPING && !sv->flight.head && !sv->waiting.head) {
            sv->state = MCP_STOPPING;
            snprintf(sv->why, sizeof sv->why, "the worker is stopping");
            wrk_child_stop(&sv->c, WRK_STOP_EOF);
        }
}

size_t wrk_mcp_count(const WrkMcp *m)
{
    size_t n = 0;

    for (const McpServer *sv = m ? m->head : NULL; sv; sv = sv->next)
        n++;
    return n;
}
