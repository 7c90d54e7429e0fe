/* What worker/mcp.c (the servers' lives, their stdio) and worker/mcp_call.c (the calls: queue, deadline,
 * cancel, end) share; worker/mcp.h draws both. */
#ifndef WRK_MCP_INT_H
#define WRK_MCP_INT_H

#include "child.h"
#include "mcp.h"

typedef enum { MCP_STARTING, MCP_READY, MCP_STOPPING } McpState;

typedef struct McpServer McpServer;

struct WrkMcpCall {
    struct WrkMcpCall *next, *prev; /* in its server's waiting queue or its list in flight */
    McpServer *sv;
    long long id; /* its request's id once sent, else 0 */
    json_t *arguments;
    char *mcp_tool;
    WrkMcpProgram prog; /* the caller's strings, which outlive the call: a new server for it starts by it */
    char label[160];
    struct timespec started;
    int timeout_sec;
    struct event *deadline;
    WrkMcpDone done;
    WrkMcpProgress progress;
    void *arg;
};

/* A list of calls, in order. */
typedef struct McpList {
    WrkMcpCall *head, *tail;
    int n;
} McpList;

struct McpServer {
    McpServer *next, *prev;
    WrkMcp *m;
    char *key; /* the section, limits and mcp line: which calls it takes */
    WrkChild c;
    McpState state;
    bool was_ready;   /* it answered initialize: calls waiting for it at its end go to a new server */
    bool fail_at_end; /* STOPPING, but its calls end when it has exited (with how it ended) */
    char name[120];   /* "mcp tool=T pid=N" */
    int max_inflight, init_sec;
    long long next_id, init_id, ping_id;
    struct event *ping_timer;
    struct timespec heard; /* when it last wrote a line, any line: a sign of life beside a ping's answer */
    McpList waiting, flight;
    char *wbuf; /* what is still to be written to its stdin */
    size_t wlen, woff, wcap;
    char *rbuf; /* its stdout since the last newline */
    size_t rlen, rcap;
    bool skipping; /* a line over WRK_MCP_LINE_MAX: dropped up to its newline */
    long bad_lines;
    char why[512]; /* why it is stopping: what its calls in flight end with */
};

struct WrkMcp {
    struct event_base *base;
    bool stopping;
    McpServer *head;
};

/* Calls (mcp_call.c). */
void mcp_list_add(McpList *l, WrkMcpCall *c);
void mcp_list_del(McpList *l, WrkMcpCall *c);
void mcp_call_free(WrkMcpCall *c);
/** The call ends: out of its server's lists, its done told (outcome taken by it); the server sends more. */
void mcp_call_end(WrkMcpCall *c, json_t *outcome);
/** Send what the server may take now: waiting calls, up to max_inflight. */
void mcp_sv_pump(McpServer *sv);
/** How long initialize may take for a server started for c: its timeout, at least the grace period and
 *  WRK_MCP_INIT_MIN_SEC. */
#define WRK_MCP_INIT_MIN_SEC 10
int mcp_init_limit(const WrkMcpCall *c);
/** sv is STOPPING: its calls in flight end with code (tool_exit, or resource_limit when a program limit
 *  stopped it) and why; its waiting calls go to a new server when it had become ready, else fail as well (a
 *  server that cannot start would be started again for ever). */
void mcp_sv_fail_calls(McpServer *sv, const char *code, const char *why);
/** notifications/cancelled for request id. */
void mcp_sv_cancelled(McpServer *sv, long long id, const char *reason);
WrkMcpCall *mcp_in_flight(McpServer *sv, long long id);

/* Servers (mcp.c). */
/** Queue line (len bytes, taken; NULL: out of memory) for its stdin. */
void mcp_sv_write(McpServer *sv, char *line);
/** Stop it (SIGTERM, SIGKILL after the grace): no new calls; its calls end now (mcp_sv_fail_calls). */
void mcp_sv_stop(McpServer *sv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Start a server for key, initialize sent, bounded by init_sec; NULL with errno set. */
McpServer *mcp_sv_start(WrkMcp *m, const WrkMcpProgram *prog, const char *key, int init_sec);
/** After a call timed out: does it still answer at all? (one ping at a time) */
void mcp_sv_ping(McpServer *sv);

#endif
