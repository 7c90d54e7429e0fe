/* Starting an agent or tool program: fork and execve with its argv (never a shell, no PATH search) in a
 * process group of its own, its stdin, stdout and stderr pipes to the worker, and the limits of its section
 * (docs/security.md: memory, CPU, open files, processes, another user) set in its process before execve.
 */
#ifndef WRK_LAUNCH_H
#define WRK_LAUNCH_H

#include <stdbool.h>
#include <sys/types.h>

#include "config.h"

struct event;

/* One end of a program's pipe, watched by the loop. Which pipe it is (device and inode) is kept: a descriptor
 * that something else in the process closes behind the worker's back (a double close) comes back as another
 * file under the same number, and the worker must then neither read that file nor close it. Such a close also
 * leaves libevent believing the number is still watched, so that a new pipe under it is never reported:
 * wrk_proc_exited therefore reads what a program left in its pipes itself, not only when told they are
 * readable. */
typedef struct WrkPipe {
    struct event *ev;
    int fd;
    const char *name; /* "stdin", "stdout", "stderr" */
    dev_t dev;
    ino_t ino;
} WrkPipe;

/** True when l (may be NULL) sets any limit or a user. */
bool wrk_limits_any(const TwLimitsConf *l);

/** Start argv[0] with argv in its own process group, the subreaper of what it starts (a process it starts
 *  whose parent ends becomes its child, not the worker's: see wrk_orphans_end in child.h), with the
 * environment without inherited TURNWATCH_* variables plus env_extra ("K=V", NULL-terminated), its stdin,
 * stdout and stderr pipes to us (non-blocking, close-on-exec) in in, out and err (unset, fd -1, when it
 * fails), default signal dispositions, an empty signal mask and no other descriptor of ours. With limits
 * (wrk_limits_any), they are set in its process before execve: RLIMIT_DATA, RLIMIT_CPU (SIGXCPU at the limit,
 * SIGKILL one second later; with cpu_movable, for a serve process, the hard limit is left where it is when
 * the worker cannot raise it later, without CAP_SYS_RESOURCE: see wrk_cpu_window), RLIMIT_NOFILE,
 * RLIMIT_NPROC, and run_as_user (its group, no supplementary groups, its HOME, USER and LOGNAME,
 * PR_SET_NO_NEW_PRIVS). Returns 0, or -1 with errno set (what failed is logged). */
int wrk_spawn(char *const argv[], char *const env_extra[], const TwLimitsConf *limits, bool cpu_movable,
              pid_t *pid, WrkPipe *in, WrkPipe *out, WrkPipe *err) __attribute__((warn_unused_result));

/** Why the last start that failed could not start its program, in words, when the worker knows better than
 *  errno (its run_as_user does not exist, a limit could not be set), or NULL; taken once (the next call
 *  gives NULL until another start fails so), and valid until the next call. */
const char *wrk_spawn_why_take(void);

/** A serve process's CPU limit for its next request: cpu_limit_sec more seconds than it has used so far
 *  (whole seconds, rounded up): its soft RLIMIT_CPU, and its hard one a second above when the worker may
 *  raise it (CAP_SYS_RESOURCE, which root normally has). Returns the new soft limit, or -1 with errno set. */
long wrk_cpu_window(pid_t pid, int cpu_limit_sec);

#endif
