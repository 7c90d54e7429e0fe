/* Running one agent or tool program: execve with an argv (never a shell), the step document on stdin,
 * one JSON reply on stdout (at most TW_DOC_MAX bytes), stderr lines to the log (at most a budget per run,
 * see stderr_budget.h), and a time limit enforced with SIGTERM then SIGKILL after a grace period, to the
 * whole process group. */
#ifndef WRK_RUNNER_H
#define WRK_RUNNER_H

#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "child.h"
#include "config.h"

struct rusage;

typedef struct WrkProc WrkProc;

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
/** Whether pid is a proc that has not exited yet (for wrk_orphans_end). */
bool wrk_proc_running(pid_t pid);
/** Number of procs still alive. */
size_t wrk_proc_count(void);

#endif
