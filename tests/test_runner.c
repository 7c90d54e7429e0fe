/* Unit tests for worker/runner.c and worker/serve.c: the time limit of a program, whatever the order in which
 * the event loop sees the deadline and the program's reply; the pipes; a serve process that goes wrong
 * between requests (exits, closes a pipe, writes a stray line) whatever the order in which the worker sees
 * that and hands it the next request. No servers: a plain event loop, /bin/sh programs, and this process
 * reaping its children as the worker's SIGCHLD handler does. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pwd.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"
#include "runner.h"
#include "serve.h"
#include "steps.h"
#include "suite.h"

typedef struct Ran {
    bool done;
    WrkProcOutcome outcome;
    int exit_code, term_signal;
    double elapsed_sec, cpu_sec;
    long maxrss_kb;
    char limit[32];
    size_t output_len;
    char output[512];      /* its start */
    char tool_error[1024]; /* as a tool call's result: its error code and message, "" when ok */
} Ran;

static char *const no_env[] = {NULL};

/* A loop, and SIGPIPE ignored as the worker does (a program may exit before reading its input). */
static struct event_base *new_base(void)
{
    signal(SIGPIPE, SIG_IGN);
    return event_base_new();
}

static void done_cb(WrkProc *proc, const WrkProcResult *r, void *arg)
{
    Ran *ran = arg;
    (void)proc;
    ran->done = true;
    ran->outcome = r->outcome;
    ran->exit_code = r->exit_code;
    ran->term_signal = r->term_signal;
    ran->elapsed_sec = r->elapsed_sec;
    ran->cpu_sec = r->cpu_sec;
    ran->maxrss_kb = r->maxrss_kb;
    snprintf(ran->limit, sizeof ran->limit, "%s", r->limit ? r->limit : "");
    ran->output_len = r->output_len;
    snprintf(ran->output, sizeof ran->output, "%.*s", (int)r->output_len, r->output ? r->output : "");
    json_t *t = wrk_tool_outcome(10, r), *e = json_object_get(t, "error");
    snprintf(ran->tool_error, sizeof ran->tool_error, "%s%s%s",
             e ? json_string_value(json_object_get(e, "code")) : "", e ? ": " : "",
             e ? json_string_value(json_object_get(e, "message")) : "");
    json_decref(t);
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
    for (int i = 0; i < 2000 && !ran->done; i++) {
        struct timeval tick = {0, 10000};
        event_base_loopexit(base, &tick);
        event_base_dispatch(base);
        int status;
        struct rusage ru;
        pid_t pid;
        while ((pid = wait4(-1, &status, WNOHANG, &ru)) > 0)
            if (!wrk_proc_exited(pid, status, &ru) && serve)
                wrk_serve_exited(serve, pid, status, &ru);
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
    struct event_base *base = new_base();
    char *const argv[] = {"/bin/sh", "-c", "sleep 1.5; echo '{\"complete\":{\"output\":{}}}'", NULL};
    Ran ran = {0};
    WrkProc *p = wrk_proc_start(base, argv, no_env, NULL, "{}", 2, 1, 1, "late", done_cb, &ran);
    ck_assert_ptr_nonnull(p);
    /* The loop does not run for 2.5 s: a frozen worker. The program has replied and exited by then. */
    struct timespec frozen = {2, 500000000};
    nanosleep(&frozen, NULL);
    /* On waking, the worker's SIGCHLD handler reaps it before the loop looks at the expired deadline; the
     * loop then reads the reply. */
    int status;
    pid_t pid = waitpid(-1, &status, 0);
    ck_assert_int_gt(pid, 0);
    ck_assert(wrk_proc_exited(pid, status, NULL));
    run_until_done(base, &ran);
    ck_assert_msg(ran.outcome == WRK_PROC_TIMEOUT, "outcome %d after %.3f s, not a timeout", (int)ran.outcome,
                  ran.elapsed_sec);
    event_base_free(base);
}
END_TEST

/* The deadline never stops a program before its whole time has passed, even when the loop's clock is behind:
 * a program started from a callback runs on the time the loop cached before that callback, and a loaded
 * worker can spend a while in its callbacks (a claim that starts many programs). */
/* Starts its program (a serve request when serve is set) after 400 ms spent in this callback. */
typedef struct Late {
    struct event_base *base;
    WrkServe *serve;
    Ran *ran;
    char *const *argv;
} Late;

static WrkServeReq *serve_request(WrkServe *s, const char *sleep_sec, Ran *ran);

static void start_late_cb(evutil_socket_t fd, short what, void *arg)
{
    Late *l = arg;
    (void)fd;
    (void)what;
    struct timespec busy = {0, 400000000};
    nanosleep(&busy, NULL);
    if (l->serve)
        ck_assert_ptr_nonnull(serve_request(l->serve, "5", l->ran));
    else
        ck_assert_ptr_nonnull(
            wrk_proc_start(l->base, l->argv, no_env, NULL, "{}", 2, 1, 1, "early", done_cb, l->ran));
}

START_TEST(test_deadline_not_early)
{
    struct event_base *base = new_base();
    char *const argv[] = {"/bin/sh", "-c", "exec sleep 5", NULL};
    Ran ran = {0};
    Late late = {base, NULL, &ran, argv};
    struct timeval now = {0, 0};
    event_base_once(base, -1, EV_TIMEOUT, start_late_cb, &late, &now);
    run_until_done(base, &ran);
    ck_assert_int_eq(ran.outcome, WRK_PROC_TIMEOUT);
    ck_assert_msg(ran.elapsed_sec >= 1.0, "stopped after %.3f s of a 1 s limit", ran.elapsed_sec);
    event_base_free(base);
}
END_TEST

/* Descriptors are handed out lowest first: the lowest free one now. */
static int lowest_free_fd(void)
{
    int fd = open("/dev/null", O_RDONLY);
    ck_assert_int_ge(fd, 0);
    close(fd);
    return fd;
}

/* Another part of the process closed the descriptor of a program's stdout twice, and the number came back as
 * another file: the runner must neither read that file nor close it, and the step still ends. */
START_TEST(test_pipe_closed_behind_our_back)
{
    struct event_base *base = new_base();
    char *const argv[] = {"/bin/sh", "-c", "echo '{\"complete\":{}}'; exec sleep 0.5", NULL};
    Ran ran = {0};
    int b = lowest_free_fd(), out = -1;
    ck_assert_ptr_nonnull(wrk_proc_start(base, argv, no_env, NULL, "{}", 2, 10, 1, "foreign", done_cb, &ran));
    /* Its stdout is the read end that gets the reply first: stdin's write end is b + 1, stdout's and
     * stderr's read ends b + 2 and b + 4. */
    for (int i = 0; i < 500 && out < 0; i++) {
        int avail = 0;
        if (ioctl(b + 2, FIONREAD, &avail) == 0 && avail > 0)
            out = b + 2;
        else
            usleep(10000);
    }
    ck_assert_msg(out >= 0, "the program's reply never reached descriptor %d", b + 2);
    /* Closed and handed out again as another file, in one step. */
    int dev_null = open("/dev/null", O_RDONLY), foreign = out;
    ck_assert_int_eq(dup2(dev_null, foreign), foreign);
    close(dev_null);
    run_until_done(base, &ran);
    struct stat st;
    ck_assert_msg(fstat(foreign, &st) == 0 && S_ISCHR(st.st_mode),
                  "the runner closed descriptor %d, which was no longer its pipe", foreign);
    close(foreign);
    event_base_free(base);
}
END_TEST

static void never_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}

/* libevent still watches a number whose descriptor was closed behind its back; a new pipe under that number
 * is then never reported readable. A program's reply must not depend on that report: what it wrote before
 * exiting is taken when its exit is seen. */
START_TEST(test_reply_taken_at_exit)
{
    struct event_base *base = new_base();
    char *const argv[] = {"/bin/sh", "-c", "echo '{\"complete\":{}}'", NULL};
    Ran ran = {0};
    int b = lowest_free_fd();
    /* b and b + 1 taken, so that a pipe gets b + 2 (the number the program's stdout will get), watched, then
     * closed without telling libevent. */
    int a = open("/dev/null", O_RDONLY), c = open("/dev/null", O_RDONLY), fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    ck_assert_int_eq(fds[0], b + 2);
    struct event *stale = event_new(base, fds[0], EV_READ | EV_PERSIST, never_cb, NULL);
    ck_assert_int_eq(event_add(stale, NULL), 0);
    close(fds[0]);
    close(fds[1]);
    close(a);
    close(c);
    ck_assert_ptr_nonnull(wrk_proc_start(base, argv, no_env, NULL, "{}", 2, 10, 1, "stale", done_cb, &ran));
    /* Its stdin is written from the loop; then it replies and exits. */
    for (int i = 0; i < 5; i++)
        event_base_loop(base, EVLOOP_NONBLOCK);
    int status;
    pid_t pid = waitpid(-1, &status, 0);
    ck_assert_int_gt(pid, 0);
    ck_assert(wrk_proc_exited(pid, status, NULL));
    ck_assert_msg(ran.done, "the reply was not taken at the program's exit");
    ck_assert_int_eq(ran.outcome, WRK_PROC_OK);
    ck_assert_uint_eq(ran.output_len, strlen("{\"complete\":{}}\n"));
    event_free(stale);
    event_base_free(base);
}
END_TEST

/* Serve mode keeps the same rule: a program that answers one JSON line per request. */
static const char serve_loop[] = "while read -r line; do sleep \"$TW_SLEEP\"; echo '{\"complete\":{}}'; done";

static WrkServeReq *serve_request(WrkServe *s, const char *sleep_sec, Ran *ran)
{
    static char *argv[] = {"/bin/sh", "-c", (char *)serve_loop, NULL};
    WrkServeProgram prog = {
        .kind = "agent", .exec = "serve-loop", .argv = argv, .grace_sec = 1, .max_requests = 10};

    setenv("TW_SLEEP", sleep_sec, 1);
    return wrk_serve_call(s, &prog, "{}", 2, 1, "serve", serve_done_cb, ran);
}

START_TEST(test_serve_late_reply_while_frozen_is_a_timeout)
{
    struct event_base *base = new_base();
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

START_TEST(test_serve_deadline_not_early)
{
    struct event_base *base = new_base();
    WrkServe *s = wrk_serve_new(base, 2);
    Ran ran = {0};
    Late late = {base, s, &ran, NULL};
    struct timeval now = {0, 0};
    event_base_once(base, -1, EV_TIMEOUT, start_late_cb, &late, &now);
    run_until(base, s, &ran);
    ck_assert_int_eq(ran.outcome, WRK_PROC_TIMEOUT);
    ck_assert_msg(ran.elapsed_sec >= 1.0, "stopped after %.3f s of a 1 s limit", ran.elapsed_sec);
    wrk_serve_free(s);
    event_base_free(base);
}
END_TEST

/* ---- serve mode: a process that goes wrong between requests costs the next request nothing */

/* A /bin/sh serve program: script runs with $TW_DIR set to a fresh directory. Each of its replies echoes the
 * request, so a test sees which request a reply answered. */
typedef struct Between {
    struct event_base *base;
    WrkServe *s;
    char dir[64];
    char *argv[4];
} Between;

static void between_start(Between *b, const char *script)
{
    b->base = new_base();
    b->s = wrk_serve_new(b->base, 1);
    snprintf(b->dir, sizeof b->dir, "/tmp/tw-runner-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(b->dir));
    setenv("TW_DIR", b->dir, 1);
    b->argv[0] = "/bin/sh";
    b->argv[1] = "-c";
    b->argv[2] = (char *)script;
    b->argv[3] = NULL;
}

/* Request {"n": n}, without running the loop. */
static void between_send(Between *b, int n, Ran *ran)
{
    WrkServeProgram prog = {
        .kind = "agent", .exec = "between", .argv = b->argv, .grace_sec = 1, .max_requests = 100};
    char doc[32];

    *ran = (Ran){0};
    snprintf(doc, sizeof doc, "{\"n\":%d}", n);
    ck_assert_ptr_nonnull(wrk_serve_call(b->s, &prog, doc, strlen(doc), 10, "between", serve_done_cb, ran));
}

/* Request {"n": n}, and run until its result is in. */
static void between_request(Between *b, int n, Ran *ran)
{
    between_send(b, n, ran);
    run_until(b->base, b->s, ran);
}

/* Waits (the loop not running) until the program has made $TW_DIR/name. */
static void between_wait_file(const Between *b, const char *name)
{
    char path[96];

    snprintf(path, sizeof path, "%s/%s", b->dir, name);
    for (int i = 0; i < 2000 && access(path, F_OK) != 0; i++)
        usleep(10000);
    ck_assert_msg(access(path, F_OK) == 0, "the program never made %s", name);
}

/* The reply to request n, as a program that echoes its request writes it. */
static void between_answered(const Ran *ran, int n)
{
    char want[64];

    snprintf(want, sizeof want, "{\"complete\":{\"output\":{\"n\":%d}}}", n);
    ck_assert_msg(ran->outcome == WRK_PROC_OK && strcmp(ran->output, want) == 0,
                  "request %d: outcome %d (exit code %d), output '%s'", n, (int)ran->outcome, ran->exit_code,
                  ran->output);
}

static void between_touch(const Between *b, const char *name)
{
    char path[96];

    snprintf(path, sizeof path, "%s/%s", b->dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
}

/* Lines in $TW_DIR/starts: each process of the scripts below writes one when it starts. */
static int between_starts(const Between *b)
{
    char path[96], line[64];
    int n = 0;

    snprintf(path, sizeof path, "%s/starts", b->dir);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof line, f))
        n++;
    fclose(f);
    return n;
}

static void between_end(Between *b)
{
    char cmd[96];

    wrk_serve_free(b->s);
    event_base_free(b->base);
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", b->dir);
    ck_assert_int_eq(system(cmd), 0);
}

#define BETWEEN_REPLY                                                                                        \
    "echo $$ >> \"$TW_DIR/starts\"; read -r line; echo \"{\\\"complete\\\":{\\\"output\\\":$line}}\"; "

/* Two requests one after the other, each answered; the second by a new process (the first one was on its way
 * out, or answered nothing after its reply). */
static void between_second_by_new(Between *b)
{
    Ran ran;

    between_request(b, 1, &ran);
    between_answered(&ran, 1);
    between_request(b, 2, &ran);
    between_answered(&ran, 2);
    ck_assert_int_eq(between_starts(b), 2);
}

/* It replies, then exits without reading the next request: that request, already written to it, goes to a
 * new process. Seen first as EOF on its stdout, or (a child of its own keeps its pipes open) as its exit. */
START_TEST(test_serve_exit_after_reply)
{
    static const char *const scripts[] = {BETWEEN_REPLY "exec sleep 0.5",
                                          BETWEEN_REPLY "sleep 1.5 & exec sleep 0.5"};

    for (size_t i = 0; i < sizeof scripts / sizeof scripts[0]; i++) {
        Between b;

        between_start(&b, scripts[i]);
        between_second_by_new(&b);
        between_end(&b);
    }
}
END_TEST

/* It replies, then closes its stdin and lingers: a request already given to it cannot be written (EPIPE) and
 * goes to a new process. */
START_TEST(test_serve_stdin_closed_after_reply)
{
    Between b;
    Ran ran;

    between_start(&b, BETWEEN_REPLY "while [ ! -e \"$TW_DIR/go\" ]; do sleep 0.01; done; "
                                    "exec 0<&-; touch \"$TW_DIR/closed\"; exec sleep 5");
    between_request(&b, 1, &ran);
    between_answered(&ran, 1);
    /* Given the request first, then it closes its stdin, then the loop writes the request. */
    between_send(&b, 2, &ran);
    between_touch(&b, "go");
    between_wait_file(&b, "closed");
    run_until(b.base, b.s, &ran);
    between_answered(&ran, 2);
    ck_assert_int_eq(between_starts(&b), 2);
    between_end(&b);
}
END_TEST

/* It replies, closes its stdout and reads on (it can never answer again): it serves no more. */
START_TEST(test_serve_stdout_closed_after_reply)
{
    Between b;
    Ran ran;

    between_start(&b, BETWEEN_REPLY "exec 1>&-; touch \"$TW_DIR/closed\"; exec cat >/dev/null");
    between_request(&b, 1, &ran);
    between_answered(&ran, 1);
    between_wait_file(&b, "closed");
    between_request(&b, 2, &ran);
    between_answered(&ran, 2);
    ck_assert_int_eq(between_starts(&b), 2);
    between_end(&b);
}
END_TEST

/* Replies, then a stray line after `sleep 0.3`, then $TW_DIR/strayed; then it waits `TW_PAUSE` seconds and
 * reads on. */
#define BETWEEN_STRAY                                                                                        \
    "echo $$ >> \"$TW_DIR/starts\"; while read -r line; do "                                                 \
    "echo \"{\\\"complete\\\":{\\\"output\\\":$line}}\"; sleep 0.3; echo "                                   \
    "'{\"complete\":{\"output\":\"stray\"}}'; "                                                              \
    "touch \"$TW_DIR/strayed\"; sleep \"$TW_PAUSE\"; done"

/* The stray line is there before the next request is written: the request goes to a new process instead,
 * whether the line came before the worker chose the process (here: it is in the pipe before the request is
 * made) or after (the request made, the loop not yet run to write it). */
START_TEST(test_serve_stray_line_before_request)
{
    for (int chosen_first = 0; chosen_first < 2; chosen_first++) {
        Between b;
        Ran ran;

        setenv("TW_PAUSE", "0", 1);
        between_start(&b, BETWEEN_STRAY);
        between_request(&b, 1, &ran);
        between_answered(&ran, 1);
        if (chosen_first) {
            between_send(&b, 2, &ran);
            between_wait_file(&b, "strayed");
            run_until(b.base, b.s, &ran);
        } else {
            between_wait_file(&b, "strayed");
            between_request(&b, 2, &ran);
        }
        between_answered(&ran, 2);
        ck_assert_int_eq(between_starts(&b), 2);
        between_end(&b);
    }
}
END_TEST

/* The stray line comes after the next request was written, while that request still waits unread: the line
 * answers nothing, and a new process serves the request. */
START_TEST(test_serve_stray_line_after_request)
{
    Between b;

    setenv("TW_PAUSE", "5", 1);
    between_start(&b, BETWEEN_STRAY);
    between_second_by_new(&b);
    between_end(&b);
}
END_TEST

/* A request goes to a new process at most once: here the new process dies before reading it too (the first
 * one left $TW_DIR/die behind), and the request fails with that exit, as in exec mode. */
START_TEST(test_serve_resent_once)
{
    Between b;
    Ran ran;

    between_start(&b,
                  "[ -e \"$TW_DIR/die\" ] && exit 3; " BETWEEN_REPLY "touch \"$TW_DIR/die\"; exec sleep 0.5");
    between_request(&b, 1, &ran);
    between_answered(&ran, 1);
    between_request(&b, 2, &ran);
    ck_assert_msg(ran.outcome == WRK_PROC_EXIT && ran.exit_code == 3, "request 2: outcome %d (exit code %d)",
                  (int)ran.outcome, ran.exit_code);
    /* The second process died before writing its start line; no third was started. */
    ck_assert_int_eq(between_starts(&b), 1);
    ck_assert_uint_eq(wrk_serve_count(b.s), 0);
    between_end(&b);
}
END_TEST

/* ---- limits on programs (contract 16)
 * ------------------------------------------------------------------------------------ */

/* tw-hog-tool.py (python3, not instrumented: a sanitizer's shadow memory would not fit a memory limit) as a
 * tool, with args; its result in ran. It runs from a copy of its own: with run_as_user = nobody, the checkout
 * may be out of that user's reach. */
static void hog(const TwLimitsConf *limits, const char *args, int timeout_sec, Ran *ran)
{
    struct event_base *base = new_base();
    char *script = NULL, *doc = NULL;
    ck_assert_int_gt(asprintf(&script, "%s/examples/tools/tw-hog-tool.py", tw_fx_source_dir()), 0);
    char *copy = tw_fx_copy_for_user(script);
    free(script);
    script = copy;
    ck_assert_int_gt(asprintf(&doc, "{\"tool_call_id\":\"c1\",\"tool\":\"hog\",\"args\":%s}", args), 0);
    char *const argv[] = {"/usr/bin/python3", script, NULL};
    *ran = (Ran){0};
    WrkProc *p =
        wrk_proc_start(base, argv, no_env, limits, doc, strlen(doc), timeout_sec, 1, "hog", done_cb, ran);
    ck_assert_ptr_nonnull(p);
    run_until_done(base, ran);
    event_base_free(base);
    tw_fx_remove_copy(script);
    free(doc);
}

/* A program that allocates 512 MiB under memory_limit_mb = 64 exits 1 (Python's MemoryError), and that is
 * resource_limit with the limit in the message, told apart by its peak memory; one that fails otherwise under
 * the same limit is not. */
START_TEST(test_limit_memory)
{
    TwLimitsConf l = {.memory_limit_mb = 64};
    Ran ran;
    hog(&l, "{\"what\":\"memory\",\"mb\":512}", 20, &ran);
    ck_assert_msg(ran.outcome == WRK_PROC_LIMIT, "outcome %d, exit %d, peak %ld KiB: %s", (int)ran.outcome,
                  ran.exit_code, ran.maxrss_kb, ran.tool_error);
    ck_assert_str_eq(ran.limit, "memory_limit_mb");
    ck_assert_int_eq(ran.exit_code, 1);
    ck_assert_msg(strstr(ran.tool_error, "resource_limit: the tool program exited with status 1 at its "
                                         "memory_limit_mb (64 MiB; its peak resident memory was") &&
                      strstr(ran.tool_error, "MemoryError"),
                  "%s", ran.tool_error);
    /* Within the limit: fine. */
    hog(&l, "{\"what\":\"memory\",\"mb\":8}", 20, &ran);
    ck_assert_msg(ran.outcome == WRK_PROC_OK, "%s", ran.tool_error);
    /* A failure of its own, far from the limit, is the tool's failure as before. */
    TwLimitsConf lf = {.memory_limit_mb = 64, .max_open_files = 16};
    hog(&lf, "{\"what\":\"files\",\"n\":100}", 20, &ran);
    ck_assert_msg(ran.outcome == WRK_PROC_EXIT && ran.exit_code == 1, "outcome %d: %s", (int)ran.outcome,
                  ran.tool_error);
    ck_assert_msg(strstr(ran.tool_error, "tool_failed: ") && strstr(ran.tool_error, "Too many open files"),
                  "%s", ran.tool_error);
    /* Without a limit it opens them all. */
    hog(NULL, "{\"what\":\"files\",\"n\":100}", 20, &ran);
    ck_assert_msg(ran.outcome == WRK_PROC_OK && strstr(ran.output, "\"opened\": 100"), "%s %s", ran.output,
                  ran.tool_error);
}
END_TEST

/* A busy loop under cpu_limit_seconds = 1 is stopped by SIGXCPU; one that ignores SIGXCPU by the SIGKILL a
 * second later; both resource_limit. */
START_TEST(test_limit_cpu)
{
    TwLimitsConf l = {.cpu_limit_sec = 1};
    Ran ran;
    hog(&l, "{\"what\":\"cpu\"}", 20, &ran);
    ck_assert_msg(ran.outcome == WRK_PROC_LIMIT && ran.term_signal == SIGXCPU, "outcome %d signal %d: %s",
                  (int)ran.outcome, ran.term_signal, ran.tool_error);
    ck_assert_str_eq(ran.limit, "cpu_limit_seconds");
    ck_assert_msg(ran.cpu_sec > 0, "%.3f s of CPU", ran.cpu_sec); /* wait4's is sampled: not exactly 1 s */
    ck_assert_msg(strstr(ran.tool_error,
                         "resource_limit: the tool program used up its cpu_limit_seconds (1 s of "
                         "CPU time) and was stopped (SIGXCPU)"),
                  "%s", ran.tool_error);

    struct event_base *base = new_base();
    char *const argv[] = {"/bin/sh", "-c", "trap '' XCPU; while :; do :; done", NULL};
    ran = (Ran){0};
    ck_assert_ptr_nonnull(wrk_proc_start(base, argv, no_env, &l, "{}", 2, 20, 1, "deaf", done_cb, &ran));
    run_until_done(base, &ran);
    event_base_free(base);
    ck_assert_msg(ran.outcome == WRK_PROC_LIMIT && ran.term_signal == SIGKILL, "outcome %d signal %d: %s",
                  (int)ran.outcome, ran.term_signal, ran.tool_error);
    ck_assert_msg(strstr(ran.tool_error, "(SIGKILL at the hard limit, one second later)"), "%s",
                  ran.tool_error);
}
END_TEST

/* The limits a program's process starts with, as it sees them (the shell's ulimit; dash's -p is processes).
 */
START_TEST(test_limits_set_before_exec)
{
    TwLimitsConf l = {
        .memory_limit_mb = 100, .cpu_limit_sec = 7, .max_open_files = 50, .max_processes = 4000};
    struct event_base *base = new_base();
    char *const argv[] = {"/bin/sh", "-c", "echo $(ulimit -d) $(ulimit -t) $(ulimit -n) $(ulimit -p)", NULL};
    Ran ran = {0};
    ck_assert_ptr_nonnull(wrk_proc_start(base, argv, no_env, &l, "{}", 2, 10, 1, "ulimit", done_cb, &ran));
    run_until_done(base, &ran);
    event_base_free(base);
    ck_assert_int_eq(ran.outcome, WRK_PROC_OK);
    ck_assert_str_eq(ran.output, "102400 7 50 4000\n");
}
END_TEST

/* run_as_user: the program runs with that user's uid and gid, no supplementary groups, no new privileges and
 * its HOME; max_processes then holds (RLIMIT_NPROC of that user). A user that does not exist: no start. */
START_TEST(test_limits_run_as_user)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_limits_run_as_user: needs root; not run\n");
        return;
    }
    struct passwd *pw = getpwnam("nobody");
    ck_assert_ptr_nonnull(pw);
    uid_t uid = pw->pw_uid;
    gid_t gid = pw->pw_gid;
    char *home = strdup(pw->pw_dir);
    TwLimitsConf l = {.run_as_user = "nobody"};
    Ran ran;
    hog(&l, "{\"what\":\"id\"}", 20, &ran);
    ck_assert_msg(ran.outcome == WRK_PROC_OK, "%s", ran.tool_error);
    json_t *j = json_loads(ran.output, 0, NULL), *o = json_object_get(j, "output");
    ck_assert_msg(o, "%s", ran.output);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "uid")), uid);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "euid")), uid);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "gid")), gid);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "egid")), gid);
    ck_assert_uint_eq(json_array_size(json_object_get(o, "groups")), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "no_new_privs")), 1);
    ck_assert_str_eq(json_string_value(json_object_get(o, "home")), home);
    json_decref(j);
    free(home);

    TwLimitsConf lp = {.run_as_user = "nobody", .max_processes = 5};
    hog(&lp, "{\"what\":\"procs\",\"n\":20}", 20, &ran);
    ck_assert_msg(ran.outcome == WRK_PROC_EXIT && strstr(ran.tool_error, "fork failed after"),
                  "outcome %d: %s", (int)ran.outcome, ran.tool_error);
    hog(&l, "{\"what\":\"procs\",\"n\":20}", 20, &ran);
    ck_assert_msg(ran.outcome == WRK_PROC_OK && strstr(ran.output, "\"started\": 20"), "%s %s", ran.output,
                  ran.tool_error);

    TwLimitsConf lx = {.run_as_user = "no-such-user-tw"};
    struct event_base *base = new_base();
    char *const argv[] = {"/bin/true", NULL};
    ck_assert_ptr_null(wrk_proc_start(base, argv, no_env, &lx, "{}", 2, 10, 1, "nouser", done_cb, &ran));
    event_base_free(base);
}
END_TEST

/* Serve mode: the CPU limit is per request (each of three requests uses 0.6 s of a 1 s limit, 1.8 s in all),
 * and a request that loops is stopped by it; the process then is gone, and the next request has a new one. */
static WrkServeReq *hog_serve(WrkServe *s, const TwLimitsConf *l, const char *args, Ran *ran)
{
    static char script[512];
    const char *src = getenv("TW_SOURCE_DIR");
    snprintf(script, sizeof script, "%s/examples/tools/tw-hog-tool.py", src ? src : "..");
    static char *argv[] = {"/usr/bin/python3", script, NULL};
    WrkServeProgram prog = {
        .kind = "tool", .exec = "hog", .argv = argv, .grace_sec = 1, .max_requests = 100, .limits = l};
    char doc[256];
    snprintf(doc, sizeof doc, "{\"tool_call_id\":\"c1\",\"tool\":\"hog\",\"args\":%s}", args);
    *ran = (Ran){0};
    return wrk_serve_call(s, &prog, doc, strlen(doc), 20, "hog-serve", serve_done_cb, ran);
}

START_TEST(test_limit_cpu_serve_per_request)
{
    struct event_base *base = new_base();
    WrkServe *s = wrk_serve_new(base, 2);
    TwLimitsConf l = {.cpu_limit_sec = 1};
    Ran ran;
    setenv("TURNWATCH_MODE", "serve", 1); /* what the worker puts in a serve program's environment */
    long pid = 0;
    for (int i = 0; i < 3; i++) {
        ck_assert_ptr_nonnull(hog_serve(s, &l, "{\"what\":\"cpu\",\"seconds\":0.6}", &ran));
        run_until(base, s, &ran);
        ck_assert_msg(ran.outcome == WRK_PROC_OK, "request %d: outcome %d: %s", i, (int)ran.outcome,
                      ran.tool_error);
        json_t *j = json_loads(ran.output, 0, NULL);
        long p = (long)json_integer_value(json_object_get(json_object_get(j, "output"), "pid"));
        json_decref(j);
        ck_assert_msg(i == 0 || p == pid, "request %d was served by a new process", i);
        pid = p;
    }
    ck_assert_ptr_nonnull(hog_serve(s, &l, "{\"what\":\"cpu\"}", &ran));
    run_until(base, s, &ran);
    ck_assert_msg(ran.outcome == WRK_PROC_LIMIT && strcmp(ran.limit, "cpu_limit_seconds") == 0,
                  "outcome %d: %s", (int)ran.outcome, ran.tool_error);
    ck_assert_ptr_nonnull(hog_serve(s, &l, "{\"what\":\"ok\"}", &ran));
    run_until(base, s, &ran);
    ck_assert_int_eq(ran.outcome, WRK_PROC_OK);
    json_t *j = json_loads(ran.output, 0, NULL);
    ck_assert_int_ne(json_integer_value(json_object_get(json_object_get(j, "output"), "pid")), pid);
    json_decref(j);
    unsetenv("TURNWATCH_MODE");
    wrk_serve_free(s);
    event_base_free(base);
}
END_TEST

/* Out of descriptors: neither way of starting a program gets its pipes, and each says why in errno (EMFILE),
 * which the step's error message turns into "the worker is out of file descriptors" (test_steps) rather than
 * a suggestion that the program is not executable. */
START_TEST(test_spawn_out_of_descriptors)
{
    struct event_base *base = new_base();
    WrkServe *s = wrk_serve_new(base, 2);
    char *const argv[] = {"/bin/sh", "-c", "echo '{}'", NULL};
    Ran ran = {0};
    struct rlimit was, none;
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

    /* The lowest free descriptor becomes the limit: nothing more can be opened. */
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &was), 0);
    none = (struct rlimit){(rlim_t)fd, was.rlim_max};
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &none), 0);
    errno = 0;
    WrkProc *p = wrk_proc_start(base, argv, no_env, NULL, "{}", 2, 1, 1, "nofd", done_cb, &ran);
    int proc_errno = errno;
    errno = 0;
    WrkServeReq *sp = serve_request(s, "0", &ran);
    int serve_errno = errno;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &was), 0);
    ck_assert_ptr_null(p);
    ck_assert_ptr_null(sp);
    ck_assert_msg(proc_errno == EMFILE, "wrk_proc_start: errno %d (%s)", proc_errno, strerror(proc_errno));
    ck_assert_msg(serve_errno == EMFILE, "wrk_serve_call: errno %d (%s)", serve_errno, strerror(serve_errno));
    ck_assert(!ran.done);
    wrk_serve_free(s);
    event_base_free(base);
}
END_TEST

/* A run_as_user that no longer exists (deleted after the worker's start, which checked it): the start fails,
 * and the step's error says that the user does not exist, not that the program might be missing. */
START_TEST(test_spawn_user_gone)
{
    struct event_base *base = new_base();
    TwLimitsConf l = {.run_as_user = "tw-no-such-user"};
    char *const argv[] = {"/bin/true", NULL};
    Ran ran = {0};

    errno = 0;
    ck_assert_ptr_null(wrk_proc_start(base, argv, no_env, &l, "{}", 2, 10, 1, "nouser", done_cb, &ran));
    WrkProcResult r = wrk_spawn_result(errno);
    json_t *t = wrk_tool_outcome(10, &r), *e = json_object_get(t, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    ck_assert_msg(msg && strstr(msg, "run_as_user tw-no-such-user does not exist") &&
                      !strstr(msg, "configured"),
                  "%s", msg ? msg : "(no message)");
    ck_assert(!ran.done);
    json_decref(t);
    event_base_free(base);
}
END_TEST

TW_SUITE_DEFINE(runner, {
                            {"time_limit", test_late_reply_while_frozen_is_a_timeout, 30},
                            {"time_limit", test_deadline_not_early, 30},
                            {"serve_time_limit", test_serve_late_reply_while_frozen_is_a_timeout, 30},
                            {"serve_time_limit", test_serve_deadline_not_early, 30},
                            {"pipes", test_pipe_closed_behind_our_back, 30},
                            {"pipes", test_reply_taken_at_exit, 30},
                            {"serve_between_requests", test_serve_exit_after_reply, 30},
                            {"serve_between_requests", test_serve_stdin_closed_after_reply, 30},
                            {"serve_between_requests", test_serve_stdout_closed_after_reply, 30},
                            {"serve_between_requests", test_serve_stray_line_before_request, 30},
                            {"serve_between_requests", test_serve_stray_line_after_request, 30},
                            {"serve_between_requests", test_serve_resent_once, 30},
                            {"pipes", test_spawn_out_of_descriptors, 30},
                            {"pipes", test_spawn_user_gone, 30},
                            {"limits", test_limit_memory, 60},
                            {"limits", test_limit_cpu, 60},
                            {"limits", test_limits_set_before_exec, 60},
                            {"limits", test_limits_run_as_user, 60},
                            {"limits", test_limit_cpu_serve_per_request, 60},
                        })
