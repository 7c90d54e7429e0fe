/* MCP tool calls: queued on their server, sent up to mcp_max_inflight, ended once (worker/mcp.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "mcp_int.h"
#include "mcp_proto.h"

void mcp_list_add(McpList *l, WrkMcpCall *c)
{
    c->prev = l->tail;
    c->next = NULL;
    if (l->tail)
        l->tail->next = c;
    else
        l->head = c;
    l->tail = c;
    l->n++;
}

void mcp_list_del(McpList *l, WrkMcpCall *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        l->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        l->tail = c->prev;
    c->next = c->prev = NULL;
    l->n--;
}

void mcp_call_free(WrkMcpCall *c)
{
    if (c->deadline)
        event_free(c->deadline);
    json_decref(c->arguments);
    free(c->mcp_tool);
    free(c);
}

/* The call ends: out of its server's lists, its done told (outcome taken by it). */
void mcp_call_end(WrkMcpCall *c, json_t *outcome)
{
    McpServer *sv = c->sv;

    if (sv)
        mcp_list_del(c->id ? &sv->flight : &sv->waiting, c);
    c->sv = NULL;
    c->done(outcome, wrk_elapsed_sec(&c->started), c->arg);
    mcp_call_free(c);
    if (sv)
        mcp_sv_pump(sv);
}

/* Send what the server may take now: waiting calls, up to max_inflight. */
void mcp_sv_pump(McpServer *sv)
{
    while (sv->state == MCP_READY && sv->waiting.head && sv->flight.n < sv->max_inflight) {
        WrkMcpCall *c = sv->waiting.head;
        mcp_list_del(&sv->waiting, c);
        c->id = ++sv->next_id;
        mcp_list_add(&sv->flight, c);
        json_t *params = json_pack("{s:s,s:O,s:{s:I}}", "name", c->mcp_tool, "arguments", c->arguments,
                                   "_meta", "progressToken", (json_int_t)c->id);
        mcp_sv_write(sv, wrk_mcp_request(c->id, "tools/call", params, NULL));
        log_debug("%s: tools/call %s id=%lld sent to %s", c->label, c->mcp_tool, c->id, sv->name);
    }
}

int mcp_init_limit(const WrkMcpCall *c)
{
    int sec = c->timeout_sec > c->prog.grace_sec ? c->timeout_sec : c->prog.grace_sec;

    /* A server's start (node, python) can take seconds on a loaded host: its first call's timeout alone
     * would stop a slow starter that later calls would have found ready. */
    return sec > WRK_MCP_INIT_MIN_SEC ? sec : WRK_MCP_INIT_MIN_SEC;
}

/* Its calls in flight end with code and why (it is STOPPING already); its waiting calls go to a new server
 * when it had become ready, else fail as well (a server that cannot start would be started again for ever).
 */
void mcp_sv_fail_calls(McpServer *sv, const char *code, const char *why)
{
    WrkMcp *m = sv->m;

    while (sv->flight.head)
        mcp_call_end(sv->flight.head, wrk_mcp_error_outcome("error", code, "%s", why));
    while (sv->waiting.head) {
        WrkMcpCall *c = sv->waiting.head;
        McpServer *ns = NULL;
        if (sv->was_ready && !m->stopping) {
            for (ns = m->head; ns; ns = ns->next)
                if (ns != sv && ns->state != MCP_STOPPING && strcmp(ns->key, sv->key) == 0)
                    break;
            if (!ns)
                ns = mcp_sv_start(m, &c->prog, sv->key, mcp_init_limit(c));
        }
        if (!ns) {
            mcp_call_end(c, wrk_mcp_error_outcome("error", code, "%s", why));
            continue;
        }
        log_info("%s: %s; the call goes to %s", c->label, why, ns->name);
        mcp_list_del(&sv->waiting, c);
        c->sv = ns;
        mcp_list_add(&ns->waiting, c);
        mcp_sv_pump(ns);
    }
}

void mcp_sv_cancelled(McpServer *sv, long long id, const char *reason)
{
    if (sv->state == MCP_STOPPING)
        return;
    mcp_sv_write(sv, wrk_mcp_notification(
                         "notifications/cancelled",
                         json_pack("{s:I,s:s}", "requestId", (json_int_t)id, "reason", reason), NULL));
}

static void call_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkMcpCall *c = arg;
    McpServer *sv = c->sv;

    if (wrk_deadline_early(c->deadline, &c->started, (int64_t)c->timeout_sec * 1000))
        return;
    if (c->id && sv) {
        log_warn("%s: no answer within its %d s limit; notifications/cancelled sent to %s", c->label,
                 c->timeout_sec, sv->name);
        mcp_sv_cancelled(sv, c->id, "timeout");
        mcp_sv_ping(sv);
        mcp_call_end(
            c, wrk_mcp_error_outcome("timeout", "tool_timeout",
                                     "the MCP tool did not answer within its %d second limit; the call was "
                                     "cancelled (notifications/cancelled) and the server goes on",
                                     c->timeout_sec));
        return;
    }
    mcp_call_end(
        c, wrk_mcp_error_outcome("timeout", "tool_timeout",
                                 "the MCP tool did not answer within its %d second limit: the call never "
                                 "reached the server (%s)",
                                 c->timeout_sec,
                                 sv && sv->state == MCP_STARTING
                                     ? "it had not answered initialize yet"
                                     : "it was waiting for one of mcp_max_inflight calls to end"));
}

WrkMcpCall *wrk_mcp_call(WrkMcp *m, const WrkMcpProgram *prog, json_t *arguments, int timeout_sec,
                         const char *label, WrkMcpDone done, WrkMcpProgress progress, void *arg)
{
    WrkMcpCall *c = calloc(1, sizeof *c);
    const TwLimitsConf *l = prog->limits;
    McpServer *sv = NULL;
    char *key = NULL;

    if (!c)
        return NULL;
    if (asprintf(&key, "%s %d %d %d %d %d %d %s %s", prog->tool, prog->grace_sec, l ? l->memory_limit_mb : 0,
                 l ? l->cpu_limit_sec : 0, l ? l->max_open_files : 0, l ? l->max_processes : 0,
                 prog->max_inflight, l && l->run_as_user ? l->run_as_user : "", prog->exec) < 0)
        key = NULL;
    c->arguments = json_incref(arguments);
    c->mcp_tool = strdup(prog->mcp_tool);
    c->prog = *prog;
    c->timeout_sec = timeout_sec > 0 ? timeout_sec : 1;
    c->done = done;
    c->progress = progress;
    c->arg = arg;
    snprintf(c->label, sizeof c->label, "%s", label);
    clock_gettime(CLOCK_MONOTONIC, &c->started);
    if (!key || !c->mcp_tool || !(c->deadline = evtimer_new(m->base, call_deadline_cb, c))) {
        free(key);
        mcp_call_free(c);
        errno = ENOMEM;
        return NULL;
    }
    for (sv = m->head; sv; sv = sv->next)
        if (sv->state != MCP_STOPPING && strcmp(sv->key, key) == 0)
            break;
    /* initialize is bounded by the first call's limit (at least the grace period). */
    if (!sv && !(sv = mcp_sv_start(m, prog, key, mcp_init_limit(c)))) {
        int err = errno;
        free(key);
        mcp_call_free(c);
        errno = err;
        return NULL;
    }
    free(key);
    struct timeval tv = {c->timeout_sec, 0};
    evtimer_add(c->deadline, &tv);
    c->sv = sv;
    mcp_list_add(&sv->waiting, c);
    mcp_sv_pump(sv);
    return c;
}

void wrk_mcp_cancel(WrkMcpCall *c, const char *why)
{
    if (c->id && c->sv) {
        log_info("%s: cancelled (%s); notifications/cancelled sent to %s", c->label, why, c->sv->name);
        mcp_sv_cancelled(c->sv, c->id, why);
    }
    mcp_call_end(c, NULL);
}

WrkMcpCall *mcp_in_flight(McpServer *sv, long long id)
{
    for (WrkMcpCall *c = sv->flight.head; c; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}
