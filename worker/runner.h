/* Running one agent or tool program: execve with an argv (never a shell), the step document on stdin,
 * one JSON reply on stdout (at most TW_DOC_MAX bytes), stderr lines to the log (at most a budget per run,
 * see runner.c), and a time limit enforced with SIGTERM then SIGKILL after a grace period, to the whole
 * process group. */
#ifndef WRK_RUNNER_H
#define WRK_RUNNER_H

#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct WrkProc WrkProc;

typedef enum {
    WRK_PROC_OK,       /* exited 0; output holds stdout */
    WRK_PROC_EXIT,     /* exited non-zero (exit_code) */
    WRK_PROC_SIGNAL,   /* killed by a signal it did not get from us (term_signal) */
    WRK_PROC_TIMEOUT,  /* outlived its time limit and was stopped */
    WRK_PROC_OVERSIZE, /* wrote more than the output limit to stdout and was stopped */
    WRK_PROC_STOPPED,  /* stopped on request (wrk_proc_stop) */
    WRK_PROC_SPAWN,    /* could not be started */
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
} WrkProcResult;

typedef void (*WrkProcDone)(WrkProc *proc, const WrkProcResult *result, void *arg);

/** Start argv[0] with argv, the current environment plus env_extra ("K=V", NULL-terminated), input on
 *  stdin. done runs once, from the loop, after the process has exited and its pipes are drained; the
 *  proc is freed after done returns. label prefixes its log lines. */
WrkProc *wrk_proc_start(struct event_base *base, char *const argv[], char *const env_extra[],
                        const char *input, size_t input_len, int timeout_sec, int grace_sec,
                        const char *label, WrkProcDone done, void *arg);
/** Stop it now (SIGTERM, SIGKILL after the grace period); done still runs, with WRK_PROC_STOPPED. */
void wrk_proc_stop(WrkProc *proc, const char *why);
/** Call from the SIGCHLD handler: reaps every exited child and completes their procs. */
void wrk_proc_reap_children(void);
/** Number of procs still alive. */
size_t wrk_proc_count(void);

#endif
