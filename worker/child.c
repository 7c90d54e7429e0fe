/* A child program of the worker: what exec runs (runner.c) and serve processes (serve.c) share. */
#include "child.h"

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"

/* After the program exits, how long its pipes may stay open (a grandchild holding them). */
#define DRAIN_AFTER_EXIT_MS 1000

bool wrk_pipe_watch(WrkPipe *pp, struct event_base *base, short what, event_callback_fn cb, void *arg)
{
    pp->ev = event_new(base, pp->fd, what | EV_PERSIST, cb, arg);
    return pp->ev != NULL;
}

bool wrk_pipe_intact(WrkPipe *pp, const char *label)
{
    struct stat st;

    if (pp->fd < 0)
        return false;
    bool gone = fstat(pp->fd, &st) != 0;
    if (!gone && st.st_dev == pp->dev && st.st_ino == pp->ino)
        return true;
    log_error(
        "%s: its %s pipe (descriptor %d) was closed behind the worker's back (%s): something in this "
        "process closed a descriptor twice; whatever the program wrote there is lost, and the descriptor "
        "is left to its new owner",
        label, pp->name, pp->fd, gone ? "now unused" : "now another file");
    if (pp->ev) {
        event_free(pp->ev);
        pp->ev = NULL;
    }
    pp->fd = -1;
    return false;
}

void wrk_pipe_close(WrkPipe *pp, const char *label)
{
    bool ours = wrk_pipe_intact(pp, label);

    if (pp->ev) {
        event_free(pp->ev);
        pp->ev = NULL;
    }
    if (ours)
        close(pp->fd);
    pp->fd = -1;
}

size_t wrk_pipe_unread(WrkPipe *pp, const char *label)
{
    int n = 0;

    if (!wrk_pipe_intact(pp, label) || ioctl(pp->fd, FIONREAD, &n) != 0 || n < 0)
        return 0;
    return (size_t)n;
}

bool wrk_pipe_hung_up(WrkPipe *pp, const char *label)
{
    struct pollfd in = {.fd = pp->fd, .events = POLLOUT};

    return !wrk_pipe_intact(pp, label) ||
           (poll(&in, 1, 0) == 1 && (in.revents & (POLLERR | POLLHUP | POLLNVAL)));
}

int wrk_pipe_write(WrkPipe *pp, const char *buf, size_t len, size_t *off)
{
    while (*off < len) {
        ssize_t n = write(pp->fd, buf + *off, len - *off);
        if (n < 0)
            return errno == EAGAIN || errno == EINTR ? 1 : -1;
        *off += (size_t)n;
    }
    return 0;
}

void wrk_signal_group(pid_t pid, int sig)
{
    /* The program runs in its own process group: stop what it started too. */
    if (kill(-pid, sig) != 0)
        kill(pid, sig);
}

/* The children of this process, from /proc/self/task/TID/children (a process's children hang on the
 * thread that started them, or, reparented, on any of its threads): up to max of them into pids; how many. */
static int children_of_self(pid_t *pids, int max)
{
    DIR *tasks = opendir("/proc/self/task");
    struct dirent *t;
    int n = 0;

    if (!tasks)
        return 0;
    while ((t = readdir(tasks)) && n < max) {
        char path[64];
        if (t->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%.20s/children", t->d_name);
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        int pid;
        while (n < max && fscanf(f, "%d", &pid) == 1)
            pids[n++] = (pid_t)pid;
        fclose(f);
    }
    closedir(tasks);
    return n;
}

int wrk_orphans_end(bool (*ours)(pid_t pid, void *arg), void *arg)
{
    pid_t pids[1024];
    char list[256];
    size_t len = 0;
    int n = children_of_self(pids, (int)(sizeof pids / sizeof pids[0])), ended = 0;

    list[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (ours && ours(pids[i], arg))
            continue;
        /* A child of ours stays what it is until we reap it: its pid cannot be another process's now. */
        if (getpgid(pids[i]) == pids[i])
            kill(-pids[i], SIGKILL);
        if (kill(pids[i], SIGKILL) != 0)
            continue;
        ended++;
        if (len < sizeof list - 16)
            len += (size_t)snprintf(list + len, sizeof list - len, " %d", (int)pids[i]);
    }
    if (ended)
        log_info("ended %d process(es) left behind by programs that have ended (pid%s)", ended, list);
    return ended;
}

void wrk_orphans_end_all(int ms)
{
    pid_t pids[1024];
    struct timespec t0, tick = {0, 10 * 1000 * 1000};

    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        int n = children_of_self(pids, (int)(sizeof pids / sizeof pids[0]));
        if (n == 0 || wrk_elapsed_sec(&t0) * 1000.0 >= ms)
            break;
        for (int i = 0; i < n; i++) {
            if (getpgid(pids[i]) == pids[i])
                kill(-pids[i], SIGKILL);
            kill(pids[i], SIGKILL);
        }
        nanosleep(&tick, NULL);
    }
}

bool wrk_deadline_early(struct event *deadline, const struct timespec *started, int64_t timeout_ms)
{
    int64_t left = timeout_ms - (int64_t)(wrk_elapsed_sec(started) * 1000.0);

    if (left <= 0)
        return false;
    struct timeval tv = {(time_t)(left / 1000), (suseconds_t)((left % 1000) * 1000)};
    evtimer_add(deadline, &tv);
    return true;
}

bool wrk_reply_late(const char *label, double elapsed_sec, int64_t timeout_ms)
{
    if (elapsed_sec * 1000.0 < (double)timeout_ms)
        return false;
    log_warn("%s: its reply came after the time limit (%.3f s); counted as a timeout", label, elapsed_sec);
    return true;
}

/* Whether a program that ended on its own was stopped by a limit, or ended badly at its memory limit. */
static bool limit_hit(WrkProcResult *r, int status, const struct rusage *ru, const TwLimitsConf *l,
                      long cpu_window)
{
    bool signaled = WIFSIGNALED(status), bad = signaled || WEXITSTATUS(status) != 0;

    if (!l || !bad)
        return false;
    if (l->cpu_limit_sec > 0 && signaled &&
        (WTERMSIG(status) == SIGXCPU ||
         (WTERMSIG(status) == SIGKILL && ru && r->cpu_sec >= (double)cpu_window))) {
        r->limit = "cpu_limit_seconds";
        r->limit_value = l->cpu_limit_sec;
        return true;
    }
    if (l->memory_limit_mb > 0 && ru &&
        r->maxrss_kb * 100 >= (long)l->memory_limit_mb * 1024 * WRK_MEMORY_LIMIT_PERCENT) {
        r->limit = "memory_limit_mb";
        r->limit_value = l->memory_limit_mb;
        return true;
    }
    return false;
}

void wrk_result_outcome(WrkProcResult *r, bool stopped, bool oversize, bool timed_out, int status,
                        const struct rusage *ru, const TwLimitsConf *limits, long cpu_window)
{
    if (ru) {
        r->cpu_sec = (double)(ru->ru_utime.tv_sec + ru->ru_stime.tv_sec) +
                     (double)(ru->ru_utime.tv_usec + ru->ru_stime.tv_usec) / 1e6;
        r->maxrss_kb = ru->ru_maxrss;
    }
    if (stopped) {
        r->outcome = WRK_PROC_STOPPED;
    } else if (oversize) {
        r->outcome = WRK_PROC_OVERSIZE;
    } else if (timed_out) {
        r->outcome = WRK_PROC_TIMEOUT;
    } else if (limit_hit(r, status, ru, limits, cpu_window)) {
        r->outcome = WRK_PROC_LIMIT;
        r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
        r->term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    } else if (WIFSIGNALED(status)) {
        r->outcome = WRK_PROC_SIGNAL;
        r->term_signal = WTERMSIG(status);
    } else if (WEXITSTATUS(status) == 0) {
        r->outcome = WRK_PROC_OK;
    } else {
        r->outcome = WRK_PROC_EXIT;
        r->exit_code = WEXITSTATUS(status);
    }
}

double wrk_elapsed_sec(const struct timespec *t0)
{
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) / 1e9;
}

bool wrk_buf_room(char **buf, size_t len, size_t *cap)
{
    if (*cap - len >= 4096)
        return true;
    size_t ncap = *cap ? *cap * 2 : 16384;
    char *g = realloc(*buf, ncap + 1);
    if (!g)
        return false;
    *buf = g;
    *cap = ncap;
    return true;
}

/* Read what its stdout and stderr hold now, without waiting to be told they are readable, and close those at
 * their end. */
static void take_pipes(WrkChild *c)
{
    if (wrk_pipe_intact(&c->out_pipe, c->label) && c->out_read(c->owner))
        wrk_pipe_close(&c->out_pipe, c->label);
    if (wrk_pipe_intact(&c->err_pipe, c->label) && wrk_stderr_read(&c->err, c->err_pipe.fd))
        wrk_pipe_close(&c->err_pipe, c->label);
}

static void err_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkChild *c = arg;

    if (wrk_stderr_read(&c->err, c->err_pipe.fd)) {
        wrk_pipe_close(&c->err_pipe, c->label);
        c->maybe_done(c->owner);
    }
}

static void drain_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkChild *c = arg;

    /* It exited but something still holds its pipes open (a grandchild): take what they hold now and stop
     * waiting for them. */
    take_pipes(c);
    wrk_pipe_close(&c->out_pipe, c->label);
    wrk_pipe_close(&c->err_pipe, c->label);
    c->maybe_done(c->owner);
}

void wrk_child_stop(WrkChild *c, WrkStop to)
{
    struct timeval tv = {c->grace_sec, 0};

    if (c->exited || to <= c->stop)
        return;
    c->stop = to;
    if (c->stop_closes_stdin)
        wrk_pipe_close(&c->in_pipe, c->label);
    if (to == WRK_STOP_TERM)
        wrk_signal_group(c->pid, SIGTERM);
    if (to == WRK_STOP_KILL) {
        log_warn("%s: still running %ds after SIGTERM; sending SIGKILL", c->label, c->grace_sec);
        c->killed_hard = true;
        wrk_signal_group(c->pid, SIGKILL);
        return;
    }
    evtimer_add(c->grace, &tv);
}

static void grace_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkChild *c = arg;

    wrk_child_stop(c, (WrkStop)(c->stop + 1));
}

void wrk_child_free(WrkChild *c)
{
    wrk_pipe_close(&c->in_pipe, c->label);
    wrk_pipe_close(&c->out_pipe, c->label);
    wrk_pipe_close(&c->err_pipe, c->label);
    struct event *timers[] = {c->deadline, c->grace, c->drain};
    for (size_t i = 0; i < 3; i++)
        if (timers[i])
            event_free(timers[i]);
    c->deadline = c->grace = c->drain = NULL;
}

int wrk_child_spawn(WrkChild *c, struct event_base *base, char *const argv[], char *const env_extra[],
                    const TwLimitsConf *limits, bool cpu_movable, event_callback_fn in_cb,
                    event_callback_fn out_cb, event_callback_fn deadline_cb)
{
    if (limits) {
        c->limits = *limits;
        c->limits.run_as_user = NULL;
    }
    if (wrk_spawn(argv, env_extra, limits, cpu_movable, &c->pid, &c->in_pipe, &c->out_pipe, &c->err_pipe))
        return -1;
    wrk_pipe_watch(&c->in_pipe, base, EV_WRITE, in_cb, c->owner);
    wrk_pipe_watch(&c->out_pipe, base, EV_READ, out_cb, c->owner);
    wrk_pipe_watch(&c->err_pipe, base, EV_READ, err_cb, c);
    c->deadline = evtimer_new(base, deadline_cb, c->owner);
    c->grace = evtimer_new(base, grace_cb, c);
    c->drain = evtimer_new(base, drain_cb, c);
    if (!c->in_pipe.ev || !c->out_pipe.ev || !c->err_pipe.ev || !c->deadline || !c->grace || !c->drain) {
        log_error("%s: out of memory", c->label);
        wrk_signal_group(c->pid, SIGKILL);
        while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR)
            ; /* SIGKILL: at once */
        wrk_child_free(c);
        errno = ENOMEM;
        return -1;
    }
    return 0;
}

void wrk_child_exited(WrkChild *c, int status, const struct rusage *ru)
{
    c->exited = true;
    c->status = status;
    if (ru) {
        c->ru = *ru;
        c->have_ru = true;
    }
}

void wrk_child_wind_up(WrkChild *c)
{
    struct timeval tv = {0, DRAIN_AFTER_EXIT_MS * 1000};

    evtimer_del(c->deadline);
    evtimer_del(c->grace);
    wrk_pipe_close(&c->in_pipe, c->label);
    evtimer_add(c->drain, &tv);
    /* What it wrote before exiting is in its pipes now: take it here rather than trust their events alone
     * (see WrkPipe in launch.h). */
    take_pipes(c);
}

bool wrk_child_drained(const WrkChild *c)
{
    return c->exited && c->out_pipe.fd < 0 && c->err_pipe.fd < 0;
}

void wrk_child_result(const WrkChild *c, WrkProcResult *r, char *out, size_t out_len, bool stopped,
                      bool oversize, bool timed_out, long cpu_window)
{
    r->killed_hard = c->killed_hard;
    r->stderr_tail = c->err.tail;
    if (out)
        out[out_len] = '\0';
    r->output = out ? out : "";
    r->output_len = out_len;
    wrk_result_outcome(r, stopped, oversize, timed_out, c->status, c->have_ru ? &c->ru : NULL, &c->limits,
                       cpu_window);
}

bool wrk_child_reaped(WrkChild *c)
{
    int status;
    struct rusage ru;

    if (c->exited || wait4(c->pid, &status, WNOHANG, &ru) != c->pid)
        return false;
    wrk_child_exited(c, status, &ru);
    return true;
}

WrkProcResult wrk_spawn_result(int err)
{
    return (WrkProcResult){.outcome = WRK_PROC_SPAWN,
                           .stderr_tail = "",
                           .output = "",
                           .spawn_errno = err,
                           .spawn_why = wrk_spawn_why_take()};
}
