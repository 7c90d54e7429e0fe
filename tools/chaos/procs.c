/* The soak's processes: the four daemons, nats-server, pg_ctl and the CLI, all started with posix_spawn
 * (argv, never a shell) and reaped from the main loop with waitpid(WNOHANG). */
#include "chaos.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* With mask, the program starts with those signals blocked (a daemon: see spawn_daemon). */
static pid_t spawn_masked(char *const argv[], const char *out, const char *err, bool append,
                          const sigset_t *mask)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    int flags = O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC);
    pid_t pid = 0;
    int rc;

    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out ? out : "/dev/null", flags, 0644);
    if (err && out && strcmp(err, out) == 0)
        posix_spawn_file_actions_adddup2(&fa, 1, 2);
    else
        posix_spawn_file_actions_addopen(&fa, 2, err ? err : "/dev/null", flags, 0644);
    posix_spawnattr_init(&attr);
    if (mask) {
        posix_spawnattr_setsigmask(&attr, mask);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    }
    rc = posix_spawn(&pid, argv[0], &fa, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        fprintf(stderr, "turnwatch-soak: cannot start %s: %s\n", argv[0], strerror(rc));
        return -1;
    }
    return pid;
}

pid_t chaos_spawn(char *const argv[], const char *out, const char *err, bool append)
{
    return spawn_masked(argv, out, err, append, NULL);
}

/* A daemon starts with SIGTERM, SIGINT and SIGHUP blocked, as it blocks them itself from its first line until
 * its event loop handles them: a fault that signals it in the milliseconds before main (the loader, the
 * sanitizer's start-up) is then a graceful stop too, which no daemon can arrange for itself. */
static pid_t spawn_daemon(char *const argv[], const char *log)
{
    sigset_t held;

    sigemptyset(&held);
    sigaddset(&held, SIGTERM);
    sigaddset(&held, SIGINT);
    sigaddset(&held, SIGHUP);
    return spawn_masked(argv, log, log, true, &held);
}

static void describe_status(int status, char *buf, size_t size)
{
    if (WIFEXITED(status))
        snprintf(buf, size, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, size, "signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        snprintf(buf, size, "status 0x%x", status);
}

/* ---- daemons
 * --------------------------------------------------------------------------------------------------- */

int chaos_daemon_start(ChaosRun *run, ChaosDaemon *d)
{
    char *argv[] = {(char *)d->binary, "-c", run->ini, NULL};
    FILE *log = fopen(d->log, "a");

    if (log) {
        fprintf(log, "=== turnwatch-soak: start #%d of %s at t=%.1fs ===\n", d->starts + 1, d->name,
                (double)chaos_now_ms(run) / 1000.0);
        fclose(log);
    }
    d->pid = spawn_daemon(argv, d->log);
    if (d->pid <= 0) {
        d->pid = 0;
        return -1;
    }
    d->starts++;
    d->stopped = false;
    d->expect = CHAOS_EXPECT_NONE;
    d->restart_at_ms = -1;
    if (run->opt.verbose)
        chaos_note(run, "%s started (pid %d)", d->name, (int)d->pid);
    return 0;
}

void chaos_daemon_signal(ChaosRun *run, ChaosDaemon *d, int sig)
{
    if (d->pid <= 0)
        return;
    if (sig == SIGKILL)
        d->expect = CHAOS_EXPECT_KILL;
    else if (sig == SIGTERM && d->expect == CHAOS_EXPECT_NONE)
        d->expect = CHAOS_EXPECT_CLEAN_EXIT;
    if (kill(d->pid, sig) != 0)
        chaos_note(run, "kill(%s pid %d, %d): %s", d->name, (int)d->pid, sig, strerror(errno));
    if (sig == SIGSTOP)
        d->stopped = true;
    else if (sig == SIGCONT)
        d->stopped = false;
}

static void daemon_exited(ChaosRun *run, ChaosDaemon *d, int status)
{
    char how[64];
    int64_t now = chaos_now_ms(run);

    describe_status(status, how, sizeof how);
    if (d->expect == CHAOS_EXPECT_NONE) {
        /* Nothing we did ends a daemon: it crashed (a sanitizer report, an assertion) or gave up. */
        chaos_incident(run, "daemon died on its own", "%s (pid %d) ended with %s at t=%.1fs; log %s", d->name,
                       (int)d->pid, how, (double)now / 1000.0, d->log);
        d->restart_at_ms = now + 1000;
    } else if (d->expect == CHAOS_EXPECT_CLEAN_EXIT) {
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            chaos_incident(run, "daemon stop", "%s (pid %d) ended with %s after SIGTERM at t=%.1fs; log %s",
                           d->name, (int)d->pid, how, (double)now / 1000.0, d->log);
        else
            chaos_note(run, "%s (pid %d) stopped cleanly", d->name, (int)d->pid);
        d->restart_at_ms = now + d->restart_delay_ms;
    } else if (run->opt.verbose) {
        chaos_note(run, "%s (pid %d) ended: %s", d->name, (int)d->pid, how);
    }
    d->pid = 0;
    d->stopped = false;
}

bool chaos_daemons_stop(ChaosRun *run, int grace_ms)
{
    bool ok = true;
    int64_t until;

    for (int i = 0; i < CHAOS_DAEMONS; i++) {
        ChaosDaemon *d = &run->daemons[i];
        if (d->pid > 0) {
            chaos_daemon_signal(run, d, SIGCONT);
            chaos_daemon_signal(run, d, SIGTERM);
        }
        d->restart_at_ms = -1;
    }
    until = chaos_now_ms(run) + grace_ms;
    for (int i = 0; i < CHAOS_DAEMONS; i++) {
        ChaosDaemon *d = &run->daemons[i];
        int status = 0;
        char how[64];
        while (d->pid > 0) {
            pid_t r = waitpid(d->pid, &status, WNOHANG);
            if (r == d->pid)
                break;
            if (r < 0 && errno != EINTR) {
                d->pid = 0;
                break;
            }
            if (chaos_now_ms(run) > until) {
                chaos_incident(run, "daemon shutdown",
                               "%s (pid %d) did not exit within %d ms of SIGTERM; killed", d->name,
                               (int)d->pid, grace_ms);
                kill(d->pid, SIGKILL);
                waitpid(d->pid, &status, 0);
                ok = false;
                d->pid = 0;
                break;
            }
            nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
        }
        if (d->pid > 0) {
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                describe_status(status, how, sizeof how);
                chaos_incident(run, "daemon shutdown", "%s (pid %d) ended with %s after SIGTERM; log %s",
                               d->name, (int)d->pid, how, d->log);
                ok = false;
            }
            d->pid = 0;
        }
    }
    return ok;
}

/* ---- nats-server
 * ----------------------------------------------------------------------------------------------- */

int chaos_nats_start(ChaosRun *run)
{
    char port[16], store[PATH_MAX], log[PATH_MAX];

    snprintf(port, sizeof port, "%d", run->opt.nats_port);
    /* JetStream on, with its store in the work dir: a stream kept across restarts holds what the server took
     * while the soak's own subscriber was reconnecting. */
    snprintf(store, sizeof store, "%s/nats-js", run->opt.dir);
    snprintf(log, sizeof log, "%s/nats.log", run->opt.dir);
    char *argv[] = {(char *)run->opt.nats_bin, "-a", "127.0.0.1", "-p", port, "-js", "-sd", store, NULL};
    run->nats_pid = chaos_spawn(argv, log, log, true);
    if (run->nats_pid <= 0) {
        run->nats_pid = 0;
        return -1;
    }
    run->nats_state = CHAOS_SRV_STARTING;
    return 0;
}

void chaos_nats_stop(ChaosRun *run)
{
    if (run->nats_pid <= 0)
        return;
    /* SIGTERM: nats-server's clean shutdown (the JetStream store is flushed). */
    kill(run->nats_pid, SIGTERM);
    run->nats_state = CHAOS_SRV_STOPPING;
}

bool chaos_nats_accepting(const ChaosRun *run)
{
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)run->opt.nats_port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool ok;

    if (fd < 0)
        return false;
    ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return ok;
}

/* ---- PostgreSQL
 * ------------------------------------------------------------------------------------------------ */

/* pg_ctl ACTION [-m MODE] in the background; its exit is seen by chaos_reap. As the postgres user when we are
 * root (the server refuses root). */
int chaos_pg_ctl(ChaosRun *run, const char *action, const char *mode)
{
    char pg_ctl[PATH_MAX], log[PATH_MAX], out[PATH_MAX];
    char *argv[20];
    int n = 0;

    snprintf(pg_ctl, sizeof pg_ctl, "%s/pg_ctl", run->opt.pg_bin);
    snprintf(log, sizeof log, "%s/../postgres.log", run->opt.pg_data);
    snprintf(out, sizeof out, "%s/pg_ctl.log", run->opt.dir);
    if (run->opt.pg_user) {
        argv[n++] = "/usr/sbin/runuser";
        argv[n++] = "-u";
        argv[n++] = (char *)run->opt.pg_user;
        argv[n++] = "--";
    }
    argv[n++] = pg_ctl;
    argv[n++] = "-D";
    argv[n++] = (char *)run->opt.pg_data;
    argv[n++] = "-l";
    argv[n++] = log;
    argv[n++] = "-w";
    argv[n++] = "-t";
    argv[n++] = "120";
    if (mode) {
        argv[n++] = "-m";
        argv[n++] = (char *)mode;
    }
    argv[n++] = (char *)action;
    argv[n] = NULL;
    if (run->opt.pg_user && access(argv[0], X_OK) != 0)
        argv[0] = "/sbin/runuser";
    run->pg_ctl_pid = chaos_spawn(argv, out, out, true);
    if (run->pg_ctl_pid <= 0) {
        run->pg_ctl_pid = 0;
        return -1;
    }
    return 0;
}

/* ---- running something to the end
 * ------------------------------------------------------------------------------ */

int chaos_run_sync(ChaosRun *run, char *const argv[], const char *log)
{
    int status;
    pid_t pid = chaos_spawn(argv, log, log, true);

    if (pid <= 0)
        return -1;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* ---- reaping
 * --------------------------------------------------------------------------------------------------- */

void chaos_reap(ChaosRun *run)
{
    int status;
    pid_t pid;

    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        bool known = false;
        for (int i = 0; i < CHAOS_DAEMONS; i++) {
            if (run->daemons[i].pid == pid) {
                daemon_exited(run, &run->daemons[i], status);
                known = true;
            }
        }
        for (int i = 0; !known && i < CHAOS_CLI_MAX; i++) {
            if (run->cli[i].pid == pid) {
                run->cli_done(run, &run->cli[i], status);
                run->cli[i].pid = 0;
                known = true;
            }
        }
        if (!known && pid == run->nats_pid) {
            if (run->nats_state != CHAOS_SRV_STOPPING) {
                char how[64];
                describe_status(status, how, sizeof how);
                chaos_incident(run, "nats-server died on its own", "nats-server ended with %s at t=%.1fs",
                               how, (double)chaos_now_ms(run) / 1000.0);
                run->nats_up_at_ms = chaos_now_ms(run) + 500;
            }
            run->nats_pid = 0;
            run->nats_state = CHAOS_SRV_DOWN;
        } else if (!known && pid == run->pg_ctl_pid) {
            run->pg_ctl_pid = 0;
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                char how[64];
                describe_status(status, how, sizeof how);
                chaos_note(run, "pg_ctl ended with %s (see %s/pg_ctl.log)", how, run->opt.dir);
            }
            /* A stop that ended leaves the server down until its planned start; a start leaves it up (or, if
             * it failed, down: the heal phase tries again). */
            if (run->pg_state == CHAOS_SRV_STOPPING)
                run->pg_state = CHAOS_SRV_DOWN;
            else if (run->pg_state == CHAOS_SRV_STARTING && WIFEXITED(status) && WEXITSTATUS(status) == 0)
                run->pg_state = CHAOS_SRV_UP;
            else if (run->pg_state == CHAOS_SRV_STARTING) {
                run->pg_state = CHAOS_SRV_DOWN;
                run->pg_up_at_ms = chaos_now_ms(run) + 1000;
            }
        }
    }
}
