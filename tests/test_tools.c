/* test_tools.c — issue 3, tool calls end to end against real PostgreSQL, nats-server, turnwatch-pmo and
 * turnwatch-worker: suspend, run tools, collect and resume with wait all / any / n, tool errors, external
 * tools answered from the CLI, multi-step turns, crashes around results and resume ledger leases, duplicate
 * doorbells and replayed state-machine calls, and the time from the last tool result to the next step. */
#include "fixture.h"
#include "suite.h"

#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Waits are generous (2 shared cores, other test runs at the same time); what is expected is short. */
#define TT_WAIT_MS 20000

typedef struct Tt {
    TwFx *fx;
    TwFxEvents *ev;  /* evt.> */
    TwFxEvents *cmd; /* cmd.> (doorbells) */
    TwFxProc *pmo;
    TwFxProc *workers[6];
    int n_workers;
} Tt;

/* ---- set-up
 * ---------------------------------------------------------------------------------------------------- */

/* Servers, the default config with `overrides`, migrate, event collectors, pmo and (with_worker) one worker.
 */
static Tt *tt_start(const char *overrides, bool with_worker)
{
    Tt *t = calloc(1, sizeof *t);
    ck_assert_ptr_nonnull(t);
    ck_assert_msg(tw_fx_daemons_built(), "turnwatch-pmo, turnwatch-worker and turnwatch must be built");
    t->fx = tw_fx_new();
    tw_fx_pg_init(t->fx);
    tw_fx_nats_start(t->fx);
    tw_fx_write_config(t->fx, NULL, overrides);
    tw_fx_migrate(t->fx);
    t->ev = tw_fx_events_new(t->fx, "evt.>");
    t->cmd = tw_fx_events_new(t->fx, "cmd.>");
    t->pmo = tw_fx_start_pmo(t->fx, NULL);
    if (with_worker)
        t->workers[t->n_workers++] = tw_fx_start_worker(t->fx, NULL);
    return t;
}

static TwFxProc *tt_worker(Tt *t, const char *config)
{
    ck_assert_int_lt(t->n_workers, (int)(sizeof t->workers / sizeof t->workers[0]));
    return t->workers[t->n_workers++] = tw_fx_start_worker(t->fx, config);
}

static void tt_free(Tt *t)
{
    tw_fx_free(t->fx);
    free(t);
}

/* ---- diagnostics
 * ----------------------------------------------------------------------------------------------- */

static void tt_dump_log(const char *what, TwFxProc *p)
{
    char *log = tw_fx_proc_log(p);
    size_t n = strlen(log);
    fprintf(stderr, "---- %s (%s), last lines:\n%s\n", what, tw_fx_proc_log_path(p),
            n > 6000 ? log + n - 6000 : log);
    free(log);
}

/* Everything a reader needs when a wait fails: the turn as the CLI shows it, and the daemons' logs. */
static void tt_dump(Tt *t, const char *turn)
{
    if (turn) {
        char *out = NULL, *err = NULL;
        tw_fx_cli(t->fx, &out, &err, "turn", "show", turn, NULL);
        fprintf(stderr, "---- turnwatch turn show %s\n%s%s\n", turn, out ? out : "", err ? err : "");
        free(out);
        free(err);
    }
    tt_dump_log("pmo", t->pmo);
    for (int i = 0; i < t->n_workers; i++)
        tt_dump_log("worker", t->workers[i]);
}

/* ---- JSON
 * ------------------------------------------------------------------------------------------------------ */

static json_t *tt_parse(char *s)
{
    json_t *j = s ? json_loads(s, JSON_DECODE_ANY, NULL) : NULL;
    ck_assert_msg(j != NULL, "expected JSON, got %s", s ? s : "(null)");
    free(s);
    return j;
}

/* First column of the first row, parsed as JSON. */
#define TT_SQL_JSON(fx, ...) tt_parse(tw_fx_sql_str((fx), __VA_ARGS__))

/* Walks "a.b.0.c": object keys, and array indexes for all-digit parts. */
static json_t *tt_at(json_t *j, const char *path)
{
    char buf[256];
    char *save = NULL;
    snprintf(buf, sizeof buf, "%s", path);
    for (char *k = strtok_r(buf, ".", &save); k && j; k = strtok_r(NULL, ".", &save)) {
        if (json_is_array(j) && isdigit((unsigned char)k[0]))
            j = json_array_get(j, (size_t)strtoul(k, NULL, 10));
        else
            j = json_object_get(j, k);
    }
    return j;
}

static const char *tt_str(json_t *j, const char *path)
{
    const char *s = json_string_value(tt_at(j, path));
    return s ? s : "(none)";
}

/* Each path of `j` (tt_str) is its string: pairs of a path and the string it must be, ended by a NULL path. A
 * failure names the caller's line, the path, what it wanted and what it found. */
static void tt_expect_strs(int line, json_t *j, ...)
{
    va_list ap;
    va_start(ap, j);
    for (const char *path = va_arg(ap, const char *); path; path = va_arg(ap, const char *)) {
        const char *want = va_arg(ap, const char *), *got = tt_str(j, path);
        ck_assert_msg(want && strcmp(got, want) == 0, "line %d: %s is '%s', want '%s'", line, path, got,
                      want ? want : "(null)");
    }
    va_end(ap);
}

#define TT_EXPECT_STRS(j, ...) tt_expect_strs(__LINE__, (j), __VA_ARGS__, (const char *)NULL)

/* ---- turns
 * ----------------------------------------------------------------------------------------------------- */

/* turnwatch submit --json; returns the new turn id (malloc'd). */
static char *tt_submit(Tt *t, const char *agent, const char *channel, const char *input)
{
    char *out = NULL, *err = NULL;
    int rc = tw_fx_cli(t->fx, &out, &err, "submit", "--agent", agent, "--channel", channel, "--input", input,
                       "--json", NULL);
    ck_assert_msg(rc == 0, "submit exited %d: %s", rc, err);
    json_t *j = tt_parse(out);
    char *id = strdup(tt_str(j, "turn_id"));
    json_decref(j);
    free(err);
    return id;
}

static char *tt_submit_json(Tt *t, const char *agent, const char *channel, json_t *input)
{
    char *s = json_dumps(input, JSON_COMPACT);
    char *id = tt_submit(t, agent, channel, s);
    free(s);
    json_decref(input);
    return id;
}

static void tt_wait_status(Tt *t, const char *turn, const char *status)
{
    if (!tw_fx_sql_wait(t->fx, TT_WAIT_MS, status, "SELECT status FROM state.turns WHERE turn_id = $1::uuid",
                        1, turn)) {
        tt_dump(t, turn);
        ck_abort_msg("turn %s did not reach status %s", turn, status);
    }
}

/* Polls a query until it gives `expect`; on timeout dumps the turn and fails. */
#define TT_WAIT_SQL(t, turn, expect, ...)                                                                    \
    do {                                                                                                     \
        if (!tw_fx_sql_wait((t)->fx, TT_WAIT_MS, (expect), __VA_ARGS__)) {                                   \
            tt_dump((t), (turn));                                                                            \
            ck_abort_msg("waited in vain for %s from: %s", (expect) ? (expect) : "NULL", #__VA_ARGS__);      \
        }                                                                                                    \
    } while (0)

/* turnwatch turn show ID --json */
static json_t *tt_show(Tt *t, const char *turn)
{
    char *out = NULL, *err = NULL;
    int rc = tw_fx_cli(t->fx, &out, &err, "turn", "show", turn, "--json", NULL);
    ck_assert_msg(rc == 0, "turn show exited %d: %s", rc, err);
    free(err);
    return tt_parse(out);
}

/* The turn's task.deliverable content. */
static json_t *tt_deliverable(Tt *t, const char *turn)
{
    return TT_SQL_JSON(
        t->fx,
        "SELECT c.content::text FROM state.turns t JOIN state.cards c ON c.card_id = t.deliverable_card_id"
        " WHERE t.turn_id = $1::uuid",
        1, turn);
}

/* What the tw-test-agent saw, one array of tool_results per resumed step (its output.tool_results). */
static json_t *tt_seen(Tt *t, const char *turn)
{
    json_t *d = tt_deliverable(t, turn);
    json_t *seen = json_incref(tt_at(d, "output.tool_results"));
    json_decref(d);
    ck_assert_msg(json_is_array(seen), "turn %s: the deliverable has no output.tool_results", turn);
    return seen;
}

static int64_t tt_count(Tt *t, const char *table_where, const char *turn)
{
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %s", table_where);
    return tw_fx_sql_int(t->fx, sql, 1, turn);
}

static bool tt_is_task_for(const char *subject, const json_t *data, void *arg)
{
    size_t n = subject ? strlen(subject) : 0;
    const char *id = json_string_value(json_object_get(data, "turn_id"));
    return n > 5 && strcmp(subject + n - 5, ".task") == 0 && id && strcmp(id, arg) == 0;
}

/* Exactly one final event for the turn on NATS (waited for, then a grace period for a second one), with
 * `status`, and exactly one task event in the outbox. */
static void tt_one_final_event(Tt *t, const char *turn, const char *status)
{
    if (!tw_fx_events_wait_if(t->ev, tt_is_task_for, (void *)turn, 1, TT_WAIT_MS)) {
        tw_fx_events_dump(t->ev);
        tt_dump(t, turn);
        ck_abort_msg("no final event for turn %s", turn);
    }
    tw_fx_sleep_ms(300);
    ck_assert_uint_eq(tw_fx_events_count_if(t->ev, tt_is_task_for, (void *)turn), 1);
    json_t *e = tw_fx_events_get_if(t->ev, tt_is_task_for, (void *)turn, 0, NULL, NULL);
    ck_assert_str_eq(tt_str(e, "status"), status);
    json_decref(e);
    ck_assert_int_eq(tt_count(t, "state.outbox WHERE kind = 'task' AND turn_id = $1::uuid", turn), 1);
}

/* The turn ends done, with exactly one final event (tt_one_final_event). */
static void tt_done(Tt *t, const char *turn)
{
    tt_wait_status(t, turn, "done");
    tt_one_final_event(t, turn, "done");
}

/* Submits `input` (stolen) to the test agent on `channel` and waits until the turn is done (tt_done); returns
 * its id. */
static char *tt_run(Tt *t, const char *channel, json_t *input)
{
    char *turn = tt_submit_json(t, "tester", channel, input);
    tt_done(t, turn);
    return turn;
}

/* How many times the turn went to `status` (agent state events in the outbox): 'running' counts the first
 * step plus one per resume. */
static int64_t tt_state_events(Tt *t, const char *turn, const char *status)
{
    return tw_fx_sql_int(t->fx,
                         "SELECT count(*) FROM state.outbox WHERE kind = 'state' AND turn_id = $1::uuid"
                         " AND payload ->> 'status' = $2",
                         2, turn, status);
}

/* A digest of everything the turn owns (rows of turns, waiting calls, cards, inbox without re-ring marks,
 * ledger, outbox): equal digests mean nothing changed. */
static char *tt_fingerprint(Tt *t, const char *turn)
{
    return tw_fx_sql_str(
        t->fx,
        "SELECT md5(concat_ws('|',"
        " (SELECT row_to_json(x)::text FROM state.turns x WHERE turn_id = $1::uuid),"
        " (SELECT string_agg(row_to_json(w)::text, ',' ORDER BY step, call_index) FROM "
        "state.turn_waiting_tools w"
        "   WHERE turn_id = $1::uuid),"
        " (SELECT string_agg(row_to_json(c)::text, ',' ORDER BY card_id) FROM state.cards c WHERE turn_id = "
        "$1::uuid),"
        " (SELECT string_agg((to_jsonb(i) - 'rung_at')::text, ',' ORDER BY inbox_id) FROM state.agent_inbox i"
        "   WHERE turn_id = $1::uuid),"
        " (SELECT string_agg(row_to_json(l)::text, ',' ORDER BY ledger_id) FROM state.turn_resume_ledger l"
        "   WHERE turn_id = $1::uuid),"
        " (SELECT count(*)::text FROM state.outbox o WHERE turn_id = $1::uuid)))",
        1, turn);
}

/* Runs the CLI; returns its exit code, stderr in *err (malloc'd). */
static int tt_cli_err(Tt *t, char **err, const char *turn, const char *call, const char *status,
                      const char *output)
{
    char *out = NULL;
    int rc = status ? tw_fx_cli(t->fx, &out, err, "tool-result", "--turn", turn, "--call", call, "--status",
                                status, "--output", output, NULL)
                    : tw_fx_cli(t->fx, &out, err, "tool-result", "--turn", turn, "--call", call, "--output",
                                output, NULL);
    free(out);
    return rc;
}

/* `turnwatch tool-result` for `call` of `turn` (with --status `status` unless NULL) is accepted. */
static void tt_result(Tt *t, const char *turn, const char *call, const char *status, const char *output)
{
    char *err = NULL;
    int rc = tt_cli_err(t, &err, turn, call, status, output);
    ck_assert_msg(rc == 0, "tool-result %s: exit %d: %s", call, rc, err ? err : "");
    free(err);
}

/* `turnwatch tool-result` for `call` of `turn` is refused with exit code `rc`, its stderr saying `says` and
 * `also`, and nothing the turn owns changed (tt_fingerprint). */
static void tt_result_refused(Tt *t, const char *turn, const char *call, const char *output, int rc,
                              const char *says, const char *also)
{
    char *before = tt_fingerprint(t, turn), *err = NULL;
    ck_assert_int_eq(tt_cli_err(t, &err, turn, call, NULL, output), rc);
    ck_assert_msg(strstr(err, says) && strstr(err, also), "stderr: %s", err);
    free(err);
    char *after = tt_fingerprint(t, turn);
    ck_assert_str_eq(before, after);
    free(before);
    free(after);
}

/* ---- processes
 * ------------------------------------------------------------------------------------------------- */

/* Children of `parent` whose command name is `comm`: live ones, or (zombies) those that exited and were not
 * reaped yet. */
static int tt_children_named(pid_t parent, const char *comm, bool zombies)
{
    DIR *d = opendir("/proc");
    struct dirent *de;
    int n = 0;

    ck_assert_ptr_nonnull(d);
    while ((de = readdir(d))) {
        char path[300], buf[512] = "";
        if (!isdigit((unsigned char)de->d_name[0]))
            continue;
        snprintf(path, sizeof path, "/proc/%s/stat", de->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (!fgets(buf, sizeof buf, f))
            buf[0] = '\0';
        fclose(f);
        char *open = strchr(buf, '('), *close = strrchr(buf, ')');
        char state = 0;
        int ppid = 0;
        if (!open || !close || sscanf(close + 1, " %c %d", &state, &ppid) != 2 || (state == 'Z') != zombies)
            continue;
        if (ppid == parent && (size_t)(close - open - 1) == strlen(comm) &&
            strncmp(open + 1, comm, strlen(comm)) == 0)
            n++;
    }
    closedir(d);
    return n;
}

typedef struct TtKids {
    pid_t parent;
    const char *comm;
    int want;
    bool zombies;
} TtKids;

static bool tt_kids_are(void *arg)
{
    TtKids *k = arg;
    return tt_children_named(k->parent, k->comm, k->zombies) == k->want;
}

/* At least one child of that name exists, running or already exited (a zombie its frozen parent has not
 * reaped). */
static bool tt_kid_spawned(void *arg)
{
    TtKids *k = arg;
    return tt_children_named(k->parent, k->comm, false) + tt_children_named(k->parent, k->comm, true) >= 1;
}

/* The first worker's tw-sleep-tool programs are all gone (within TT_WAIT_MS): its cancelled calls were
 * stopped. */
static void tt_sleeps_stopped(Tt *t)
{
    ck_assert_msg(tw_fx_wait_until(tt_kids_are,
                                   &(TtKids){tw_fx_proc_pid(t->workers[0]), "tw-sleep-tool", 0, false},
                                   TT_WAIT_MS),
                  "cancelled sleep programs still run");
}

static bool tt_log_has(TwFxProc *p, const char *needle)
{
    char *log = tw_fx_proc_log(p);
    bool has = strstr(log, needle) != NULL;
    free(log);
    return has;
}

static bool tt_file_exists(void *path)
{
    return access(path, F_OK) == 0;
}

/* A new worker (on `config`, or the default one when NULL) finishes the turn: done, with one final event;
 * when `rule` is given, the new worker's log shows that watchdog rule acting. */
static void tt_new_worker_finishes(Tt *t, const char *turn, const char *config, const char *rule)
{
    TwFxProc *w = tt_worker(t, config);
    tt_done(t, turn);
    if (rule) {
        char needle[128];
        snprintf(needle, sizeof needle, "watchdog rule=\"%s\"", rule);
        ck_assert_msg(tt_log_has(w, needle), "the new worker's log lacks %s", needle);
    }
}

/* The turn's one tool call has one result card, the turn was resumed once at the first try (one ledger row,
 * attempts 1), and the agent saw the result ok. */
static void tt_one_result_resumed_once(Tt *t, const char *turn)
{
    ck_assert_int_eq(tt_count(t, "state.cards WHERE turn_id = $1::uuid AND card_type = 'tool.result'", turn),
                     1);
    ck_assert_int_eq(tt_count(t, "state.turn_resume_ledger WHERE turn_id = $1::uuid AND attempts = 1", turn),
                     1);
    json_t *seen = tt_seen(t, turn);
    ck_assert_str_eq(tt_str(seen, "0.0.status"), "ok");
    json_decref(seen);
}

/* ---- inputs for tw-test-agent
 * ---------------------------------------------------------------------------------- */

/* {"mode":"tools","calls":calls,"wait":wait} (wait may be NULL; both stolen). */
static json_t *tt_tools_input(json_t *calls, json_t *wait)
{
    json_t *in = json_pack("{s:s,s:o}", "mode", "tools", "calls", calls);
    if (wait)
        json_object_set_new(in, "wait", wait);
    return in;
}

static json_t *tt_call(const char *id, const char *tool, json_t *args, int timeout_s)
{
    json_t *c = json_pack("{s:s,s:s,s:o}", "id", id, "tool", tool, "args", args ? args : json_object());
    if (timeout_s > 0)
        json_object_set_new(c, "timeout_seconds", json_integer(timeout_s));
    return c;
}

static json_t *tt_sleep_call(const char *id, double seconds, int timeout_s)
{
    return tt_call(id, "sleep", json_pack("{s:f}", "seconds", seconds), timeout_s);
}

/* ---- tests
 * ----------------------------------------------------------------------------------------------------- */

/* Fan-out of 10 calls with wait all: results settle out of call order, yet the turn resumes once (one ledger
 * row, two 'running' transitions), the resumed step sees 10 results in call order, and the turn ends done
 * with one final event. The example fan-out agent does the same with its own aggregation. */
START_TEST(test_fanout_all)
{
    Tt *t = tt_start("[worker]\nconcurrency = 8\n", true);
    json_t *calls = json_array();
    /* c0 is external and answered only once c1..c9 have settled, so the results settle out of call order on
     * any machine; c1 sleeps longest, c9 not at all. */
    json_array_append_new(calls, tt_call("c0", "ext", NULL, 0));
    for (int i = 1; i < 10; i++) {
        char id[8];
        snprintf(id, sizeof id, "c%d", i);
        json_array_append_new(calls, tt_sleep_call(id, (9 - i) * 0.15, 0));
    }
    char *turn = tt_submit_json(t, "tester", "fan", tt_tools_input(calls, json_string("all")));
    char *fan = tt_submit(t, "fanout", "fan", "{\"n\":10,\"tool\":\"sleep\"}");
    TT_WAIT_SQL(t, turn, "9",
                "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1::uuid AND wait_status = "
                "'received'",
                1, turn);
    tt_result(t, turn, "c0", NULL, "{\"slept\":1.35}");

    tt_done(t, turn);
    ck_assert_int_eq(tt_count(t, "state.turn_resume_ledger WHERE turn_id = $1::uuid", turn), 1);
    json_t *l =
        TT_SQL_JSON(t->fx,
                    "SELECT jsonb_build_object('step', step, 'status', status, 'outcome', outcome,"
                    " 'attempts', attempts)::text FROM state.turn_resume_ledger WHERE turn_id = $1::uuid",
                    1, turn);
    ck_assert_int_eq(json_integer_value(tt_at(l, "step")), 0);
    TT_EXPECT_STRS(l, "status", "done", "outcome", "applied");
    ck_assert_int_eq(json_integer_value(tt_at(l, "attempts")), 1);
    json_decref(l);
    ck_assert_int_eq(tt_state_events(t, turn, "running"), 2);
    ck_assert_int_eq(tt_state_events(t, turn, "suspended"), 1);
    ck_assert_int_eq(tt_count(t,
                              "state.turn_waiting_tools WHERE turn_id = $1::uuid AND wait_status = 'received'"
                              " AND result_status = 'ok'",
                              turn),
                     10);
    ck_assert_int_eq(tt_count(t, "state.cards WHERE turn_id = $1::uuid AND card_type = 'tool.call'", turn),
                     10);
    ck_assert_int_eq(tt_count(t, "state.cards WHERE turn_id = $1::uuid AND card_type = 'tool.result'", turn),
                     10);
    /* The results really came back out of call order... */
    ck_assert_int_eq(
        tw_fx_sql_int(t->fx,
                      "SELECT ((SELECT settled_at FROM state.turn_waiting_tools WHERE turn_id = $1::uuid"
                      "         AND tool_call_id = 'c9')"
                      "     < (SELECT settled_at FROM state.turn_waiting_tools WHERE turn_id = $1::uuid"
                      "         AND tool_call_id = 'c0'))::int",
                      1, turn),
        1);
    /* ...and the agent saw them in call order, all ten. */
    json_t *seen = tt_seen(t, turn);
    ck_assert_uint_eq(json_array_size(seen), 1);
    json_t *results = json_array_get(seen, 0);
    ck_assert_uint_eq(json_array_size(results), 10);
    for (int i = 0; i < 10; i++) {
        char id[8];
        json_t *r = json_array_get(results, (size_t)i);
        snprintf(id, sizeof id, "c%d", i);
        TT_EXPECT_STRS(r, "tool_call_id", id, "tool", i == 0 ? "ext" : "sleep", "status", "ok");
        ck_assert(json_is_number(tt_at(r, "output.slept")));
        ck_assert_double_eq_tol(json_number_value(tt_at(r, "output.slept")), (9 - i) * 0.15, 1e-9);
    }
    json_decref(seen);

    /* The example fan-out agent: ten sleeps, aggregated in order. */
    tt_done(t, fan);
    ck_assert_int_eq(tt_count(t, "state.turn_resume_ledger WHERE turn_id = $1::uuid", fan), 1);
    json_t *d = tt_deliverable(t, fan);
    ck_assert_uint_eq(json_array_size(tt_at(d, "output.results")), 10);
    for (int i = 0; i < 10; i++) {
        char path[64], id[8];
        snprintf(id, sizeof id, "f%d", i);
        snprintf(path, sizeof path, "output.results.%d.id", i);
        ck_assert_str_eq(tt_str(d, path), id);
        snprintf(path, sizeof path, "output.results.%d.status", i);
        ck_assert_str_eq(tt_str(d, path), "ok");
    }
    json_decref(d);
    /* At most [worker] concurrency (8) programs at once: no more than 8 calls were ever running together (a
     * call runs from its claim, started_at, until its result's transaction, settled_at). */
    int64_t overlap =
        tw_fx_sql_int(t->fx,
                      "SELECT max((SELECT count(*) FROM state.turn_waiting_tools y"
                      "            WHERE y.started_at <= x.started_at AND y.settled_at > x.started_at))"
                      "  FROM state.turn_waiting_tools x",
                      0);
    fprintf(stderr, "fanout_all: at most %lld tool calls ran at once (concurrency 8)\n", (long long)overlap);
    ck_assert_int_le(overlap, 8);
    ck_assert_int_ge(overlap, 2);
    free(fan);
    free(turn);
    tt_free(t);
}
END_TEST

/* wait any: the turn resumes on the first result; the other calls read `cancelled` in `turn show --json` and
 * in the tool_results the agent saw; the tool programs still running for them are stopped (heartbeat); a late
 * result for a cancelled call is refused with no effect. The example race agent wins with its fastest call.
 */
START_TEST(test_wait_any)
{
    /* The sleep tool's own limit (110 s) outlasts the test: only being stopped ends a loser early. */
    Tt *t = tt_start("[worker]\nconcurrency = 10\n[tool.sleep]\ntimeout_seconds = 110\n", true);
    /* The losers sleep 100 s (their time limit 110 s): only being stopped ends them within the test's
     * waits, on any machine. */
    json_t *calls = json_pack("[o,o,o]", tt_sleep_call("c0", 100, 110), tt_sleep_call("c1", 0.2, 0),
                              tt_sleep_call("c2", 100, 110));
    char *turn = tt_submit_json(t, "tester", "race", tt_tools_input(calls, json_string("any")));
    char *race = tt_submit(t, "racer", "race", "{\"durations\":[100,0.2,100]}");

    /* All three programs run at once before the race is decided. */
    TT_WAIT_SQL(
        t, turn, "3",
        "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1::uuid AND started_at IS NOT NULL",
        1, turn);
    tt_done(t, turn);
    ck_assert_int_eq(tt_count(t, "state.turn_resume_ledger WHERE turn_id = $1::uuid", turn), 1);
    ck_assert_int_eq(tt_state_events(t, turn, "running"), 2);

    json_t *seen = tt_seen(t, turn);
    ck_assert_uint_eq(json_array_size(json_array_get(seen, 0)), 3);
    TT_EXPECT_STRS(seen, "0.0.tool_call_id", "c0", "0.0.status", "cancelled", "0.0.error.code", "cancelled",
                   "0.1.tool_call_id", "c1", "0.1.status", "ok", "0.2.tool_call_id", "c2", "0.2.status",
                   "cancelled");
    json_decref(seen);

    json_t *show = tt_show(t, turn);
    ck_assert_uint_eq(json_array_size(tt_at(show, "tool_calls")), 3);
    TT_EXPECT_STRS(show, "tool_calls.0.status", "cancelled", "tool_calls.1.status", "received",
                   "tool_calls.1.result_status", "ok", "tool_calls.2.status", "cancelled",
                   "tool_calls.2.error.code", "cancelled");
    json_decref(show);
    ck_assert_int_eq(tt_count(t,
                              "state.agent_inbox WHERE turn_id = $1::uuid AND message_type = 'tool.call'"
                              " AND status = 'archived' AND outcome = 'cancelled'",
                              turn),
                     2);

    /* The racer example finishes too, with its fastest call. */
    tt_done(t, race);
    json_t *d = tt_deliverable(t, race);
    ck_assert_str_eq(tt_str(d, "output.winner.id"), "r1");
    json_decref(d);

    /* Four 100 s sleeps were cancelled: the heartbeat stops their programs long before they would end. */
    tt_sleeps_stopped(t);
    ck_assert(tt_log_has(t->workers[0], "call=c0 turn="));
    char *log = tw_fx_proc_log(t->workers[0]);
    char needle[160];
    snprintf(needle, sizeof needle, "tool=sleep call=c0 turn=%s", turn);
    const char *at = strstr(log, needle);
    ck_assert_msg(at && strstr(at, "stopping (claim lost)"), "worker log does not show c0 stopped");
    free(log);

    /* A late result for a cancelled call changes nothing. */
    char *before = tt_fingerprint(t, turn), *err = NULL;
    ck_assert_int_eq(tt_cli_err(t, &err, turn, "c2", NULL, "{\"late\":true}"), 1);
    ck_assert_ptr_nonnull(strstr(err, "already ended") ? err : strstr(err, "cancelled"));
    char *after = tt_fingerprint(t, turn);
    ck_assert_str_eq(before, after);
    free(before);
    free(after);
    free(err);
    free(race);
    free(turn);
    tt_free(t);
}
END_TEST

/* wait any while every slot of the only worker is taken by the calls that lose the race: the winning result
 * (an external tool's, from the CLI) is consumed although no slot is free, the losers' programs are stopped
 * at once (not at the next heartbeat, not when they end), and the turn resumes and ends within a moment. */
START_TEST(test_wait_any_full_worker)
{
    /* The losers sleep 100 s and the next heartbeat is up to 60 s away: a turn that ends within the test's
     * wait (20 s) had its losers stopped as it resumed, on any machine. */
    Tt *t = tt_start("[pmo]\nactive_reap_seconds = 200\n[worker]\nconcurrency = 2\nheartbeat_seconds = 60\n"
                     "inbox_processing_timeout_seconds = 200\n[tool.sleep]\ntimeout_seconds = 110\n",
                     true);
    json_t *calls = json_pack("[o,o,o]", tt_sleep_call("s1", 100, 0), tt_sleep_call("s2", 100, 0),
                              tt_call("x", "ext", NULL, 0));
    char *turn = tt_submit_json(t, "tester", "full", tt_tools_input(calls, json_string("any")));
    TT_WAIT_SQL(
        t, turn, "2",
        "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1::uuid AND started_at IS NOT NULL",
        1, turn);
    int64_t t0 = tw_fx_now_ms();
    tt_result(t, turn, "x", NULL, "{\"won\":true}");
    tt_wait_status(t, turn, "done");
    int64_t took = tw_fx_now_ms() - t0;
    fprintf(stderr, "wait_any_full_worker: resumed and done %lld ms after the winning result\n",
            (long long)took);
    tt_one_final_event(t, turn, "done");
    json_t *seen = tt_seen(t, turn);
    TT_EXPECT_STRS(seen, "0.0.status", "cancelled", "0.1.status", "cancelled", "0.2.status", "ok");
    json_decref(seen);
    tt_sleeps_stopped(t);
    free(turn);
    tt_free(t);
}
END_TEST

/* wait 2 of 3: resumes when two have settled; the third reads cancelled. */
START_TEST(test_wait_n)
{
    Tt *t = tt_start(NULL, true);
    json_t *calls = json_pack("[o,o,o]", tt_sleep_call("a", 0.1, 0), tt_sleep_call("b", 25, 30),
                              tt_sleep_call("c", 0.3, 0));
    char *turn = tt_run(t, "n", tt_tools_input(calls, json_integer(2)));
    ck_assert_int_eq(tt_count(t, "state.turn_resume_ledger WHERE turn_id = $1::uuid", turn), 1);
    json_t *seen = tt_seen(t, turn);
    TT_EXPECT_STRS(seen, "0.0.status", "ok", "0.1.tool_call_id", "b", "0.1.status", "cancelled", "0.2.status",
                   "ok");
    json_decref(seen);
    json_t *show = tt_show(t, turn);
    ck_assert_int_eq(json_integer_value(tt_at(show, "wait")), 2);
    ck_assert_str_eq(tt_str(show, "tool_calls.1.status"), "cancelled");
    json_decref(show);
    tt_sleeps_stopped(t);
    free(turn);
    tt_free(t);
}
END_TEST

/* A tool that exits non-zero, one that prints garbage and one that overruns its time limit each come back
 * with their own error code (tool_failed with the stderr tail, bad_output, tool_timeout) and the agent
 * continues to done; `turnwatch turn show` lists each call with tool, status, timings and error. */
START_TEST(test_tool_errors)
{
    Tt *t = tt_start(NULL, true);
    json_t *calls =
        json_pack("[o,o,o,o]", tt_call("e0", "fail", NULL, 0), tt_call("e1", "garbage", NULL, 0),
                  tt_sleep_call("e2", 8, 1), tt_call("e3", "echo", json_pack("{s:i}", "x", 1), 0));
    char *turn = tt_run(t, "err", tt_tools_input(calls, NULL));

    json_t *seen = tt_seen(t, turn);
    json_t *r = json_array_get(seen, 0);
    ck_assert_uint_eq(json_array_size(r), 4);
    TT_EXPECT_STRS(r, "0.status", "error", "0.error.code", "tool_failed");
    ck_assert_ptr_nonnull(strstr(tt_str(r, "0.error.message"), "exited with status 3"));
    ck_assert_ptr_nonnull(strstr(tt_str(r, "0.error.message"), "something broke"));
    TT_EXPECT_STRS(r, "1.status", "error", "1.error.code", "bad_output");
    ck_assert_ptr_nonnull(strstr(tt_str(r, "1.error.message"), "this is not json"));
    TT_EXPECT_STRS(r, "2.status", "timeout", "2.error.code", "tool_timeout");
    ck_assert_ptr_nonnull(strstr(tt_str(r, "2.error.message"), "1 second limit"));
    ck_assert_str_eq(tt_str(r, "3.status"), "ok");
    ck_assert_int_eq(json_integer_value(tt_at(r, "3.output.x")), 1);
    json_decref(seen);

    json_t *show = tt_show(t, turn);
    TT_EXPECT_STRS(show, "tool_calls.0.tool", "fail", "tool_calls.0.status", "received",
                   "tool_calls.0.error.code", "tool_failed", "tool_calls.2.status", "timeout",
                   "tool_calls.2.result_status", "timeout");
    ck_assert_int_eq(json_integer_value(tt_at(show, "tool_calls.2.timeout_seconds")), 1);
    for (int i = 0; i < 4; i++) {
        char p[64];
        snprintf(p, sizeof p, "tool_calls.%d.started_at", i);
        ck_assert(json_is_string(tt_at(show, p)));
        snprintf(p, sizeof p, "tool_calls.%d.settled_at", i);
        ck_assert(json_is_string(tt_at(show, p)));
    }
    json_decref(show);

    char *out = NULL, *err = NULL;
    ck_assert_int_eq(tw_fx_cli(t->fx, &out, &err, "turn", "show", turn, NULL), 0);
    /* One line per call: tool, status, timings, and the error code with its explanation. */
    const char *want[] = {
        "id=e0 tool=fail status=received result=error issued=",
        "error=tool_failed (the tool program exited with status 3; stderr: something broke)",
        "id=e1 tool=garbage status=received result=error issued=",
        "error=bad_output (the tool program's reply is not valid",
        "id=e2 tool=sleep status=timeout result=timeout issued=",
        "error=tool_timeout (the tool program did not reply within its 1 second limit",
        "id=e3 tool=echo status=received result=ok issued="};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(out, want[i]), "turn show lacks '%s':\n%s", want[i], out);
    ck_assert_ptr_null(strstr(out, "started=-"));
    free(out);
    free(err);
    free(turn);
    tt_free(t);
}
END_TEST

/* Suspension as the issue describes it (cards, waiting rows with their own deadlines, resume_deadline, saved
 * state, tool.call inbox only for tools that run, state event, tool doorbell), then an external tool answered
 * from the CLI: unknown turn / call refused, a second result refused with the first standing and nothing
 * changed, an error result, and a result for an ended turn refused. */
START_TEST(test_external_tool)
{
    Tt *t = tt_start("[tool.ext]\nsuspend_timeout_seconds = 45\n", true);
    json_t *calls = json_pack("[o,o,o]", tt_call("x1", "ext", json_pack("{s:s}", "q", "life"), 0),
                              tt_call("x2", "ext", NULL, 0), tt_sleep_call("s1", 0.1, 0));
    char *turn = tt_submit_json(t, "tester", "ext", tt_tools_input(calls, NULL));

    tt_wait_status(t, turn, "suspended");
    ck_assert_int_eq(tt_count(t, "state.cards WHERE turn_id = $1::uuid AND card_type = 'tool.call'", turn),
                     3);
    ck_assert_int_eq(
        tt_count(t, "state.turn_waiting_tools WHERE turn_id = $1::uuid AND call_card_id IS NOT NULL", turn),
        3);
    /* Deadlines: suspension + max([worker] 30, tool suspend_timeout, tool timeout): ext 45, sleep
     * max(30,20,10). */
    ck_assert_int_eq(tt_count(t,
                              "state.turn_waiting_tools w JOIN state.turns t USING (turn_id)"
                              " WHERE w.turn_id = $1::uuid AND w.tool = 'ext' AND w.external"
                              " AND w.deadline_at = t.suspended_at + interval '45 seconds'",
                              turn),
                     2);
    ck_assert_int_eq(tt_count(t,
                              "state.turn_waiting_tools w JOIN state.turns t USING (turn_id)"
                              " WHERE w.turn_id = $1::uuid AND w.tool = 'sleep' AND NOT w.external"
                              " AND w.deadline_at = t.suspended_at + interval '30 seconds'",
                              turn),
                     1);
    ck_assert_int_eq(
        tt_count(t,
                 "state.turns WHERE turn_id = $1::uuid"
                 " AND resume_deadline = suspended_at + interval '30 seconds'"
                 " AND agent_state = '{\"round\": 1, \"seen\": []}'::jsonb AND wait_mode = 'all'",
                 turn),
        1);
    ck_assert_int_eq(tt_count(t,
                              "state.agents WHERE agent = 'tester' AND status = 'suspended'"
                              " AND active_agent_turn_id = $1::uuid",
                              turn),
                     1);
    /* Only the tool that runs gets a tool.call message; nobody runs ext. */
    ck_assert_int_eq(
        tt_count(t, "state.agent_inbox WHERE turn_id = $1::uuid AND message_type = 'tool.call'", turn), 1);
    ck_assert_int_eq(tt_count(t,
                              "state.agent_inbox WHERE turn_id = $1::uuid AND message_type = 'tool.call'"
                              " AND target_kind = 'tool' AND target = 'sleep' AND tool_call_id = 's1'",
                              turn),
                     1);
    ck_assert_int_eq(tt_state_events(t, turn, "suspended"), 1);
    ck_assert(tw_fx_events_wait(t->ev, "evt.agent.tester.state", "\"suspended\"", 1, TT_WAIT_MS));
    ck_assert(tw_fx_events_wait(t->cmd, "cmd.tool.sleep.wakeup", NULL, 1, TT_WAIT_MS));
    ck_assert_uint_eq(tw_fx_events_count(t->cmd, "cmd.tool.ext.wakeup", NULL), 0);

    /* The sleep result arrives and is consumed; the turn keeps waiting for the two external calls. */
    TT_WAIT_SQL(
        t, turn, "archived",
        "SELECT status FROM state.agent_inbox WHERE turn_id = $1::uuid AND message_type = 'tool.result'", 1,
        turn);
    ck_assert_int_eq(tt_count(t, "state.turn_resume_ledger WHERE turn_id = $1::uuid", turn), 0);
    tt_wait_status(t, turn, "suspended");

    char *before = tt_fingerprint(t, turn), *after, *err = NULL;
    ck_assert_int_eq(tt_cli_err(t, &err, turn, "nope", NULL, "{}"), 2);
    ck_assert_msg(strstr(err, "no tool call 'nope'") && strstr(err, "nothing changed"), "stderr: %s", err);
    free(err);
    ck_assert_int_eq(tt_cli_err(t, &err, "00000000-0000-4000-8000-000000000000", "x1", NULL, "{}"), 2);
    ck_assert_msg(strstr(err, "no turn") && strstr(err, "nothing changed"), "stderr: %s", err);
    free(err);
    ck_assert_int_eq(tt_cli_err(t, &err, "not-a-uuid", "x1", NULL, "{}"), 2);
    free(err);
    ck_assert_int_eq(tt_cli_err(t, &err, turn, "x1", NULL, "{not json"), 2);
    free(err);
    after = tt_fingerprint(t, turn);
    ck_assert_str_eq(before, after);
    free(before);
    free(after);

    tt_result(t, turn, "x1", NULL, "{\"answer\":42}");
    /* Delivered exactly as a tool program's result: a tool.result card and message, the agent's doorbell. */
    ck_assert(tw_fx_events_wait(t->cmd, "cmd.agent.tester.wakeup", "\"tool.result\"", 1, TT_WAIT_MS));
    ck_assert_int_eq(tt_count(t,
                              "state.cards WHERE turn_id = $1::uuid AND card_type = 'tool.result'"
                              " AND tool_call_id = 'x1'",
                              turn),
                     1);
    /* x2 still waits; a second answer for x1 is refused and the first one stands. */
    tw_fx_sleep_ms(200);
    ck_assert_int_eq(tt_count(t, "state.turn_resume_ledger WHERE turn_id = $1::uuid", turn), 0);
    TT_WAIT_SQL(t, turn, "0",
                "SELECT count(*) FROM state.agent_inbox WHERE turn_id = $1::uuid AND status = 'pending'", 1,
                turn);
    tt_result_refused(t, turn, "x1", "{\"answer\":43}", 1, "already has a result", "first one stands");
    ck_assert_int_eq(tw_fx_sql_int(t->fx,
                                   "SELECT (output ->> 'answer')::int FROM state.turn_waiting_tools"
                                   " WHERE turn_id = $1::uuid AND tool_call_id = 'x1'",
                                   1, turn),
                     42);

    tt_result(t, turn, "x2", "error", "{\"code\":\"denied\",\"message\":\"no\"}");
    tt_done(t, turn);
    json_t *seen = tt_seen(t, turn);
    TT_EXPECT_STRS(seen, "0.0.tool_call_id", "x1", "0.0.status", "ok");
    ck_assert_int_eq(json_integer_value(tt_at(seen, "0.0.output.answer")), 42);
    TT_EXPECT_STRS(seen, "0.1.status", "error", "0.1.error.code", "denied", "0.2.tool_call_id", "s1",
                   "0.2.status", "ok");
    json_decref(seen);
    ck_assert_int_eq(tt_count(t, "state.turn_resume_ledger WHERE turn_id = $1::uuid", turn), 1);

    /* A result for a turn that has ended: refused, nothing changed. */
    char *t2 = tt_submit_json(t, "tester", "ext",
                              tt_tools_input(json_pack("[o]", tt_call("y1", "ext", NULL, 0)), NULL));
    tt_wait_status(t, t2, "suspended");
    char *out = NULL;
    ck_assert_int_eq(tw_fx_cli(t->fx, &out, &err, "cancel", t2, NULL), 0);
    free(out);
    free(err);
    tt_wait_status(t, t2, "cancelled");
    tt_result_refused(t, t2, "y1", "{\"late\":1}", 1, "already ended", "nothing changed");
    ck_assert_int_eq(tt_count(t, "state.cards WHERE turn_id = $1::uuid AND card_type = 'tool.result'", t2),
                     0);

    /* A result for a call the turn went on without (wait 1 of 2) is refused as cancelled while the turn is
     * still going (suspended again at step 1 on u-2 and v-2). */
    json_t *in3 = tt_tools_input(
        json_pack("[o,o]", tt_call("u", "ext", NULL, 0), tt_call("v", "ext", NULL, 0)), json_integer(1));
    json_object_set_new(in3, "rounds", json_integer(2));
    char *t3 = tt_submit_json(t, "tester", "ext", in3);
    tt_wait_status(t, t3, "suspended");
    tt_result(t, t3, "u", NULL, "{\"first\":true}");
    TT_WAIT_SQL(t, t3, "2",
                "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1::uuid AND step = 1"
                " AND wait_status = 'waiting'",
                1, t3);
    tt_wait_status(t, t3, "suspended");
    tt_result_refused(t, t3, "v", "{\"late\":true}", 1, "was cancelled", "nothing changed");
    tt_result(t, t3, "v-2", NULL, "{\"second\":true}");
    tt_done(t, t3);
    seen = tt_seen(t, t3);
    TT_EXPECT_STRS(seen, "0.0.status", "ok", "0.1.tool_call_id", "v", "0.1.status", "cancelled",
                   "1.0.tool_call_id", "u-2", "1.0.status", "cancelled", "1.1.status", "ok");
    ck_assert(json_is_true(tt_at(seen, "1.1.output.second")));
    json_decref(seen);
    ck_assert_int_eq(tt_count(t, "state.turn_resume_ledger WHERE turn_id = $1::uuid", t3), 2);
    free(t3);
    free(t2);
    free(turn);
    tt_free(t);
}
END_TEST

/* A result posted from outside for a call whose tool runs a program (issue 23): refused as not_external, by
 * the CLI (exit 2, saying why) and by tw.post_tool_result, with nothing changed; the tool's own result
 * stands. */
START_TEST(test_result_not_external)
{
    Tt *t = tt_start(NULL, true);
    json_t *calls = json_pack("[o,o]", tt_sleep_call("s1", 4, 0), tt_call("x1", "ext", NULL, 0));
    char *turn = tt_submit_json(t, "tester", "notext", tt_tools_input(calls, NULL));

    tt_wait_status(t, turn, "suspended");
    char *err = NULL;
    ck_assert_int_eq(tt_cli_err(t, &err, turn, "s1", NULL, "{\"forged\":true}"), 2);
    ck_assert_msg(strstr(err, "not a call of an external tool") && strstr(err, "sleep") &&
                      strstr(err, "nothing changed"),
                  "stderr: %s", err);
    free(err);
    char *r = tw_fx_sql_str(t->fx, "SELECT tw.post_tool_result($1::uuid, 's1', 'ok', '{\"forged\": true}')",
                            1, turn);
    ck_assert_str_eq(r, "not_external");
    free(r);
    r = tw_fx_sql_str(t->fx, "SELECT tw.post_tool_result($1::uuid, 's1', 'error', '\"no\"')", 1, turn);
    ck_assert_str_eq(r, "not_external");
    free(r);
    /* Nothing changed: the call still waits for its program (whose heartbeats move other columns). */
    ck_assert_int_eq(tt_count(t,
                              "state.turn_waiting_tools WHERE turn_id = $1::uuid AND tool_call_id = 's1'"
                              " AND wait_status = 'waiting' AND result_card_id IS NULL",
                              turn),
                     1);
    ck_assert_int_eq(tt_count(t, "state.cards WHERE turn_id = $1::uuid AND card_type = 'tool.result'", turn),
                     0);
    ck_assert_int_eq(
        tt_count(t, "state.agent_inbox WHERE turn_id = $1::uuid AND message_type = 'tool.result'", turn), 0);

    /* The external call takes its result; the sleep tool's own result arrives from the worker. */
    tt_result(t, turn, "x1", NULL, "{\"answer\":1}");
    tt_done(t, turn);
    json_t *seen = tt_seen(t, turn);
    TT_EXPECT_STRS(seen, "0.0.tool_call_id", "s1", "0.0.status", "ok", "0.1.tool_call_id", "x1", "0.1.status",
                   "ok");
    ck_assert_ptr_null(tt_at(seen, "0.0.output.forged"));
    json_decref(seen);
    free(turn);
    tt_free(t);
}
END_TEST

/* Tools, then more tools, then complete: three suspensions, three ledger rows, four steps, one final event.
 */
START_TEST(test_multi_step)
{
    /* A tool that shows what the worker gave it: its stdin document and TURNWATCH_* environment. */
    Tt *t = tt_start("[tool.probe]\n"
                     "exec = /bin/sh -c 'printf "
                     "\"{\\\"output\\\":{\\\"doc\\\":%s,\\\"call\\\":\\\"%s\\\",\\\"turn\\\":\\\"%s\\\"}}\" "
                     "\"$(cat)\" \"$TURNWATCH_TOOL_CALL_ID\" \"$TURNWATCH_TURN_ID\"'\n"
                     "timeout_seconds = 10\n",
                     true);
    json_t *in = tt_tools_input(json_pack("[o,o,o]", tt_call("a", "echo", json_pack("{s:s}", "k", "v"), 0),
                                          tt_sleep_call("b", 0.1, 0),
                                          tt_call("p", "probe", json_pack("{s:i}", "z", 9), 0)),
                                NULL);
    json_object_set_new(in, "rounds", json_integer(3));
    char *turn = tt_run(t, "multi", in);
    ck_assert_int_eq(tt_count(t,
                              "state.turn_resume_ledger WHERE turn_id = $1::uuid AND status = 'done'"
                              " AND outcome = 'applied' AND attempts = 1",
                              turn),
                     3);
    ck_assert_int_eq(tw_fx_sql_int(t->fx, "SELECT step FROM state.turns WHERE turn_id = $1::uuid", 1, turn),
                     3);
    ck_assert_int_eq(tt_state_events(t, turn, "running"), 4);
    ck_assert_int_eq(tt_state_events(t, turn, "suspended"), 3);
    ck_assert_int_eq(
        tt_count(t, "state.turn_waiting_tools WHERE turn_id = $1::uuid AND wait_status = 'received'", turn),
        9);
    json_t *seen = tt_seen(t, turn);
    ck_assert_uint_eq(json_array_size(seen), 3);
    const char *ids[3][3] = {{"a", "b", "p"}, {"a-2", "b-2", "p-2"}, {"a-3", "b-3", "p-3"}};
    for (int s = 0; s < 3; s++) {
        json_t *r = json_array_get(seen, (size_t)s);
        ck_assert_uint_eq(json_array_size(r), 3);
        TT_EXPECT_STRS(r, "0.tool_call_id", ids[s][0], "0.output.k", "v", "1.tool_call_id", ids[s][1],
                       "1.status", "ok");
        /* Contract §5: {"tool_call_id","tool","args","turn_id"} on stdin, TURNWATCH_TOOL_CALL_ID and
         * TURNWATCH_TURN_ID in the environment. */
        TT_EXPECT_STRS(r, "2.tool_call_id", ids[s][2], "2.status", "ok", "2.output.call", ids[s][2],
                       "2.output.turn", turn, "2.output.doc.tool_call_id", ids[s][2], "2.output.doc.tool",
                       "probe", "2.output.doc.turn_id", turn);
        ck_assert_int_eq(json_integer_value(tt_at(r, "2.output.doc.args.z")), 9);
    }
    json_decref(seen);
    free(turn);
    tt_free(t);
}
END_TEST

/* Tools and agents on different workers; the agent-side worker is killed with SIGKILL while the tool runs, so
 * the result arrives while no worker serves the agent. Nothing is lost: once an agent-side worker runs again,
 * the turn resumes and finishes, once. */
START_TEST(test_kill_agent_worker_before_result)
{
    Tt *t = tt_start("[pmo]\nactive_reap_seconds = 60\n", false);
    const char *agent_ini = tw_fx_write_config(t->fx, "agent-side.ini",
                                               "[worker]\nagents = tester\n"
                                               "[pmo]\nactive_reap_seconds = 60\n");
    const char *tool_ini = tw_fx_write_config(t->fx, "tool-side.ini",
                                              "[worker]\nagents = sleep\n"
                                              "[pmo]\nactive_reap_seconds = 60\n");
    TwFxProc *agent_side = tt_worker(t, agent_ini);
    tt_worker(t, tool_ini);
    char *turn =
        tt_submit_json(t, "tester", "kill", tt_tools_input(json_pack("[o]", tt_sleep_call("s", 3, 0)), NULL));

    TT_WAIT_SQL(
        t, turn, "1",
        "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1::uuid AND started_at IS NOT NULL",
        1, turn);
    tw_fx_proc_kill9(agent_side);
    /* The tool side delivers: the result waits in the inbox; the turn stays suspended with no ledger entry.
     */
    TT_WAIT_SQL(
        t, turn, "received",
        "SELECT wait_status FROM state.turn_waiting_tools WHERE turn_id = $1::uuid AND tool_call_id = 's'", 1,
        turn);
    TT_WAIT_SQL(
        t, turn, "pending",
        "SELECT status FROM state.agent_inbox WHERE turn_id = $1::uuid AND message_type = 'tool.result'", 1,
        turn);
    tw_fx_sleep_ms(500);
    ck_assert_int_eq(tt_count(t, "state.turn_resume_ledger WHERE turn_id = $1::uuid", turn), 0);
    ck_assert_int_eq(tt_count(t, "state.turns WHERE turn_id = $1::uuid AND status = 'suspended'", turn), 1);

    tt_new_worker_finishes(t, turn, agent_ini, NULL);
    tt_one_result_resumed_once(t, turn);
    free(turn);
    tt_free(t);
}
END_TEST

/* The worker freezes (SIGSTOP) right after its tool program has replied, before it could deliver the result
 * (the program exits and waits, unreaped, with its reply).
 * Rule 2.1 gives the tool.call back after inbox_processing_timeout_seconds, a new worker runs the tool again
 * and delivers, and the turn finishes with one result card and one final event. */
START_TEST(test_kill_worker_before_delivery)
{
    Tt *t =
        tt_start("[worker]\ninbox_processing_timeout_seconds = 3\n[pmo]\nactive_reap_seconds = 60\n", true);
    TwFxProc *w1 = t->workers[0];
    char *turn = tt_submit_json(t, "tester", "undelivered",
                                tt_tools_input(json_pack("[o]", tt_sleep_call("s", 0.3, 0)), NULL));
    TT_WAIT_SQL(
        t, turn, "1",
        "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1::uuid AND started_at IS NOT NULL",
        1, turn);
    /* started_at is written when the call is claimed, before the worker spawns the program: wait for the
     * program itself, or a loaded machine lets us freeze the worker before it ever started one. */
    ck_assert(tw_fx_wait_until(tt_kid_spawned, &(TtKids){tw_fx_proc_pid(w1), "tw-sleep-tool", 1, false},
                               TT_WAIT_MS));
    ck_assert(tw_fx_proc_freeze(w1));
    /* The program has replied and exited; the frozen worker never read its reply. */
    ck_assert(
        tw_fx_wait_until(tt_kids_are, &(TtKids){tw_fx_proc_pid(w1), "tw-sleep-tool", 1, true}, TT_WAIT_MS));
    /* It stays frozen: its session (and liveness lock) lives on, so only the lease (2.1) hands the call back.
     * A worker that dies outright is handed back at once by the liveness check (test_worker_watchdogs). */
    ck_assert_int_eq(tt_count(t,
                              "state.agent_inbox WHERE turn_id = $1::uuid AND message_type = 'tool.call'"
                              " AND status = 'processing' AND attempts = 1",
                              turn),
                     1);
    ck_assert_int_eq(tt_count(t, "state.cards WHERE turn_id = $1::uuid AND card_type = 'tool.result'", turn),
                     0);
    ck_assert_int_eq(tt_count(t, "state.turns WHERE turn_id = $1::uuid AND status = 'suspended'", turn), 1);

    tt_new_worker_finishes(t, turn, NULL, "2.1 reclaim_inbox");
    ck_assert_int_eq(tt_count(t,
                              "state.agent_inbox WHERE turn_id = $1::uuid AND message_type = 'tool.call'"
                              " AND status = 'archived' AND outcome = 'applied' AND attempts = 2",
                              turn),
                     1);
    tt_one_result_resumed_once(t, turn);
    free(turn);
    tt_free(t);
}
END_TEST

/* The worker freezes (SIGSTOP) while it holds a resume ledger entry (the resumed step sleeps). The lease
 * (= inbox_processing_timeout_seconds) expires, rule 2.3 puts the entry back, a new worker runs the step
 * again from the ledger and the received results, and the turn ends done with one final event. */
START_TEST(test_kill_worker_holding_ledger)
{
    Tt *t =
        tt_start("[worker]\ninbox_processing_timeout_seconds = 3\n[pmo]\nactive_reap_seconds = 60\n", true);
    char marker[512];
    snprintf(marker, sizeof marker, "%s/resume-sleep.pid", tw_fx_dir(t->fx));
    json_t *in = tt_tools_input(json_pack("[o]", tt_call("e", "echo", json_pack("{s:i}", "n", 7), 0)), NULL);
    json_object_set_new(in, "resume_sleep", json_integer(30));
    json_object_set_new(in, "resume_sleep_once", json_string(marker));
    char *turn = tt_submit_json(t, "tester", "lease", in);

    TT_WAIT_SQL(t, turn, "processing", "SELECT status FROM state.turn_resume_ledger WHERE turn_id = $1::uuid",
                1, turn);
    /* The resumed step's program has started (it wrote its pid). */
    ck_assert(tw_fx_wait_until(tt_file_exists, marker, TT_WAIT_MS));
    /* Frozen, not killed: its session lives on, so only the lease (2.3) hands the entry back. */
    ck_assert(tw_fx_proc_freeze(t->workers[0]));
    ck_assert_int_eq(
        tt_count(t, "state.turns WHERE turn_id = $1::uuid AND status = 'running' AND step = 1", turn), 1);
    ck_assert_int_eq(tt_count(t,
                              "state.turn_resume_ledger WHERE turn_id = $1::uuid AND status = 'processing'"
                              " AND attempts = 1",
                              turn),
                     1);

    tt_new_worker_finishes(t, turn, NULL, "2.3 requeue_expired_resume_ledgers");
    ck_assert_int_eq(tt_count(t,
                              "state.turn_resume_ledger WHERE turn_id = $1::uuid AND status = 'done'"
                              " AND outcome = 'applied' AND attempts = 2",
                              turn),
                     1);
    /* The step was run again with the same results, and applied once. */
    ck_assert_int_eq(tt_state_events(t, turn, "running"), 2);
    json_t *seen = tt_seen(t, turn);
    ck_assert_uint_eq(json_array_size(seen), 1);
    ck_assert_str_eq(tt_str(seen, "0.0.tool_call_id"), "e");
    ck_assert_int_eq(json_integer_value(tt_at(seen, "0.0.output.n")), 7);
    json_decref(seen);

    /* The first run of the step was orphaned by the kill; its output can no longer matter. Stop it. */
    FILE *f = fopen(marker, "r");
    int pid = 0;
    if (f) {
        if (fscanf(f, "%d", &pid) != 1)
            pid = 0;
        fclose(f);
    }
    if (pid > 0)
        kill(pid, SIGKILL);
    free(turn);
    tt_free(t);
}
END_TEST

typedef struct TtRing {
    Tt *t;
    const char *turn;
    int sent;
} TtRing;

/* Rings doorbells for the agent and the tool on every poll until the turn ended. */
static bool tt_ring_until_done(void *arg)
{
    TtRing *r = arg;
    bool ok = tw_fx_nats_publish(r->t->fx, "cmd.agent.tester.wakeup",
                                 "{\"target\":\"tester\",\"reason\":\"test\"}");
    ok =
        tw_fx_nats_publish(r->t->fx, "cmd.tool.sleep.wakeup", "{\"target\":\"sleep\",\"reason\":\"test\"}") &&
        ok;
    r->sent += ok ? 2 : 0;
    char *s = tw_fx_sql_str(r->t->fx, "SELECT status FROM state.turns WHERE turn_id = $1::uuid", 1, r->turn);
    bool done = s && strcmp(s, "done") == 0;
    free(s);
    return done;
}

/* Duplicate doorbells change nothing twice; replayed state-machine calls (tw.apply_step, tw.consume_result,
 * tw.claim twice each, a stale claim token, a duplicate result message) are refused by compare-and-set and
 * unique keys. */
START_TEST(test_duplicates_and_replays)
{
    Tt *t = tt_start("[pmo]\nactive_reap_seconds = 60\n", true);
    json_t *calls = json_array();
    for (int i = 0; i < 6; i++) {
        char id[8];
        snprintf(id, sizeof id, "d%d", i);
        json_array_append_new(calls, tt_sleep_call(id, 0.2 * i, 0));
    }
    char *turn = tt_submit_json(t, "tester", "dup", tt_tools_input(calls, NULL));
    TtRing ring = {t, turn, 0};
    if (!tw_fx_wait_until(tt_ring_until_done, &ring, TT_WAIT_MS)) {
        tt_dump(t, turn);
        ck_abort_msg("turn did not end under a storm of doorbells");
    }
    ck_assert_int_gt(ring.sent, 20);
    tt_one_final_event(t, turn, "done");
    ck_assert_int_eq(tt_count(t, "state.turn_resume_ledger WHERE turn_id = $1::uuid AND attempts = 1", turn),
                     1);
    ck_assert_int_eq(tt_state_events(t, turn, "running"), 2);
    ck_assert_int_eq(tt_count(t,
                              "state.agent_inbox WHERE turn_id = $1::uuid AND message_type = 'tool.call'"
                              " AND attempts = 1 AND outcome = 'applied'",
                              turn),
                     6);
    ck_assert_int_eq(tt_count(t, "state.cards WHERE turn_id = $1::uuid AND card_type = 'tool.result'", turn),
                     6);
    json_t *seen = tt_seen(t, turn);
    ck_assert_uint_eq(json_array_size(json_array_get(seen, 0)), 6);
    json_decref(seen);
    /* More doorbells after the end: nothing moves. */
    char *before = tt_fingerprint(t, turn);
    for (int i = 0; i < 20; i++)
        ck_assert(
            tw_fx_nats_publish(t->fx, "cmd.agent.tester.wakeup", "{\"target\":\"tester\",\"reason\":\"x\"}"));
    tw_fx_sleep_ms(500);
    char *after = tt_fingerprint(t, turn);
    ck_assert_str_eq(before, after);
    free(before);
    free(after);

    /* Replays, driven by hand: no worker serves the agent now. */
    ck_assert_int_eq(tw_fx_proc_terminate(t->workers[0], 10000), 0);
    char *t2 = tt_submit_json(t, "tester", "dup",
                              tt_tools_input(json_pack("[o]", tt_call("x1", "ext", NULL, 0)), NULL));
    tt_wait_status(t, t2, "dispatched");
    json_t *c1 = TT_SQL_JSON(t->fx, "SELECT tw.claim('replayer', '{tester}', '{}', 4, 30)::text", 0);
    json_t *c2 = TT_SQL_JSON(t->fx, "SELECT tw.claim('replayer', '{tester}', '{}', 4, 30)::text", 0);
    ck_assert_uint_eq(json_array_size(tt_at(c1, "jobs")), 1);
    ck_assert_uint_eq(json_array_size(tt_at(c2, "jobs")), 0);
    json_t *job = tt_at(c1, "jobs.0");
    ck_assert_str_eq(tt_str(job, "turn_id"), t2);
    ck_assert_int_eq(json_integer_value(tt_at(job, "step")), 0);
    const char *reply =
        "{\"tool_calls\":[{\"id\":\"x1\",\"tool\":\"ext\",\"args\":{},\"timeout_seconds\":30,"
        "\"wait_seconds\":30,\"external\":true}],\"wait\":\"all\",\"state\":{\"round\":1,\"seen\":[]}}";
    json_t *stale = json_deep_copy(job);
    json_object_set_new(stale, "token", json_integer(json_integer_value(tt_at(job, "token")) + 1000));
    char *stale_s = json_dumps(stale, JSON_COMPACT), *job_s = json_dumps(job, JSON_COMPACT);
    json_t *a0 = TT_SQL_JSON(t->fx, "SELECT tw.apply_step($1::jsonb, $2::jsonb)::text", 2, stale_s, reply);
    json_t *a1 = TT_SQL_JSON(t->fx, "SELECT tw.apply_step($1::jsonb, $2::jsonb)::text", 2, job_s, reply);
    json_t *a2 = TT_SQL_JSON(t->fx, "SELECT tw.apply_step($1::jsonb, $2::jsonb)::text", 2, job_s, reply);
    ck_assert(json_is_false(tt_at(a0, "applied")));
    ck_assert(json_is_true(tt_at(a1, "applied")));
    ck_assert(json_is_false(tt_at(a2, "applied")));
    ck_assert_int_eq(tt_count(t, "state.cards WHERE turn_id = $1::uuid AND card_type = 'tool.call'", t2), 1);
    ck_assert_int_eq(tt_count(t, "state.turn_waiting_tools WHERE turn_id = $1::uuid", t2), 1);
    tt_wait_status(t, t2, "suspended");
    json_decref(a0);
    json_decref(a1);
    json_decref(a2);
    free(stale_s);
    free(job_s);
    json_decref(stale);
    json_decref(c1);
    json_decref(c2);

    char *err = NULL;
    tt_result(t, t2, "x1", NULL, "{\"v\":1}");
    ck_assert_int_eq(tt_cli_err(t, &err, t2, "x1", NULL, "{\"v\":2}"), 1);
    free(err);
    /* A duplicate of the result message (as a replay after a crash could leave) next to the real one. */
    tw_fx_sql_exec(
        t->fx,
        "INSERT INTO state.agent_inbox (target_kind, target, message_type, turn_id, turn_epoch, step,"
        " tool_call_id, channel_id, payload)"
        " SELECT target_kind, target, message_type, turn_id, turn_epoch, step, tool_call_id, channel_id,"
        " payload FROM state.agent_inbox WHERE turn_id = $1::uuid AND message_type = 'tool.result'",
        1, t2);
    ck_assert_int_eq(tt_count(t,
                              "state.agent_inbox WHERE turn_id = $1::uuid AND message_type = 'tool.result'"
                              " AND status = 'pending'",
                              t2),
                     2);
    /* consume_result twice on the same message (the second changes nothing at all), then on the duplicate:
     * one ledger row. The message is read once, so the replay gets the row as it was before the first call.
     */
    char *msg = tw_fx_sql_str(t->fx,
                              "SELECT m::text FROM state.agent_inbox m WHERE turn_id = $1::uuid"
                              " AND message_type = 'tool.result' ORDER BY inbox_id LIMIT 1",
                              1, t2);
    json_t *r1 = TT_SQL_JSON(t->fx, "SELECT tw.consume_result($1::state.agent_inbox)::text", 1, msg);
    ck_assert_str_eq(tt_str(r1, "0.subject"), "cmd.agent.tester.wakeup");
    json_decref(r1);
    before = tt_fingerprint(t, t2);
    r1 = TT_SQL_JSON(t->fx, "SELECT tw.consume_result($1::state.agent_inbox)::text", 1, msg);
    ck_assert_uint_eq(json_array_size(r1), 0);
    json_decref(r1);
    after = tt_fingerprint(t, t2);
    ck_assert_str_eq(before, after);
    free(before);
    free(after);
    free(msg);
    tw_fx_sql_exec(t->fx,
                   "SELECT tw.consume_result(m) FROM state.agent_inbox m WHERE turn_id = $1::uuid"
                   " AND message_type = 'tool.result' ORDER BY inbox_id DESC LIMIT 1",
                   1, t2);
    ck_assert_int_eq(
        tt_count(t, "state.turn_resume_ledger WHERE turn_id = $1::uuid AND status = 'pending'", t2), 1);
    ck_assert_int_eq(tt_count(t, "state.agent_inbox WHERE turn_id = $1::uuid AND status = 'pending'", t2), 0);

    c1 = TT_SQL_JSON(t->fx, "SELECT tw.claim('replayer', '{tester}', '{}', 4, 30)::text", 0);
    c2 = TT_SQL_JSON(t->fx, "SELECT tw.claim('replayer', '{tester}', '{}', 4, 30)::text", 0);
    ck_assert_uint_eq(json_array_size(tt_at(c1, "jobs")), 1);
    ck_assert_uint_eq(json_array_size(tt_at(c2, "jobs")), 0);
    job = tt_at(c1, "jobs.0");
    ck_assert_str_eq(tt_str(job, "fence"), "ledger");
    ck_assert_int_eq(json_integer_value(tt_at(job, "step")), 1);
    /* The step document travels as the text the database made of it. */
    json_t *doc = tt_parse(strdup(tt_str(job, "doc")));
    ck_assert_str_eq(tt_str(doc, "tool_results.0.tool_call_id"), "x1");
    ck_assert_int_eq(json_integer_value(tt_at(doc, "tool_results.0.output.v")), 1);
    ck_assert_int_eq(json_integer_value(tt_at(doc, "state.round")), 1);
    json_decref(doc);
    ck_assert_int_eq(
        tt_count(t, "state.turn_resume_ledger WHERE turn_id = $1::uuid AND status = 'processing'", t2), 1);
    job_s = json_dumps(job, JSON_COMPACT);
    const char *done = "{\"complete\":{\"output\":{\"replayed\":true}}}";
    a1 = TT_SQL_JSON(t->fx, "SELECT tw.apply_step($1::jsonb, $2::jsonb)::text", 2, job_s, done);
    a2 = TT_SQL_JSON(t->fx, "SELECT tw.apply_step($1::jsonb, $2::jsonb)::text", 2, job_s, done);
    ck_assert(json_is_true(tt_at(a1, "applied")));
    ck_assert(json_is_false(tt_at(a2, "applied")));
    tt_wait_status(t, t2, "done");
    ck_assert_int_eq(tt_count(t, "state.outbox WHERE kind = 'task' AND turn_id = $1::uuid", t2), 1);
    ck_assert_int_eq(
        tt_count(t, "state.cards WHERE turn_id = $1::uuid AND card_type = 'task.deliverable'", t2), 1);
    ck_assert_int_eq(tt_count(t, "state.turn_resume_ledger WHERE turn_id = $1::uuid AND status = 'done'", t2),
                     1);
    ck_assert_int_eq(tw_fx_sql_int(t->fx,
                                   "SELECT count(*) FROM state.agents WHERE agent = 'tester'"
                                   " AND status = 'idle' AND active_agent_turn_id IS NULL",
                                   0),
                     1);
    json_decref(a1);
    json_decref(a2);
    free(job_s);
    json_decref(c1);
    json_decref(c2);
    free(t2);
    free(turn);
    tt_free(t);
}
END_TEST

/* Invalid tool_calls replies fail the turn with bad_tool_call and a sentence that says why; nothing is
 * suspended. */
START_TEST(test_bad_tool_calls)
{
    Tt *t = tt_start(NULL, true);
    static const struct {
        const char *input, *why;
    } cases[] = {
        {"{\"mode\":\"tools\",\"calls\":[{\"id\":\"a\",\"tool\":\"echo\",\"args\":{}},"
         "{\"id\":\"a\",\"tool\":\"echo\",\"args\":{}}]}",
         "used twice"},
        {"{\"mode\":\"tools\",\"calls\":[{\"id\":\"a\",\"tool\":\"nosuch\",\"args\":{}}]}",
         "unknown tool 'nosuch'"},
        {"{\"mode\":\"tools\",\"calls\":[{\"id\":\"a\",\"tool\":\"echo\",\"args\":[1]}]}",
         "args must be a JSON object"},
        {"{\"mode\":\"tools\",\"calls\":[{\"id\":\"a\",\"tool\":\"echo\",\"args\":{}}],\"wait\":0}",
         "wait must be"},
        {"{\"mode\":\"tools\",\"calls\":[{\"id\":\"a\",\"tool\":\"echo\",\"args\":{}}],\"wait\":2}",
         "wait must be"},
        {"{\"mode\":\"tools\",\"calls\":[{\"id\":\"a\",\"tool\":\"echo\",\"args\":{}}],\"wait\":\"some\"}",
         "wait must be"},
        {"{\"mode\":\"tools\",\"calls\":[]}", "tool_calls must be an array of 1"},
    };
    char *ids[sizeof cases / sizeof cases[0]];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ids[i] = tt_submit(t, "tester", "bad", cases[i].input);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tt_wait_status(t, ids[i], "failed");
        char *err = tw_fx_sql_str(t->fx, "SELECT error FROM state.turns WHERE turn_id = $1::uuid", 1, ids[i]);
        char *msg =
            tw_fx_sql_str(t->fx, "SELECT error_message FROM state.turns WHERE turn_id = $1::uuid", 1, ids[i]);
        ck_assert_str_eq(err, "bad_tool_call");
        ck_assert_msg(msg && strstr(msg, cases[i].why), "case %zu: message '%s' lacks '%s'", i, msg,
                      cases[i].why);
        ck_assert_int_eq(
            tt_count(t, "state.cards WHERE turn_id = $1::uuid AND card_type <> 'task.deliverable'", ids[i]),
            0);
        ck_assert_int_eq(tt_count(t, "state.turn_waiting_tools WHERE turn_id = $1::uuid", ids[i]), 0);
        ck_assert_int_eq(tt_state_events(t, ids[i], "suspended"), 0);
        tt_one_final_event(t, ids[i], "failed");
        free(err);
        free(msg);
        free(ids[i]);
    }
    tt_free(t);
}
END_TEST

#define TT_LATENCY_TURNS 20

/* TT_LATENCY_TURNS turns on `channel`, each with one echo call, all waited until done; then the median (and
 * p90, max) of the time from the last tool result to the next step starting, database clock: the waiting
 * row's settled_at (the result's transaction) to the 'running' state event of the resume (the ledger claim's
 * transaction). */
static void tt_latency_round(Tt *t, const char *channel, const char *label)
{
    const char *in = "{\"mode\":\"tools\",\"calls\":[{\"id\":\"e\",\"tool\":\"echo\",\"args\":{\"i\":1}}]}";
    char *ids[TT_LATENCY_TURNS];
    for (int i = 0; i < TT_LATENCY_TURNS; i++)
        ids[i] = tt_submit(t, "tester", channel, in);
    for (int i = 0; i < TT_LATENCY_TURNS; i++) {
        tt_wait_status(t, ids[i], "done");
        free(ids[i]);
    }
    json_t *j = TT_SQL_JSON(
        t->fx,
        "WITH r AS ("
        "  SELECT w.turn_id, greatest(0, extract(epoch FROM (SELECT o.created_at FROM state.outbox o"
        "      WHERE o.turn_id = w.turn_id AND o.kind = 'state' AND o.payload ->> 'status' = 'running'"
        "      ORDER BY o.created_at, o.xid, o.seq OFFSET 1 LIMIT 1) - w.settled_at) * 1000) AS ms"
        "  FROM state.turn_waiting_tools w JOIN state.turns t USING (turn_id)"
        "  WHERE t.channel_id = $1 AND t.status = 'done')"
        " SELECT jsonb_build_object('n', count(ms), 'median', percentile_cont(0.5) WITHIN GROUP (ORDER BY "
        "ms),"
        "   'p90', percentile_cont(0.9) WITHIN GROUP (ORDER BY ms), 'max', max(ms), 'min', min(ms))::text "
        "FROM r",
        1, channel);
    fprintf(stderr,
            "resume latency (%s): last tool result settled -> next step claimed, database clock: n=%lld "
            "median=%.1f ms p90=%.1f ms min=%.1f ms max=%.1f ms\n",
            label, (long long)json_integer_value(tt_at(j, "n")), json_number_value(tt_at(j, "median")),
            json_number_value(tt_at(j, "p90")), json_number_value(tt_at(j, "min")),
            json_number_value(tt_at(j, "max")));
    /* Every turn has its resumption: the second `running` of its agent (the first is its start). Its time is
     * that of the claim's transaction, which may have begun before the result it consumed was settled
     * (a claim consumes results committed while it runs): such a resumption counts as 0 ms. */
    ck_assert_int_eq(json_integer_value(tt_at(j, "n")), TT_LATENCY_TURNS);
    /* Doorbell-driven: tens of milliseconds expected; a generous bound for a loaded machine. */
    ck_assert_double_lt(json_number_value(tt_at(j, "median")), 1000.0);
    json_decref(j);
}

/* The time from the last tool result to the next step, over 20 turns each with one worker doing everything
 * and with tools and agents on different workers (the result's doorbell then crosses NATS). */
START_TEST(test_resume_latency)
{
    Tt *t = tt_start(NULL, true);
    tt_latency_round(t, "lat-one", "one worker");

    ck_assert_int_eq(tw_fx_proc_terminate(t->workers[0], 10000), 0);
    tt_worker(t, tw_fx_write_config(t->fx, "agent-side.ini", "[worker]\nagents = tester\n"));
    tt_worker(t, tw_fx_write_config(t->fx, "tool-side.ini", "[worker]\nagents = echo\n"));
    tt_latency_round(t, "lat-split", "agents and tools on two workers");
    tt_free(t);
}
END_TEST

TW_SUITE_DEFINE(tools, {
                           {"fanout_all", test_fanout_all, 90},
                           {"wait_any", test_wait_any, 90},
                           {"wait_any_full_worker", test_wait_any_full_worker, 90},
                           {"wait_n", test_wait_n, 90},
                           {"tool_errors", test_tool_errors, 90},
                           {"external_tool", test_external_tool, 90},
                           {"result_not_external", test_result_not_external, 90},
                           {"multi_step", test_multi_step, 90},
                           {"kill_agent_worker_before_result", test_kill_agent_worker_before_result, 90},
                           {"kill_worker_before_delivery", test_kill_worker_before_delivery, 90},
                           {"kill_worker_holding_ledger", test_kill_worker_holding_ledger, 90},
                           {"duplicates_and_replays", test_duplicates_and_replays, 90},
                           {"bad_tool_calls", test_bad_tool_calls, 90},
                           {"resume_latency", test_resume_latency, 120},
                       })
