/* Unit tests for worker/runner.c: the time limit of a program, whatever the order in which the event loop
 * sees the deadline and the program's reply. No servers: a plain event loop, /bin/sh programs, and this
 * process reaping its children as the worker's SIGCHLD handler does. */
#include <check.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runner.h"
#include "serve.h"
#include "suite.h"

typedef struct Ran {
    bool done;
    WrkProcOutcome outcome;
    double elapsed_sec;
} Ran;

static void done_cb(WrkProc *proc, const WrkProcResult *r, void *arg)
{
    Ran *ran = arg;
    (void)proc;
    ran->done = true;
    ran->outcome = r->outcome;
    ran->elapsed_sec = r->elapsed_sec;
}

static bool serve_done_cb(const WrkProcResult *r, void *arg)
{
    done_cb(NULL, r, arg);
    return true;
}

/* Runs the loop until the program's result is in, reaping children as the worker's SIGCHLD handler would
 * (serve processes too, when serve is not NULL). */
static void run_until(struct event_base *base, WrkServe *serve, Ran *ran)
{
    signal(SIGPIPE, SIG_IGN); /* as the worker: a program that exits before reading its input */
    for (int i = 0; i < 2000 && !ran->done; i++) {
        struct timeval tick = {0, 10000};
        event_base_loopexit(base, &tick);
        event_base_dispatch(base);
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
            if (!wrk_proc_exited(pid, status) && serve)
                wrk_serve_exited(serve, pid, status);
    }
    ck_assert_msg(ran->done, "the program's result never came");
}

static void run_until_done(struct event_base *base, Ran *ran)
{
    run_until(base, NULL, ran);
}

/* The worker frozen (SIGSTOP) past a step's deadline while its program replies late: when it wakes up, the
 * deadline and the reply are both there. The reply, 1.5 s into a 1 s limit, is a timeout whichever the loop
 * handles first. */
START_TEST(test_late_reply_while_frozen_is_a_timeout)
{
    signal(SIGPIPE, SIG_IGN); /* as the worker: a program that exits before reading its input */
    struct event_base *base = event_base_new();
    char *const argv[] = {"/bin/sh", "-c", "sleep 1.5; echo '{\"complete\":{\"output\":{}}}'", NULL};
    Ran ran = {0};
    char *const no_env[] = {NULL};
    WrkProc *p = wrk_proc_start(base, argv, no_env, "{}", 2, 1, 1, "late", done_cb, &ran);
    ck_assert_ptr_nonnull(p);
    /* The loop does not run for 2.5 s: a frozen worker. The program has replied and exited by then. */
    struct timespec frozen = {2, 500000000};
    nanosleep(&frozen, NULL);
    /* On waking, the worker's SIGCHLD handler reaps it before the loop looks at the expired deadline; the
     * loop then reads the reply. */
    int status;
    pid_t pid = waitpid(-1, &status, 0);
    ck_assert_int_gt(pid, 0);
    ck_assert(wrk_proc_exited(pid, status));
    run_until_done(base, &ran);
    ck_assert_msg(ran.outcome == WRK_PROC_TIMEOUT, "outcome %d after %.3f s, not a timeout", (int)ran.outcome,
                  ran.elapsed_sec);
    event_base_free(base);
}
END_TEST

/* The deadline never stops a program before its whole time has passed, even when the loop's clock is behind:
 * a program started from a callback runs on the time the loop cached before that callback, and a loaded
 * worker can spend a while in its callbacks (a claim that starts many programs). */
typedef struct Late {
    struct event_base *base;
    Ran *ran;
    char *const *argv;
} Late;

static void start_late_cb(evutil_socket_t fd, short what, void *arg)
{
    Late *l = arg;
    char *const no_env[] = {NULL};
    (void)fd;
    (void)what;
    struct timespec busy = {0, 400000000};
    nanosleep(&busy, NULL);
    ck_assert_ptr_nonnull(wrk_proc_start(l->base, l->argv, no_env, "{}", 2, 1, 1, "early", done_cb, l->ran));
}

START_TEST(test_deadline_not_early)
{
    struct event_base *base = event_base_new();
    char *const argv[] = {"/bin/sh", "-c", "exec sleep 5", NULL};
    Ran ran = {0};
    Late late = {base, &ran, argv};
    struct timeval now = {0, 0};
    event_base_once(base, -1, EV_TIMEOUT, start_late_cb, &late, &now);
    run_until_done(base, &ran);
    ck_assert_int_eq(ran.outcome, WRK_PROC_TIMEOUT);
    ck_assert_msg(ran.elapsed_sec >= 1.0, "stopped after %.3f s of a 1 s limit", ran.elapsed_sec);
    event_base_free(base);
}
END_TEST

/* Serve mode keeps the same rule: a program that answers one JSON line per request. */
static const char serve_loop[] = "while read -r line; do sleep \"$TW_SLEEP\"; echo '{\"complete\":{}}'; done";

static WrkServeProc *serve_request(WrkServe *s, const char *sleep_sec, Ran *ran)
{
    static char *argv[] = {"/bin/sh", "-c", (char *)serve_loop, NULL};
    WrkServeProgram prog = {
        .kind = "agent", .exec = "serve-loop", .argv = argv, .grace_sec = 1, .max_requests = 10};

    setenv("TW_SLEEP", sleep_sec, 1);
    return wrk_serve_call(s, &prog, "{}", 2, 1, "serve", serve_done_cb, ran);
}

START_TEST(test_serve_late_reply_while_frozen_is_a_timeout)
{
    signal(SIGPIPE, SIG_IGN);
    struct event_base *base = event_base_new();
    WrkServe *s = wrk_serve_new(base, 2);
    Ran ran = {0};
    ck_assert_ptr_nonnull(serve_request(s, "1.5", &ran));
    /* Its request goes out; then the worker freezes for 2.5 s, and the reply, 1.5 s into the 1 s limit, is on
     * stdout when it wakes up, together with the expired deadline. */
    for (int i = 0; i < 5; i++)
        event_base_loop(base, EVLOOP_NONBLOCK);
    struct timespec frozen = {2, 500000000};
    nanosleep(&frozen, NULL);
    run_until(base, s, &ran);
    ck_assert_msg(ran.outcome == WRK_PROC_TIMEOUT, "outcome %d after %.3f s, not a timeout", (int)ran.outcome,
                  ran.elapsed_sec);
    wrk_serve_free(s);
    event_base_free(base);
}
END_TEST

typedef struct ServeLate {
    WrkServe *s;
    Ran *ran;
} ServeLate;

static void serve_late_cb(evutil_socket_t fd, short what, void *arg)
{
    ServeLate *l = arg;
    (void)fd;
    (void)what;
    struct timespec busy = {0, 400000000};
    nanosleep(&busy, NULL);
    ck_assert_ptr_nonnull(serve_request(l->s, "5", l->ran));
}

START_TEST(test_serve_deadline_not_early)
{
    signal(SIGPIPE, SIG_IGN);
    struct event_base *base = event_base_new();
    WrkServe *s = wrk_serve_new(base, 2);
    Ran ran = {0};
    ServeLate late = {s, &ran};
    struct timeval now = {0, 0};
    event_base_once(base, -1, EV_TIMEOUT, serve_late_cb, &late, &now);
    run_until(base, s, &ran);
    ck_assert_int_eq(ran.outcome, WRK_PROC_TIMEOUT);
    ck_assert_msg(ran.elapsed_sec >= 1.0, "stopped after %.3f s of a 1 s limit", ran.elapsed_sec);
    wrk_serve_free(s);
    event_base_free(base);
}
END_TEST

TW_SUITE_DEFINE(runner, {
                            {"time_limit", test_late_reply_while_frozen_is_a_timeout, 30},
                            {"time_limit", test_deadline_not_early, 30},
                            {"serve_time_limit", test_serve_late_reply_while_frozen_is_a_timeout, 30},
                            {"serve_time_limit", test_serve_deadline_not_early, 30},
                        })
