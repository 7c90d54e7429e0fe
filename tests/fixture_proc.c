/* fixture_proc.c — the fixture's running programs (to completion, with a timeout) and processes
 * (started in the background, logged, stopped). See fixture.h. */
#include "fixture_int.h"

#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <glob.h>
#include <libpq-fe.h>
#include <math.h>
#include <nats/nats.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- running programs
 * ------------------------------------------------------------------------------------------- */

/* After fork, before exec: a clean slate (default signal handling, nothing inherited but 0-2), then exec.
 * Only async-signal-safe calls, because nats.c threads may hold locks in the parent. */
__attribute__((noreturn)) static void fx_child_exec(const char *path, char *const argv[], int in_fd,
                                                    int out_fd, int err_fd, const char *cwd)
{
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigaction(SIGPIPE, &dfl, NULL);
    if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0)
        _exit(127);
    syscall(SYS_close_range, 3U, ~0U, 0U);
    if (cwd && chdir(cwd) != 0)
        _exit(127);
    execv(path, argv);
    static const char msg[] = "fixture: exec failed\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(127);
}

static int fx_status_code(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return -1;
}

typedef struct FxBuf {
    char *s;
    size_t len, cap;
} FxBuf;

static void fx_buf_add(FxBuf *b, const char *data, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->s = fx_xrealloc(b->s, b->cap);
    }
    memcpy(b->s + b->len, data, n);
    b->len += n;
    b->s[b->len] = '\0';
}

/* One read from a ready pipe into `b`; at its end (or on an error) the pipe is closed and *fd set to -1. */
static void fx_pipe_read(int *fd, FxBuf *b)
{
    char chunk[8192];
    ssize_t n = read(*fd, chunk, sizeof chunk);
    if (n > 0) {
        fx_buf_add(b, chunk, (size_t)n);
    } else if (n == 0 || errno != EINTR) {
        close(*fd);
        *fd = -1;
    }
}

/* Runs argv to completion, capturing output; see tw_fx_run_full. `cwd` NULL keeps ours. */
int fx_run(const char *const argv[], const char *input, char **out, char **err, int timeout_ms,
           const char *cwd)
{
    FxBuf ob = {0}, eb = {0};
    fx_buf_add(&ob, "", 0);
    fx_buf_add(&eb, "", 0);
    char *path = fx_which(argv[0]);
    int in_p[2] = {-1, -1}, out_p[2] = {-1, -1}, err_p[2] = {-1, -1};
    int rc = -1;
    pid_t pid = -1;

    if (!path) {
        const char *m = "fixture: program not found: ";
        fx_buf_add(&eb, m, strlen(m));
        fx_buf_add(&eb, argv[0], strlen(argv[0]));
        goto done;
    }
    if ((input ? pipe2(in_p, O_CLOEXEC)
               : ((in_p[0] = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0 ? -1 : 0)) < 0 ||
        pipe2(out_p, O_CLOEXEC) < 0 || pipe2(err_p, O_CLOEXEC) < 0)
        goto done;
    /* A child that stops reading its input must not kill us with SIGPIPE. */
    signal(SIGPIPE, SIG_IGN);
    pid = fork();
    if (pid < 0)
        goto done;
    if (pid == 0)
        fx_child_exec(path, (char *const *)argv, in_p[0], out_p[1], err_p[1], cwd);
    close(in_p[0]);
    close(out_p[1]);
    close(err_p[1]);
    in_p[0] = out_p[1] = err_p[1] = -1;

    size_t in_len = input ? strlen(input) : 0, in_off = 0;
    if (input && in_len == 0) {
        close(in_p[1]);
        in_p[1] = -1;
    }
    if (in_p[1] >= 0)
        fcntl(in_p[1], F_SETFL, O_NONBLOCK);
    int64_t deadline = tw_fx_now_ms() + timeout_ms;
    bool timed_out = false;
    while (out_p[0] >= 0 || err_p[0] >= 0) {
        struct pollfd pfd[3];
        int nfd = 0, io = -1, ie = -1, ii = -1;
        if (out_p[0] >= 0)
            io = nfd, pfd[nfd++] = (struct pollfd){.fd = out_p[0], .events = POLLIN};
        if (err_p[0] >= 0)
            ie = nfd, pfd[nfd++] = (struct pollfd){.fd = err_p[0], .events = POLLIN};
        if (in_p[1] >= 0)
            ii = nfd, pfd[nfd++] = (struct pollfd){.fd = in_p[1], .events = POLLOUT};
        int64_t left = deadline - tw_fx_now_ms();
        if (left <= 0) {
            timed_out = true;
            kill(pid, SIGKILL);
            break;
        }
        if (poll(pfd, (nfds_t)nfd, (int)(left > 200 ? 200 : left)) < 0 && errno != EINTR)
            break;
        if (io >= 0 && pfd[io].revents)
            fx_pipe_read(&out_p[0], &ob);
        if (ie >= 0 && pfd[ie].revents)
            fx_pipe_read(&err_p[0], &eb);
        if (ii >= 0 && pfd[ii].revents) {
            ssize_t n = write(in_p[1], input + in_off, in_len - in_off);
            if (n > 0)
                in_off += (size_t)n;
            if ((n < 0 && errno != EAGAIN && errno != EINTR) || in_off == in_len)
                close(in_p[1]), in_p[1] = -1;
        }
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    rc = timed_out ? -1 : fx_status_code(status);
    if (timed_out) {
        const char *m = "\nfixture: killed after timeout\n";
        fx_buf_add(&eb, m, strlen(m));
    }
done:
    for (int i = 0; i < 2; i++) {
        if (in_p[i] >= 0)
            close(in_p[i]);
        if (out_p[i] >= 0)
            close(out_p[i]);
        if (err_p[i] >= 0)
            close(err_p[i]);
    }
    free(path);
    if (out)
        *out = ob.s;
    else
        free(ob.s);
    if (err)
        *err = eb.s;
    else
        free(eb.s);
    return rc;
}

int tw_fx_run_full(const char *const argv[], const char *input, char **out, char **err, int timeout_ms)
{
    return fx_run(argv, input, out, err, timeout_ms, NULL);
}

int tw_fx_run(const char *const argv[], char **out, char **err)
{
    return fx_run(argv, NULL, out, err, FX_RUN_TIMEOUT_MS, NULL);
}

/* ---- processes
 * -------------------------------------------------------------------------------------------------- */

/* Starts a process logging to <dir>/<log_name>.log; not linked into fx->procs. NULL if fork/open failed. */
TwFxProc *fx_proc_start(TwFx *fx, const char *name, const char *log_name, const char *const argv[])
{
    TwFxProc *p = calloc(1, sizeof *p);
    if (!p)
        abort();
    p->fx = fx;
    p->name = fx_xstrdup(name);
    p->log_path = fx_asprintf("%s/%s.log", fx->dir, log_name);
    int log_fd = open(p->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (log_fd >= 0 && null_fd >= 0) {
        p->pid = fork();
        if (p->pid == 0)
            fx_child_exec(argv[0], (char *const *)argv, null_fd, log_fd, log_fd, NULL);
    }
    if (log_fd >= 0)
        close(log_fd);
    if (null_fd >= 0)
        close(null_fd);
    if (p->pid <= 0) {
        free(p->name);
        free(p->log_path);
        free(p);
        return NULL;
    }
    return p;
}

void fx_proc_destroy(TwFxProc *p)
{
    if (!p)
        return;
    free(p->name);
    free(p->log_path);
    free(p);
}

TwFxProc *tw_fx_spawn(TwFx *fx, const char *name, const char *const argv[])
{
    if (!fx_is_executable(argv[0]))
        fx_fail("spawn %s: %s is not an executable file", name, argv[0]);
    TwFxProc *p = fx_proc_start(fx, name, name, argv);
    if (!p)
        fx_fail("spawn %s: %s", name, strerror(errno));
    p->next = fx->procs;
    fx->procs = p;
    return p;
}

pid_t tw_fx_proc_pid(const TwFxProc *p)
{
    return p->pid;
}

const char *tw_fx_proc_log_path(const TwFxProc *p)
{
    return p->log_path;
}

char *tw_fx_proc_log(const TwFxProc *p)
{
    return fx_read_file(p->log_path);
}

bool tw_fx_proc_alive(TwFxProc *p)
{
    if (p->reaped)
        return false;
    int status;
    pid_t r = waitpid(p->pid, &status, WNOHANG);
    if (r == p->pid || (r < 0 && errno == ECHILD)) {
        p->reaped = true;
        p->status = r == p->pid ? status : 0;
        return false;
    }
    return true;
}

pid_t tw_fx_turn_pid(const char *turn)
{
    char needle[128];
    int nl = snprintf(needle, sizeof needle, "TURNWATCH_TURN_ID=%s", turn);
    DIR *d = opendir("/proc");
    pid_t found = 0;
    struct dirent *de;
    while (d && !found && (de = readdir(d))) {
        if (!isdigit((unsigned char)de->d_name[0]))
            continue;
        char path[300];
        snprintf(path, sizeof path, "/proc/%s/environ", de->d_name);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        static char buf[65536];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        if (memmem(buf, n, needle, (size_t)nl))
            found = (pid_t)atoi(de->d_name);
    }
    if (d)
        closedir(d);
    return found;
}

char tw_fx_pid_state(pid_t pid)
{
    char path[64], buf[512] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(buf, sizeof buf, f))
            buf[0] = '\0';
        fclose(f);
    }
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

bool tw_fx_proc_signal(TwFxProc *p, int sig)
{
    return tw_fx_proc_alive(p) && kill(p->pid, sig) == 0;
}

bool tw_fx_proc_freeze(TwFxProc *p)
{
    return tw_fx_proc_signal(p, SIGSTOP);
}

bool tw_fx_proc_thaw(TwFxProc *p)
{
    return tw_fx_proc_signal(p, SIGCONT);
}

bool tw_fx_proc_wait(TwFxProc *p, int timeout_ms, int *status)
{
    int64_t deadline = tw_fx_now_ms() + timeout_ms;
    while (tw_fx_proc_alive(p)) {
        if (tw_fx_now_ms() >= deadline)
            return false;
        tw_fx_sleep_ms(10);
    }
    if (status)
        *status = p->status;
    return true;
}

void tw_fx_proc_kill9(TwFxProc *p)
{
    if (tw_fx_proc_signal(p, SIGKILL)) {
        int status;
        while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR)
            ;
        p->reaped = true;
        p->status = status;
    }
}

int tw_fx_proc_terminate(TwFxProc *p, int timeout_ms)
{
    if (tw_fx_proc_alive(p)) {
        /* A frozen process would never act on SIGTERM. */
        kill(p->pid, SIGCONT);
        kill(p->pid, SIGTERM);
        if (!tw_fx_proc_wait(p, timeout_ms, NULL)) {
            tw_fx_proc_kill9(p);
            return -1;
        }
    }
    return fx_status_code(p->status);
}
