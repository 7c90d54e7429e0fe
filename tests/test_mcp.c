/* test_mcp.c — MCP servers as tools (docs/mcp.md) against real PostgreSQL, nats-server, turnwatch-pmo and
 * turnwatch-worker, and real MCP servers nobody here wrote: npm's @modelcontextprotocol/server-everything
 * (echo, get-sum, trigger-long-running-operation with progress) and tests/mcp/hostile-server.mjs, written
 * with the official @modelcontextprotocol/sdk for what the published servers never do (hang, flood
 * progress, write garbage, wedge, hang in initialize). Both installed by `npm ci` from the committed
 * tests/mcp/package-lock.json (pinned versions), once per build directory. */
#include "fixture.h"
#include "suite.h"
#include "turn_helpers.h"

#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

/* Waits are generous (2 shared cores, other test runs at the same time; node starts slowly). */
#define MC_WAIT_MS 60000

/* The MCP packages in <build>/tests/mcp (npm ci from the committed package-lock.json), once; the directory.
 * typescript/tests/run installs the same tree when it runs first: both hold <dir>/.npm-ci.lock (flock) while
 * they look and install. */
static char *mc_npm_ci(void)
{
    char *dir = tw_fx_build_path("tests/mcp");
    char *marker = wd_fmt("%s/node_modules/@modelcontextprotocol/server-everything/package.json", dir);
    char *lock = wd_fmt("%s/.npm-ci.lock", dir);
    int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    ck_assert_msg(lfd >= 0 && flock(lfd, LOCK_EX) == 0, "cannot lock %s", lock);
    if (access(marker, R_OK) != 0) {
        char *out = NULL, *err = NULL;
        const char *argv[] = {"npm", "ci", "--prefix", dir, "--no-audit", "--no-fund", NULL};
        int rc = tw_fx_run_full(argv, NULL, &out, &err, 240000);
        ck_assert_msg(rc == 0, "npm ci --prefix %s exited %d:\n%s\n%s", dir, rc, out ? out : "",
                      err ? err : "");
        free(out);
        free(err);
    }
    close(lfd); /* and its lock */
    free(lock);
    free(marker);
    return dir;
}

/* node, by its absolute path (exec lines take no PATH search). */
static const char *mc_node(void)
{
    static char path[512];
    const char *dirs[] = {"/usr/bin", "/usr/local/bin", NULL};
    for (int i = 0; dirs[i]; i++) {
        snprintf(path, sizeof path, "%s/node", dirs[i]);
        if (access(path, X_OK) == 0)
            return path;
    }
    ck_abort_msg("no node in /usr/bin or /usr/local/bin (apt-get install nodejs)");
    return NULL;
}

typedef struct Mc {
    TwFxStack st;
    char *dir;    /* <build>/tests/mcp */
    char *record; /* what the hostile server records */
} Mc;

/* s with every `from` replaced by `to` (malloc'd). */
static char *mc_replace(const char *s, const char *from, const char *to)
{
    char *out = strdup("");
    const char *p;
    while ((p = strstr(s, from))) {
        wd_append(&out, "%.*s%s", (int)(p - s), s, to);
        s = p + strlen(from);
    }
    wd_append(&out, "%s", s);
    return out;
}

/* The stack with the MCP tools: mcp_echo, mcp_add, mcp_long (server-everything) and hostile (the SDK server,
 * its tool act), with `extra` config lines after them, in which @HOSTILE@ is the hostile server's argv (with
 * --record) and @EVERYTHING@ server-everything's: more sections, each its own server. */
static Mc mc_start(const char *hostile_args, const char *extra)
{
    Mc m = {0};
    char *cfg = NULL;
    m.dir = mc_npm_ci();
    const char *node = mc_node();
    char *everything =
        wd_fmt("%s %s/node_modules/@modelcontextprotocol/server-everything/dist/index.js stdio", node, m.dir);
    char tmpl[] = "/tmp/tw-mcp-record-XXXXXX";
    int fd = mkstemp(tmpl);
    ck_assert_int_ge(fd, 0);
    close(fd);
    m.record = strdup(tmpl);
    wd_append(&cfg, "[worker]\nconcurrency = 8\n");
    wd_append(&cfg, "[tool.mcp_echo]\nmcp = %s\nmcp_tool = echo\ntimeout_seconds = 60\n", everything);
    wd_append(&cfg, "[tool.mcp_add]\nmcp = %s\nmcp_tool = get-sum\ntimeout_seconds = 60\n", everything);
    wd_append(&cfg,
              "[tool.mcp_long]\nmcp = %s\nmcp_tool = trigger-long-running-operation\ntimeout_seconds = 60\n",
              everything);
    wd_append(
        &cfg,
        "[tool.hostile]\nmcp = %s %s/hostile-server.mjs --record %s %s\nmcp_tool = act\ntimeout_seconds = "
        "60\nkill_grace_seconds = 2\n",
        node, m.dir, m.record, hostile_args ? hostile_args : "");
    if (extra) {
        char *hostile = wd_fmt("%s %s/hostile-server.mjs --record %s", node, m.dir, m.record);
        char *a = mc_replace(extra, "@HOSTILE@", hostile), *b = mc_replace(a, "@EVERYTHING@", everything);
        wd_append(&cfg, "%s", b);
        free(hostile);
        free(a);
        free(b);
    }
    m.st = tw_fx_stack_start(cfg);
    free(cfg);
    free(everything);
    return m;
}

static void mc_stop(Mc *m)
{
    wd_done(m->st.fx);
    unlink(m->record);
    free(m->dir);
    free(m->record);
}

/* One call's row: {"status": wait_status, "result_status", "output", "error", "progress"}. */
static json_t *mc_call(Mc *m, const char *turn, const char *call)
{
    char *s = tw_fx_sql_str(m->st.fx,
                            "SELECT jsonb_build_object('status', wait_status, 'result_status', result_status,"
                            " 'output', output, 'error', error, 'progress', progress)::text"
                            " FROM state.turn_waiting_tools WHERE turn_id = $1::uuid AND tool_call_id = $2",
                            2, turn, call);
    ck_assert_msg(s, "turn %s has no call %s", turn, call);
    json_t *j = json_loads(s, 0, NULL);
    free(s);
    ck_assert_ptr_nonnull(j);
    return j;
}

/* Submit a tester turn that makes `calls` (a JSON array text) with wait (all, any). */
static char *mc_submit_wait(Mc *m, const char *wait, const char *calls)
{
    char *input = wd_fmt("{\"mode\":\"tools\",\"wait\":\"%s\",\"calls\":%s}", wait, calls);
    char *turn = wd_submit(m->st.fx, "tester", input);
    free(input);
    return turn;
}

static char *mc_submit(Mc *m, const char *calls)
{
    return mc_submit_wait(m, "all", calls);
}

/* Wait for the call to have settled (received, or timeout), then return its row. */
static json_t *mc_settled(Mc *m, const char *turn, const char *call)
{
    if (!tw_fx_sql_wait(
            m->st.fx, MC_WAIT_MS, "t",
            "SELECT (wait_status <> 'waiting')::text::char FROM state.turn_waiting_tools WHERE turn_id"
            " = $1::uuid AND tool_call_id = $2",
            2, turn, call)) {
        tw_fx_stack_dump(&m->st);
        ck_abort_msg("call %s of turn %s did not settle", call, turn);
    }
    return mc_call(m, turn, call);
}

static const char *mc_str(const json_t *j, const char *a, const char *b)
{
    const json_t *v = json_object_get(j, a);
    return json_string_value(b ? json_object_get(v, b) : v);
}

/* The first text content of a call's output. */
static const char *mc_text(const json_t *row)
{
    return json_string_value(json_object_get(
        json_array_get(json_object_get(json_object_get(row, "output"), "content"), 0), "text"));
}

/* The hostile server of tool section `tool` up (initialized) before a test times calls on it: its start under
 * load takes seconds. */
static void mc_warm_tool(Mc *m, const char *tool)
{
    char *calls =
        wd_fmt("[{\"id\":\"warm\",\"tool\":\"%s\",\"args\":{\"action\":\"echo\",\"message\":\"up\"}}]", tool);
    char *turn = mc_submit(m, calls);
    free(calls);
    json_t *w = mc_settled(m, turn, "warm");
    ck_assert_msg(mc_text(w) && strcmp(mc_text(w), "echo: up") == 0, "warm-up call: %s", json_dumps(w, 0));
    json_decref(w);
    WD_STATUS_IS(m->st.fx, turn, "done");
    free(turn);
}

static void mc_warm(Mc *m)
{
    mc_warm_tool(m, "hostile");
}

/* How many lines of the record file have the string `has`. */
static int mc_recorded(const Mc *m, const char *has)
{
    FILE *f = fopen(m->record, "r");
    char line[4096];
    int n = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, has) != NULL;
    fclose(f);
    return n;
}

typedef struct McRec {
    const Mc *m;
    const char *has;
    int n;
} McRec;

static bool mc_recorded_n(void *arg)
{
    McRec *r = arg;
    return mc_recorded(r->m, r->has) >= r->n;
}

/* echo, get-sum and the long-running tool of server-everything: their outputs as the server sent them, the
 * progress of the long one on its row and in `turn show`. */
START_TEST(test_mcp_everything)
{
    Mc m = mc_start(NULL, NULL);
    char *turn = mc_submit(&m, "[{\"id\":\"e\",\"tool\":\"mcp_echo\",\"args\":{\"message\":\"hello mcp\"}},"
                               "{\"id\":\"a\",\"tool\":\"mcp_add\",\"args\":{\"a\":2,\"b\":40}},"
                               "{\"id\":\"l\",\"tool\":\"mcp_long\",\"args\":{\"duration\":4,\"steps\":4}}]");
    json_t *e = mc_settled(&m, turn, "e"), *a = mc_settled(&m, turn, "a"), *l = mc_settled(&m, turn, "l");
    ck_assert_str_eq(mc_str(e, "result_status", NULL), "ok");
    ck_assert_str_eq(mc_text(e), "Echo: hello mcp");
    ck_assert_str_eq(mc_str(a, "result_status", NULL), "ok");
    ck_assert_msg(strstr(mc_text(a), "42"), "get-sum said: %s", mc_text(a));
    ck_assert_str_eq(mc_str(l, "result_status", NULL), "ok");
    ck_assert_msg(strstr(mc_text(l), "Long running operation completed"), "%s", mc_text(l));
    /* Its progress (4 notifications over 4 s, written at most once a second): the last written is kept. */
    const json_t *p = json_object_get(l, "progress");
    ck_assert_msg(json_is_number(json_object_get(p, "progress")) &&
                      json_integer_value(json_object_get(p, "total")) == 4,
                  "no progress on the long call's row: %s", json_dumps(l, 0));
    char *out = NULL, *err = NULL;
    ck_assert_int_eq(tw_fx_cli(m.st.fx, &out, &err, "turn", "show", turn, "--json", NULL), 0);
    ck_assert_msg(strstr(out, "\"progress\""), "turn show has no progress: %s", out);
    free(out);
    free(err);
    /* The console's turn (its timeline and calls table read it). */
    char *console =
        tw_fx_sql_str(m.st.fx,
                      "SELECT tw.console_turn($1::uuid) #>> '{tool_calls}' FROM state.turns WHERE "
                      "turn_id = $1::uuid",
                      1, turn);
    ck_assert_msg(console && strstr(console, "\"progress\": {"), "the console's turn has no progress: %s",
                  console ? console : "(null)");
    free(console);
    WD_STATUS_IS(m.st.fx, turn, "done");
    json_decref(e);
    json_decref(a);
    json_decref(l);
    free(turn);
    mc_stop(&m);
}
END_TEST

/* One server, many calls at once: isError is mcp_tool_error with its text; a call that never answers times
 * out alone (notifications/cancelled, the server records it) while the others on the same server succeed;
 * garbage lines and an answer to an unknown id fail nothing; a flood of progress is survived. */
START_TEST(test_mcp_hostile_calls)
{
    Mc m = mc_start(NULL, NULL);
    mc_warm(&m);
    char *turn = mc_submit(
        &m, "[{\"id\":\"h\",\"tool\":\"hostile\",\"args\":{\"action\":\"hang\"},\"timeout_seconds\":4},"
            "{\"id\":\"f\",\"tool\":\"hostile\",\"args\":{\"action\":\"fail\"}},"
            "{\"id\":\"g\",\"tool\":\"hostile\",\"args\":{\"action\":\"garbage\"}},"
            "{\"id\":\"p\",\"tool\":\"hostile\",\"args\":{\"action\":\"flood\",\"n\":5000}},"
            "{\"id\":\"e\",\"tool\":\"hostile\",\"args\":{\"action\":\"echo\",\"message\":\"still here\"}}]");
    json_t *h = mc_settled(&m, turn, "h"), *f = mc_settled(&m, turn, "f"), *g = mc_settled(&m, turn, "g");
    json_t *p = mc_settled(&m, turn, "p"), *e = mc_settled(&m, turn, "e");
    ck_assert_str_eq(mc_str(h, "result_status", NULL), "timeout");
    ck_assert_str_eq(mc_str(h, "error", "code"), "tool_timeout");
    ck_assert_msg(strstr(mc_str(h, "error", "message"), "notifications/cancelled"), "%s",
                  mc_str(h, "error", "message"));
    ck_assert_str_eq(mc_str(f, "result_status", NULL), "error");
    ck_assert_str_eq(mc_str(f, "error", "code"), "mcp_tool_error");
    ck_assert_str_eq(mc_str(f, "error", "message"), "it broke on purpose");
    ck_assert_str_eq(mc_str(g, "result_status", NULL), "ok");
    ck_assert_str_eq(mc_text(g), "after the garbage");
    ck_assert_str_eq(mc_str(p, "result_status", NULL), "ok");
    ck_assert_str_eq(mc_text(p), "flooded 5000");
    ck_assert_str_eq(mc_str(e, "result_status", NULL), "ok");
    ck_assert_str_eq(mc_text(e), "echo: still here");
    /* The server heard the cancel, with the reason; it was one server all along. */
    McRec rec = {&m, "\"cancelled\"", 1};
    ck_assert_msg(tw_fx_wait_until(mc_recorded_n, &rec, MC_WAIT_MS),
                  "the server never heard notifications/cancelled");
    ck_assert_int_eq(mc_recorded(&m, "\"reason\":\"timeout\""), 1);
    ck_assert_int_eq(mc_recorded(&m, "\"started\""), 1);
    char *log = tw_fx_proc_log(m.st.worker);
    ck_assert_msg(strstr(log, "dropped a line (not JSON"), "the garbage line was not logged");
    ck_assert_msg(strstr(log, "an answer to no request of ours"), "the unknown id was not logged");
    free(log);
    WD_STATUS_IS(m.st.fx, turn, "done");
    ck_assert(tw_fx_proc_alive(m.st.worker));
    json_decref(h);
    json_decref(f);
    json_decref(g);
    json_decref(p);
    json_decref(e);
    free(turn);
    mc_stop(&m);
}
END_TEST

/* A server that answers no ping after a call timed out is wedged: stopped (its call in flight ends
 * tool_exit), and a new one serves the next call. */
START_TEST(test_mcp_wedged)
{
    Mc m = mc_start(NULL, NULL);
    mc_warm(&m);
    char *turn = mc_submit(
        &m, "[{\"id\":\"w\",\"tool\":\"hostile\",\"args\":{\"action\":\"wedge\"},\"timeout_seconds\":3},"
            "{\"id\":\"h\",\"tool\":\"hostile\",\"args\":{\"action\":\"hang\"},\"timeout_seconds\":50}]");
    json_t *w = mc_settled(&m, turn, "w"), *h = mc_settled(&m, turn, "h");
    ck_assert_str_eq(mc_str(w, "error", "code"), "tool_timeout");
    ck_assert_str_eq(mc_str(h, "error", "code"), "tool_exit");
    ck_assert_msg(strstr(mc_str(h, "error", "message"), "did not answer ping"), "%s",
                  mc_str(h, "error", "message"));
    char *next = mc_submit(
        &m, "[{\"id\":\"e\",\"tool\":\"hostile\",\"args\":{\"action\":\"echo\",\"message\":\"new\"}}]");
    json_t *e = mc_settled(&m, next, "e");
    ck_assert_str_eq(mc_text(e), "echo: new");
    ck_assert_int_eq(mc_recorded(&m, "\"started\""), 2);
    json_decref(w);
    json_decref(h);
    json_decref(e);
    free(turn);
    free(next);
    mc_stop(&m);
}
END_TEST

/* The pid the hostile server recorded at its start, the k-th (1-based). */
static pid_t mc_started_pid(const Mc *m, int k)
{
    FILE *f = fopen(m->record, "r");
    char line[4096];
    int n = 0;
    pid_t pid = 0;
    while (f && fgets(line, sizeof line, f)) {
        char *s = strstr(line, "{\"started\":");
        if (s && ++n == k)
            pid = (pid_t)atol(s + 11);
    }
    if (f)
        fclose(f);
    return pid;
}

/* A server killed with SIGKILL fails its calls in flight with tool_exit at once, and the next call starts a
 * new one. */
START_TEST(test_mcp_server_exits)
{
    Mc m = mc_start(NULL, NULL);
    mc_warm(&m);
    char *turn = mc_submit(
        &m, "[{\"id\":\"h\",\"tool\":\"hostile\",\"args\":{\"action\":\"hang\"},\"timeout_seconds\":50}]");
    McRec rec = {&m, "\"call\":\"hang\"", 1};
    ck_assert_msg(tw_fx_wait_until(mc_recorded_n, &rec, MC_WAIT_MS),
                  "the hang call never reached the server");
    pid_t pid = mc_started_pid(&m, 1);
    ck_assert_int_gt(pid, 1);
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    json_t *h = mc_settled(&m, turn, "h");
    ck_assert_str_eq(mc_str(h, "error", "code"), "tool_exit");
    ck_assert_msg(strstr(mc_str(h, "error", "message"), "signal 9"), "%s", mc_str(h, "error", "message"));
    char *next = mc_submit(
        &m, "[{\"id\":\"e\",\"tool\":\"hostile\",\"args\":{\"action\":\"echo\",\"message\":\"again\"}}]");
    json_t *e = mc_settled(&m, next, "e");
    ck_assert_str_eq(mc_text(e), "echo: again");
    ck_assert_int_eq(mc_recorded(&m, "\"started\""), 2);
    json_decref(h);
    json_decref(e);
    free(turn);
    free(next);
    mc_stop(&m);
}
END_TEST

/* A server that never answers initialize: the call fails clearly, the server is stopped, the worker goes on.
 */
START_TEST(test_mcp_initialize_hangs)
{
    Mc m = mc_start("--hang-initialize", NULL);
    char *turn = mc_submit(
        &m, "[{\"id\":\"h\",\"tool\":\"hostile\",\"args\":{\"action\":\"echo\"},\"timeout_seconds\":3}]");
    json_t *h = mc_settled(&m, turn, "h");
    ck_assert_msg(strstr(mc_str(h, "error", "message"), "initialize"), "%s", mc_str(h, "error", "message"));
    WdLogHas has = {m.st.worker, "did not answer initialize", NULL};
    ck_assert_msg(tw_fx_wait_until(wd_log_line_has, &has, MC_WAIT_MS), "the server was not stopped");
    ck_assert(tw_fx_proc_alive(m.st.worker));
    json_decref(h);
    free(turn);
    mc_stop(&m);
}
END_TEST

/* Cancelling the turn cancels its call on the server (notifications/cancelled). */
START_TEST(test_mcp_turn_cancel)
{
    Mc m = mc_start(NULL, NULL);
    mc_warm(&m);
    char *turn = mc_submit(
        &m, "[{\"id\":\"h\",\"tool\":\"hostile\",\"args\":{\"action\":\"hang\"},\"timeout_seconds\":50}]");
    McRec rec = {&m, "\"call\":\"hang\"", 1};
    ck_assert_msg(tw_fx_wait_until(mc_recorded_n, &rec, MC_WAIT_MS),
                  "the hang call never reached the server");
    char *out = NULL, *err = NULL;
    ck_assert_int_eq(tw_fx_cli(m.st.fx, &out, &err, "cancel", turn, NULL), 0);
    free(out);
    free(err);
    WD_STATUS_IS(m.st.fx, turn, "cancelled");
    McRec c = {&m, "\"cancelled\"", 1};
    if (!tw_fx_wait_until(mc_recorded_n, &c, MC_WAIT_MS)) {
        tw_fx_stack_dump(&m.st);
        ck_abort_msg("the server never heard notifications/cancelled of the cancelled turn's call");
    }
    free(turn);
    mc_stop(&m);
}
END_TEST

/* Flow control holds MCP calls as any: with max_concurrent = 1, the second call waits for its limit while the
 * first hangs on the server. */
START_TEST(test_mcp_limit)
{
    Mc m = mc_start(NULL, "[tool.hostile]\nmax_concurrent = 1\n");
    mc_warm(&m);
    char *turn = mc_submit(
        &m, "[{\"id\":\"h1\",\"tool\":\"hostile\",\"args\":{\"action\":\"hang\"},\"timeout_seconds\":10},"
            "{\"id\":\"h2\",\"tool\":\"hostile\",\"args\":{\"action\":\"hang\"},\"timeout_seconds\":10}]");
    McRec rec = {&m, "\"call\":\"hang\"", 1};
    ck_assert_msg(tw_fx_wait_until(mc_recorded_n, &rec, MC_WAIT_MS), "no hang call reached the server");
    /* One reached it; the other waits for the limit, not on the server. */
    ck_assert_int_eq(
        tw_fx_sql_int(m.st.fx,
                      "SELECT count(*) FROM state.limit_calls WHERE turn_id = $1::uuid AND status = "
                      "'waiting'",
                      1, turn),
        1);
    ck_assert_int_eq(mc_recorded(&m, "\"call\":\"hang\""), 1);
    json_t *h1 = mc_settled(&m, turn, "h1"), *h2 = mc_settled(&m, turn, "h2");
    ck_assert_str_eq(mc_str(h1, "error", "code"), "tool_timeout");
    ck_assert_str_eq(mc_str(h2, "error", "code"), "tool_timeout");
    ck_assert_int_eq(mc_recorded(&m, "\"call\":\"hang\""), 2); /* one after the other */
    json_decref(h1);
    json_decref(h2);
    free(turn);
    mc_stop(&m);
}
END_TEST

/* `turnwatch tools list --json`: each tool with its kind, and an MCP tool's server's tools with their input
 * schemas (the CLI asks the server itself); a server that cannot be asked is said, and the exit is 1. No
 * database. */
START_TEST(test_mcp_tools_list)
{
    char *dir = mc_npm_ci();
    const char *node = mc_node();
    char tmpl[] = "/tmp/tw-mcp-ini-XXXXXX";
    int fd = mkstemp(tmpl);
    ck_assert_int_ge(fd, 0);
    char *ini =
        wd_fmt("[postgres]\ndsn = host=/nonexistent\n[tool.plain]\nexec = /bin/cat\n"
               "[tool.mcp_echo]\nmcp = %s %s/node_modules/@modelcontextprotocol/server-everything/dist/"
               "index.js stdio\nmcp_tool = echo\n",
               node, dir);
    ck_assert_int_eq(write(fd, ini, strlen(ini)), (int)strlen(ini));
    close(fd);
    char *out = NULL, *err = NULL;
    const char *argv[] = {tw_fx_cli_path(), "-c", tmpl, "tools", "list", "--json", NULL};
    int rc = tw_fx_run_full(argv, NULL, &out, &err, 60000);
    ck_assert_msg(rc == 0, "tools list exited %d: %s %s", rc, out ? out : "", err ? err : "");
    json_t *all = json_loads(out, 0, NULL);
    ck_assert_msg(json_is_array(all) && json_array_size(all) == 2, "%s", out);
    json_t *plain = json_array_get(all, 0), *mcp = json_array_get(all, 1);
    ck_assert_str_eq(mc_str(plain, "kind", NULL), "exec");
    ck_assert_str_eq(mc_str(mcp, "kind", NULL), "mcp");
    ck_assert_str_eq(mc_str(mcp, "mcp_tool", NULL), "echo");
    size_t i;
    json_t *t;
    bool found = false;
    json_array_foreach(json_object_get(mcp, "server_tools"), i, t)
    {
        if (strcmp(mc_str(t, "name", NULL), "echo") == 0)
            found = json_is_object(
                json_object_get(json_object_get(json_object_get(t, "inputSchema"), "properties"), "message"));
    }
    ck_assert_msg(found, "no echo tool with its input schema: %s", out);
    json_decref(all);
    free(out);
    free(err);
    /* A server that never answers: said, exit 1 (within the CLI's 20 s). */
    char *bad = wd_fmt("[postgres]\ndsn = host=/nonexistent\n[tool.hostile]\nmcp = %s %s/hostile-server.mjs "
                       "--hang-initialize\n",
                       node, dir);
    FILE *f = fopen(tmpl, "w");
    ck_assert_ptr_nonnull(f);
    fputs(bad, f);
    fclose(f);
    const char *argv2[] = {tw_fx_cli_path(), "-c", tmpl, "tools", "list", NULL};
    rc = tw_fx_run_full(argv2, NULL, &out, &err, 60000);
    ck_assert_msg(rc == 1 && out && strstr(out, "the server could not be asked: no answer within 20 s"),
                  "rc %d: %s %s", rc, out ? out : "", err ? err : "");
    free(out);
    free(err);
    unlink(tmpl);
    free(ini);
    free(bad);
    free(dir);
}
END_TEST

/* Section 16's program limits hold for an MCP server: one stopped by its cpu_limit_seconds (a call that burns
 * CPU) ends its calls in flight resource_limit, the limit in the message, not tool_exit; the next call starts
 * a new server. */
START_TEST(test_mcp_resource_limit)
{
    Mc m = mc_start(NULL, "[tool.burner]\nmcp = @HOSTILE@\nmcp_tool = act\ntimeout_seconds = 60\n"
                          "cpu_limit_seconds = 3\n");
    mc_warm_tool(&m, "burner");
    char *turn = mc_submit(&m, "[{\"id\":\"h\",\"tool\":\"burner\",\"args\":{\"action\":\"hang\"}},"
                               "{\"id\":\"w\",\"tool\":\"burner\",\"args\":{\"action\":\"wedge\"}}]");
    json_t *h = mc_settled(&m, turn, "h"), *w = mc_settled(&m, turn, "w");
    const json_t *both[] = {h, w};
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(mc_str(both[i], "result_status", NULL) &&
                          strcmp(mc_str(both[i], "result_status", NULL), "error") == 0 &&
                          strcmp(mc_str(both[i], "error", "code"), "resource_limit") == 0,
                      "not resource_limit: %s", json_dumps(both[i], 0));
        ck_assert_msg(strstr(mc_str(both[i], "error", "message"),
                             "the MCP server used up its cpu_limit_seconds (3 s of CPU time)"),
                      "%s", mc_str(both[i], "error", "message"));
    }
    char *next = mc_submit(
        &m, "[{\"id\":\"e\",\"tool\":\"burner\",\"args\":{\"action\":\"echo\",\"message\":\"again\"}}]");
    json_t *e = mc_settled(&m, next, "e");
    ck_assert_str_eq(mc_text(e), "echo: again");
    ck_assert_int_eq(mc_recorded(&m, "\"started\""), 2);
    ck_assert(tw_fx_proc_alive(m.st.worker));
    json_decref(h);
    json_decref(w);
    json_decref(e);
    free(turn);
    free(next);
    mc_stop(&m);
}
END_TEST

/* A line with the id of a call in flight that is no JSON-RPC 2.0 answer (no "jsonrpc", neither result nor
 * error, a result that is no object) fails that call at once with bad_output; the server's other calls go
 * on. */
START_TEST(test_mcp_malformed_answer)
{
    Mc m = mc_start(NULL, NULL);
    mc_warm(&m);
    char *turn = mc_submit(
        &m, "[{\"id\":\"j\",\"tool\":\"hostile\",\"args\":{\"action\":\"malformed\",\"kind\":\"nojsonrpc\"},"
            "\"timeout_seconds\":40},"
            "{\"id\":\"n\",\"tool\":\"hostile\",\"args\":{\"action\":\"malformed\",\"kind\":\"neither\"},"
            "\"timeout_seconds\":40},"
            "{\"id\":\"r\",\"tool\":\"hostile\",\"args\":{\"action\":\"malformed\",\"kind\":\"result\"},"
            "\"timeout_seconds\":40},"
            "{\"id\":\"e\",\"tool\":\"hostile\",\"args\":{\"action\":\"echo\",\"message\":\"fine\"}}]");
    json_t *j = mc_settled(&m, turn, "j"), *n = mc_settled(&m, turn, "n"), *r = mc_settled(&m, turn, "r");
    json_t *e = mc_settled(&m, turn, "e");
    const struct {
        const json_t *row;
        const char *says;
    } bad[] = {{j, "no \"jsonrpc\": \"2.0\""}, {n, "neither a request"}, {r, "no result object"}};
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(strcmp(mc_str(bad[i].row, "result_status", NULL), "error") == 0 &&
                          strcmp(mc_str(bad[i].row, "error", "code"), "bad_output") == 0,
                      "not bad_output: %s", json_dumps(bad[i].row, 0));
        ck_assert_msg(strstr(mc_str(bad[i].row, "error", "message"), bad[i].says), "%s",
                      mc_str(bad[i].row, "error", "message"));
    }
    ck_assert_str_eq(mc_text(e), "echo: fine");
    ck_assert_int_eq(mc_recorded(&m, "\"started\""), 1);
    WD_STATUS_IS(m.st.fx, turn, "done");
    json_decref(j);
    json_decref(n);
    json_decref(r);
    json_decref(e);
    free(turn);
    mc_stop(&m);
}
END_TEST

/* Progress is a sign of life: a server that ignores ping after a call timed out but keeps sending progress
 * for another call is not wedged (that call succeeds); once silent for kill_grace_seconds with the ping
 * unanswered it is. The text form of `turn show` prints the call's last progress. */
START_TEST(test_mcp_progress_alive)
{
    Mc m =
        mc_start(NULL, "[tool.deaf]\nmcp = @HOSTILE@ --deaf-to-ping\nmcp_tool = act\ntimeout_seconds = 60\n"
                       "kill_grace_seconds = 2\n");
    mc_warm_tool(&m, "deaf");
    char *turn = mc_submit(
        &m, "[{\"id\":\"h\",\"tool\":\"deaf\",\"args\":{\"action\":\"hang\"},\"timeout_seconds\":2},"
            "{\"id\":\"t\",\"tool\":\"deaf\",\"args\":{\"action\":\"trickle\",\"ms\":7000,\"every\":200}},"
            "{\"id\":\"h2\",\"tool\":\"deaf\",\"args\":{\"action\":\"hang\"},\"timeout_seconds\":50}]");
    json_t *h = mc_settled(&m, turn, "h"), *t = mc_settled(&m, turn, "t"), *h2 = mc_settled(&m, turn, "h2");
    ck_assert_str_eq(mc_str(h, "error", "code"), "tool_timeout");
    ck_assert_msg(mc_str(t, "result_status", NULL) && strcmp(mc_str(t, "result_status", NULL), "ok") == 0,
                  "the call that sent progress did not succeed: %s", json_dumps(t, 0));
    ck_assert_str_eq(mc_text(t), "trickled 7000");
    ck_assert_str_eq(mc_str(h2, "error", "code"), "tool_exit");
    ck_assert_msg(strstr(mc_str(h2, "error", "message"), "did not answer ping"), "%s",
                  mc_str(h2, "error", "message"));
    ck_assert_int_ge(mc_recorded(&m, "\"ping_ignored\""), 1);
    char *out = NULL, *err = NULL;
    ck_assert_int_eq(tw_fx_cli(m.st.fx, &out, &err, "turn", "show", turn, NULL), 0);
    ck_assert_msg(strstr(out, "tool call progress   id=t progress=") && strstr(out, "(trickle "),
                  "turn show prints no progress of call t:\n%s", out);
    free(out);
    free(err);
    json_decref(h);
    json_decref(t);
    json_decref(h2);
    free(turn);
    mc_stop(&m);
}
END_TEST

/* mcp_max_inflight = 1: of two calls taken at once, the second waits in the worker until the first has been
 * answered (the server never has two in hand), and both succeed. */
START_TEST(test_mcp_max_inflight)
{
    Mc m = mc_start(NULL, "[tool.single]\nmcp = @HOSTILE@\nmcp_tool = act\nmcp_max_inflight = 1\n"
                          "timeout_seconds = 60\n");
    mc_warm_tool(&m, "single");
    char gate[] = "/tmp/tw-mcp-gate-XXXXXX";
    int fd = mkstemp(gate);
    ck_assert_int_ge(fd, 0);
    close(fd);
    unlink(gate);
    char *calls =
        wd_fmt("[{\"id\":\"s1\",\"tool\":\"single\",\"args\":{\"action\":\"slow\",\"gate\":\"%s\"}},"
               "{\"id\":\"s2\",\"tool\":\"single\",\"args\":{\"action\":\"slow\",\"ms\":10}}]",
               gate);
    char *turn = mc_submit(&m, calls);
    /* Both taken by the worker, one at the server. */
    McRec rec = {&m, "\"in_hand\"", 1};
    ck_assert_msg(tw_fx_wait_until(mc_recorded_n, &rec, MC_WAIT_MS), "no slow call reached the server");
    ck_assert_msg(
        tw_fx_sql_wait(m.st.fx, MC_WAIT_MS, "2",
                       "SELECT count(*)::text FROM state.turn_waiting_tools WHERE turn_id = $1::uuid"
                       " AND started_at IS NOT NULL",
                       1, turn),
        "the worker did not take both calls");
    usleep(500 * 1000); /* room for a second call to reach the server, were it sent */
    ck_assert_int_eq(mc_recorded(&m, "\"in_hand\""), 1);
    FILE *f = fopen(gate, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    json_t *s1 = mc_settled(&m, turn, "s1"), *s2 = mc_settled(&m, turn, "s2");
    ck_assert_str_eq(mc_str(s1, "result_status", NULL), "ok");
    ck_assert_str_eq(mc_str(s2, "result_status", NULL), "ok");
    ck_assert_str_eq(mc_text(s2), "slept 10");
    ck_assert_int_eq(mc_recorded(&m, "\"in_hand\":1"), 2);
    ck_assert_int_eq(mc_recorded(&m, "\"in_hand\":2"), 0);
    unlink(gate);
    json_decref(s1);
    json_decref(s2);
    free(calls);
    free(turn);
    mc_stop(&m);
}
END_TEST

/* A JSON-RPC error answer is mcp_tool_error with its code and message; a result's structuredContent
 * (server-everything's get-structured-content) is passed through beside its content. */
START_TEST(test_mcp_answers)
{
    Mc m = mc_start(NULL, "[tool.mcp_weather]\nmcp = @EVERYTHING@\nmcp_tool = get-structured-content\n"
                          "timeout_seconds = 60\n");
    char *turn =
        mc_submit(&m, "[{\"id\":\"x\",\"tool\":\"hostile\",\"args\":{\"action\":\"rpc_error\"}},"
                      "{\"id\":\"w\",\"tool\":\"mcp_weather\",\"args\":{\"location\":\"Chicago\"}}]");
    json_t *x = mc_settled(&m, turn, "x"), *w = mc_settled(&m, turn, "w");
    ck_assert_str_eq(mc_str(x, "result_status", NULL), "error");
    ck_assert_str_eq(mc_str(x, "error", "code"), "mcp_tool_error");
    ck_assert_msg(strstr(mc_str(x, "error", "message"), "answered error -32602") &&
                      strstr(mc_str(x, "error", "message"), "bad arguments on purpose"),
                  "%s", mc_str(x, "error", "message"));
    ck_assert_str_eq(mc_str(w, "result_status", NULL), "ok");
    const json_t *sc = json_object_get(json_object_get(w, "output"), "structuredContent");
    ck_assert_msg(json_integer_value(json_object_get(sc, "temperature")) == 36 &&
                      json_string_value(json_object_get(sc, "conditions")) &&
                      strcmp(json_string_value(json_object_get(sc, "conditions")), "Light rain / drizzle") ==
                          0,
                  "no structuredContent: %s", json_dumps(w, 0));
    ck_assert_msg(mc_text(w) && strstr(mc_text(w), "\"temperature\":36"), "no content: %s", json_dumps(w, 0));
    json_decref(x);
    json_decref(w);
    free(turn);
    mc_stop(&m);
}
END_TEST

/* A server that answers initialize with an older protocol version the worker speaks serves; one that
 * answers a version nobody here speaks is refused, its call failing with the version in the message. */
START_TEST(test_mcp_versions)
{
    Mc m = mc_start(NULL, "[tool.old]\nmcp = @HOSTILE@ --protocol-version 2024-11-05\nmcp_tool = act\n"
                          "timeout_seconds = 60\n"
                          "[tool.alien]\nmcp = @HOSTILE@ --protocol-version 1999-01-01\nmcp_tool = act\n"
                          "timeout_seconds = 60\n");
    char *turn = mc_submit(
        &m, "[{\"id\":\"o\",\"tool\":\"old\",\"args\":{\"action\":\"echo\",\"message\":\"old\"}},"
            "{\"id\":\"a\",\"tool\":\"alien\",\"args\":{\"action\":\"echo\",\"message\":\"alien\"}}]");
    json_t *o = mc_settled(&m, turn, "o"), *a = mc_settled(&m, turn, "a");
    ck_assert_msg(mc_text(o) && strcmp(mc_text(o), "echo: old") == 0, "%s", json_dumps(o, 0));
    ck_assert_str_eq(mc_str(a, "result_status", NULL), "error");
    ck_assert_str_eq(mc_str(a, "error", "code"), "tool_exit");
    ck_assert_msg(strstr(mc_str(a, "error", "message"), "protocol version 1999-01-01, which the worker does "
                                                        "not speak"),
                  "%s", mc_str(a, "error", "message"));
    char *log = tw_fx_proc_log(m.st.worker);
    ck_assert_msg(strstr(log, "initialized (protocol 2024-11-05)"), "the old server was not initialized");
    free(log);
    ck_assert_int_eq(mc_recorded(&m, "\"call\":\"echo\""), 1); /* the refused server got no call */
    json_decref(o);
    json_decref(a);
    free(turn);
    mc_stop(&m);
}
END_TEST

/* wait any: once one call has settled, the loser still in flight on an MCP server is cancelled there
 * (notifications/cancelled, with the worker's reason, long before its own timeout). */
START_TEST(test_mcp_any_loser)
{
    Mc m = mc_start(NULL, NULL);
    mc_warm(&m);
    char *turn = mc_submit_wait(
        &m, "any",
        "[{\"id\":\"h\",\"tool\":\"hostile\",\"args\":{\"action\":\"hang\"},\"timeout_seconds\":300},"
        "{\"id\":\"s\",\"tool\":\"hostile\",\"args\":{\"action\":\"slow\",\"ms\":1000}}]");
    McRec rec = {&m, "\"call\":\"hang\"", 1};
    ck_assert_msg(tw_fx_wait_until(mc_recorded_n, &rec, MC_WAIT_MS),
                  "the hang call never reached the server");
    WD_STATUS_IS(m.st.fx, turn, "done");
    McRec c = {&m, "\"cancelled\"", 1};
    if (!tw_fx_wait_until(mc_recorded_n, &c, MC_WAIT_MS)) {
        tw_fx_stack_dump(&m.st);
        ck_abort_msg("the server never heard notifications/cancelled of the any wait's loser");
    }
    ck_assert_int_eq(mc_recorded(&m, "no longer wanted"), 1);
    free(turn);
    mc_stop(&m);
}
END_TEST

TW_SUITE_DEFINE(mcp, {
                         {"mcp_everything", test_mcp_everything, 240},
                         {"mcp_hostile", test_mcp_hostile_calls, 180},
                         {"mcp_wedged", test_mcp_wedged, 180},
                         {"mcp_exits", test_mcp_server_exits, 180},
                         {"mcp_initialize", test_mcp_initialize_hangs, 180},
                         {"mcp_cancel", test_mcp_turn_cancel, 180},
                         {"mcp_limit", test_mcp_limit, 180},
                         {"mcp_tools_list", test_mcp_tools_list, 120},
                         {"mcp_resource_limit", test_mcp_resource_limit, 180},
                         {"mcp_malformed", test_mcp_malformed_answer, 180},
                         {"mcp_progress_alive", test_mcp_progress_alive, 180},
                         {"mcp_max_inflight", test_mcp_max_inflight, 180},
                         {"mcp_answers", test_mcp_answers, 180},
                         {"mcp_versions", test_mcp_versions, 180},
                         {"mcp_any_loser", test_mcp_any_loser, 180},
                     })
