/* test_procs.c — programs end with their step (docs/security.md, "Programs end with their step"): an
 * exec-mode agent that leaves a child in its process group and a grandchild in a session of its own
 * (tests/programs/tw-leave-behind.sh) has none of them left once its step ends, whether it replied done,
 * timed out or was cancelled, nor once a serve process is stopped; under run_as_user and max_processes,
 * what it left behind does not hold its user's process budget. Real PostgreSQL, nats-server and daemons. */
#include "suite.h"
#include "turn_helpers.h"

#include <ftw.h>
#include <pwd.h>

/* How long a process left behind may take to be gone after its step ended: the worker ends it at once; this
 * only bounds a loaded machine. */
#define PR_GONE_MS 15000

static const char pr_overrides[] = "[worker]\nheartbeat_seconds = 1\n";

/* A directory of its own for what the agent runs and writes, made here, open to every user (the agent may
 * run as another user, and the checkout may lie under a directory others cannot enter): the script copied
 * into it (mode 0755) and its pid files (the directory is 01777). */
typedef struct PrDir {
    char path[64];
    char *script;
} PrDir;

static PrDir pr_dir(void)
{
    PrDir d;
    snprintf(d.path, sizeof d.path, "/tmp/tw-procs-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(d.path));
    ck_assert_int_eq(chmod(d.path, 01777), 0);
    char *src = wd_fmt("%s/tests/programs/tw-leave-behind.sh", tw_fx_source_dir());
    d.script = wd_fmt("%s/tw-leave-behind.sh", d.path);
    FILE *in = fopen(src, "r"), *out = fopen(d.script, "w");
    ck_assert_ptr_nonnull(in);
    ck_assert_ptr_nonnull(out);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        ck_assert_uint_eq(fwrite(buf, 1, n, out), n);
    fclose(in);
    ck_assert_int_eq(fclose(out), 0);
    ck_assert_int_eq(chmod(d.script, 0755), 0);
    free(src);
    return d;
}

static int pr_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void pr_dir_free(PrDir *d)
{
    nftw(d->path, pr_rm, 8, FTW_DEPTH | FTW_PHYS);
    free(d->script);
}

/* The pids a pid file lists ("what PID" lines), at most max; how many. */
static int pr_pids(const char *pidfile, pid_t *pids, int max)
{
    FILE *f = fopen(pidfile, "r");
    char what[32];
    int pid, n = 0;

    if (!f)
        return 0;
    while (n < max && fscanf(f, "%31s %d", what, &pid) == 2)
        pids[n++] = (pid_t)pid;
    fclose(f);
    return n;
}

typedef struct PrFile {
    const char *path;
    int lines;
} PrFile;

static bool pr_has_pids(void *arg)
{
    PrFile *f = arg;
    pid_t pids[64];
    return pr_pids(f->path, pids, 64) >= f->lines;
}

typedef struct PrGone {
    const pid_t *pids;
    int n;
} PrGone;

static bool pr_all_gone(void *arg)
{
    PrGone *g = arg;
    for (int i = 0; i < g->n; i++)
        if (kill(g->pids[i], 0) == 0 || errno != ESRCH)
            return false;
    return true;
}

/* Every process the pid file lists is gone within PR_GONE_MS; those that are not are named in the failure
 * (and killed, so that a failing test leaves nothing behind either). `when` says which step's end. */
static void pr_assert_gone(const TwFxStack *st, const char *pidfile, int expect, const char *when)
{
    pid_t pids[64];
    int n = pr_pids(pidfile, pids, 64);
    ck_assert_msg(n == expect, "%s: the agent wrote %d pid(s) to %s, not %d", when, n, pidfile, expect);
    PrGone g = {pids, n};
    if (tw_fx_wait_until(pr_all_gone, &g, PR_GONE_MS))
        return;
    char *left = wd_fmt("%s", "");
    for (int i = 0; i < n; i++) {
        if (kill(pids[i], 0) != 0)
            continue;
        char *stat = wd_fmt("/proc/%d/stat", (int)pids[i]), line[512] = "";
        FILE *f = fopen(stat, "r");
        if (f) {
            if (!fgets(line, sizeof line, f))
                line[0] = '\0';
            fclose(f);
        }
        /* pid (comm) state ppid pgrp session: the fields up to the sixth space */
        char *end = line;
        for (int sp = 0; end && sp < 6; sp++)
            end = strchr(end + (sp > 0), ' ');
        if (end)
            *end = '\0';
        wd_append(&left, " [%s]", line[0] ? line : "?");
        kill(pids[i], SIGKILL);
        free(stat);
    }
    tw_fx_stack_dump(st);
    ck_abort_msg("%s: processes its program started still run %d s after the step ended:%s", when,
                 PR_GONE_MS / 1000, left);
}

/* A step that replied done, one that timed out, one that was cancelled, and a serve process stopped at a
 * step's time limit: none of them leaves a process. */
START_TEST(test_programs_end_with_their_step)
{
    PrDir d = pr_dir();
    char *pf_done = wd_fmt("%s/done.pids", d.path), *pf_timeout = wd_fmt("%s/timeout.pids", d.path);
    char *pf_cancel = wd_fmt("%s/cancel.pids", d.path), *pf_serve = wd_fmt("%s/serve.pids", d.path);
    char *ov = wd_fmt("%s"
                      "[agent.leaves]\nexec = /bin/sh %s %s done\nstep_timeout_seconds = 30\n"
                      "[agent.hangs]\nexec = /bin/sh %s %s hang\nstep_timeout_seconds = 8\n"
                      "kill_grace_seconds = 1\n"
                      "[agent.waits]\nexec = /bin/sh %s %s hang\nstep_timeout_seconds = 60\n"
                      "kill_grace_seconds = 1\n"
                      "[agent.serves]\nexec = /bin/sh %s %s hang\nmode = serve\nstep_timeout_seconds = 8\n"
                      "kill_grace_seconds = 1\n",
                      pr_overrides, d.script, pf_done, d.script, pf_timeout, d.script, pf_cancel, d.script,
                      pf_serve);
    TwFxStack st = tw_fx_stack_start(ov);
    TwFx *fx = st.fx;

    char *t1 = wd_submit(fx, "leaves", "{}");
    WD_STATUS_IS(fx, t1, "done");
    pr_assert_gone(&st, pf_done, 2, "a step that replied done");

    char *t2 = wd_submit(fx, "hangs", "{}");
    WD_STATUS_WITHIN(fx, t2, "failed", 30000);
    char *err = tw_fx_sql_str(fx, "SELECT error FROM state.turns WHERE turn_id = $1::uuid", 1, t2);
    ck_assert_str_eq(err, "step_timeout");
    pr_assert_gone(&st, pf_timeout, 2, "a step that timed out");

    char *t3 = wd_submit(fx, "waits", "{}");
    PrFile f = {pf_cancel, 2};
    ck_assert_msg(tw_fx_wait_until(pr_has_pids, &f, WD_WAIT_MS), "the agent did not start its processes");
    char *out = NULL, *e = NULL;
    ck_assert_int_eq(tw_fx_cli(fx, &out, &e, "cancel", t3, NULL), 0);
    WD_STATUS_IS(fx, t3, "cancelled");
    pr_assert_gone(&st, pf_cancel, 2, "a step that was cancelled");

    /* A serve process stopped at a step's time limit: it and all it started. */
    char *t4 = wd_submit(fx, "serves", "{}");
    WD_STATUS_WITHIN(fx, t4, "failed", 30000);
    free(err);
    err = tw_fx_sql_str(fx, "SELECT error FROM state.turns WHERE turn_id = $1::uuid", 1, t4);
    ck_assert_str_eq(err, "step_timeout");
    pr_assert_gone(&st, pf_serve, 2, "a serve process stopped at its time limit");
    ck_assert(tw_fx_proc_alive(st.worker));
    ck_assert_int_eq(tw_fx_proc_terminate(st.worker, 30000), 0);

    free(t4);
    free(pf_serve);
    free(out);
    free(e);
    free(err);
    free(t1);
    free(t2);
    free(t3);
    free(ov);
    free(pf_done);
    free(pf_timeout);
    free(pf_cancel);
    pr_dir_free(&d);
    tw_fx_free(fx);
}
END_TEST

/* Under run_as_user = nobody and max_processes = 8, turn after turn of an agent that leaves two processes
 * behind each time: more turns than its budget would hold if they stayed, each done, and after each nothing
 * of it left. */
START_TEST(test_left_behind_do_not_hold_the_budget)
{
    if (geteuid() != 0 || !getpwnam("nobody")) {
        fprintf(stderr, "# SKIP: run_as_user needs root and a user nobody\n");
        return;
    }
    PrDir d = pr_dir();
    char *pf = wd_fmt("%s/nobody.pids", d.path);
    char *ov = wd_fmt("%s[agent.leaves]\nexec = /bin/sh %s %s done\nstep_timeout_seconds = 30\n"
                      "run_as_user = nobody\nmax_processes = 8\n",
                      pr_overrides, d.script, pf);
    TwFxStack st = tw_fx_stack_start(ov);
    TwFx *fx = st.fx;
    for (int i = 1; i <= 6; i++) {
        char *t = wd_submit(fx, "leaves", "{}");
        WD_STATUS_IS(fx, t, "done");
        char *when = wd_fmt("turn %d as nobody", i);
        pr_assert_gone(&st, pf, 2 * i, when);
        free(when);
        free(t);
    }
    ck_assert_int_eq(tw_fx_proc_terminate(st.worker, 30000), 0);
    free(pf);
    free(ov);
    pr_dir_free(&d);
    tw_fx_free(fx);
}
END_TEST

TW_SUITE_DEFINE(procs, {
                           {"end_with_step", test_programs_end_with_their_step, 150},
                           {"budget", test_left_behind_do_not_hold_the_budget, 150},
                       })
