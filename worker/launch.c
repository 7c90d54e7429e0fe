/* Starting agent and tool programs, with the limits of their section. */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"

extern char **environ;

/* A pipe end of ours: non-blocking, close-on-exec, and which pipe it is. */
static void pipe_keep(WrkPipe *pp, int fd)
{
    struct stat st;

    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    pp->fd = fd;
    if (fstat(fd, &st) == 0) {
        pp->dev = st.st_dev;
        pp->ino = st.st_ino;
    }
}

/* The environment of environ without what is the worker's own, plus env_extra, plus user_env (HOME, USER,
 * LOGNAME of run_as_user, which replace the worker's). The strings are borrowed. */
static char **build_env(char *const env_extra[], char *const user_env[])
{
    size_t n = 0, m = 0, u = 0;
    char **env;

    while (environ[n])
        n++;
    while (env_extra[m])
        m++;
    while (user_env && user_env[u])
        u++;
    if (!(env = calloc(n + m + u + 1, sizeof *env)))
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        /* Our own variables come from env_extra only, never inherited; systemd's notify socket and watchdog
         * are the worker's, not its programs'. */
        bool skip =
            strncmp(environ[i], "TURNWATCH_", 10) == 0 || strncmp(environ[i], "NOTIFY_SOCKET=", 14) == 0 ||
            strncmp(environ[i], "WATCHDOG_USEC=", 14) == 0 || strncmp(environ[i], "WATCHDOG_PID=", 13) == 0;
        for (size_t j = 0; j < u && !skip; j++) {
            size_t name = (size_t)(strchr(user_env[j], '=') - user_env[j]) + 1;
            skip = strncmp(environ[i], user_env[j], name) == 0;
        }
        if (!skip)
            env[k++] = environ[i];
    }
    for (size_t i = 0; i < m; i++)
        env[k++] = env_extra[i];
    for (size_t i = 0; i < u; i++)
        env[k++] = user_env[i];
    env[k] = NULL;
    return env;
}

/* Why the last failed start failed, when errno does not say it (wrk_spawn_why_take). */
static char spawn_why[512];

const char *wrk_spawn_why_take(void)
{
    static char taken[sizeof spawn_why];

    if (!spawn_why[0])
        return NULL;
    memcpy(taken, spawn_why, sizeof taken);
    spawn_why[0] = '\0';
    return taken;
}

bool wrk_limits_any(const TwLimitsConf *l)
{
    return l && (l->memory_limit_mb > 0 || l->cpu_limit_sec > 0 || l->max_open_files > 0 ||
                 l->max_processes > 0 || (l->run_as_user && *l->run_as_user));
}

/* ---- the child's side of a start with limits */

/* What is done between fork and execve, in this order; a step that fails is reported to the parent. */
typedef enum {
    STEP_PGROUP,
    STEP_SUBREAPER,
    STEP_PIPES,
    STEP_DATA,
    STEP_CPU,
    STEP_NOFILE,
    STEP_NPROC,
    STEP_GROUPS,
    STEP_GID,
    STEP_UID,
    STEP_NO_NEW_PRIVS,
    STEP_EXEC,
} SpawnStep;

static const char *const step_names[] = {
    [STEP_PGROUP] = "setpgid",
    [STEP_SUBREAPER] = "prctl(PR_SET_CHILD_SUBREAPER)",
    [STEP_PIPES] = "dup2 of its pipes",
    [STEP_DATA] = "setrlimit(RLIMIT_DATA) for memory_limit_mb",
    [STEP_CPU] = "setrlimit(RLIMIT_CPU) for cpu_limit_seconds",
    [STEP_NOFILE] = "setrlimit(RLIMIT_NOFILE) for max_open_files",
    [STEP_NPROC] = "setrlimit(RLIMIT_NPROC) for max_processes",
    [STEP_GROUPS] = "setgroups (no supplementary groups) for run_as_user",
    [STEP_GID] = "setresgid for run_as_user",
    [STEP_UID] = "setresuid for run_as_user",
    [STEP_NO_NEW_PRIVS] = "prctl(PR_SET_NO_NEW_PRIVS)",
    [STEP_EXEC] = "execve",
};

typedef struct SpawnFail {
    int step, err;
} SpawnFail;

/* Everything the child needs, made before fork: after it, the child of a process with threads (nats.c's,
 * libpq's) may only make async-signal-safe calls. */
typedef struct SpawnPlan {
    char *const *argv;
    char **env;
    int in_r, out_w, err_w, report;
    struct {
        int resource, step;
        struct rlimit rl;
    } rl[4];
    int n_rl;
    bool as_user;
    uid_t uid;
    gid_t gid;
    int max_fd; /* above the highest descriptor this process may have */
} SpawnPlan;

/* The child of vfork shares the worker's memory until execve: it writes nothing but its own stack (and
 * errno), and is not instrumented (a sanitizer's bookkeeping in it would be the worker's). */
#define CHILD_SIDE __attribute__((noreturn, no_sanitize("address", "undefined")))

CHILD_SIDE static void child_fail(const SpawnPlan *pl, SpawnStep step)
{
    SpawnFail f = {step, errno};
    ssize_t n = write(pl->report, &f, sizeof f);
    (void)n;
    _exit(127);
}

/* Raw system calls for the ids: they change this thread only, which is all there is after fork, and need
 * none of libc's coordination of threads. */
CHILD_SIDE static void child_run(const SpawnPlan *pl)
{
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigset_t none;

    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP)
            sigaction(sig, &dfl, NULL); /* libc's own signals refuse: harmless */
    if (setpgid(0, 0) != 0)
        child_fail(pl, STEP_PGROUP);
    /* What it starts and orphans while it runs becomes its child, not the worker's: the worker ends every
     * process that comes to it (wrk_orphans_end), and those of a program that still runs must live on. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
        child_fail(pl, STEP_SUBREAPER);
    if (dup2(pl->in_r, 0) < 0 || dup2(pl->out_w, 1) < 0 || dup2(pl->err_w, 2) < 0)
        child_fail(pl, STEP_PIPES);
    for (int i = 0; i < pl->n_rl; i++)
        if (setrlimit(pl->rl[i].resource, &pl->rl[i].rl) != 0)
            child_fail(pl, (SpawnStep)pl->rl[i].step);
    if (pl->as_user) {
        if (syscall(SYS_setgroups, 0, NULL) != 0)
            child_fail(pl, STEP_GROUPS);
        if (syscall(SYS_setresgid, pl->gid, pl->gid, pl->gid) != 0)
            child_fail(pl, STEP_GID);
        if (syscall(SYS_setresuid, pl->uid, pl->uid, pl->uid) != 0)
            child_fail(pl, STEP_UID);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
            child_fail(pl, STEP_NO_NEW_PRIVS);
    }
    /* No descriptor of ours but the three: the rest close at execve (the report pipe too, which says then
     * that all went well). A kernel before 5.11 has no CLOSE_RANGE_CLOEXEC: one by one then. */
    if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) != 0)
        for (int fd = 3; fd < pl->max_fd; fd++)
            fcntl(fd, F_SETFD, FD_CLOEXEC);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(pl->argv[0], pl->argv, pl->env);
    child_fail(pl, STEP_EXEC);
}

static void plan_rlimit(SpawnPlan *pl, int resource, SpawnStep step, rlim_t soft, rlim_t hard)
{
    pl->rl[pl->n_rl].resource = resource;
    pl->rl[pl->n_rl].step = step;
    pl->rl[pl->n_rl].rl = (struct rlimit){soft, hard};
    pl->n_rl++;
}

/* Whether this process may raise a hard resource limit (CAP_SYS_RESOURCE; root without it, as in some
 * containers, may not). */
static bool can_raise_limits(void)
{
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];

    if (syscall(SYS_capget, &hdr, data) != 0)
        return false;
    return data[CAP_TO_INDEX(CAP_SYS_RESOURCE)].effective & CAP_TO_MASK(CAP_SYS_RESOURCE);
}

/* The child's pid, or -1 with errno set; the child runs pl. Alone in a function of its own: nothing of the
 * caller's frame is live across vfork. */
__attribute__((noinline)) static pid_t vfork_run(const SpawnPlan *pl)
{
    pid_t child = vfork();

    if (child == 0)
        child_run(pl);
    return child;
}

/* vfork, the limits (l: NULL for none), execve; the child's failure before execve comes back through a
 * close-on-exec pipe. Every program is started so, not with posix_spawn: it must be made the subreaper of
 * its descendants between the two, which posix_spawn cannot do. vfork, not fork: the worker's page tables
 * are not copied for every step (fork cost three times the CPU of posix_spawn for a 20 MB process, vfork the
 * same as posix_spawn, which glibc does with a vfork-style clone). */
static int spawn_forked(SpawnPlan *pl, const TwLimitsConf *l, bool cpu_movable, pid_t *pid)
{
    static const TwLimitsConf none = {0};
    int report[2];
    sigset_t all, old;
    SpawnFail f;
    ssize_t n;

    if (!l)
        l = &none;
    if (l->memory_limit_mb > 0)
        plan_rlimit(pl, RLIMIT_DATA, STEP_DATA, (rlim_t)l->memory_limit_mb << 20,
                    (rlim_t)l->memory_limit_mb << 20);
    if (l->cpu_limit_sec > 0) {
        /* A serve process gets a new window per request (wrk_cpu_window); a hard limit can only be raised
         * with CAP_SYS_RESOURCE, so a worker without it leaves that where it is. */
        struct rlimit cur = {RLIM_INFINITY, RLIM_INFINITY};
        getrlimit(RLIMIT_CPU, &cur);
        rlim_t soft = (rlim_t)l->cpu_limit_sec;
        plan_rlimit(pl, RLIMIT_CPU, STEP_CPU, soft,
                    cpu_movable && !can_raise_limits() ? cur.rlim_max : soft + 1);
    }
    if (l->max_open_files > 0)
        plan_rlimit(pl, RLIMIT_NOFILE, STEP_NOFILE, (rlim_t)l->max_open_files, (rlim_t)l->max_open_files);
    if (l->max_processes > 0)
        plan_rlimit(pl, RLIMIT_NPROC, STEP_NPROC, (rlim_t)l->max_processes, (rlim_t)l->max_processes);
    struct rlimit nofile = {1024, 1024};
    getrlimit(RLIMIT_NOFILE, &nofile);
    pl->max_fd =
        nofile.rlim_cur == RLIM_INFINITY || nofile.rlim_cur > 1048576 ? 1048576 : (int)nofile.rlim_cur;
    if (pipe2(report, O_CLOEXEC) != 0)
        return -1;
    pl->report = report[1];
    /* No handler of ours may run in the child (libevent's would write into the worker's own socket). */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    *pid = vfork_run(pl);
    int fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(report[1]);
    if (*pid < 0) {
        close(report[0]);
        errno = fork_errno;
        return -1;
    }
    while ((n = read(report[0], &f, sizeof f)) < 0 && errno == EINTR)
        ;
    close(report[0]);
    if (n != (ssize_t)sizeof f)
        return 0; /* EOF: execve went through */
    while (waitpid(*pid, NULL, 0) < 0 && errno == EINTR)
        ;
    const char *step = f.step >= 0 && f.step <= STEP_EXEC ? step_names[f.step] : "a step";
    bool nproc = f.step == STEP_EXEC && f.err == EAGAIN && l->max_processes > 0;
    log_error("program %s: %s failed in its process before it started: %s%s", pl->argv[0], step,
              strerror(f.err), nproc ? " (its user has max_processes processes already)" : "");
    if (nproc)
        snprintf(spawn_why, sizeof spawn_why, "its user has max_processes (%d) processes already",
                 l->max_processes);
    else if (f.step != STEP_EXEC)
        snprintf(spawn_why, sizeof spawn_why, "%s failed: %s", step, strerror(f.err));
    errno = f.err;
    return -1;
}

int wrk_spawn(char *const argv[], char *const env_extra[], const TwLimitsConf *limits, bool cpu_movable,
              pid_t *pid, WrkPipe *in, WrkPipe *out, WrkPipe *err_p)
{
    int in_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    char *user_env[4] = {NULL};
    SpawnPlan pl = {.argv = argv};
    bool limited = wrk_limits_any(limits);
    int err, rc;

    spawn_why[0] = '\0';
    *in = (WrkPipe){.fd = -1, .name = "stdin"};
    *out = (WrkPipe){.fd = -1, .name = "stdout"};
    *err_p = (WrkPipe){.fd = -1, .name = "stderr"};
    if (limited && limits->run_as_user && *limits->run_as_user) {
        struct passwd pw, *found = NULL;
        char buf[4096];
        int e = getpwnam_r(limits->run_as_user, &pw, buf, sizeof buf, &found);
        if (!found) {
            log_error("program %s: run_as_user %s: %s", argv[0], limits->run_as_user,
                      e ? strerror(e) : "no such user");
            if (e)
                snprintf(spawn_why, sizeof spawn_why, "its run_as_user %s could not be looked up: %s",
                         limits->run_as_user, strerror(e));
            else
                snprintf(spawn_why, sizeof spawn_why, "its run_as_user %s does not exist on this host",
                         limits->run_as_user);
            errno = e ? e : ENOENT;
            return -1;
        }
        pl.as_user = true;
        pl.uid = pw.pw_uid;
        pl.gid = pw.pw_gid;
        if (asprintf(&user_env[0], "HOME=%s", pw.pw_dir) < 0 ||
            asprintf(&user_env[1], "USER=%s", pw.pw_name) < 0 ||
            asprintf(&user_env[2], "LOGNAME=%s", pw.pw_name) < 0) {
            errno = ENOMEM;
            goto fail;
        }
    }
    if (!(pl.env = build_env(env_extra, pl.as_user ? user_env : NULL)))
        goto fail;
    if (pipe2(in_pipe, O_CLOEXEC) || pipe2(out_pipe, O_CLOEXEC) || pipe2(err_pipe, O_CLOEXEC))
        goto fail;
    pl.in_r = in_pipe[0];
    pl.out_w = out_pipe[1];
    pl.err_w = err_pipe[1];
    rc = spawn_forked(&pl, limited ? limits : NULL, cpu_movable, pid);
    if (rc != 0)
        goto fail;
    free(pl.env);
    for (size_t i = 0; i < 3; i++)
        free(user_env[i]);
    close(in_pipe[0]);
    close(out_pipe[1]);
    close(err_pipe[1]);
    pipe_keep(in, in_pipe[1]);
    pipe_keep(out, out_pipe[0]);
    pipe_keep(err_p, err_pipe[0]);
    return 0;

fail:
    err = errno;
    for (int i = 0; i < 2; i++) {
        if (in_pipe[i] >= 0)
            close(in_pipe[i]);
        if (out_pipe[i] >= 0)
            close(out_pipe[i]);
        if (err_pipe[i] >= 0)
            close(err_pipe[i]);
    }
    free(pl.env);
    for (size_t i = 0; i < 3; i++)
        free(user_env[i]);
    errno = err;
    return -1;
}

long wrk_cpu_window(pid_t pid, int cpu_limit_sec)
{
    char path[64], buf[1024];
    unsigned long long utime, stime;
    long ticks = sysconf(_SC_CLK_TCK);
    FILE *f;
    size_t n;

    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (!(f = fopen(path, "re")))
        return -1;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* pid (comm) state ppid ... utime stime: fields 14 and 15, counted after the last ')' (comm may hold
     * anything). */
    const char *p = strrchr(buf, ')');
    if (!p || ticks <= 0 ||
        sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2) {
        errno = EINVAL;
        return -1;
    }
    rlim_t soft = (rlim_t)((utime + stime + (unsigned long long)ticks - 1) / (unsigned long long)ticks) +
                  (rlim_t)cpu_limit_sec;
    struct rlimit rl = {soft, soft + 1};
    if (!can_raise_limits() && prlimit(pid, RLIMIT_CPU, NULL, &rl) == 0) {
        rl.rlim_cur = soft; /* without CAP_SYS_RESOURCE, the hard limit stays the one it started with */
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < soft)
            rl.rlim_cur = rl.rlim_max;
    }
    if (prlimit(pid, RLIMIT_CPU, &rl, NULL) != 0)
        return -1;
    return (long)rl.rlim_cur;
}
