/* test_startup.c — a signal during a daemon's start-up (found by the chaos soak: a worker sent SIGTERM 1.4 s
 * after its start, on a loaded machine, died of the signal's default action before its handlers were in
 * place). Each daemon holds SIGTERM, SIGINT and SIGHUP from its first line until its event loop handles them;
 * one sent in between is a graceful stop (or a reload) like any other. Real PostgreSQL, nats-server and
 * daemons. */
#include "fixture.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "suite.h"

/* True when pid blocks signal sig (the SigBlk mask of /proc/PID/status). */
static bool blocks(pid_t pid, int sig)
{
    char path[64], line[256];
    unsigned long long mask = 0;
    bool found = false;

    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "SigBlk: %llx", &mask) == 1) {
            found = true;
            break;
        }
    fclose(f);
    return found && (mask & (1ULL << (sig - 1)));
}

typedef struct Held {
    TwFxProc *p;
} Held;

static bool held(void *arg)
{
    const Held *h = arg;
    return blocks(tw_fx_proc_pid(h->p), SIGTERM) || !tw_fx_proc_alive(h->p);
}

/* Starts a daemon, signals it as soon as it holds the signals (so, in all likelihood, before its event loop
 * runs), and expects a clean exit 0 with its "stopped" line. `first` is sent before SIGTERM (0: none). */
static void signal_during_startup(TwFx *fx, TwFxProc *p, int first)
{
    Held h = {p};
    int status = 0;

    /* Without the hold, this never holds and the test fails here. */
    ck_assert_msg(tw_fx_wait_until(held, &h, 20000) && tw_fx_proc_alive(p),
                  "the daemon did not hold SIGTERM during its start-up");
    if (first)
        ck_assert(tw_fx_proc_signal(p, first));
    ck_assert(tw_fx_proc_signal(p, SIGTERM));
    ck_assert_msg(tw_fx_proc_wait(p, 30000, &status), "the daemon did not stop within 30 s of SIGTERM");
    char *log = tw_fx_proc_log(p);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "the daemon ended with wait status 0x%x (killed by signal %d), not a clean exit; log:\n%s",
                  (unsigned)status, WIFSIGNALED(status) ? WTERMSIG(status) : 0, log);
    ck_assert_msg(strstr(log, " stopped"), "no 'stopped' line in the log:\n%s", log);
    free(log);
    (void)fx;
}

/* The daemons start in milliseconds now (their connections are made in the background): each pauses 1 s with
 * the signals held (TW_TEST_STARTUP_PAUSE_MS, read by tw_daemon_hold_signals), so that the signal surely
 * comes while they are held, whatever the machine's speed. */
static TwFx *startup_fixture(void)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    setenv("TW_TEST_STARTUP_PAUSE_MS", "1000", 1);
    return fx;
}

START_TEST(test_sigterm_during_startup)
{
    TwFx *fx = startup_fixture();
    signal_during_startup(fx, tw_fx_start_worker(fx, NULL), 0);
    signal_during_startup(fx, tw_fx_start_pmo(fx, NULL), 0);
    tw_fx_free(fx);
}
END_TEST

/* SIGHUP (what systemd's ExecReload sends) during start-up is a reload, not the death its default action is.
 */
START_TEST(test_sighup_during_startup)
{
    TwFx *fx = startup_fixture();
    signal_during_startup(fx, tw_fx_start_worker(fx, NULL), SIGHUP);
    signal_during_startup(fx, tw_fx_start_pmo(fx, NULL), SIGHUP);
    tw_fx_free(fx);
}
END_TEST

TW_SUITE_DEFINE(startup, {
                             {"signals", test_sigterm_during_startup, 90},
                             {"signals", test_sighup_during_startup, 90},
                         })
