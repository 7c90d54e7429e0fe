/* Serve mode (docs/protocol.md): long-lived agent and tool programs, one per worker slot. A program is
 * started the first time a step (or call) of its agent (or tool) needs one and kept; each request is one
 * JSON line on its stdin, its reply one line on its stdout. A process is replaced after max_requests, and
 * when it exits, writes a bad line, writes between requests, or outlives a request's time limit (SIGTERM,
 * then SIGKILL after the grace period, to its process group); only the request it was serving fails, with
 * the outcome exec mode would report. A request it was given but had not read a byte of when it exited,
 * closed a pipe or wrote something (it did that between requests) goes to a new process instead, once.
 * Requests are handed out on the worker's loop, never blocking it. */
/* A process's life (worker/serve.c: every move through srv_set_state, checked against its move table):
 *   IDLE     --wrk_serve_call-->                 BUSY (take_idle first makes sure it has not exited, written
 *                                                anything or closed a pipe since its last reply)
 *   BUSY     --reply line-->                     REPLYING while the job reads the reply (no request is
 *                                                given to it, it counts as no live process), then IDLE, or
 *                                                RETIRING (max_requests, a bad or extra line, more
 *                                                processes than slots)
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
#ifndef WRK_SERVE_H
#define WRK_SERVE_H

#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "child.h"

typedef struct WrkServe WrkServe;
typedef struct WrkServeProc WrkServeProc;
typedef struct WrkServeReq WrkServeReq; /* one request, whichever process serves it */

/* Which program serves a request. A process may serve any agent (or tool) configured with the same program,
 * grace, max_requests and limits: the agent, turn and epoch are in each document, so the many agents of one
 * program share the slots' processes instead of each keeping processes of its own. */
typedef struct WrkServeProgram {
    const char *kind; /* "agent" or "tool": their documents differ */
    const char *exec; /* the exec line as configured */
    char *const *argv;
    int grace_sec; /* SIGTERM to SIGKILL */
    int max_requests;
    const TwLimitsConf *limits; /* NULL: none; its CPU limit is per request */
} WrkServeProgram;

/* The request ended: r as wrk_proc_start's done gets it (output: the reply line without its newline). Runs
 * once, from the loop. Return false when an OK reply was not usable (not a reply object): the process is
 * then replaced. */
typedef bool (*WrkServeDone)(const WrkProcResult *r, void *arg);

/** All the serve processes of a worker; at most max_procs of them (the worker's slots) are kept. */
WrkServe *wrk_serve_new(struct event_base *base, int max_procs);
/** Teardown: SIGKILL whatever still runs and free everything, without callbacks. Accepts NULL. */
void wrk_serve_free(WrkServe *s);
/** Send doc (one JSON document without newlines) to an idle process of prog, started if none is idle.
 *  NULL with errno set when no process could be started (done is not called). label prefixes the request's
 *  log lines. prog's strings and argv are kept, not copied: they must last until done has run (or
 *  wrk_serve_free). The request is valid until done runs. */
WrkServeReq *wrk_serve_call(WrkServe *s, const WrkServeProgram *prog, const char *doc, size_t len,
                            int timeout_sec, const char *label, WrkServeDone done, void *arg);
/** Stop the request's process now (SIGTERM, SIGKILL after the grace period); done still runs, with
 *  WRK_PROC_STOPPED, once it has exited. */
void wrk_serve_cancel(WrkServeReq *q, const char *why);
/** For the SIGCHLD handler (ru: the resource usage wait4 gave, or NULL): false when pid is not a serve
 *  process. */
bool wrk_serve_exited(WrkServe *s, pid_t pid, int status, const struct rusage *ru);
/** Whether pid is a serve process that has not exited yet (for wrk_orphans_end); s may be NULL. */
bool wrk_serve_running(const WrkServe *s, pid_t pid);
/** Shutdown: replace no more, end the idle processes (EOF on stdin, then SIGTERM, then SIGKILL). */
void wrk_serve_stop_idle(WrkServe *s);
/** Processes still alive (idle, serving, or on their way out). */
size_t wrk_serve_count(const WrkServe *s);

#endif
