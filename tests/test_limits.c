/* test_limits.c — issue 35, flow control (docs/flow-control.md) against a real PostgreSQL, nats-server,
 * turnwatch-pmo and turnwatch-workers: a cap holds across two workers at every instant (from the times the
 * tool program itself records), a rate's token bucket bounds the starts, max_wait_seconds ends a waiting call
 * error/limit_timeout, a call's own timeout counts from its start and not from its wait, a limit set at run
 * time takes effect without a restart, and a holder's worker killed gives its slot back. Bounds are generous:
 * the machine is small and shared; no assertion depends on its speed. */
#include "fixture.h"
#include "suite.h"
#include "turn_helpers.h"

#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TL_WAIT_MS 60000

/* A tool program that appends "start MS" and "end MS" (wall clock, ms) to the file `log`, sleeping `sleep`
 * seconds between them, and answers ok. Returns its exec line. */
static char *tl_tool(TwFx *fx, const char *name, const char *log, const char *sleep)
{
    char *body = wd_fmt("turn=$(tr -d '\\n' | sed -n 's/.*\"turn_id\": *\"\\([0-9a-f-]*\\)\".*/\\1/p')\n"
                        "echo \"start $(date +%%s%%3N) $turn\" >> %s\n"
                        "sleep %s\n"
                        "echo \"end $(date +%%s%%3N) $turn\" >> %s\n"
                        "echo '{\"output\":{\"ok\":true}}'\n",
                        log, sleep, log);
    char *exec = wd_script(fx, name, body);
    free(body);
    return exec;
}

/* The times of the records of kind `what` (start or end) in `log`, sorted; *n their count. */
static long long *tl_times(const char *log, const char *what, size_t *n)
{
    FILE *f = fopen(log, "r");
    long long *v = calloc(4096, sizeof *v);
    char line[256], kind[16];
    long long ms;
    *n = 0;
    ck_assert_ptr_nonnull(v);
    if (!f)
        return v;
    while (fgets(line, sizeof line, f) && *n < 4096)
        if (sscanf(line, "%15s %lld", kind, &ms) == 2 && strcmp(kind, what) == 0)
            v[(*n)++] = ms;
    fclose(f);
    qsort(v, *n, sizeof *v, wd_cmp_i64);
    return v;
}

/* The most runs of the tool at one instant, from its records: at equal times an end comes before a start (a
 * slot handed over within the same millisecond is not two holders). */
static int tl_max_overlap(const char *log)
{
    size_t ns, ne, i = 0, j = 0;
    long long *s = tl_times(log, "start", &ns), *e = tl_times(log, "end", &ne);
    int cur = 0, max = 0;
    while (i < ns) {
        if (j < ne && e[j] <= s[i]) {
            cur--;
            j++;
        } else {
            cur++;
            i++;
            if (cur > max)
                max = cur;
        }
    }
    free(s);
    free(e);
    return max;
}

/* The fan-out agent's turn: n calls of `tool`. */
static char *tl_fanout(TwFx *fx, const char *tool, int n)
{
    char *input = wd_fmt("{\"n\":%d,\"tool\":\"%s\"}", n, tool);
    char *id = wd_submit(fx, "fanout", input);
    free(input);
    return id;
}

/* How many results of the turn's output have status `status` (and, when code is given, that error code). */
static int64_t tl_results(TwFx *fx, const char *turn, const char *status, const char *code)
{
    return tw_fx_sql_int(
        fx,
        "SELECT count(*) FROM state.turns t JOIN state.cards c ON c.card_id = t.deliverable_card_id,"
        " jsonb_array_elements(c.content -> 'output' -> 'results') r"
        " WHERE t.turn_id = $1::uuid AND r ->> 'status' = $2"
        "   AND ($3 = '' OR r -> 'error' ->> 'code' = $3)",
        3, turn, status, code ? code : "");
}

static void tl_dump(TwFx *fx, const char *turn, TwFxProc *const *procs, size_t n)
{
    char *out = NULL, *err = NULL;
    (void)tw_fx_cli(fx, &out, &err, "turn", "show", turn, "--json", NULL);
    fprintf(stderr, "turn show: %s\n%s\n", out ? out : "", err ? err : "");
    free(out);
    free(err);
    for (size_t i = 0; i < n; i++)
        tw_fx_proc_dump(procs[i]);
}

/* Wait until the turn has ended done; otherwise dump what the daemons say of it and fail with why (what). */
static void tl_wait_done(TwFx *fx, const char *turn, TwFxProc *const *procs, size_t n, const char *what)
{
    if (tw_fx_sql_wait(fx, TL_WAIT_MS, "done", "SELECT status FROM state.turns WHERE turn_id = $1::uuid", 1,
                       turn))
        return;
    tl_dump(fx, turn, procs, n);
    ck_abort_msg("%s did not end done", what);
}

/* The turns of the starts in `log`, in the order they started (an array of turn ids). */
static json_t *tl_start_order(const char *log)
{
    FILE *f = fopen(log, "r");
    char line[256], kind[16], turn[64];
    long long ms;
    json_t *rows = json_array(), *out = json_array();
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%15s %lld %63s", kind, &ms, turn) == 3 && strcmp(kind, "start") == 0)
            json_array_append_new(rows, json_pack("{s:I,s:s}", "ms", (json_int_t)ms, "turn", turn));
    fclose(f);
    /* Appended in start order already but for equal times; a stable sort by time keeps that order. */
    size_t n = json_array_size(rows);
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0; j--) {
            json_t *a = json_array_get(rows, j - 1), *b = json_array_get(rows, j);
            if (json_integer_value(json_object_get(a, "ms")) <= json_integer_value(json_object_get(b, "ms")))
                break;
            json_incref(a);
            json_array_set(rows, j - 1, b);
            json_array_set_new(rows, j, a);
        }
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) json_array_append(out, json_object_get(r, "turn"));
    json_decref(rows);
    return out;
}

/* The fan-out agent's turn of n calls of `tool`, submitted with a limit key and a priority. */
static char *tl_fanout_as(TwFx *fx, const char *tool, int n, const char *key, const char *prio)
{
    char *input = wd_fmt("{\"n\":%d,\"tool\":\"%s\"}", n, tool), *out = NULL, *err = NULL;
    int rc = tw_fx_cli(fx, &out, &err, "submit", "--json", "--agent", "fanout", "--channel", "chan-1",
                       "--input", input, "--limit-key", key, "--priority", prio, NULL);
    ck_assert_msg(rc == 0, "submit exited %d: %s", rc, err);
    json_t *j = json_loads(out, 0, NULL);
    ck_assert_ptr_nonnull(j);
    char *id = strdup(json_string_value(json_object_get(j, "turn_id")));
    json_decref(j);
    free(out);
    free(err);
    free(input);
    return id;
}

/* Where turn `turn` is in `order`: the 1-based places of its starts, in *places (at most max), and how many.
 */
static size_t tl_places(json_t *order, const char *turn, size_t *places, size_t max)
{
    size_t i, n = 0;
    json_t *t;
    json_array_foreach(order, i, t) if (strcmp(json_string_value(t), turn) == 0 && n < max) places[n++] =
        i + 1;
    return n;
}

/* The fan-out agent as a second profile, so that two turns run at once (one agent runs one turn at a time).
 */
#define TL_SECOND_AGENT                                                                                      \
    "[agent.fanout2]\nexec = %s/examples/agents/tw-fanout-agent\nstep_timeout_seconds = 10\n"

/* Fairness and priority through a cap of 1: turn A's 6 calls wait (one runs); then turn B (another key)
 * brings 3: B is not served last but in turn with A (round robin across keys), and a turn C of priority 5
 * that comes last is served before both. */
START_TEST(test_fair_and_priority)
{
    TwFx *fx = tw_fx_new_all();
    char *log = wd_fmt("%s/fair.log", tw_fx_dir(fx));
    char *exec = tl_tool(fx, "fair.sh", log, "0.3");
    char *ov =
        wd_fmt("[worker]\nconcurrency = 8\n[limit.one]\nmax_concurrent = 1\n"
               "[tool.rec]\nexec = %s\ntimeout_seconds = 30\nlimits = one\n" TL_SECOND_AGENT
               "[agent.fanout3]\nexec = %s/examples/agents/tw-fanout-agent\nstep_timeout_seconds = 10\n",
               exec, tw_fx_build_dir(), tw_fx_build_dir());
    tw_fx_write_config(fx, NULL, ov);
    tw_fx_migrate(fx);
    TwFxProc *procs[2] = {tw_fx_start_pmo(fx, NULL), tw_fx_start_worker(fx, NULL)};
    /* Paused (as a tool's pushback would), so that every call waits until all three turns have asked. */
    if (!tw_fx_sql_wait(fx, TL_WAIT_MS, "1", "SELECT count(*) FROM state.limits WHERE name = 'one'", 0))
        ck_abort_msg("the worker did not publish [limit.one]");
    tw_fx_sql_exec(fx, "UPDATE state.limits SET paused_until = now() + interval '1 hour' WHERE name = 'one'",
                   0);
    char *a = tl_fanout_as(fx, "rec", 6, "tenant-a", "0");
    if (!tw_fx_sql_wait(fx, TL_WAIT_MS, "6", "SELECT tw.limit_show('one') ->> 'waiting'", 0)) {
        tl_dump(fx, a, procs, 2);
        ck_abort_msg("A's calls did not wait");
    }
    char *input = wd_fmt("{\"n\":3,\"tool\":\"rec\"}"), *out = NULL, *err = NULL;
    ck_assert_int_eq(tw_fx_cli(fx, &out, &err, "submit", "--json", "--agent", "fanout2", "--channel", "c",
                               "--input", input, "--limit-key", "tenant-b", NULL),
                     0);
    json_t *j = json_loads(out, 0, NULL);
    char *b = strdup(json_string_value(json_object_get(j, "turn_id")));
    json_decref(j);
    free(out);
    free(err);
    ck_assert_int_eq(tw_fx_cli(fx, &out, &err, "submit", "--json", "--agent", "fanout3", "--channel", "c",
                               "--input", "{\"n\":1,\"tool\":\"rec\"}", "--limit-key", "tenant-c",
                               "--priority", "5", NULL),
                     0);
    j = json_loads(out, 0, NULL);
    char *c = strdup(json_string_value(json_object_get(j, "turn_id")));
    json_decref(j);
    free(out);
    free(err);
    if (!tw_fx_sql_wait(fx, TL_WAIT_MS, "10", "SELECT tw.limit_show('one') ->> 'waiting'", 0)) {
        tl_dump(fx, b, procs, 2);
        ck_abort_msg("B's and C's calls did not wait");
    }
    /* The pause ends; setting the limit again (the same values) grants at once. */
    tw_fx_sql_exec(fx, "UPDATE state.limits SET paused_until = NULL, next_grant_at = NULL WHERE name = 'one'",
                   0);
    tw_fx_sql_exec(fx, "SELECT tw.set_limit('one', 1)", 0);
    const char *turns[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        char what[32];
        snprintf(what, sizeof what, "turn %d", i);
        tl_wait_done(fx, turns[i], procs, 2, what);
    }
    json_t *order = tl_start_order(log);
    char *text = json_dumps(order, JSON_COMPACT);
    size_t pa[8], pb[8], pc[8];
    ck_assert_uint_eq(json_array_size(order), 10);
    ck_assert_uint_eq(tl_places(order, a, pa, 8), 6);
    ck_assert_uint_eq(tl_places(order, b, pb, 8), 3);
    ck_assert_uint_eq(tl_places(order, c, pc, 8), 1);
    /* C's priority puts it first; then A and B in turn (A1 B1 A2 B2 A3 B3), A's backlog last. */
    ck_assert_msg(pc[0] == 1, "the priority-5 call started %zu-th: %s", pc[0], text);
    ck_assert_msg(pb[0] == 3 && pb[1] == 5 && pb[2] == 7,
                  "B's calls started at %zu, %zu, %zu of 10, not 3, 5, 7 (round robin with A): %s", pb[0],
                  pb[1], pb[2], text);
    free(text);
    json_decref(order);
    free(input);
    free(a);
    free(b);
    free(c);
    free(ov);
    free(exec);
    free(log);
    tw_fx_free(fx);
}
END_TEST

/* Per-key caps: a limit of 1 per key; two turns of two keys, 3 calls each: never 2 of one key at once, and
 * the keys run side by side (a turn's 3 calls take at least 6 s one after the other). */
START_TEST(test_per_key)
{
    TwFx *fx = tw_fx_new_all();
    char *log = wd_fmt("%s/pk.log", tw_fx_dir(fx));
    char *exec = tl_tool(fx, "pk.sh", log, "2");
    char *ov = wd_fmt("[worker]\nconcurrency = 8\n[limit.pk]\nmax_concurrent = 1\nper_key = true\n"
                      "[tool.rec]\nexec = %s\ntimeout_seconds = 30\nlimits = pk\n" TL_SECOND_AGENT,
                      exec, tw_fx_build_dir());
    tw_fx_write_config(fx, NULL, ov);
    tw_fx_migrate(fx);
    TwFxProc *procs[2] = {tw_fx_start_pmo(fx, NULL), tw_fx_start_worker(fx, NULL)};
    char *a = tl_fanout_as(fx, "rec", 3, "k1", "0");
    char *input = wd_fmt("{\"n\":3,\"tool\":\"rec\"}"), *out = NULL, *err = NULL;
    ck_assert_int_eq(tw_fx_cli(fx, &out, &err, "submit", "--json", "--agent", "fanout2", "--channel", "c",
                               "--input", input, "--limit-key", "k2", NULL),
                     0);
    json_t *j = json_loads(out, 0, NULL);
    char *b = strdup(json_string_value(json_object_get(j, "turn_id")));
    json_decref(j);
    free(out);
    free(err);
    const char *turns[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        char what[32];
        snprintf(what, sizeof what, "turn %d", i);
        tl_wait_done(fx, turns[i], procs, 2, what);
    }
    /* Per turn (= per key here): the overlap of its own calls. */
    for (int i = 0; i < 2; i++) {
        char *one = wd_fmt("%s/pk-%d.log", tw_fx_dir(fx), i);
        char *cmd = wd_fmt("grep -F %s %s > %s", turns[i], log, one);
        ck_assert_int_eq(system(cmd), 0);
        ck_assert_msg(tl_max_overlap(one) <= 1, "key %d ran %d calls at once", i + 1, tl_max_overlap(one));
        free(cmd);
        free(one);
    }
    ck_assert_msg(tl_max_overlap(log) == 2, "the two keys ran %d calls at once at most, not side by side",
                  tl_max_overlap(log));
    free(input);
    free(a);
    free(b);
    free(ov);
    free(exec);
    free(log);
    tw_fx_free(fx);
}
END_TEST

/* A cap of 3, two workers of 8 slots each, 12 calls: never more than 3 running at once, all 12 done. */
START_TEST(test_cap_across_workers)
{
    TwFx *fx = tw_fx_new_all();
    char *log = wd_fmt("%s/rec.log", tw_fx_dir(fx));
    char *exec = tl_tool(fx, "rec.sh", log, "0.4");
    char *ov = wd_fmt("[worker]\nconcurrency = 8\n[limit.cap3]\nmax_concurrent = 3\n"
                      "[tool.rec]\nexec = %s\ntimeout_seconds = 30\nlimits = cap3\n",
                      exec);
    tw_fx_write_config(fx, NULL, ov);
    tw_fx_migrate(fx);
    TwFxProc *procs[3] = {tw_fx_start_pmo(fx, NULL), tw_fx_start_worker(fx, NULL),
                          tw_fx_start_worker(fx, NULL)};
    char *turn = tl_fanout(fx, "rec", 12);
    tl_wait_done(fx, turn, procs, 3, "the turn");
    ck_assert_int_eq(tl_results(fx, turn, "ok", NULL), 12);
    size_t n;
    free(tl_times(log, "start", &n));
    ck_assert_uint_eq(n, 12);
    int max = tl_max_overlap(log);
    ck_assert_msg(max <= 3, "%d calls of a tool capped at 3 ran at once", max);
    /* Every slot is back. */
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.limit_calls", 0), 0);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT coalesce(sum(in_use), 0) FROM state.limit_usage", 0), 0);
    free(turn);
    free(ov);
    free(exec);
    free(log);
    tw_fx_free(fx);
}
END_TEST

/* A rate of 5 per 2 s (burst 5), 12 calls: the k-th start is no earlier than (k - 5) * 0.4 s after the submit
 * (each start follows its grant, and the bucket grants at most burst + 5 W / 2 in the first W seconds). */
START_TEST(test_rate_bucket)
{
    TwFx *fx = tw_fx_new_all();
    char *log = wd_fmt("%s/rate.log", tw_fx_dir(fx));
    char *exec = tl_tool(fx, "rate.sh", log, "0");
    char *ov = wd_fmt("[worker]\nconcurrency = 16\n[limit.r5]\nrate = 5/2\n"
                      "[tool.rec]\nexec = %s\ntimeout_seconds = 30\nlimits = r5\n",
                      exec);
    tw_fx_write_config(fx, NULL, ov);
    tw_fx_migrate(fx);
    TwFxProc *procs[2] = {tw_fx_start_pmo(fx, NULL), tw_fx_start_worker(fx, NULL)};
    /* The submit's time by the database clock, in the tool's terms (ms since the epoch, same machine). */
    long long t0 = tw_fx_sql_int(fx, "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint", 0);
    char *turn = tl_fanout(fx, "rec", 12);
    tl_wait_done(fx, turn, procs, 2, "the turn");
    size_t n;
    long long *s = tl_times(log, "start", &n);
    ck_assert_uint_eq(n, 12);
    for (size_t k = 6; k <= n; k++)
        ck_assert_msg(
            s[k - 1] - t0 >= (long long)(k - 5) * 400 - 20,
            "start %zu came %lld ms after the submit; the bucket allows it at %lld ms at the earliest", k,
            s[k - 1] - t0, (long long)(k - 5) * 400);
    free(s);
    free(turn);
    free(ov);
    free(exec);
    free(log);
    tw_fx_free(fx);
}
END_TEST

/* A cap of 1 with max_wait_seconds = 1, three calls of 4 s: one runs, the two that wait end
 * error/limit_timeout (the agent sees them), and the turn goes on. */
START_TEST(test_max_wait)
{
    TwFx *fx = tw_fx_new_all();
    char *log = wd_fmt("%s/wait.log", tw_fx_dir(fx));
    char *exec = tl_tool(fx, "wait.sh", log, "4");
    char *ov = wd_fmt("[worker]\nconcurrency = 8\n[limit.one]\nmax_concurrent = 1\nmax_wait_seconds = 1\n"
                      "[tool.rec]\nexec = %s\ntimeout_seconds = 30\nlimits = one\n",
                      exec);
    tw_fx_write_config(fx, NULL, ov);
    tw_fx_migrate(fx);
    TwFxProc *procs[2] = {tw_fx_start_pmo(fx, NULL), tw_fx_start_worker(fx, NULL)};
    char *turn = tl_fanout(fx, "rec", 3);
    tl_wait_done(fx, turn, procs, 2, "the turn");
    ck_assert_int_eq(tl_results(fx, turn, "ok", NULL), 1);
    ck_assert_int_eq(tl_results(fx, turn, "error", "limit_timeout"), 2);
    size_t n;
    free(tl_times(log, "start", &n));
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.limit_calls", 0), 0);
    free(turn);
    free(ov);
    free(exec);
    free(log);
    tw_fx_free(fx);
}
END_TEST

/* A call's own deadline (2.2: at least the tool's timeout, here 3 s) counts from its start: three calls of
 * 1.5 s through a cap of 1 wait up to 3 s before they start, and every one of them ends ok. */
START_TEST(test_timeout_counts_from_start)
{
    TwFx *fx = tw_fx_new_all();
    char *log = wd_fmt("%s/to.log", tw_fx_dir(fx));
    char *exec = tl_tool(fx, "to.sh", log, "1.5");
    char *ov =
        wd_fmt("[worker]\nconcurrency = 8\nsuspend_timeout_seconds = 1\n[limit.one]\nmax_concurrent = 1\n"
               "[tool.rec]\nexec = %s\ntimeout_seconds = 3\nsuspend_timeout_seconds = 1\nlimits = one\n",
               exec);
    tw_fx_write_config(fx, NULL, ov);
    tw_fx_migrate(fx);
    TwFxProc *procs[2] = {tw_fx_start_pmo(fx, NULL), tw_fx_start_worker(fx, NULL)};
    char *turn = tl_fanout(fx, "rec", 3);
    tl_wait_done(fx, turn, procs, 2, "the turn");
    ck_assert_msg(tl_results(fx, turn, "ok", NULL) == 3,
                  "%lld of 3 calls ok: a wait counted against a timeout",
                  (long long)tl_results(fx, turn, "ok", NULL));
    ck_assert_int_le(tl_max_overlap(log), 1);
    free(turn);
    free(ov);
    free(exec);
    free(log);
    tw_fx_free(fx);
}
END_TEST

/* A sample of the PMO's /metrics on port, NAN when it is not there (yet). */
static double tl_metric(int port, const char *key)
{
    char *body = NULL, *err = NULL;
    double v = NAN;
    if (tw_fx_http_get(port, "/metrics", &body) == 200) {
        json_t *samples = tw_fx_prom_parse(body, &err);
        ck_assert_msg(samples, "/metrics: %s", err ? err : "");
        v = tw_fx_prom_value(samples, key);
        json_decref(samples);
    }
    free(body);
    free(err);
    return v;
}

/* Waits up to 15 s for a sample of the PMO's /metrics to be `want`. */
static void tl_metric_is(int port, const char *key, double want)
{
    int64_t deadline = tw_fx_now_ms() + 15000;
    double v;
    while ((v = tl_metric(port, key)) != want)
        ck_assert_msg(tw_fx_poll(deadline), "%s is %g, not %g", key, v, want);
}

/* A limit set at run time (tw.set_limit, no INI section) holds at once and, raised, lets the waiters start
 * without a restart; `turnwatch limits show --json` says what is in use and waiting. */
START_TEST(test_runtime_limit)
{
    TwFx *fx = tw_fx_new_all();
    char *log = wd_fmt("%s/rt.log", tw_fx_dir(fx));
    char *exec = tl_tool(fx, "rt.sh", log, "15");
    int port = tw_fx_free_port();
    char *ov = wd_fmt("[pmo]\nmetrics_listen = 127.0.0.1:%d\n"
                      "[worker]\nconcurrency = 8\n[tool.rec]\nexec = %s\ntimeout_seconds = 30\nlimits = rt\n",
                      port, exec);
    tw_fx_write_config(fx, NULL, ov);
    tw_fx_migrate(fx);
    tw_fx_sql_exec(fx, "SELECT tw.set_limit('rt', 1)", 0);
    TwFxProc *procs[2] = {tw_fx_start_pmo(fx, NULL), tw_fx_start_worker(fx, NULL)};
    char *turn = tl_fanout(fx, "rec", 4);
    if (!tw_fx_sql_wait(
            fx, TL_WAIT_MS, "1/3",
            "SELECT (tw.limit_show('rt') ->> 'in_use') || '/' || (tw.limit_show('rt') ->> 'waiting')", 0)) {
        tl_dump(fx, turn, procs, 2);
        ck_abort_msg("the limit set at run time did not hold 1 and keep 3 waiting");
    }
    char *out = NULL, *err = NULL;
    /* The PMO's metrics say so too. */
    tl_metric_is(port, "turnwatch_limit_in_use{limit=\"rt\"}", 1);
    tl_metric_is(port, "turnwatch_limit_waiting{limit=\"rt\"}", 3);
    /* turn show says which calls wait for their limits. */
    ck_assert_int_eq(tw_fx_cli(fx, &out, &err, "turn", "show", turn, "--json", NULL), 0);
    json_t *shown = json_loads(out, 0, NULL), *call;
    size_t i, waiting = 0;
    ck_assert_ptr_nonnull(shown);
    json_array_foreach(json_object_get(shown, "tool_calls"), i, call) waiting +=
        strcmp(json_string_value(json_object_get(call, "status")), "waiting_limit") == 0;
    ck_assert_uint_eq(waiting, 3);
    json_decref(shown);
    free(out);
    free(err);
    ck_assert_int_eq(tw_fx_cli(fx, &out, &err, "limits", "show", "rt", "--json", NULL), 0);
    json_t *j = json_loads(out, 0, NULL);
    ck_assert_ptr_nonnull(j);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "in_use")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "waiting")), 3);
    json_decref(j);
    free(out);
    free(err);
    /* Raised (after the waiters have waited a second at least): the three waiting start now, while the first
     * still runs. */
    tw_fx_sleep_ms(1100);
    tw_fx_sql_exec(fx, "SELECT tw.set_limit('rt', 4)", 0);
    size_t n = 0;
    int64_t deadline = tw_fx_now_ms() + 5000;
    for (;;) {
        free(tl_times(log, "start", &n));
        if (n == 4)
            break;
        if (!tw_fx_poll(deadline)) {
            tl_dump(fx, turn, procs, 2);
            ck_abort_msg("raising the limit started %zu of 4 calls within 5 s", n);
        }
    }
    size_t ne;
    free(tl_times(log, "end", &ne));
    ck_assert_uint_eq(ne, 0);
    tl_wait_done(fx, turn, procs, 2, "the turn");
    /* Four calls got the limit, three of them after a wait of over a second. */
    tl_metric_is(port, "turnwatch_limit_wait_seconds_count{limit=\"rt\"}", 4);
    tl_metric_is(port, "turnwatch_limit_in_use{limit=\"rt\"}", 0);
    ck_assert_msg(tl_metric(port, "turnwatch_limit_wait_seconds_bucket{limit=\"rt\",le=\"+Inf\"}") -
                          tl_metric(port, "turnwatch_limit_wait_seconds_bucket{limit=\"rt\",le=\"1\"}") ==
                      3,
                  "the three calls that waited are not in the buckets above 1 s");
    /* Removed: it no longer applies. */
    ck_assert_int_eq(tw_fx_cli(fx, &out, &err, "limits", "remove", "rt", NULL), 0);
    free(out);
    free(err);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.limits", 0), 0);
    free(turn);
    free(ov);
    free(exec);
    free(log);
    tw_fx_free(fx);
}
END_TEST

/* A limit removed while calls wait for it: it no longer applies, and they start at once. */
START_TEST(test_remove_starts_waiters)
{
    TwFx *fx = tw_fx_new_all();
    char *log = wd_fmt("%s/rm.log", tw_fx_dir(fx));
    char *exec = tl_tool(fx, "rm.sh", log, "10");
    char *ov =
        wd_fmt("[worker]\nconcurrency = 8\n[tool.rec]\nexec = %s\ntimeout_seconds = 30\nlimits = rm\n", exec);
    tw_fx_write_config(fx, NULL, ov);
    tw_fx_migrate(fx);
    tw_fx_sql_exec(fx, "SELECT tw.set_limit('rm', 1)", 0);
    TwFxProc *procs[2] = {tw_fx_start_pmo(fx, NULL), tw_fx_start_worker(fx, NULL)};
    char *turn = tl_fanout(fx, "rec", 3);
    if (!tw_fx_sql_wait(
            fx, TL_WAIT_MS, "1/2",
            "SELECT (tw.limit_show('rm') ->> 'in_use') || '/' || (tw.limit_show('rm') ->> 'waiting')", 0)) {
        tl_dump(fx, turn, procs, 2);
        ck_abort_msg("the limit did not hold 1 and keep 2 waiting");
    }
    tw_fx_sql_exec(fx, "SELECT tw.remove_limit('rm')", 0);
    size_t n = 0, ne;
    int64_t deadline = tw_fx_now_ms() + 5000;
    while (free(tl_times(log, "start", &n)), n < 3)
        if (!tw_fx_poll(deadline)) {
            tl_dump(fx, turn, procs, 2);
            ck_abort_msg("removing the limit started %zu of 3 calls within 5 s", n);
        }
    free(tl_times(log, "end", &ne));
    ck_assert_uint_eq(ne, 0);
    tl_wait_done(fx, turn, procs, 2, "the turn");
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.limit_calls", 0), 0);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.limit_usage", 0), 0);
    free(turn);
    free(ov);
    free(exec);
    free(log);
    tw_fx_free(fx);
}
END_TEST

/* A cap of 1: the holder's worker is killed (SIGKILL); its slot comes back with its lease (the liveness
 * check), and a call starts again on the other worker within a bounded time. */
START_TEST(test_holder_killed)
{
    TwFx *fx = tw_fx_new_all();
    char *log = wd_fmt("%s/kill.log", tw_fx_dir(fx));
    char *exec = tl_tool(fx, "kill.sh", log, "2");
    char *ov = wd_fmt("[worker]\nconcurrency = 4\n[limit.one]\nmax_concurrent = 1\n"
                      "[tool.rec]\nexec = %s\ntimeout_seconds = 30\nlimits = one\n",
                      exec);
    tw_fx_write_config(fx, NULL, ov);
    tw_fx_migrate(fx);
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    TwFxProc *w1 = tw_fx_start_worker(fx, NULL);
    char *turn = tl_fanout(fx, "rec", 2);
    size_t n = 0;
    int64_t deadline = tw_fx_now_ms() + TL_WAIT_MS;
    while (free(tl_times(log, "start", &n)), n < 1)
        ck_assert_msg(tw_fx_poll(deadline), "no call started");
    tw_fx_proc_kill9(w1);
    TwFxProc *procs[3] = {pmo, w1, tw_fx_start_worker(fx, NULL)};
    /* A second worker takes over: the slot held by the dead worker's call serves again. */
    deadline = tw_fx_now_ms() + 20000;
    while (free(tl_times(log, "start", &n)), n < 2)
        if (!tw_fx_poll(deadline)) {
            tl_dump(fx, turn, procs, 3);
            ck_abort_msg("no call started again within 20 s of the holder's worker's death");
        }
    tl_wait_done(fx, turn, procs, 3, "the turn");
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT coalesce(sum(in_use), 0) FROM state.limit_usage", 0), 0);
    free(turn);
    free(ov);
    free(exec);
    free(log);
    tw_fx_free(fx);
}
END_TEST

/* A tool that answers rate_limited (retry after `after` s) while the counter file has fewer than `n` lines,
 * then ok; it records "start MS", and "rl MS" when it answers rate_limited. */
static char *tl_pushy_tool(TwFx *fx, const char *name, const char *log, int n, const char *after)
{
    char *body = wd_fmt(
        "cat > /dev/null\n"
        "echo \"start $(date +%%s%%3N)\" >> %s\n"
        "if [ \"$(grep -c '^rl' %s)\" -lt %d ]; then\n"
        "  echo \"rl $(date +%%s%%3N)\" >> %s\n"
        "  echo '{\"error\":{\"code\":\"rate_limited\",\"message\":\"429\",\"retry_after_seconds\":%s}}'\n"
        "  exit 0\n"
        "fi\n"
        "echo \"end $(date +%%s%%3N)\" >> %s\n"
        "echo '{\"output\":{\"ok\":true}}'\n",
        log, log, n, log, after, log);
    char *exec = wd_script(fx, name, body);
    free(body);
    return exec;
}

/* Pushback: one call answers rate_limited (retry after 1.5 s): the tool's limit is paused for every call, no
 * call of it starts within the pause, the call runs again after it and the turn ends with every call ok; the
 * try is in turn show. Then a tool with no limit that keeps answering rate_limited: it runs again
 * rate_limited_retries times (2), the pause between its tries held, then ends error rate_limited. */
START_TEST(test_pushback)
{
    TwFx *fx = tw_fx_new_all();
    char *log = wd_fmt("%s/pb.log", tw_fx_dir(fx)), *log2 = wd_fmt("%s/pb2.log", tw_fx_dir(fx));
    char *exec = tl_pushy_tool(fx, "pb.sh", log, 1, "1.5"),
         *exec2 = tl_pushy_tool(fx, "pb2.sh", log2, 100, "0.5");
    char *ov = wd_fmt("[worker]\nconcurrency = 8\n[limit.p]\nmax_concurrent = 1\n"
                      "[tool.rec]\nexec = %s\ntimeout_seconds = 30\nlimits = p\n"
                      "[tool.free]\nexec = %s\ntimeout_seconds = 30\nrate_limited_retries = 2\n",
                      exec, exec2);
    tw_fx_write_config(fx, NULL, ov);
    tw_fx_migrate(fx);
    TwFxProc *procs[2] = {tw_fx_start_pmo(fx, NULL), tw_fx_start_worker(fx, NULL)};
    char *turn = tl_fanout(fx, "rec", 3);
    tl_wait_done(fx, turn, procs, 2, "the turn");
    ck_assert_int_eq(tl_results(fx, turn, "ok", NULL), 3);
    size_t ns, nr;
    long long *s = tl_times(log, "start", &ns), *rl = tl_times(log, "rl", &nr);
    ck_assert_uint_eq(nr, 1);
    ck_assert_uint_eq(ns, 4); /* 3 calls, one of them twice */
    for (size_t i = 0; i < ns; i++)
        ck_assert_msg(s[i] <= rl[0] || s[i] >= rl[0] + 1500 - 50,
                      "a call started %lld ms after the tool said rate_limited (retry after 1500 ms)",
                      s[i] - rl[0]);
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1::uuid"
                      " AND jsonb_array_length(tries) = 1 AND tries -> 0 -> 'error' ->> 'code' = "
                      "'rate_limited'",
                      1, turn),
        1);
    free(s);
    free(rl);
    free(turn);
    /* A tool with no limit: its own pause, 2 more tries, then the tool's own error. */
    turn = tl_fanout(fx, "free", 1);
    tl_wait_done(fx, turn, procs, 2, "the second turn");
    ck_assert_int_eq(tl_results(fx, turn, "error", "rate_limited"), 1);
    s = tl_times(log2, "start", &ns);
    ck_assert_uint_eq(ns, 3);
    for (size_t i = 1; i < ns; i++)
        ck_assert_msg(s[i] - s[i - 1] >= 500 - 50,
                      "try %zu came %lld ms after the one before (retry after 500 ms)", i + 1,
                      s[i] - s[i - 1]);
    free(s);
    free(turn);
    free(ov);
    free(exec);
    free(exec2);
    free(log);
    free(log2);
    tw_fx_free(fx);
}
END_TEST

/* ---- limits on turns ([agent.P] limits) */

/* An agent program that appends "start MS TURN" and "end MS TURN" to `log`, sleeping `sleep` seconds between
 * them, and completes. Returns its exec line. */
static char *tl_agent(TwFx *fx, const char *name, const char *log, const char *sleep)
{
    char *body = wd_fmt("turn=$(grep -o '\"turn_id\": *\"[0-9a-f-]*\"' | head -n 1 | tr -dc '0-9a-f-')\n"
                        "echo \"start $(date +%%s%%3N) $turn\" >> %s\n"
                        "sleep %s\n"
                        "echo \"end $(date +%%s%%3N) $turn\" >> %s\n"
                        "echo '{\"complete\":{\"output\":{\"ok\":true}}}'\n",
                        log, sleep, log);
    char *exec = wd_script(fx, name, body);
    free(body);
    return exec;
}

/* Two profiles whose turns hold [limit.tcap] (max_concurrent 1, max_wait_seconds `wait`), both running
 * `exec`; starts a PMO and a worker into procs and waits until the worker has published the profiles' limits.
 */
static void tl_turn_setup(TwFx *fx, const char *exec, const char *wait, TwFxProc **procs)
{
    char *ov = wd_fmt("[worker]\nconcurrency = 8\n[limit.tcap]\nmax_concurrent = 1\nmax_wait_seconds = %s\n"
                      "[agent.lim1]\nexec = %s\nstep_timeout_seconds = 30\nlimits = tcap\n"
                      "[agent.lim2]\nexec = %s\nstep_timeout_seconds = 30\nlimits = tcap\n",
                      wait, exec, exec);
    tw_fx_write_config(fx, NULL, ov);
    tw_fx_migrate(fx);
    procs[0] = tw_fx_start_pmo(fx, NULL);
    procs[1] = tw_fx_start_worker(fx, NULL);
    if (!tw_fx_sql_wait(fx, TL_WAIT_MS, "2",
                        "SELECT count(*) FROM state.profiles WHERE limits = '{tcap}'::text[]", 0))
        ck_abort_msg("the worker did not publish the profiles' [agent.P] limits");
    free(ov);
}

/* Turn `a` runs (holding tcap), then turn `b` waits pending with reason waiting_limit:tcap. */
static void tl_second_waits(TwFx *fx, const char *a, const char *b, TwFxProc *const *procs)
{
    if (!tw_fx_sql_wait(fx, TL_WAIT_MS, "waiting_limit:tcap pending",
                        "SELECT concat_ws(' ', tw.turn_show($1::uuid) ->> 'pending_reason', status)"
                        "  FROM state.turns WHERE turn_id = $1::uuid",
                        1, b)) {
        tl_dump(fx, b, procs, 2);
        ck_abort_msg("the second turn did not wait pending, waiting_limit:tcap");
    }
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns WHERE turn_id = $1::uuid AND status = 'running'",
                      1, a),
        1);
}

/* A cap of 1 on the turns of two profiles: the second turn waits pending, waiting_limit:tcap (turn show and
 * its JSON say so) while the first runs, then runs; never two at once (from the times the agent program
 * records); its history has the wait, from when to when and for which limit; nothing is left held. */
START_TEST(test_turn_limit)
{
    TwFx *fx = tw_fx_new_all();
    char *log = wd_fmt("%s/turns.log", tw_fx_dir(fx));
    char *exec = tl_agent(fx, "tlim.sh", log, "2");
    TwFxProc *procs[2];
    tl_turn_setup(fx, exec, "0", procs);
    char *a = wd_submit(fx, "lim1", "{}");
    if (!tw_fx_sql_wait(fx, TL_WAIT_MS, "running", "SELECT status FROM state.turns WHERE turn_id = $1::uuid",
                        1, a)) {
        tl_dump(fx, a, procs, 2);
        ck_abort_msg("the first turn did not run");
    }
    char *b = wd_submit(fx, "lim2", "{}");
    tl_second_waits(fx, a, b, procs);
    char *out = NULL, *err = NULL;
    ck_assert_int_eq(tw_fx_cli(fx, &out, &err, "turn", "show", b, NULL), 0);
    ck_assert_msg(strstr(out, "waiting_limit:tcap"), "turn show does not say why it waits:\n%s", out);
    free(out);
    free(err);
    tl_wait_done(fx, a, procs, 2, "the first turn");
    tl_wait_done(fx, b, procs, 2, "the second turn");
    size_t n;
    free(tl_times(log, "start", &n));
    ck_assert_uint_eq(n, 2);
    ck_assert_msg(tl_max_overlap(log) == 1, "%d turns held a limit of 1 at once", tl_max_overlap(log));
    /* The wait in the history (JSON and text). */
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM jsonb_array_elements(tw.turn_history($1::uuid)) h"
                                   " WHERE h ->> 'limit' = 'tcap' AND (h ->> 'waited_from')::timestamptz < "
                                   "(h ->> 'at')::timestamptz AND h ->> 'from' = 'pending'",
                                   1, b),
                     1);
    ck_assert_int_eq(tw_fx_cli(fx, &out, &err, "turn", "history", b, NULL), 0);
    ck_assert_msg(strstr(out, "the turn waited") && strstr(out, "for limit tcap"), "turn history:\n%s", out);
    free(out);
    free(err);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.limit_calls", 0), 0);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT coalesce(sum(in_use), 0) FROM state.limit_usage", 0), 0);
    free(a);
    free(b);
    free(exec);
    free(log);
    tw_fx_free(fx);
}
END_TEST

/* max_wait_seconds = 1 on a turn's limit: the second turn, waiting while the first runs 6 s, ends
 * timeout/limit_timeout; the first ends done and the slot is free again (a third turn runs). */
START_TEST(test_turn_limit_max_wait)
{
    TwFx *fx = tw_fx_new_all();
    char *log = wd_fmt("%s/turns.log", tw_fx_dir(fx));
    char *exec = tl_agent(fx, "tlim.sh", log, "6");
    TwFxProc *procs[2];
    tl_turn_setup(fx, exec, "1", procs);
    char *a = wd_submit(fx, "lim1", "{}");
    if (!tw_fx_sql_wait(fx, TL_WAIT_MS, "running", "SELECT status FROM state.turns WHERE turn_id = $1::uuid",
                        1, a))
        ck_abort_msg("the first turn did not run");
    char *b = wd_submit(fx, "lim2", "{}");
    if (!tw_fx_sql_wait(fx, TL_WAIT_MS, "timeout limit_timeout",
                        "SELECT concat_ws(' ', status, error) FROM state.turns WHERE turn_id = $1::uuid", 1,
                        b)) {
        tl_dump(fx, b, procs, 2);
        ck_abort_msg("the waiting turn did not end timeout/limit_timeout");
    }
    tl_wait_done(fx, a, procs, 2, "the first turn");
    size_t n;
    free(tl_times(log, "start", &n));
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.limit_calls", 0), 0);
    free(a);
    free(b);
    free(exec);
    free(log);
    tw_fx_free(fx);
}
END_TEST

/* A waiting turn is cancelled like any pending turn: it ends cancelled, holds nothing, never runs; the first
 * ends done, and the slot goes to the next turn (no leak). */
START_TEST(test_turn_limit_cancel)
{
    TwFx *fx = tw_fx_new_all();
    char *log = wd_fmt("%s/turns.log", tw_fx_dir(fx));
    char *exec = tl_agent(fx, "tlim.sh", log, "3");
    TwFxProc *procs[2];
    tl_turn_setup(fx, exec, "0", procs);
    char *a = wd_submit(fx, "lim1", "{}");
    if (!tw_fx_sql_wait(fx, TL_WAIT_MS, "running", "SELECT status FROM state.turns WHERE turn_id = $1::uuid",
                        1, a))
        ck_abort_msg("the first turn did not run");
    char *b = wd_submit(fx, "lim2", "{}");
    tl_second_waits(fx, a, b, procs);
    char *out = NULL, *err = NULL;
    ck_assert_int_eq(tw_fx_cli(fx, &out, &err, "cancel", b, NULL), 0);
    free(out);
    free(err);
    ck_assert_int_eq(
        tw_fx_sql_int(
            fx, "SELECT count(*) FROM state.turns WHERE turn_id = $1::uuid AND status = 'cancelled'", 1, b),
        1);
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.limit_calls WHERE turn_id = $1::uuid", 1, b), 0);
    tl_wait_done(fx, a, procs, 2, "the first turn");
    char *c = wd_submit(fx, "lim2", "{}");
    tl_wait_done(fx, c, procs, 2, "the third turn");
    size_t n;
    free(tl_times(log, "start", &n));
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT coalesce(sum(in_use), 0) FROM state.limit_usage", 0), 0);
    free(a);
    free(b);
    free(c);
    free(exec);
    free(log);
    tw_fx_free(fx);
}
END_TEST

/* A turn holds its profile's limits while it runs, not while it is suspended: a fan-out turn of a limited
 * profile (cap 1) suspends on 30 sleep calls; meanwhile a turn of another profile on the same limit runs to
 * its end; then the first resumes (asking again) and ends done; nothing is left held. */
START_TEST(test_turn_limit_suspended)
{
    TwFx *fx = tw_fx_new_all();
    char *ov = wd_fmt("[worker]\nconcurrency = 8\n[limit.tcap]\nmax_concurrent = 1\n"
                      "[agent.fan1]\nexec = %s/examples/agents/tw-fanout-agent\nlimits = tcap\n"
                      "[agent.fan2]\nexec = %s/examples/agents/tw-fanout-agent\nlimits = tcap\n",
                      tw_fx_build_dir(), tw_fx_build_dir());
    tw_fx_write_config(fx, NULL, ov);
    tw_fx_migrate(fx);
    TwFxProc *procs[2] = {tw_fx_start_pmo(fx, NULL), tw_fx_start_worker(fx, NULL)};
    if (!tw_fx_sql_wait(fx, TL_WAIT_MS, "2",
                        "SELECT count(*) FROM state.profiles WHERE limits = '{tcap}'::text[]", 0))
        ck_abort_msg("the worker did not publish the profiles' [agent.P] limits");
    char *a = wd_submit(fx, "fan1", "{\"n\":30,\"tool\":\"sleep\"}");
    if (!tw_fx_sql_wait(fx, TL_WAIT_MS, "suspended",
                        "SELECT status FROM state.turns WHERE turn_id = $1::uuid", 1, a)) {
        tl_dump(fx, a, procs, 2);
        ck_abort_msg("the fan-out turn did not suspend");
    }
    char *b = wd_submit(fx, "fan2", "{\"n\":1,\"tool\":\"sleep\"}");
    tl_wait_done(fx, b, procs, 2, "the second turn");
    ck_assert_msg(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turns WHERE turn_id = $1::uuid AND status = 'suspended'", 1,
                      a) == 1,
        "the first turn was no longer suspended when the second ended: it did not wait that long");
    tl_wait_done(fx, a, procs, 2, "the first turn");
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.limit_calls", 0), 0);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT coalesce(sum(in_use), 0) FROM state.limit_usage", 0), 0);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns WHERE flow_limits IS NULL", 0), 0);
    free(a);
    free(b);
    free(ov);
    tw_fx_free(fx);
}
END_TEST

Suite *limits_suite(void)
{
    Suite *s = suite_create("limits");
    TCase *tc = tcase_create("flow control");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_cap_across_workers);
    tcase_add_test(tc, test_rate_bucket);
    tcase_add_test(tc, test_max_wait);
    tcase_add_test(tc, test_timeout_counts_from_start);
    tcase_add_test(tc, test_runtime_limit);
    tcase_add_test(tc, test_holder_killed);
    tcase_add_test(tc, test_remove_starts_waiters);
    tcase_add_test(tc, test_fair_and_priority);
    tcase_add_test(tc, test_per_key);
    tcase_add_test(tc, test_pushback);
    suite_add_tcase(s, tc);
    TCase *tt = tcase_create("turns");
    tcase_set_timeout(tt, 180);
    tcase_add_test(tt, test_turn_limit);
    tcase_add_test(tt, test_turn_limit_max_wait);
    tcase_add_test(tt, test_turn_limit_cancel);
    tcase_add_test(tt, test_turn_limit_suspended);
    suite_add_tcase(s, tt);
    return s;
}
