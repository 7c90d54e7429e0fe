/* MCP servers as tools (docs/mcp.md): a [tool.T] with `mcp = argv` runs as one Model Context Protocol server
 * per tool section, started through wrk_spawn like a serve process (its limits, run_as_user, its process
 * group) when a call first needs it, and kept. Each call is a tools/call request on the server's stdin, many
 * at once (mcp_max_inflight; the others wait in the worker), matched to its answer by its JSON-RPC id.
 *
 * A server's life:
 *   STARTING --initialize answered (a version we speak)-->  READY: notifications/initialized, calls sent
 *   STARTING --initialize refused, not answered in time-->  STOPPING; its waiting calls fail
 *   READY    --a call timed out-->                          READY, a ping sent (one at a time)
 *   READY    --the ping unanswered, and not a line        STOPPING (wedged): its calls in flight fail
 *              written, for kill_grace_seconds-->
 *   any      --exit, EOF, a write error-->                  STOPPING; calls in flight fail, calls waiting
 *                                                           go to a new server (they fail when it never
 *                                                           became READY)
 *   STOPPING --SIGTERM, SIGKILL after the grace-->          freed once exited and drained
 * A call ends once: its answer (ok, or isError / a JSON-RPC error: mcp_tool_error; a line with its id that is
 * no valid JSON-RPC 2.0 answer: bad_output), its timeout (tool_timeout at once, notifications/cancelled sent,
 * a late answer dropped), a cancel (notifications/cancelled), or its server's end (tool_exit; resource_limit
 * when a program limit stopped it). Any line a server writes (progress above all) is a sign of life for the
 * wedge check. Lines that cannot be tied to a call (not JSON, answers to unknown ids, notifications about
 * nothing of ours) are logged and dropped: they fail nothing. */
#ifndef WRK_MCP_H
#define WRK_MCP_H

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "config.h"

typedef struct WrkMcp WrkMcp;
typedef struct WrkMcpCall WrkMcpCall;

/* Which server a call goes to, and how it is run. The strings are copied where kept. */
typedef struct WrkMcpProgram {
    const char *tool;     /* the [tool.T] section: one server per section (and exec line, limits) */
    const char *exec;     /* the mcp line as configured, for logs */
    char *const *argv;    /* read at start only */
    const char *mcp_tool; /* the server's tool a call calls */
    int grace_sec;        /* SIGTERM to SIGKILL, and the ping's answer time */
    int max_inflight;
    const TwLimitsConf *limits; /* NULL: none */
} WrkMcpProgram;

/* The call ended: outcome (taken by the callee) as steps.c's tool outcomes ({"status","output"} or
 * {"status","error"}), or NULL when it was cancelled (wrk_mcp_cancel). Runs once, from the loop. */
typedef void (*WrkMcpDone)(json_t *outcome, double elapsed_sec, void *arg);
/* A notifications/progress of the call: its params ({progress, total?, message?}). */
typedef void (*WrkMcpProgress)(const json_t *params, void *arg);

WrkMcp *wrk_mcp_new(struct event_base *base);
/** Teardown: SIGKILL every server and free everything, without callbacks. Accepts NULL. */
void wrk_mcp_free(WrkMcp *m);
/** Call prog's tool with arguments (an object; a reference is kept) within timeout_sec: NULL with errno set
 *  when no server could be started (done is not called). The call is valid until done runs. */
WrkMcpCall *wrk_mcp_call(WrkMcp *m, const WrkMcpProgram *prog, json_t *arguments, int timeout_sec,
                         const char *label, WrkMcpDone done, WrkMcpProgress progress, void *arg);
/** The call is no longer wanted: notifications/cancelled to its server (when sent), and done runs now with a
 *  NULL outcome. */
void wrk_mcp_cancel(WrkMcpCall *c, const char *why);
/** For the SIGCHLD handler: false when pid is not a server. */
bool wrk_mcp_exited(WrkMcp *m, pid_t pid, int status, const struct rusage *ru);
/** Whether pid is a server that has not exited yet; m may be NULL. */
bool wrk_mcp_running(const WrkMcp *m, pid_t pid);
/** Shutdown: servers with no call end (EOF on stdin, then SIGTERM, then SIGKILL); no new ones start. */
void wrk_mcp_stop_idle(WrkMcp *m);
/** Servers still alive. */
size_t wrk_mcp_count(const WrkMcp *m);

#endif
