/* A child program of the worker, exec run or serve process alike (child.c): started by wrk_spawn (launch.c),
 * its three pipes and three timers on the loop (its deadline, the grace period from SIGTERM to SIGKILL, and
 * how long its pipes may stay open after it exited), its stderr to the log within a budget
 * (stderr_budget.h), its end told apart: what runner.c and serve.c share. */
#ifndef WRK_CHILD_H
#define WRK_CHILD_H

#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <time.h>

#include "config.h"
#include "launch.h"
#include "stderr_budget.h"

typedef enum {
    WRK_PROC_OK,       /* exited 0; output holds stdout */
    WRK_PROC_EXIT,     /* exited non-zero (exit_code) */
    WRK_PROC_SIGNAL,   /* killed by a signal it did not get from us (term_signal) */
    WRK_PROC_TIMEOUT,  /* outlived its time limit and was stopped */
    WRK_PROC_OVERSIZE, /* wrote more than the output limit to stdout and was stopped */
    WRK_PROC_STOPPED,  /* stopped on request (wrk_proc_stop) */
    WRK_PROC_SPAWN,    /* could not be started (spawn_errno) */
    WRK_PROC_LIMIT,    /* stopped by its CPU limit, or ended badly at its memory limit (limit, limit_value) */
} WrkProcOutcome;

typedef struct WrkProcResult {
    WrkProcOutcome outcome;
    int exit_code;
    int term_signal;
    bool killed_hard; /* needed SIGKILL */
    const char *output;
    size_t output_len;
    const char *stderr_tail; /* the last lines of stderr, for error messages */
    double elapsed_sec;
    int spawn_errno; /* WRK_PROC_SPAWN: errno of the failure (EMFILE: the worker is out of descriptors), or 0
                      */
    const char *spawn_why; /* WRK_PROC_SPAWN: why, when errno does not say it (wrk_spawn_why_take), or NULL */
    /* What it used, from wait4 (0 when not known), and with WRK_PROC_LIMIT the limit that stopped it. */
    double cpu_sec;    /* user + system */
    long maxrss_kb;    /* peak resident memory */
    const char *limit; /* "cpu_limit_seconds" or "memory_limit_mb" */
    long limit_value;  /* its value */
} WrkProcResult;

/* How far a stop has gone; each grace period moves it one further. EOF (stdin closed) is serve mode's first
 * step: a polite program exits. */
typedef enum { WRK_STOP_NONE, WRK_STOP_EOF, WRK_STOP_TERM, WRK_STOP_KILL } WrkStop;

typedef struct WrkChild {
    pid_t pid;
    const char *label; /* prefixes its log lines: the owner's, set before wrk_child_spawn */
    WrkPipe in_pipe, out_pipe, err_pipe;
    struct event *deadline, *grace, *drain;
    WrkStderr err;
    int grace_sec;
    WrkStop stop;
    bool stop_closes_stdin; /* serve mode: its stdin is closed at the first step of a stop */
    bool exited, killed_hard;
    int status;
    struct rusage ru;
    bool have_ru;
    TwLimitsConf limits; /* the numbers only (run_as_user is needed at the start only) */
    /* The owner's: read what stdout holds now (true at its end); look whether it is done (it exited and its
     * pipes are drained: wrk_child_drained). */
    bool (*out_read)(void *owner);
    void (*maybe_done)(void *owner);
    void *owner;
} WrkChild;

/** Start argv in c (label, grace_sec, out_read, maybe_done and owner set by the caller) with wrk_spawn, and
 *  make its pipes' events (in_cb and out_cb get the owner; stderr goes to c->err) and its timers (deadline_cb
 *  gets the owner), none of them added. 0, or -1 with errno set; on failure nothing is left (a process
 *  started is killed and reaped). */
int wrk_child_spawn(WrkChild *c, struct event_base *base, char *const argv[], char *const env_extra[],
                    const TwLimitsConf *limits, bool cpu_movable, event_callback_fn in_cb,
                    event_callback_fn out_cb, event_callback_fn deadline_cb)
    __attribute__((warn_unused_result));
/** One step further towards the end (to, if not there yet): SIGTERM, then SIGKILL after the grace period
 *  (its process group); nothing once it has exited. */
void wrk_child_stop(WrkChild *c, WrkStop to);
/** It exited with wait status `status` (ru: its resource usage, or NULL): recorded. */
void wrk_child_exited(WrkChild *c, int status, const struct rusage *ru);
/** After wrk_child_exited: no more deadline or grace, stdin closed, what its pipes hold taken now (WrkPipe
 *  in launch.h says why) and the rest waited for a second at most. The owner then looks whether it is done.
 */
void wrk_child_wind_up(WrkChild *c);
/** What a job whose program could not be started ends with (wrk_proc_start or wrk_serve_call gave NULL, or
 *  a serve process could not be replaced, with errno err): WRK_PROC_SPAWN, and why. */
WrkProcResult wrk_spawn_result(int err);
/** Whether it has exited, asked without waiting (wait4 WNOHANG): when it has, wrk_child_exited is done. */
bool wrk_child_reaped(WrkChild *c);
/** It has exited and its stdout and stderr are closed. */
bool wrk_child_drained(const WrkChild *c);
/** Close its pipes and free its timers. */
void wrk_child_free(WrkChild *c);
/** r of a program that has exited (r->elapsed_sec is the caller's): its stderr tail, what it wrote on stdout
 *  (out, made a string; out_len bytes; NULL: nothing) and its outcome (wrk_result_outcome). */
void wrk_child_result(const WrkChild *c, WrkProcResult *r, char *out, size_t out_len, bool stopped,
                      bool oversize, bool timed_out, long cpu_window);
/** Room for 4096 more bytes in *buf (len used, *cap allocated, one more for a NUL); false when out of memory.
 */
bool wrk_buf_room(char **buf, size_t len, size_t *cap);

/* A program's time limit holds whatever the loop sees first. The deadline timer runs on the loop's cached
 * clock, which can be behind when the program was started from a long callback: wrk_deadline_early re-arms it
 * for what is left and returns true when the whole time has not passed yet. A reply that reaches the worker
 * only after the limit (the worker frozen, the deadline and the reply ready together) is late, as if the
 * deadline had stopped the program first: wrk_reply_late says so in the log and returns true. */
bool wrk_deadline_early(struct event *deadline, const struct timespec *started, int64_t timeout_ms);
bool wrk_reply_late(const char *label, double elapsed_sec, int64_t timeout_ms);

/** Programs end with their step: the worker is the subreaper of what its programs start (prctl
 *  PR_SET_CHILD_SUBREAPER, set at its start), and each program the subreaper of what it starts
 *  (wrk_spawn). A process that leaves its program's group (setsid, setpgid) and whose parent ends while the
 *  program runs thus becomes the program's child; once the program itself has ended (its step or call is
 *  over, its serve process stopped), all it leaves behind, in its group or not, becomes the worker's child.
 *  So every child of the worker that is not one of its programs (ours(pid, arg) false; ours NULL: none is)
 *  was left behind by a program that has ended: each is sent SIGKILL (its process group too when it leads
 *  one), and what those leave behind comes to the worker in turn, to be ended at the next SIGCHLD. Called
 *  after each SIGCHLD's reaping. Returns how many were sent SIGKILL. */
int wrk_orphans_end(bool (*ours)(pid_t pid, void *arg), void *arg);

/** At the worker's end, after its programs were sent SIGKILL: end and reap every child it still has (what
 *  they left behind comes to it as they die), for at most ms milliseconds. */
void wrk_orphans_end_all(int ms);

/** Signal the process group of a program started by wrk_spawn (the program itself if that fails). */
void wrk_signal_group(pid_t pid, int sig);

/** Make pp->ev, a persistent event of what on the pipe (not added); false when out of memory. */
bool wrk_pipe_watch(WrkPipe *pp, struct event_base *base, short what, event_callback_fn cb, void *arg);
/** True when pp->fd is still its pipe. When it is another file now, says so in the log (label prefixes the
 *  line), frees the event and forgets the descriptor without closing it, and returns false; false too when
 *  unset. */
bool wrk_pipe_intact(WrkPipe *pp, const char *label);
/** Bytes written to the pipe that its reader has not read (0 when that cannot be told: FIONREAD). */
size_t wrk_pipe_unread(WrkPipe *pp, const char *label);
/** True when the pipe's reader is gone (or pp is no longer its pipe, see wrk_pipe_intact). */
bool wrk_pipe_hung_up(WrkPipe *pp, const char *label);
/** Write buf[*off..len) to the pipe, moving *off on: 0 when all of it is written, 1 when the pipe is full
 *  (try again when it is writable), -1 with errno set on an error (EPIPE: its reader is gone). */
int wrk_pipe_write(WrkPipe *pp, const char *buf, size_t len, size_t *off);
/** Free the event and close the descriptor, once (an unset pipe is left alone); a descriptor that is no
 * longer its pipe is forgotten, not closed (wrk_pipe_intact). */
void wrk_pipe_close(WrkPipe *pp, const char *label);
/** r->outcome (and exit_code, term_signal) of a program that has exited with wait status `status`, after
 *  we stopped it on request (stopped), for writing too much (oversize) or at its time limit (timed_out), or
 *  on its own; with its resource usage ru (NULL: unknown), its limits (NULL: none) and cpu_window, the CPU
 *  seconds its RLIMIT_CPU allows in all (a serve process's moves per request). A program that ended on its
 * own by SIGXCPU, by SIGKILL with its CPU time at that window, or badly (a signal, an exit status other than
 * 0) with a peak resident memory of at least WRK_MEMORY_LIMIT_PERCENT of its memory limit is WRK_PROC_LIMIT:
 * an allocation past RLIMIT_DATA just fails, and this is how the worker tells that apart from any other
 * failure. */
void wrk_result_outcome(WrkProcResult *r, bool stopped, bool oversize, bool timed_out, int status,
                        const struct rusage *ru, const TwLimitsConf *limits, long cpu_window);
#define WRK_MEMORY_LIMIT_PERCENT 80
/** Seconds since t0 (CLOCK_MONOTONIC). */
double wrk_elapsed_sec(const struct timespec *t0);

#endif
