/* fixture_util.c — the fixture's small utilities (allocation that fails the test, files, clocks, polling),
 * paths of the build and free ports: the bottom of the fixture, used by every other part. See fixture.h. */
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

/* ---- small utilities
 * -------------------------------------------------------------------------------------------- */

__attribute__((noreturn, format(printf, 1, 2))) void fx_fail(const char *fmt, ...)
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

void *fx_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "fixture: out of memory\n");
        abort();
    }
    return p;
}

void *fx_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "fixture: out of memory\n");
        abort();
    }
    return q;
}

char *fx_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(fx_xmalloc(n), s, n);
}

__attribute__((format(printf, 1, 2))) char *fx_asprintf(const char *fmt, ...)
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
char *fx_read_file(const char *path)
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
char *fx_file_tail(const char *path, size_t max)
{
    char *all = fx_read_file(path);
    size_t len = strlen(all);
    if (len > max)
        memmove(all, all + len - max, max + 1);
    return all;
}

bool fx_is_executable(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* `name` looked up in PATH, then in the sbin directories that a non-login root PATH may lack; malloc'd or
 * NULL. */
char *fx_which(const char *name)
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

void fx_rm_rf(const char *path)
{
    nftw(path, fx_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Field 22 of /proc/PID/stat: with the pid it names one process for good, whatever pid reuse happens. 0 if
 * gone. */
unsigned long long fx_proc_starttime(pid_t pid)
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

char *tw_fx_copy_for_user(const char *path)
{
    char tmpl[] = "/tmp/" FX_TMP_PREFIX "XXXXXX";
    if (!mkdtemp(tmpl))
        fx_fail("mkdtemp: %s", strerror(errno));
    /* Whose it is, as tw_fx_new writes it: the sweep removes it once this process is gone. */
    char *owner = fx_asprintf("%s/owner", tmpl);
    FILE *f = fopen(owner, "w");
    if (f) {
        fprintf(f, "%d %llu\n", (int)getpid(), fx_proc_starttime(getpid()));
        fclose(f);
    }
    free(owner);
    if (chmod(tmpl, 0755) != 0)
        fx_fail("chmod %s: %s", tmpl, strerror(errno));
    size_t name = strlen(path);
    while (name > 0 && path[name - 1] != '/')
        name--;
    char *copy = fx_asprintf("%s/%s", tmpl, path + name);
    int in = open(path, O_RDONLY | O_CLOEXEC);
    int out = in < 0 ? -1 : open(copy, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
    if (in < 0 || out < 0)
        fx_fail("copying %s to %s: %s", path, copy, strerror(errno));
    char buf[65536];
    for (;;) {
        ssize_t n = read(in, buf, sizeof buf);
        if (n == 0)
            break;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            fx_fail("reading %s: %s", path, strerror(errno));
        for (ssize_t off = 0, w; off < n; off += w)
            if ((w = write(out, buf + off, (size_t)(n - off))) < 0)
                fx_fail("writing %s: %s", copy, strerror(errno));
    }
    close(in);
    /* 0755 whatever the umask. */
    if (fchmod(out, 0755) != 0 || close(out) != 0)
        fx_fail("%s: %s", copy, strerror(errno));
    return copy;
}

void tw_fx_remove_copy(char *copy)
{
    if (!copy)
        return;
    char *slash = strrchr(copy, '/');
    if (slash && slash != copy) {
        *slash = '\0';
        fx_rm_rf(copy);
    }
    free(copy);
}

/* ---- ports
 * ------------------------------------------------------------------------------------------------------ */

/* On 127.0.0.1:port, either bind like a server would (is the port free?) or connect (does a server accept?).
 */
bool fx_loopback_probe(int port, bool connect_to_it)
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
int fx_free_port(void)
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
