/* Running one agent or tool program: execve with an argv (never a shell), the step document on stdin,
 * one JSON reply on stdout (at most TW_DOC_MAX bytes), stderr lines to the log (at most a budget per run,
 * see runner.c), and a time limit enforced with SIGTERM then SIGKILL after a grace period, to the whole
 * process group. */
#ifndef WRK_RUNNER_H
#define WRK_RUNNER_H

#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "config.h"
#include "launch.h"

struct rusage;

typedef struct WrkProc WrkProc;

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
    /* What it used, from wait4 (0 when not known), and with WRK_PROC_LIMIT the limit that stopped it. */
    double cpu_sec;    /* user + system */
    long maxrss_kb;    /* peak resident memory */
    const char *limit; /* "cpu_limit_seconds" or "memory_limit_mb" */
    long limit_value;  /* its value */
} WrkProcResult;

typedef void (*WrkProcDone)(WrkProc *proc, const WrkProcResult *result, void *arg);

/** Start argv[0] with argv, the current environment plus env_extra ("K=V", NULL-terminated), input on
 *  stdin, and limits (NULL: none; kept until done has run, see wrk_spawn). done runs once, from the loop,
 *  after the process has exited and its pipes are drained; the proc is freed after done returns. label
 *  prefixes its log lines. NULL (logged) with errno set when it cannot be started. */
WrkProc *wrk_proc_start(struct event_base *base, char *const argv[], char *const env_extra[],
                        const TwLimitsConf *limits, const char *input, size_t input_len, int timeout_sec,
                        int grace_sec, const char *label, WrkProcDone done, void *arg);
/** Stop it now (SIGTERM, SIGKILL after the grace period); done still runs, with WRK_PROC_STOPPED. */
void wrk_proc_stop(WrkProc *proc, const char *why);
/** Call for every child reaped by the SIGCHLD handler (with wait4: ru its resource usage, or NULL); false
 *  when pid is not one of the procs. */
bool wrk_proc_exited(pid_t pid, int status, const struct rusage *ru);
/** Number of procs still alive. */
size_t wrk_proc_count(void);

/* ---- shared with serve.c (long-lived programs) */

/* What a program writes on stderr: lines go to the log, at most STDERR_LOG_LINES lines or STDERR_LOG_BYTES
 * bytes per run (a serve program: per request); past the budget they are counted, and one line at the end of
 * the run says how many were dropped. The last STDERR_TAIL bytes are kept for error messages whatever the
 * budget. */
#define WRK_STDERR_TAIL 1024
#define WRK_STDERR_LINE 512
typedef struct WrkStderr {
    const char *label; /* prefixes the log lines; the caller's, may change between runs */
    char tail[WRK_STDERR_TAIL];
    size_t tail_len;
    char line[WRK_STDERR_LINE];
    size_t line_len;
    size_t logged_lines, logged_bytes;   /* against the budget */
    size_t dropped_lines, dropped_bytes; /* past the budget */
} WrkStderr;

/** Log the complete lines of n more bytes of stderr. */
void wrk_stderr_feed(WrkStderr *e, const char *buf, size_t n);
/** Read and feed what the non-blocking fd holds; true at EOF (or a read error): then close it. */
bool wrk_stderr_read(WrkStderr *e, int fd);
/** End of a run: log the last partial line and how many lines were dropped, then start a new budget (the
 *  tail stays until wrk_stderr_clear_tail). */
void wrk_stderr_end_run(WrkStderr *e);
void wrk_stderr_clear_tail(WrkStderr *e);

/* A program's time limit holds whatever the loop sees first. The deadline timer runs on the loop's cached
 * clock, which can be behind when the program was started from a long callback: wrk_deadline_early re-arms it
 * for what is left and returns true when the whole time has not passed yet. A reply that reaches the worker
 * only after the limit (the worker frozen, the deadline and the reply ready together) is late, as if the
 * deadline had stopped the program first: wrk_reply_late says so in the log and returns true. */
bool wrk_deadline_early(struct event *deadline, const struct timespec *started, int64_t timeout_ms);
bool wrk_reply_late(const char *label, double elapsed_sec, int64_t timeout_ms);

/** Signal the process group of a program started by wrk_spawn (the program itself if that fails). */
void wrk_signal_group(pid_t pid, int sig);

/** Make pp->ev, a persistent event of what on the pipe (not added); false when out of memory. */
bool wrk_pipe_watch(WrkPipe *pp, struct event_base *base, short what, event_callback_fn cb, void *arg);
/** True when pp->fd is still its pipe. When it is another file now, says so in the log (label prefixes the
 *  line), frees the event and forgets the descriptor without closing it, and returns false; false too when
 *  unset. */
bool wrk_pipe_intact(WrkPipe *pp, const char *label);
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
