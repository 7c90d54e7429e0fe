/* fixture.c — integration test fixture: real PostgreSQL and nats-server in a temp dir, processes, SQL, NATS
 * events, daemon configs. See fixture.h for the design. */
#include "fixture.h"

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

#define FX_TMP_PREFIX "twfx-"
#define FX_RUN_TIMEOUT_MS 60000
#define FX_PG_TIMEOUT_MS 90000
#define FX_SQL_MAX_PARAMS 32
#define FX_POLL_MS 20

struct TwFxProc {
    TwFx *fx;
    char *name;
    char *log_path;
    pid_t pid;
    bool reaped;
    int status; /* raw wait status once reaped */
    TwFxProc *next;
};

typedef struct FxMsg {
    char *subject;
    char *data;
    json_t *json; /* NULL when the payload is not JSON */
    int64_t recv_ms;
} FxMsg;

struct TwFxEvents {
    TwFx *fx;
    natsConnection *nc;
    natsSubscription *sub;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    FxMsg **msgs;
    size_t n, cap;
    TwFxEvents *next;
};

typedef struct FxStr {
    char *s;
    struct FxStr *next;
} FxStr;

struct TwFx {
    char *dir;
    pid_t owner;
    /* PostgreSQL */
    char *pg_dir, *pg_data, *pg_log, *pg_dsn, *pg_conninfo;
    int pg_port;
    bool pg_inited, pg_running;
    PGconn *conn;
    /* nats-server */
    int nats_port;
    char *nats_url;
    TwFxProc *nats;
    natsConnection *pub;
    char *nats_conf;          /* tw_fx_nats_set_conf: the server's -c file, or NULL */
    TwFxNatsSetup nats_setup; /* tw_fx_nats_client: TLS and credentials of the fixture's own connections */
    void *nats_setup_arg;
    /* everything else */
    TwFxProc *procs;
    unsigned spawn_seq;
    TwFxEvents *events;
    char *config_path;
    FxStr *owned; /* strings freed with the fixture (extra config paths, tw_fx_keep) */
    TwFx *next_live;
};

/* Every fixture not yet freed, so the atexit handler can stop its servers. Tests are single-threaded. */
static TwFx *fx_live;
static bool fx_atexit_registered;

/* ---- small utilities
 * -------------------------------------------------------------------------------------------- */

__attribute__((noreturn, format(printf, 1, 2))) static void fx_fail(const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fixture: %s\n", buf);
    ck_abort_msg("fixture: %s", buf);
    abort(); /* not reached: ck_abort_msg exits the test */
}

static void *fx_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "fixture: out of memory\n");
        abort();
    }
    return p;
}

static void *fx_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "fixture: out of memory\n");
        abort();
    }
    return q;
}

static char *fx_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(fx_xmalloc(n), s, n);
}

__attribute__((format(printf, 1, 2))) static char *fx_asprintf(const char *fmt, ...)
{
    va_list ap;
    char *s = NULL;
    va_start(ap, fmt);
    int rc = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (rc < 0) {
        fprintf(stderr, "fixture: out of memory\n");
        abort();
    }
    return s;
}

int64_t tw_fx_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void tw_fx_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

bool tw_fx_poll(int64_t deadline_ms)
{
    if (tw_fx_now_ms() >= deadline_ms)
        return false;
    tw_fx_sleep_ms(FX_POLL_MS);
    return true;
}

bool tw_fx_wait_until(TwFxCond cond, void *arg, int timeout_ms)
{
    int64_t deadline = tw_fx_now_ms() + timeout_ms;
    while (!cond(arg))
        if (!tw_fx_poll(deadline))
            return false;
    return true;
}

/* Whole file as a malloc'd string ("" when missing). */
static char *fx_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    size_t len = 0, cap = 4096;
    char *buf = fx_xmalloc(cap);
    if (f) {
        size_t n;
        while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
            len += n;
            if (cap - len < 2)
                buf = fx_xrealloc(buf, cap *= 2);
        }
        fclose(f);
    }
    buf[len] = '\0';
    return buf;
}

/* Last `max` bytes of a file, for failure messages. */
static char *fx_file_tail(const char *path, size_t max)
{
    char *all = fx_read_file(path);
    size_t len = strlen(all);
    if (len > max)
        memmove(all, all + len - max, max + 1);
    return all;
}

static bool fx_is_executable(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* `name` looked up in PATH, then in the sbin directories that a non-login root PATH may lack; malloc'd or
 * NULL. */
static char *fx_which(const char *name)
{
    if (strchr(name, '/'))
        return fx_is_executable(name) ? fx_xstrdup(name) : NULL;
    const char *env = getenv("PATH");
    char *path =
        fx_asprintf("%s:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", env ? env : "");
    char *save = NULL, *found = NULL;
    for (char *d = strtok_r(path, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        char *cand = fx_asprintf("%s/%s", *d ? d : ".", name);
        if (fx_is_executable(cand))
            found = cand;
        else
            free(cand);
    }
    free(path);
    return found;
}

static int fx_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void fx_rm_rf(const char *path)
{
    nftw(path, fx_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Field 22 of /proc/PID/stat: with the pid it names one process for good, whatever pid reuse happens. 0 if
 * gone. */
static unsigned long long fx_proc_starttime(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    char *stat = fx_read_file(path);
    unsigned long long start = 0;
    char *p = strrchr(stat, ')');
    if (p) {
        /* after ")" comes field 3 (state); starttime is field 22 */
        int field = 2;
        char *save = NULL;
        for (char *tok = strtok_r(p + 1, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
            if (++field == 22) {
                start = strtoull(tok, NULL, 10);
                break;
            }
    }
    free(stat);
    return start;
}

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
static int fx_run(const char *const argv[], const char *input, char **out, char **err, int timeout_ms,
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
static TwFxProc *fx_proc_start(TwFx *fx, const char *name, const char *log_name, const char *const argv[])
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

static void fx_proc_destroy(TwFxProc *p)
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

/* ---- paths
 * ------------------------------------------------------------------------------------------------------ */

const char *tw_fx_build_dir(void)
{
    static char *dir;
    if (!dir) {
        const char *env = getenv("TW_BUILD_DIR");
        if (env && *env) {
            dir = fx_xstrdup(env);
        } else {
            /* Test executables live in <build>/tests/. */
            char exe[4096];
            ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
            exe[n > 0 ? n : 0] = '\0';
            for (int i = 0; i < 2; i++) {
                char *slash = strrchr(exe, '/');
                if (slash)
                    *slash = '\0';
            }
            dir = fx_xstrdup(*exe ? exe : ".");
        }
    }
    return dir;
}

const char *tw_fx_source_dir(void)
{
    const char *env = getenv("TW_SOURCE_DIR");
    return env && *env ? env : ".";
}

char *tw_fx_build_path(const char *rel)
{
    return fx_asprintf("%s/%s", tw_fx_build_dir(), rel);
}

static const char *fx_cached_build_path(char **slot, const char *rel)
{
    if (!*slot)
        *slot = tw_fx_build_path(rel);
    return *slot;
}

const char *tw_fx_pmo_path(void)
{
    static char *p;
    return fx_cached_build_path(&p, "pmo/turnwatch-pmo");
}

const char *tw_fx_worker_path(void)
{
    static char *p;
    return fx_cached_build_path(&p, "worker/turnwatch-worker");
}

const char *tw_fx_cli_path(void)
{
    static char *p;
    return fx_cached_build_path(&p, "tools/turnwatch");
}

bool tw_fx_daemons_built(void)
{
    return fx_is_executable(tw_fx_pmo_path()) && fx_is_executable(tw_fx_worker_path()) &&
           fx_is_executable(tw_fx_cli_path());
}

/* ---- ports
 * ------------------------------------------------------------------------------------------------------ */

/* On 127.0.0.1:port, either bind like a server would (is the port free?) or connect (does a server accept?).
 */
static bool fx_loopback_probe(int port, bool connect_to_it)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    int one = 1;
    if (!connect_to_it)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = (connect_to_it ? connect(fd, (struct sockaddr *)&sa, sizeof sa)
                             : bind(fd, (struct sockaddr *)&sa, sizeof sa)) == 0;
    close(fd);
    return ok;
}

/* A port nobody listens on, chosen below the kernel's ephemeral range: client sockets take their local ports
 * from that range, and one of them could otherwise sit on our server's port when we restart the server on it.
 */
static int fx_free_port(void)
{
    static unsigned seed;
    /* Ports handed out before and perhaps not yet bound by their server (a ring of the latest 64). */
    static int given[64];
    static size_t ngiven;
    if (!seed)
        seed = (unsigned)getpid() ^ (unsigned)tw_fx_now_ms();
    int lo = 32768;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d", &lo) != 1)
            lo = 32768;
        fclose(f);
    }
    int base = 10000, span = lo - base;
    if (span < 1000)
        base = 1024, span = lo > 2048 ? lo - 1024 : 1000;
    for (int attempt = 0; attempt < 500; attempt++) {
        int port = base + (int)(rand_r(&seed) % (unsigned)span);
        bool reused = false;
        for (size_t i = 0; i < ngiven && i < 64; i++)
            reused |= given[i] == port;
        if (!reused && fx_loopback_probe(port, false)) {
            given[ngiven++ % 64] = port;
            return port;
        }
    }
    fx_fail("no free TCP port on 127.0.0.1");
}

int tw_fx_free_port(void)
{
    return fx_free_port();
}

/* ---- lifetime
 * --------------------------------------------------------------------------------------------------- */

static void fx_atexit(void)
{
    /* nats.c tears itself down in its own destructor; calling nats_CloseAndWait() here as well crashes 3.4.x
     * at exit (its destructor then locks freed memory; fixed upstream in nats.c PR #1020). */
    while (fx_live)
        tw_fx_free(fx_live);
}

TwFx *tw_fx_new(void)
{
    TwFx *fx = calloc(1, sizeof *fx);
    if (!fx)
        abort();
    char tmpl[] = "/tmp/" FX_TMP_PREFIX "XXXXXX";
    if (!mkdtemp(tmpl))
        fx_fail("mkdtemp: %s", strerror(errno));
    fx->dir = fx_xstrdup(tmpl);
    fx->owner = getpid();
    /* The postgres user must be able to reach pg/ below it when we run as root. */
    chmod(fx->dir, 0755);
    char *owner = fx_asprintf("%s/owner", fx->dir);
    FILE *f = fopen(owner, "w");
    if (f) {
        fprintf(f, "%d %llu\n", (int)fx->owner, fx_proc_starttime(fx->owner));
        fclose(f);
    }
    free(owner);
    fx->next_live = fx_live;
    fx_live = fx;
    if (!fx_atexit_registered) {
        atexit(fx_atexit);
        fx_atexit_registered = true;
    }
    return fx;
}

TwFx *tw_fx_new_all(void)
{
    TwFx *fx = tw_fx_new();
    tw_fx_pg_init(fx);
    tw_fx_nats_start(fx);
    tw_fx_write_config(fx, NULL, NULL);
    return fx;
}

TwFx *tw_fx_new_migrated(const char *overrides)
{
    TwFx *fx = tw_fx_new();
    tw_fx_pg_init(fx);
    tw_fx_nats_start(fx);
    tw_fx_write_config(fx, NULL, overrides);
    tw_fx_migrate(fx);
    return fx;
}

const char *tw_fx_dir(const TwFx *fx)
{
    return fx->dir;
}

static int fx_pg_ctl(TwFx *fx, const char *action, const char *mode, char **out);
static bool fx_pg_has_pidfile(const TwFx *fx);
static void fx_nats_halt(TwFx *fx);

void tw_fx_free(TwFx *fx)
{
    if (!fx)
        return;
    /* A forked child that inherited the fixture must not tear down its parent's servers. */
    bool mine = fx->owner == getpid();
    while (fx->events)
        tw_fx_events_free(fx->events);
    if (fx->pub)
        natsConnection_Destroy(fx->pub);
    if (mine) {
        for (TwFxProc *p = fx->procs; p; p = p->next)
            if (tw_fx_proc_alive(p)) {
                kill(p->pid, SIGCONT);
                kill(p->pid, SIGTERM);
            }
        for (TwFxProc *p = fx->procs; p; p = p->next)
            if (!tw_fx_proc_wait(p, 5000, NULL))
                tw_fx_proc_kill9(p);
        fx_nats_halt(fx);
    }
    while (fx->procs) {
        TwFxProc *p = fx->procs;
        fx->procs = p->next;
        fx_proc_destroy(p);
    }
    PQfinish(fx->conn);
    /* Also when a start timed out half-way: the pid file, not our flag, says whether a postmaster may be up.
     */
    if (mine && fx->pg_inited && fx_pg_has_pidfile(fx))
        fx_pg_ctl(fx, "stop", "immediate", NULL);
    /* Every path keeps the lock order (sql/README.md): a deadlock PostgreSQL had to break fails the test that
     * caused it, whatever else it checked. */
    char deadlock[600] = "";
    if (mine && fx->pg_log) {
        char *log = fx_read_file(fx->pg_log), *at = log ? strstr(log, "deadlock detected") : NULL;
        if (at) {
            snprintf(deadlock, sizeof deadlock, "%s", at);
            fprintf(stderr, "fixture: PostgreSQL detected a deadlock (%s):\n%s\n", fx->pg_log, deadlock);
        }
        free(log);
    }
    if (mine) {
        const char *keep = getenv("TW_FX_KEEP");
        if (keep && *keep && strcmp(keep, "0") != 0)
            fprintf(stderr, "fixture: kept %s\n", fx->dir);
        else
            fx_rm_rf(fx->dir);
    }
    for (TwFx **pp = &fx_live; *pp; pp = &(*pp)->next_live)
        if (*pp == fx) {
            *pp = fx->next_live;
            break;
        }
    while (fx->owned) {
        FxStr *s = fx->owned;
        fx->owned = s->next;
        free(s->s);
        free(s);
    }
    free(fx->dir);
    free(fx->pg_dir);
    free(fx->pg_data);
    free(fx->pg_log);
    free(fx->pg_dsn);
    free(fx->pg_conninfo);
    free(fx->nats_url);
    free(fx->nats_conf);
    free(fx->config_path);
    free(fx);
    ck_assert_msg(deadlock[0] == '\0', "PostgreSQL detected a deadlock: %s", deadlock);
}

/* ---- PostgreSQL
 * ------------------------------------------------------------------------------------------------- */

/* Where initdb and pg_ctl live: $TW_PG_BINDIR, the newest /usr/lib/postgresql/<v>/bin (Debian keeps them off
 * PATH), or PATH. */
static const char *fx_pg_bindir(void)
{
    static char *dir;
    if (dir)
        return dir;
    const char *env = getenv("TW_PG_BINDIR");
    if (env && *env)
        return dir = fx_xstrdup(env);
    glob_t g;
    int best = -1;
    if (glob("/usr/lib/postgresql/*/bin/initdb", 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) {
            int v = atoi(g.gl_pathv[i] + strlen("/usr/lib/postgresql/"));
            if (v > best) {
                best = v;
                free(dir);
                dir = fx_xstrdup(g.gl_pathv[i]);
                *strrchr(dir, '/') = '\0';
            }
        }
        globfree(&g);
    }
    if (!dir) {
        char *initdb = fx_which("initdb");
        if (initdb)
            *strrchr(initdb, '/') = '\0';
        dir = initdb ? initdb : fx_xstrdup("/usr/lib/postgresql/15/bin");
    }
    return dir;
}

/* Runs a PostgreSQL program as the `postgres` user when we are root (initdb and postgres refuse root), in the
 * cluster's directory so that no inaccessible cwd gets in the way. */
static int fx_pg_run(TwFx *fx, const char *const args[], char **out)
{
    const char *argv[32];
    size_t n = 0;
    char *runuser = NULL;
    char *prog = fx_asprintf("%s/%s", fx_pg_bindir(), args[0]);
    if (geteuid() == 0) {
        runuser = fx_which("runuser");
        if (!runuser) {
            free(prog);
            if (out)
                *out = fx_xstrdup("runuser not found");
            return -1;
        }
        argv[n++] = runuser;
        argv[n++] = "-u";
        argv[n++] = "postgres";
        argv[n++] = "--";
    }
    argv[n++] = prog;
    for (size_t i = 1; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    char *o = NULL, *e = NULL;
    int rc = fx_run(argv, NULL, &o, &e, FX_PG_TIMEOUT_MS, fx->pg_dir);
    if (out)
        *out = fx_asprintf("%s%s", o, e);
    free(o);
    free(e);
    free(prog);
    free(runuser);
    return rc;
}

static bool fx_pg_has_pidfile(const TwFx *fx)
{
    char *pidfile = fx_asprintf("%s/postmaster.pid", fx->pg_data);
    bool has = access(pidfile, F_OK) == 0;
    free(pidfile);
    return has;
}

static int fx_pg_ctl(TwFx *fx, const char *action, const char *mode, char **out)
{
    const char *args[12] = {"pg_ctl", "-D", fx->pg_data, "-l", fx->pg_log, "-w", "-t", "60"};
    size_t n = 8;
    if (mode) {
        args[n++] = "-m";
        args[n++] = mode;
    }
    args[n++] = action;
    args[n] = NULL;
    return fx_pg_run(fx, args, out);
}

/* Runs pg_ctl and fails the test, with the server log, unless it worked. */
static void fx_pg_ctl_or_fail(TwFx *fx, const char *action, const char *mode)
{
    if (!fx->pg_inited)
        fx_fail("pg %s: call tw_fx_pg_init first", action);
    char *out = NULL;
    int rc = fx_pg_ctl(fx, action, mode, &out);
    if (rc != 0) {
        char *tail = fx_file_tail(fx->pg_log, 3000);
        fprintf(stderr, "fixture: pg_ctl %s exited %d:\n%s\n--- %s (tail) ---\n%s\n", action, rc, out,
                fx->pg_log, tail);
        free(tail);
        free(out);
        fx_fail("pg_ctl %s failed (exit %d), see stderr", action, rc);
    }
    free(out);
}

static void fx_pg_drop_conn(TwFx *fx)
{
    PQfinish(fx->conn);
    fx->conn = NULL;
}

void tw_fx_pg_init(TwFx *fx)
{
    if (fx->pg_inited)
        fx_fail("tw_fx_pg_init called twice");
    fx->pg_dir = fx_asprintf("%s/pg", fx->dir);
    fx->pg_data = fx_asprintf("%s/data", fx->pg_dir);
    fx->pg_log = fx_asprintf("%s/postgres.log", fx->pg_dir);
    if (mkdir(fx->pg_dir, 0700) != 0)
        fx_fail("mkdir %s: %s", fx->pg_dir, strerror(errno));
    if (geteuid() == 0) {
        struct passwd *pw = getpwnam("postgres");
        if (!pw)
            fx_fail("running as root but there is no `postgres` user to run PostgreSQL as");
        if (chown(fx->pg_dir, pw->pw_uid, pw->pw_gid) != 0)
            fx_fail("chown %s: %s", fx->pg_dir, strerror(errno));
    }
    char *out = NULL;
    const char *initdb[] = {"initdb",   "-D",        fx->pg_data,   "-A", "trust", "-U",
                            "postgres", "--no-sync", "--no-locale", "-E", "UTF8",  NULL};
    int rc = fx_pg_run(fx, initdb, &out);
    if (rc != 0) {
        fprintf(stderr, "fixture: initdb exited %d:\n%s\n", rc, out);
        free(out);
        fx_fail("initdb failed (exit %d), see stderr", rc);
    }
    free(out);

    fx->pg_port = fx_free_port();
    char *conf_path = fx_asprintf("%s/postgresql.conf", fx->pg_data);
    FILE *conf = fopen(conf_path, "a");
    if (!conf)
        fx_fail("open %s: %s", conf_path, strerror(errno));
    /* fsync and full-page writes only matter for an OS crash; synchronous_commit stays on so that a process
     * crash (tw_fx_pg_crash) never loses a committed transaction, which is what the daemons' tests rely on.
     */
    fprintf(conf,
            "\n# turnwatch test fixture\n"
            "port = %d\n"
            "listen_addresses = '127.0.0.1'\n"
            "unix_socket_directories = '%s'\n"
            "fsync = off\n"
            "full_page_writes = off\n"
            "max_connections = 200\n"
            "log_line_prefix = '%%m [%%p] %%q%%a '\n",
            fx->pg_port, fx->pg_dir);
    fclose(conf);
    fx->pg_inited = true;
    /* The port was free when chosen, but another process (a test running beside this one, another cluster)
     * may bind it before the postmaster does: then another port, a few times, as long as no one knows this
     * one. */
    for (int attempt = 1;; attempt++) {
        char *ctl_out = NULL;
        if (fx_pg_ctl(fx, "start", NULL, &ctl_out) == 0) {
            free(ctl_out);
            break;
        }
        free(ctl_out);
        char *log = fx_read_file(fx->pg_log);
        bool taken = strstr(log, "could not create any TCP/IP sockets") != NULL;
        free(log);
        if (!taken || attempt == 5) {
            fx_pg_ctl_or_fail(fx, "start", NULL); /* fails the test with the server's log */
            break;
        }
        fprintf(stderr, "fixture: port %d was taken before PostgreSQL bound it; another\n", fx->pg_port);
        fx->pg_port = fx_free_port();
        conf = fopen(conf_path, "a");
        if (!conf)
            fx_fail("open %s: %s", conf_path, strerror(errno));
        fprintf(conf, "port = %d\n", fx->pg_port); /* the last setting of a key wins */
        fclose(conf);
    }
    fx->pg_running = true;
    free(conf_path);
    fx->pg_dsn = fx_asprintf("postgresql://postgres@127.0.0.1:%d/turnwatch", fx->pg_port);
    fx->pg_conninfo = fx_asprintf("%s?connect_timeout=10&application_name=tw_fixture", fx->pg_dsn);

    char *admin = fx_asprintf("postgresql://postgres@127.0.0.1:%d/postgres?connect_timeout=10", fx->pg_port);
    PGconn *c = PQconnectdb(admin);
    free(admin);
    PGresult *res = PQstatus(c) == CONNECTION_OK ? PQexec(c, "CREATE DATABASE turnwatch") : NULL;
    bool ok = res && PQresultStatus(res) == PGRES_COMMAND_OK;
    char *msg = fx_xstrdup(PQerrorMessage(c));
    PQclear(res);
    PQfinish(c);
    if (!ok) {
        fx_fail("CREATE DATABASE turnwatch: %s", msg);
    }
    free(msg);
}

void tw_fx_pg_start(TwFx *fx)
{
    fx_pg_ctl_or_fail(fx, "start", NULL);
    fx->pg_running = true;
}

void tw_fx_pg_stop(TwFx *fx)
{
    fx_pg_drop_conn(fx);
    fx_pg_ctl_or_fail(fx, "stop", "fast");
    fx->pg_running = false;
}

void tw_fx_pg_crash(TwFx *fx)
{
    fx_pg_drop_conn(fx);
    fx_pg_ctl_or_fail(fx, "stop", "immediate");
    fx->pg_running = false;
}

void tw_fx_pg_restart(TwFx *fx)
{
    fx_pg_drop_conn(fx);
    fx_pg_ctl_or_fail(fx, "restart", "fast");
    fx->pg_running = true;
}

bool tw_fx_pg_running(const TwFx *fx)
{
    return fx->pg_running;
}

void tw_fx_use_servers(TwFx *fx, const char *dsn, const char *nats_url)
{
    if (dsn) {
        fx_pg_drop_conn(fx);
        free(fx->pg_dsn);
        free(fx->pg_conninfo);
        fx->pg_dsn = fx_xstrdup(dsn);
        fx->pg_conninfo = fx_asprintf("%s%sconnect_timeout=10&application_name=tw_fixture", dsn,
                                      strchr(dsn, '?') ? "&" : "?");
    }
    if (nats_url) {
        free(fx->nats_url);
        fx->nats_url = fx_xstrdup(nats_url);
    }
}

const char *tw_fx_pg_dsn(const TwFx *fx)
{
    return fx->pg_dsn;
}

int tw_fx_pg_port(const TwFx *fx)
{
    return fx->pg_port;
}

/* ---- SQL
 * -------------------------------------------------------------------------------------------------------- */

/* Runs one query on the fixture's connection, reconnecting once when the server went away underneath it (a
 * restart between two calls). Returns the result, or NULL with a malloc'd message in *err. */
static PGresult *fx_sql_query(TwFx *fx, const char *sql, int nparams, const char *const *params, char **err)
{
    if (!fx->pg_dsn) {
        *err = fx_xstrdup("PostgreSQL is not initialised (tw_fx_pg_init)");
        return NULL;
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!fx->conn || PQstatus(fx->conn) != CONNECTION_OK) {
            fx_pg_drop_conn(fx);
            fx->conn = PQconnectdb(fx->pg_conninfo);
            if (PQstatus(fx->conn) != CONNECTION_OK) {
                *err = fx_xstrdup(PQerrorMessage(fx->conn));
                fx_pg_drop_conn(fx);
                return NULL;
            }
        }
        PGresult *res = nparams == 0 ? PQexec(fx->conn, sql)
                                     : PQexecParams(fx->conn, sql, nparams, NULL, params, NULL, NULL, 0);
        ExecStatusType st = PQresultStatus(res);
        if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
            return res;
        PQclear(res);
        if (PQstatus(fx->conn) == CONNECTION_OK || attempt == 1) {
            *err = fx_xstrdup(PQerrorMessage(fx->conn));
            return NULL;
        }
    }
    *err = fx_xstrdup("unreachable");
    return NULL;
}

/* Collects `nparams` const char * varargs into `out`. */
static void fx_sql_params(int nparams, va_list ap, const char *out[FX_SQL_MAX_PARAMS])
{
    if (nparams < 0 || nparams > FX_SQL_MAX_PARAMS)
        fx_fail("SQL helpers take 0..%d parameters, got %d", FX_SQL_MAX_PARAMS, nparams);
    for (int i = 0; i < nparams; i++)
        out[i] = va_arg(ap, const char *);
}

/* Declares `params` holding the `nparams` const char * varargs of the calling SQL helper. */
#define FX_SQL_VARARGS(params, nparams)                                                                      \
    const char *params[FX_SQL_MAX_PARAMS];                                                                   \
    do {                                                                                                     \
        va_list ap_;                                                                                         \
        va_start(ap_, nparams);                                                                              \
        fx_sql_params(nparams, ap_, params);                                                                 \
        va_end(ap_);                                                                                         \
    } while (0)

static PGresult *fx_sql_must(TwFx *fx, const char *sql, int nparams, const char *const *params)
{
    char *err = NULL;
    PGresult *res = fx_sql_query(fx, sql, nparams, params, &err);
    if (!res) {
        fprintf(stderr, "fixture: SQL failed: %s\n  query: %s\n", err, sql);
        fx_fail("SQL failed: %s", err);
    }
    return res;
}

void tw_fx_sql_exec(TwFx *fx, const char *sql, int nparams, ...)
{
    FX_SQL_VARARGS(params, nparams);
    PQclear(fx_sql_must(fx, sql, nparams, params));
}

bool tw_fx_sql_try(TwFx *fx, char **err, const char *sql, int nparams, ...)
{
    FX_SQL_VARARGS(params, nparams);
    char *msg = NULL;
    PGresult *res = fx_sql_query(fx, sql, nparams, params, &msg);
    PQclear(res);
    if (err)
        *err = msg;
    else
        free(msg);
    return res != NULL;
}

static char *fx_first_value(PGresult *res)
{
    char *v = NULL;
    if (PQntuples(res) > 0 && PQnfields(res) > 0 && !PQgetisnull(res, 0, 0))
        v = fx_xstrdup(PQgetvalue(res, 0, 0));
    PQclear(res);
    return v;
}

char *tw_fx_sql_str(TwFx *fx, const char *sql, int nparams, ...)
{
    FX_SQL_VARARGS(params, nparams);
    return fx_first_value(fx_sql_must(fx, sql, nparams, params));
}

bool tw_fx_sql_wait_count(TwFx *fx, const char *sql, int64_t want, int timeout_ms)
{
    int64_t deadline = tw_fx_now_ms() + timeout_ms;
    /* The SQL helpers fail the test on an SQL error; during an outage "not yet" is the right answer. */
    while (!tw_fx_sql_try(fx, NULL, "SELECT 1", 0) || tw_fx_sql_int(fx, sql, 0) < want)
        if (!tw_fx_poll(deadline))
            return false;
    return true;
}

int64_t tw_fx_sql_int(TwFx *fx, const char *sql, int nparams, ...)
{
    FX_SQL_VARARGS(params, nparams);
    char *v = fx_first_value(fx_sql_must(fx, sql, nparams, params));
    if (!v)
        fx_fail("SQL returned no row or NULL where an integer was expected: %s", sql);
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    bool ok = errno == 0 && end != v && *end == '\0';
    if (!ok) {
        fprintf(stderr, "fixture: not an integer: '%s' from %s\n", v, sql);
        free(v);
        fx_fail("SQL returned a value that is not an integer");
    }
    free(v);
    return n;
}

bool tw_fx_sql_wait(TwFx *fx, int timeout_ms, const char *expect, const char *sql, int nparams, ...)
{
    FX_SQL_VARARGS(params, nparams);
    int64_t deadline = tw_fx_now_ms() + timeout_ms;
    char *last = NULL, *last_err = NULL;
    for (;;) {
        char *err = NULL;
        PGresult *res = fx_sql_query(fx, sql, nparams, params, &err);
        if (res) {
            free(last);
            last = fx_first_value(res);
            if (expect ? last && strcmp(last, expect) == 0 : last == NULL) {
                free(last);
                free(last_err);
                return true;
            }
        } else {
            free(last_err);
            last_err = err;
        }
        if (tw_fx_now_ms() >= deadline)
            break;
        tw_fx_sleep_ms(FX_POLL_MS);
    }
    fprintf(stderr, "fixture: waited %d ms for '%s' but got '%s'%s%s\n  query: %s\n", timeout_ms,
            expect ? expect : "(null)", last ? last : "(null)", last_err ? "; last error: " : "",
            last_err ? last_err : "", sql);
    free(last);
    free(last_err);
    return false;
}

/* ---- TLS: a test PKI (openssl), PostgreSQL with ssl
 * ----------------------------------------------------------------------------------- */

static void fx_openssl(const char *const argv[])
{
    char *out = NULL, *err = NULL;
    int rc = tw_fx_run_full(argv, NULL, &out, &err, 30000);
    if (rc != 0) {
        fprintf(stderr, "fixture: %s %s exited %d:\n%s%s\n", argv[0], argv[1], rc, out ? out : "",
                err ? err : "");
        free(out);
        free(err);
        fx_fail("openssl %s failed (exit %d), see stderr", argv[1], rc);
    }
    free(out);
    free(err);
}

const char *tw_fx_tls_cert(TwFx *fx, const char *ca, const char *name, const char *san)
{
    char *dir = fx_asprintf("%s/tls", fx->dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        fx_fail("mkdir %s: %s", dir, strerror(errno));
    char *ca_pem = fx_asprintf("%s/%s.pem", dir, ca), *ca_key = fx_asprintf("%s/%s.key", dir, ca);
    char *ca_subj = fx_asprintf("/CN=%s", ca);
    if (access(ca_pem, F_OK) != 0) {
        const char *argv[] = {
            "openssl", "req",     "-x509", "-newkey", "ec",   "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes",  "-keyout", ca_key,  "-out",    ca_pem, "-days",    "2",
            "-subj",   ca_subj,   NULL};
        fx_openssl(argv);
    }
    if (name) {
        char *pem = fx_asprintf("%s/%s.pem", dir, name), *key = fx_asprintf("%s/%s.key", dir, name);
        char *csr = fx_asprintf("%s/%s.csr", dir, name), *ext = fx_asprintf("%s/%s.ext", dir, name);
        char *subj = fx_asprintf("/CN=%s", name), *srl = fx_asprintf("%s/%s.srl", dir, ca);
        FILE *f = fopen(ext, "w");
        if (!f || fprintf(f, "subjectAltName=%s\n", san) < 0 || fclose(f) != 0)
            fx_fail("cannot write %s", ext);
        const char *req[] = {
            "openssl", "req",     "-newkey", "ec",   "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes",  "-keyout", key,       "-out", csr,        "-subj",
            subj,      NULL};
        fx_openssl(req);
        const char *sign[] = {"openssl", "x509",   "-req",  "-in",       csr,        "-CA",
                              ca_pem,    "-CAkey", ca_key,  "-CAserial", srl,        "-CAcreateserial",
                              "-out",    pem,      "-days", "2",         "-extfile", ext,
                              NULL};
        fx_openssl(sign);
        free(pem);
        free(key);
        free(csr);
        free(ext);
        free(subj);
        free(srl);
    }
    free(ca_pem);
    free(ca_key);
    free(ca_subj);
    return tw_fx_keep(fx, dir);
}

/* A copy of src in the cluster's data directory, owned by the server's user, mode 0600. */
static char *fx_pg_copy(TwFx *fx, const char *src, const char *name)
{
    char *dst = fx_asprintf("%s/%s", fx->pg_data, name);
    char *text = fx_read_file(src);
    int fd = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text) || close(fd) != 0)
        fx_fail("cannot write %s: %s", dst, strerror(errno));
    free(text);
    if (geteuid() == 0) {
        struct passwd *pw = getpwnam("postgres");
        if (!pw || chown(dst, pw->pw_uid, pw->pw_gid) != 0)
            fx_fail("chown %s to postgres: %s", dst, strerror(errno));
    }
    return dst;
}

void tw_fx_pg_ssl(TwFx *fx, const char *cert, const char *key, const char *hba_first)
{
    if (!fx->pg_inited)
        fx_fail("tw_fx_pg_ssl: call tw_fx_pg_init first");
    char *crt = fx_pg_copy(fx, cert, "server.crt"), *k = fx_pg_copy(fx, key, "server.key");
    char *conf_path = fx_asprintf("%s/postgresql.conf", fx->pg_data);
    FILE *conf = fopen(conf_path, "a");
    if (!conf || fprintf(conf, "ssl = on\nssl_cert_file = '%s'\nssl_key_file = '%s'\n", crt, k) < 0 ||
        fclose(conf) != 0)
        fx_fail("cannot append to %s", conf_path);
    /* TCP without TLS is refused, first rule wins: a connection that works is a TLS one. */
    char *hba_path = fx_asprintf("%s/pg_hba.conf", fx->pg_data);
    char *hba = fx_read_file(hba_path);
    FILE *f = fopen(hba_path, "w");
    if (!f ||
        fprintf(f, "hostnossl all all 0.0.0.0/0 reject\nhostnossl all all ::/0 reject\n%s%s",
                hba_first ? hba_first : "", hba) < 0 ||
        fclose(f) != 0)
        fx_fail("cannot write %s", hba_path);
    free(hba);
    free(hba_path);
    free(conf_path);
    free(crt);
    free(k);
    tw_fx_pg_restart(fx);
}

/* ---- nats-server
 * ------------------------------------------------------------------------------------------------ */

static char *fx_nats_server_bin(void)
{
    const char *env = getenv("TW_NATS_SERVER");
    return env && *env ? fx_xstrdup(env) : fx_which("nats-server");
}

/* Stops nats-server if it runs; never fails the test (used by tw_fx_free too). */
static void fx_nats_halt(TwFx *fx)
{
    if (!fx->nats)
        return;
    if (tw_fx_proc_signal(fx->nats, SIGCONT))
        kill(fx->nats->pid, SIGINT);
    if (!tw_fx_proc_wait(fx->nats, 10000, NULL))
        tw_fx_proc_kill9(fx->nats);
    fx_proc_destroy(fx->nats);
    fx->nats = NULL;
}

void tw_fx_nats_start(TwFx *fx)
{
    if (fx->nats)
        fx_fail("nats-server is already running");
    char *bin = fx_nats_server_bin();
    if (!bin)
        fx_fail("nats-server not found (install the nats-server package or set TW_NATS_SERVER)");
    bool fresh_port = fx->nats_port == 0;
    /* A freshly chosen port can be taken between our probe and the server's bind: then try another one. On a
     * restart the port must stay the same, so there is no second chance. */
    for (int attempt = 0; attempt < (fresh_port ? 3 : 1); attempt++) {
        if (fresh_port)
            fx->nats_port = fx_free_port();
        char port[16];
        snprintf(port, sizeof port, "%d", fx->nats_port);
        /* JetStream on, its store in the fixture's dir (kept across restarts): [nats] events_stream needs it.
         */
        char *store = fx_asprintf("%s/nats-js", fx->dir);
        const char *argv[] = {bin, "-a", "127.0.0.1", "-p", port, "-js", "-sd", store, NULL, NULL, NULL};
        if (fx->nats_conf) { /* flags win over the file: its TLS and authorization are what it adds */
            argv[8] = "-c";
            argv[9] = fx->nats_conf;
        }
        fx->nats = fx_proc_start(fx, "nats-server", "nats", argv);
        free(store);
        if (!fx->nats)
            fx_fail("cannot start nats-server: %s", strerror(errno));
        int64_t deadline = tw_fx_now_ms() + 10000;
        while (tw_fx_proc_alive(fx->nats) && !fx_loopback_probe(fx->nats_port, true) &&
               tw_fx_now_ms() < deadline)
            tw_fx_sleep_ms(10);
        if (tw_fx_proc_alive(fx->nats) && fx_loopback_probe(fx->nats_port, true))
            break;
        fx_nats_halt(fx);
    }
    free(bin);
    if (!fx->nats) {
        char *log_path = fx_asprintf("%s/nats.log", fx->dir);
        char *tail = fx_file_tail(log_path, 2000);
        fprintf(stderr, "fixture: nats-server did not start; %s (tail):\n%s\n", log_path, tail);
        free(tail);
        free(log_path);
        fx_fail("nats-server did not start on port %d", fx->nats_port);
    }
    free(fx->nats_url);
    fx->nats_url = fx_asprintf("nats://127.0.0.1:%d", fx->nats_port);
}

void tw_fx_nats_stop(TwFx *fx)
{
    if (!fx->nats)
        fx_fail("nats-server is not running");
    fx_nats_halt(fx);
}

void tw_fx_nats_restart(TwFx *fx)
{
    tw_fx_nats_stop(fx);
    tw_fx_nats_start(fx);
}

bool tw_fx_nats_running(const TwFx *fx)
{
    return fx->nats != NULL;
}

const char *tw_fx_nats_url(const TwFx *fx)
{
    return fx->nats_url;
}

int tw_fx_nats_port(const TwFx *fx)
{
    return fx->nats_port;
}

pid_t tw_fx_nats_pid(const TwFx *fx)
{
    return fx->nats ? fx->nats->pid : 0;
}

/* A connection that rides out server restarts: reconnects forever, every 100 ms, and (with `retry_first`)
 * also when the server is down at the first attempt. */
static natsStatus fx_nats_connect(TwFx *fx, natsConnection **nc, bool retry_first)
{
    natsOptions *opts = NULL;
    natsStatus s = natsOptions_Create(&opts);
    /* One URL, or a cluster's comma-separated list (tw_fx_use_servers). */
    char *urls = fx_xstrdup(fx->nats_url), *save = NULL;
    const char *servers[8];
    int n = 0;
    for (char *u = strtok_r(urls, ",", &save); u && n < 8; u = strtok_r(NULL, ",", &save))
        servers[n++] = u;
    if (s == NATS_OK)
        s = natsOptions_SetServers(opts, servers, n);
    if (s == NATS_OK && fx->nats_setup)
        s = fx->nats_setup(opts, fx->nats_setup_arg);
    free(urls);
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(opts, -1);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(opts, 100);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(opts, 2000);
    if (s == NATS_OK && retry_first)
        s = natsOptions_SetRetryOnFailedConnect(opts, true, NULL, NULL);
    if (s == NATS_OK) {
        s = natsConnection_Connect(nc, opts);
        if (s == NATS_NOT_YET_CONNECTED)
            s = NATS_OK;
    }
    natsOptions_Destroy(opts);
    return s;
}

bool tw_fx_nats_publish(TwFx *fx, const char *subject, const char *data)
{
    if (!fx->nats_url)
        fx_fail("nats-server was never started");
    if (!fx->pub && fx_nats_connect(fx, &fx->pub, false) != NATS_OK)
        return false;
    /* While disconnected nats.c would buffer the message and send it after reconnecting; a test asking to
     * publish into a dead server means "this one is lost". */
    if (natsConnection_Status(fx->pub) != NATS_CONN_STATUS_CONNECTED)
        return false;
    natsStatus s = natsConnection_PublishString(fx->pub, subject, data);
    if (s == NATS_OK)
        s = natsConnection_FlushTimeout(fx->pub, 2000);
    return s == NATS_OK;
}

bool tw_fx_nats_wait_echo(TwFx *fx, TwFxEvents *ev, const char *subject, const char *data, int timeout_ms)
{
    int64_t deadline = tw_fx_now_ms() + timeout_ms;
    while (tw_fx_events_count(ev, subject, NULL) == 0) {
        bool sent = tw_fx_nats_publish(fx, subject, data);
        (void)sent;
        if (!tw_fx_poll(deadline))
            return false;
    }
    return true;
}

void tw_fx_nats_set_conf(TwFx *fx, const char *conf)
{
    free(fx->nats_conf);
    fx->nats_conf = NULL;
    if (!conf)
        return;
    fx->nats_conf = fx_asprintf("%s/nats.conf", fx->dir);
    FILE *f = fopen(fx->nats_conf, "w");
    if (!f || fputs(conf, f) == EOF || fclose(f) != 0)
        fx_fail("cannot write %s: %s", fx->nats_conf, strerror(errno));
}

void tw_fx_nats_client(TwFx *fx, TwFxNatsSetup fn, void *arg)
{
    fx->nats_setup = fn;
    fx->nats_setup_arg = arg;
}

/* ---- NATS event collector
 * --------------------------------------------------------------------------------------- */

/* NATS subject matching: "*" matches one token, ">" one or more trailing tokens. */
static bool fx_subject_match(const char *pattern, const char *subject)
{
    if (!pattern)
        return true;
    while (*pattern && *subject) {
        const char *pe = strchr(pattern, '.'), *se = strchr(subject, '.');
        size_t pl = pe ? (size_t)(pe - pattern) : strlen(pattern);
        size_t sl = se ? (size_t)(se - subject) : strlen(subject);
        if (pl == 1 && pattern[0] == '>')
            return true;
        if (!(pl == 1 && pattern[0] == '*') && (pl != sl || memcmp(pattern, subject, pl) != 0))
            return false;
        if (!pe || !se)
            return !pe && !se;
        pattern = pe + 1;
        subject = se + 1;
    }
    return false;
}

static void fx_events_on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    (void)nc, (void)sub;
    TwFxEvents *ev = closure;
    FxMsg *m = fx_xmalloc(sizeof *m);
    int len = natsMsg_GetDataLength(msg);
    m->recv_ms = tw_fx_now_ms();
    m->subject = fx_xstrdup(natsMsg_GetSubject(msg));
    m->data = fx_xmalloc((size_t)len + 1);
    if (len > 0)
        memcpy(m->data, natsMsg_GetData(msg), (size_t)len);
    m->data[len] = '\0';
    m->json = json_loadb(m->data, (size_t)len, 0, NULL);
    natsMsg_Destroy(msg);
    pthread_mutex_lock(&ev->mu);
    if (ev->n == ev->cap) {
        ev->cap = ev->cap ? ev->cap * 2 : 64;
        ev->msgs = fx_xrealloc(ev->msgs, ev->cap * sizeof *ev->msgs);
    }
    ev->msgs[ev->n++] = m;
    pthread_cond_broadcast(&ev->cv);
    pthread_mutex_unlock(&ev->mu);
}

TwFxEvents *tw_fx_events_new(TwFx *fx, const char *pattern)
{
    if (!fx->nats_url)
        fx_fail("start nats-server before collecting events");
    TwFxEvents *ev = calloc(1, sizeof *ev);
    if (!ev)
        abort();
    ev->fx = fx;
    pthread_mutex_init(&ev->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ev->cv, &ca);
    pthread_condattr_destroy(&ca);
    ev->next = fx->events;
    fx->events = ev;
    natsStatus s = fx_nats_connect(fx, &ev->nc, true);
    if (s == NATS_OK)
        s = natsConnection_Subscribe(&ev->sub, ev->nc, pattern, fx_events_on_msg, ev);
    if (s == NATS_OK && natsConnection_Status(ev->nc) == NATS_CONN_STATUS_CONNECTED)
        s = natsConnection_FlushTimeout(ev->nc, 5000);
    if (s != NATS_OK)
        fx_fail("event collector on %s: %s", pattern, natsStatus_GetText(s));
    return ev;
}

static void fx_msgs_clear(TwFxEvents *ev)
{
    for (size_t i = 0; i < ev->n; i++) {
        free(ev->msgs[i]->subject);
        free(ev->msgs[i]->data);
        json_decref(ev->msgs[i]->json);
        free(ev->msgs[i]);
    }
    ev->n = 0;
}

void tw_fx_events_free(TwFxEvents *ev)
{
    if (!ev)
        return;
    for (TwFxEvents **pp = &ev->fx->events; *pp; pp = &(*pp)->next)
        if (*pp == ev) {
            *pp = ev->next;
            break;
        }
    /* Destroying the subscription first guarantees no callback runs on a freed collector. */
    if (ev->sub) {
        natsSubscription_Unsubscribe(ev->sub);
        natsSubscription_Destroy(ev->sub);
    }
    natsConnection_Destroy(ev->nc);
    pthread_mutex_lock(&ev->mu);
    fx_msgs_clear(ev);
    pthread_mutex_unlock(&ev->mu);
    free(ev->msgs);
    pthread_cond_destroy(&ev->cv);
    pthread_mutex_destroy(&ev->mu);
    free(ev);
}

typedef struct FxMatch {
    const char *subject, *substr;
    TwFxEventPred pred;
    void *arg;
} FxMatch;

static bool fx_match(const FxMatch *mt, const FxMsg *m)
{
    if (mt->pred)
        return mt->pred(m->subject, m->json, mt->arg);
    return fx_subject_match(mt->subject, m->subject) && (!mt->substr || strstr(m->data, mt->substr));
}

/* Index of the k-th match (0-based) or -1; with k == SIZE_MAX counts instead (returned in *count). Lock held.
 */
static ssize_t fx_find(TwFxEvents *ev, const FxMatch *mt, size_t k, size_t *count)
{
    size_t seen = 0;
    for (size_t i = 0; i < ev->n; i++)
        if (fx_match(mt, ev->msgs[i]) && seen++ == k)
            return (ssize_t)i;
    if (count)
        *count = seen;
    return -1;
}

static size_t fx_events_count(TwFxEvents *ev, const FxMatch *mt)
{
    size_t n = 0;
    pthread_mutex_lock(&ev->mu);
    fx_find(ev, mt, SIZE_MAX, &n);
    pthread_mutex_unlock(&ev->mu);
    return n;
}

static bool fx_events_wait(TwFxEvents *ev, const FxMatch *mt, size_t n, int timeout_ms)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L)
        deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&ev->mu);
    size_t have = 0;
    int rc = 0;
    for (;;) {
        fx_find(ev, mt, SIZE_MAX, &have);
        if (have >= n || rc == ETIMEDOUT)
            break;
        rc = pthread_cond_timedwait(&ev->cv, &ev->mu, &deadline);
    }
    pthread_mutex_unlock(&ev->mu);
    return have >= n;
}

static json_t *fx_events_get(TwFxEvents *ev, const FxMatch *mt, size_t k, const char **subject_out,
                             int64_t *recv_ms)
{
    json_t *j = NULL;
    pthread_mutex_lock(&ev->mu);
    ssize_t i = fx_find(ev, mt, k, NULL);
    if (i >= 0) {
        j = json_incref(ev->msgs[i]->json);
        if (subject_out)
            *subject_out = ev->msgs[i]->subject;
        if (recv_ms)
            *recv_ms = ev->msgs[i]->recv_ms;
    }
    pthread_mutex_unlock(&ev->mu);
    return j;
}

size_t tw_fx_events_count(TwFxEvents *ev, const char *subject, const char *substr)
{
    return fx_events_count(ev, &(FxMatch){.subject = subject, .substr = substr});
}

size_t tw_fx_events_count_if(TwFxEvents *ev, TwFxEventPred pred, void *arg)
{
    return fx_events_count(ev, &(FxMatch){.pred = pred, .arg = arg});
}

bool tw_fx_events_wait(TwFxEvents *ev, const char *subject, const char *substr, size_t n, int timeout_ms)
{
    return fx_events_wait(ev, &(FxMatch){.subject = subject, .substr = substr}, n, timeout_ms);
}

bool tw_fx_events_wait_if(TwFxEvents *ev, TwFxEventPred pred, void *arg, size_t n, int timeout_ms)
{
    return fx_events_wait(ev, &(FxMatch){.pred = pred, .arg = arg}, n, timeout_ms);
}

json_t *tw_fx_events_get(TwFxEvents *ev, const char *subject, const char *substr, size_t k,
                         const char **subject_out, int64_t *recv_ms)
{
    return fx_events_get(ev, &(FxMatch){.subject = subject, .substr = substr}, k, subject_out, recv_ms);
}

json_t *tw_fx_events_get_if(TwFxEvents *ev, TwFxEventPred pred, void *arg, size_t k, const char **subject_out,
                            int64_t *recv_ms)
{
    return fx_events_get(ev, &(FxMatch){.pred = pred, .arg = arg}, k, subject_out, recv_ms);
}

void tw_fx_events_clear(TwFxEvents *ev)
{
    pthread_mutex_lock(&ev->mu);
    fx_msgs_clear(ev);
    pthread_mutex_unlock(&ev->mu);
}

void tw_fx_events_dump(TwFxEvents *ev)
{
    pthread_mutex_lock(&ev->mu);
    fprintf(stderr, "fixture: %zu event(s) collected:\n", ev->n);
    for (size_t i = 0; i < ev->n; i++)
        fprintf(stderr, "  [%zu] +%lldms %s %s\n", i,
                (long long)(ev->msgs[i]->recv_ms - ev->msgs[0]->recv_ms), ev->msgs[i]->subject,
                ev->msgs[i]->data);
    pthread_mutex_unlock(&ev->mu);
}

/* ---- daemons and CLI
 * -------------------------------------------------------------------------------------------- */

static const char *fx_config_or_default(TwFx *fx, const char *config)
{
    if (config)
        return config;
    if (!fx->config_path)
        fx_fail("no config written yet (tw_fx_write_config)");
    return fx->config_path;
}

static TwFxProc *fx_start_daemon(TwFx *fx, const char *kind, const char *bin, const char *config)
{
    const char *argv[] = {bin, "-c", fx_config_or_default(fx, config), NULL};
    char name[64];
    snprintf(name, sizeof name, "%s-%u", kind, ++fx->spawn_seq);
    return tw_fx_spawn(fx, name, argv);
}

TwFxProc *tw_fx_start_pmo(TwFx *fx, const char *config)
{
    return fx_start_daemon(fx, "pmo", tw_fx_pmo_path(), config);
}

TwFxProc *tw_fx_start_worker(TwFx *fx, const char *config)
{
    return fx_start_daemon(fx, "worker", tw_fx_worker_path(), config);
}

int tw_fx_cli(TwFx *fx, char **out, char **err, ...)
{
    const char *argv[64];
    size_t n = 0;
    argv[n++] = tw_fx_cli_path();
    argv[n++] = "-c";
    argv[n++] = fx_config_or_default(fx, NULL);
    va_list ap;
    va_start(ap, err);
    for (const char *a = va_arg(ap, const char *); a; a = va_arg(ap, const char *)) {
        if (n >= 63)
            fx_fail("tw_fx_cli: too many arguments");
        argv[n++] = a;
    }
    va_end(ap);
    argv[n] = NULL;
    return tw_fx_run(argv, out, err);
}

void tw_fx_migrate(TwFx *fx)
{
    char *out = NULL, *err = NULL;
    int rc = tw_fx_cli(fx, &out, &err, "migrate", NULL);
    if (rc != 0) {
        fprintf(stderr, "fixture: turnwatch migrate exited %d\nstdout:\n%s\nstderr:\n%s\n", rc, out, err);
        free(out);
        free(err);
        fx_fail("turnwatch migrate exited %d, see stderr", rc);
    }
    free(out);
    free(err);
}

TwFxStack tw_fx_stack_start_events(const char *overrides, const char *pattern)
{
    TwFxStack st = {0};
    st.fx = tw_fx_new_migrated(overrides);
    if (pattern)
        st.ev = tw_fx_events_new(st.fx, pattern);
    st.pmo = tw_fx_start_pmo(st.fx, NULL);
    st.worker = tw_fx_start_worker(st.fx, NULL);
    return st;
}

TwFxStack tw_fx_stack_start(const char *overrides)
{
    return tw_fx_stack_start_events(overrides, "evt.>");
}

void tw_fx_proc_dump(const TwFxProc *p)
{
    char *log = tw_fx_proc_log(p);
    fprintf(stderr, "---- %s ----\n%s\n", tw_fx_proc_log_path(p), log);
    free(log);
}

void tw_fx_stack_dump(const TwFxStack *st)
{
    tw_fx_events_dump(st->ev);
    tw_fx_proc_dump(st->worker);
    tw_fx_proc_dump(st->pmo);
}

/* ---- INI writer
 * ------------------------------------------------------------------------------------------------- */

/* An INI file as ordered sections of ordered lines; a line with val == NULL is kept verbatim. */
typedef struct FxIniLine {
    char *key, *val;
} FxIniLine;

typedef struct FxIniSec {
    char *name; /* "" for lines before any [section] */
    FxIniLine *lines;
    size_t n;
} FxIniSec;

typedef struct FxIni {
    FxIniSec *secs;
    size_t n;
} FxIni;

static FxIniSec *fx_ini_section(FxIni *ini, const char *name)
{
    for (size_t i = 0; i < ini->n; i++)
        if (strcmp(ini->secs[i].name, name) == 0)
            return &ini->secs[i];
    ini->secs = fx_xrealloc(ini->secs, (ini->n + 1) * sizeof *ini->secs);
    /* Keys given before any section belong at the very top, where an INI parser sees them as section-less. */
    size_t at = *name ? ini->n : 0;
    memmove(&ini->secs[at + 1], &ini->secs[at], (ini->n - at) * sizeof *ini->secs);
    ini->secs[at] = (FxIniSec){.name = fx_xstrdup(name)};
    ini->n++;
    return &ini->secs[at];
}

static void fx_ini_add_line(FxIniSec *sec, const char *key, const char *val)
{
    sec->lines = fx_xrealloc(sec->lines, (sec->n + 1) * sizeof *sec->lines);
    sec->lines[sec->n++] = (FxIniLine){.key = fx_xstrdup(key), .val = val ? fx_xstrdup(val) : NULL};
}

static void fx_ini_set(FxIni *ini, const char *section, const char *key, const char *val)
{
    FxIniSec *sec = fx_ini_section(ini, section);
    for (size_t i = 0; i < sec->n; i++)
        if (sec->lines[i].val && strcmp(sec->lines[i].key, key) == 0) {
            free(sec->lines[i].val);
            sec->lines[i].val = fx_xstrdup(val);
            return;
        }
    fx_ini_add_line(sec, key, val);
}

static void fx_ini_free_section(FxIniSec *sec)
{
    for (size_t i = 0; i < sec->n; i++) {
        free(sec->lines[i].key);
        free(sec->lines[i].val);
    }
    free(sec->lines);
    free(sec->name);
}

static void fx_ini_del_key(FxIni *ini, const char *section, const char *key)
{
    FxIniSec *sec = fx_ini_section(ini, section);
    for (size_t i = 0; i < sec->n; i++)
        if (sec->lines[i].val && strcmp(sec->lines[i].key, key) == 0) {
            free(sec->lines[i].key);
            free(sec->lines[i].val);
            memmove(&sec->lines[i], &sec->lines[i + 1], (sec->n - i - 1) * sizeof *sec->lines);
            sec->n--;
            return;
        }
}

static void fx_ini_del_section(FxIni *ini, const char *section)
{
    for (size_t i = 0; i < ini->n; i++)
        if (strcmp(ini->secs[i].name, section) == 0) {
            fx_ini_free_section(&ini->secs[i]);
            memmove(&ini->secs[i], &ini->secs[i + 1], (ini->n - i - 1) * sizeof *ini->secs);
            ini->n--;
            return;
        }
}

static void fx_ini_free(FxIni *ini)
{
    for (size_t i = 0; i < ini->n; i++)
        fx_ini_free_section(&ini->secs[i]);
    free(ini->secs);
}

static char *fx_trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
        *--e = '\0';
    return s;
}

/* Applies the override language documented at tw_fx_write_config. */
static void fx_ini_apply(FxIni *ini, const char *overrides)
{
    char *copy = fx_xstrdup(overrides), *save = NULL;
    char *section = fx_xstrdup("");
    for (char *raw = strtok_r(copy, "\n", &save); raw; raw = strtok_r(NULL, "\n", &save)) {
        char *line = fx_trim(raw);
        size_t len = strlen(line);
        if (len == 0 || line[0] == ';' || line[0] == '#')
            continue;
        if (line[0] == '[' && line[len - 1] == ']') {
            free(section);
            line[len - 1] = '\0';
            section = fx_xstrdup(fx_trim(line + 1));
            fx_ini_section(ini, section);
        } else if (line[0] == '!' && line[1] == '[' && line[len - 1] == ']') {
            line[len - 1] = '\0';
            fx_ini_del_section(ini, fx_trim(line + 2));
        } else if (line[0] == '!') {
            fx_ini_del_key(ini, section, fx_trim(line + 1));
        } else if (strchr(line, '=')) {
            char *eq = strchr(line, '=');
            *eq = '\0';
            fx_ini_set(ini, section, fx_trim(line), fx_trim(eq + 1));
        } else {
            fx_ini_add_line(fx_ini_section(ini, section), line, NULL);
        }
    }
    free(section);
    free(copy);
}

/* A [<kind>.<name>] section whose exec is `program` in the build tree, then the lines of `keys`. */
static void fx_program_section(FxIni *ini, const char *kind, const char *name, const char *program,
                               const char *keys)
{
    char *exec = tw_fx_build_path(program);
    char *text = fx_asprintf("[%s.%s]\nexec = %s\n%s", kind, name, exec, keys);
    fx_ini_apply(ini, text);
    free(text);
    free(exec);
}

/* The base config: every key of contract §3, periods short enough for tests and consistent with the cross-key
 * rules (retry 2 < timeout 6, wakeup 2 < skip 10, heartbeat 1 < reap 10/2 and < processing 10/2). */
static void fx_base_config(TwFx *fx, FxIni *ini)
{
    static const char keys[] = "[pmo]\n"
                               "watchdog_interval_seconds = 1\n"
                               "dispatched_retry_seconds = 2\n"
                               "dispatched_timeout_seconds = 6\n"
                               "pending_wakeup_seconds = 2\n"
                               "pending_wakeup_skip_seconds = 10\n"
                               "active_reap_seconds = 10\n"
                               "[worker]\n"
                               "inbox_processing_timeout_seconds = 10\n"
                               "watchdog_interval_seconds = 1\n"
                               "suspend_timeout_seconds = 30\n"
                               "heartbeat_seconds = 1\n"
                               "concurrency = 4\n"
                               "agents = *\n";
    static const char *const agents[][2] = {
        {"echo", "examples/agents/tw-echo-agent"},   {"failer", "examples/agents/tw-fail-agent"},
        {"tester", "examples/agents/tw-test-agent"}, {"fanout", "examples/agents/tw-fanout-agent"},
        {"racer", "examples/agents/tw-race-agent"},
    };
    static const char *const tools[][2] = {
        {"sleep", "examples/tools/tw-sleep-tool"},
        {"fail", "examples/tools/tw-fail-tool"},
        {"garbage", "examples/tools/tw-garbage-tool"},
        {"echo", "examples/tools/tw-echo-tool"},
    };
    if (!fx->pg_dsn || !fx->nats_url)
        fx_fail("start PostgreSQL and nats-server before writing a config");
    fx_ini_set(ini, "postgres", "dsn", fx->pg_dsn);
    fx_ini_set(ini, "nats", "url", fx->nats_url);
    fx_ini_apply(ini, keys);
    for (size_t i = 0; i < sizeof agents / sizeof agents[0]; i++)
        fx_program_section(ini, "agent", agents[i][0], agents[i][1],
                           "step_timeout_seconds = 10\nkill_grace_seconds = 1\n");
    for (size_t i = 0; i < sizeof tools / sizeof tools[0]; i++)
        fx_program_section(ini, "tool", tools[i][0], tools[i][1],
                           "external = false\ntimeout_seconds = 10\nsuspend_timeout_seconds = 20\n");
    fx_ini_apply(ini, "[tool.ext]\nexternal = true\ntimeout_seconds = 30\nsuspend_timeout_seconds = 30\n");
}

const char *tw_fx_write_config(TwFx *fx, const char *name, const char *overrides)
{
    FxIni ini = {0};
    fx_base_config(fx, &ini);
    if (overrides)
        fx_ini_apply(&ini, overrides);
    char *path = fx_asprintf("%s/%s", fx->dir, name ? name : "turnwatch.ini");
    FILE *f = fopen(path, "w");
    if (!f)
        fx_fail("cannot write %s: %s", path, strerror(errno));
    fprintf(f, "; written by the turnwatch test fixture (tests/fixture.c)\n");
    for (size_t i = 0; i < ini.n; i++) {
        if (*ini.secs[i].name)
            fprintf(f, "\n[%s]\n", ini.secs[i].name);
        for (size_t j = 0; j < ini.secs[i].n; j++) {
            const FxIniLine *l = &ini.secs[i].lines[j];
            if (l->val)
                fprintf(f, "%s = %s\n", l->key, l->val);
            else
                fprintf(f, "%s\n", l->key);
        }
    }
    bool ok = fclose(f) == 0;
    fx_ini_free(&ini);
    if (!ok)
        fx_fail("cannot write %s", path);
    if (!name) {
        free(fx->config_path);
        fx->config_path = path;
        return path;
    }
    return tw_fx_keep(fx, path);
}

char *tw_fx_keep(TwFx *fx, char *s)
{
    if (s) {
        FxStr *kept = fx_xmalloc(sizeof *kept);
        kept->s = s;
        kept->next = fx->owned;
        fx->owned = kept;
    }
    return s;
}

const char *tw_fx_config_path(const TwFx *fx)
{
    return fx->config_path;
}

/* ---- stale fixtures
 * --------------------------------------------------------------------------------------------- */

void tw_fx_sweep_stale(void)
{
    DIR *d = opendir("/tmp");
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, FX_TMP_PREFIX, strlen(FX_TMP_PREFIX)) != 0)
            continue;
        char *dir = fx_asprintf("/tmp/%s", de->d_name);
        char *owner_path = fx_asprintf("%s/owner", dir);
        FILE *f = fopen(owner_path, "r");
        int pid = 0;
        unsigned long long start = 0;
        bool known = f && fscanf(f, "%d %llu", &pid, &start) == 2;
        if (f)
            fclose(f);
        struct stat st;
        /* A directory without owner is either being created right now or very old debris. */
        bool stale = known ? (pid != getpid() && (start == 0 || fx_proc_starttime(pid) != start))
                           : (stat(dir, &st) == 0 && time(NULL) - st.st_mtime > 3600);
        if (stale) {
            TwFx tmp = {.dir = dir};
            tmp.pg_dir = fx_asprintf("%s/pg", dir);
            tmp.pg_data = fx_asprintf("%s/data", tmp.pg_dir);
            tmp.pg_log = fx_asprintf("%s/postgres.log", tmp.pg_dir);
            if (fx_pg_has_pidfile(&tmp))
                fx_pg_ctl(&tmp, "stop", "immediate", NULL);
            /* An HA formation a test made there (test_ha: tools/lib/ha-formation), left running by a timeout.
             */
            char *ha_env = fx_asprintf("%s/ha/ha.env", dir), *ha_dir = fx_asprintf("%s/ha", dir);
            char *script = fx_asprintf("%s/tools/lib/ha-formation", tw_fx_source_dir());
            if (access(ha_env, F_OK) == 0 && access(script, X_OK) == 0) {
                const char *argv[] = {script, "stop", ha_dir, NULL};
                (void)tw_fx_run_full(argv, NULL, NULL, NULL, 120000);
            }
            free(script);
            free(ha_dir);
            free(ha_env);
            fprintf(stderr, "fixture: removed stale %s (owner %d gone)\n", dir, pid);
            fx_rm_rf(dir);
            free(tmp.pg_dir);
            free(tmp.pg_data);
            free(tmp.pg_log);
        }
        free(owner_path);
        free(dir);
    }
    closedir(d);
}

/* ---- HTTP and Prometheus
 * ------------------------------------------------------------------------------------------ */

int tw_fx_http_get(int port, const char *path, char **body)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    size_t len = 0, cap = 8192;
    char *buf, *req;
    int status = -1;
    int64_t deadline = tw_fx_now_ms() + 10000;

    if (body)
        *body = NULL;
    if (fd < 0)
        return -1;
    /* The connect is bounded too: a server whose accept queue is full drops the SYN, and a blocking connect
     * would wait for the kernel's retries (a minute or more). */
    int flags = fcntl(fd, F_GETFL);
    bool connected = fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0 &&
                     (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 || errno == EINPROGRESS);
    if (connected) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t len_err = sizeof err;
        connected = poll(&p, 1, (int)(deadline - tw_fx_now_ms())) == 1 &&
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len_err) == 0 && err == 0 &&
                    fcntl(fd, F_SETFL, flags) == 0;
    }
    if (!connected) {
        close(fd);
        return -1;
    }
    req = fx_asprintf("GET %s HTTP/1.0\r\nHost: 127.0.0.1:%d\r\n\r\n", path, port);
    bool sent = write(fd, req, strlen(req)) == (ssize_t)strlen(req);
    free(req);
    buf = fx_xmalloc(cap);
    while (sent) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)(deadline - tw_fx_now_ms());
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        if (cap - len < 4096)
            buf = fx_xrealloc(buf, cap *= 2);
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            break;
        }
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    int major, minor;
    char *head_end = strstr(buf, "\r\n\r\n");
    if (head_end && sscanf(buf, "HTTP/%d.%d %d", &major, &minor, &status) == 3 && body)
        *body = fx_xstrdup(head_end + 4);
    free(buf);
    return head_end ? status : -1;
}

static bool prom_name_char(char c, bool first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
           (!first && c >= '0' && c <= '9');
}

/* The family a sample belongs to: its name, or for a histogram's series the name without the suffix. */
static bool prom_typed(json_t *types, const char *name)
{
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    if (json_object_get(types, name))
        return true;
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(name), k = strlen(suffixes[i]);
        if (n > k && strcmp(name + n - k, suffixes[i]) == 0) {
            char *base = fx_asprintf("%.*s", (int)(n - k), name);
            const char *t = json_string_value(json_object_get(types, base));
            free(base);
            if (t && (strcmp(t, "histogram") == 0 || (i > 0 && strcmp(t, "summary") == 0)))
                return true;
        }
    }
    return false;
}

json_t *tw_fx_prom_parse(const char *text, char **err)
{
    json_t *samples = json_object(), *types = json_object();
    char *copy = fx_xstrdup(text);
    int line_no = 0;

    if (err)
        *err = NULL;
    for (char *line = copy, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        line_no++;
        if (!*line)
            continue;
        char *why = NULL;
        if (line[0] == '#') {
            char kind[8], name[256], rest[64];
            if (sscanf(line, "# %7s %255s %63s", kind, name, rest) < 2 ||
                (strcmp(kind, "HELP") != 0 && strcmp(kind, "TYPE") != 0))
                why = fx_asprintf("a comment that is not # HELP or # TYPE");
            else if (strcmp(kind, "TYPE") == 0) {
                static const char *const kinds[] = {"counter", "gauge", "histogram", "summary", "untyped"};
                bool known = false;
                for (size_t i = 0; i < 5; i++)
                    known |= strcmp(rest, kinds[i]) == 0;
                if (!known || json_object_get(types, name))
                    why = fx_asprintf("TYPE %s %s: unknown type or declared twice", name, rest);
                else
                    json_object_set_new(types, name, json_string(rest));
            }
        } else {
            const char *p = line;
            if (!prom_name_char(*p, true))
                why = fx_asprintf("no metric name");
            while (!why && prom_name_char(*p, false))
                p++;
            char *name = why ? NULL : fx_asprintf("%.*s", (int)(p - line), line);
            if (!why && *p == '{') {
                p++;
                while (!why && *p != '}') {
                    if (!prom_name_char(*p, true) || *p == ':') {
                        why = fx_asprintf("bad label name at column %d", (int)(p - line) + 1);
                        break;
                    }
                    while (prom_name_char(*p, false) && *p != ':')
                        p++;
                    if (p[0] != '=' || p[1] != '"') {
                        why = fx_asprintf("label without =\"value\" at column %d", (int)(p - line) + 1);
                        break;
                    }
                    p += 2;
                    while (*p && *p != '"') {
                        if (*p == '\\') {
                            if (p[1] != '\\' && p[1] != '"' && p[1] != 'n') {
                                why = fx_asprintf("bad escape in a label value");
                                break;
                            }
                            p++;
                        }
                        p++;
                    }
                    if (why)
                        break;
                    if (*p != '"') {
                        why = fx_asprintf("unterminated label value");
                        break;
                    }
                    p++;
                    if (*p == ',')
                        p++;
                    else if (*p != '}')
                        why = fx_asprintf("expected , or } at column %d", (int)(p - line) + 1);
                }
                if (!why)
                    p++;
            }
            if (!why && *p != ' ')
                why = fx_asprintf("no space before the value");
            if (!why) {
                char *key = fx_asprintf("%.*s", (int)(p - line), line), *end;
                double v = strtod(p + 1, &end);
                if (end == p + 1 || (*end && *end != ' '))
                    why = fx_asprintf("'%s' is not a value", p + 1);
                else if (json_object_get(samples, key))
                    why = fx_asprintf("sample %s appears twice", key);
                else if (!prom_typed(types, name))
                    why = fx_asprintf("sample %s has no # TYPE before it", key);
                else
                    json_object_set_new(samples, key, json_real(v));
                free(key);
            }
            free(name);
        }
        if (why) {
            if (err)
                *err = fx_asprintf("line %d: %s: %s", line_no, why, line);
            free(why);
            json_decref(samples);
            samples = NULL;
            break;
        }
    }
    free(copy);
    json_decref(types);
    return samples;
}

double tw_fx_prom_value(json_t *samples, const char *key)
{
    json_t *v = json_object_get(samples, key);
    return v ? json_real_value(v) : NAN;
}
