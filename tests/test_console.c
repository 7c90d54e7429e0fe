/* test_console.c — `turnwatch console` (issue 28, contract section 18) against the real stack: PostgreSQL,
 * nats-server, both daemons and the console. Over raw HTTP: every method but GET and HEAD is refused with 405
 * on the page and on each API path and changes nothing in the database (row counts and the last turn change
 * before and after); bad input is 400 before any query, an unknown turn 404, a foreign Host 403. Then in a
 * real browser (Debian's chromium, headless, driven by tests/console/console.test.mjs with puppeteer-core):
 * the turns list, a turn's timeline with its steps and tool calls named, its history and deliverable, a
 * delegating turn's children, a turn that ends while its page is open shown ended within 5 s without a
 * reload, a forced end without an epoch drawn as '–', no request to another host. The screenshot of a
 * timeline it takes stays in <build>/tests/console/console-timeline.png. */
#include "fixture.h"
#include "suite.h"
#include "turn_helpers.h"

#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <netinet/in.h>
#include <arpa/inet.h>

/* Delegation as in README: each call of tool delegate is a child turn on a new agent of profile echo. */
static const char co_overrides[] = "[tool.delegate]\nagent_profile = echo\ntimeout_seconds = 30\n"
                                   "suspend_timeout_seconds = 30\n"
                                   /* Flow control: the sleep calls of a step wait for each other. */
                                   "[limit.cw]\nmax_concurrent = 1\n[tool.sleep]\nlimits = cw\n";

/* Two rounds of three calls (two sleeps and a failing tool): steps 0, 1 and 2. */
static const char co_tools_input[] = "{\"mode\":\"tools\",\"rounds\":2,\"wait\":\"all\",\"calls\":["
                                     "{\"id\":\"search\",\"tool\":\"sleep\",\"args\":{\"seconds\":0.3}},"
                                     "{\"id\":\"fetch\",\"tool\":\"sleep\",\"args\":{\"seconds\":0.6}},"
                                     "{\"id\":\"parse\",\"tool\":\"fail\",\"args\":{}}]}";

/* A call of the external tool ext (nobody runs it: the browser test posts its result) next to a sleep. */
static const char co_ext_input[] = "{\"mode\":\"tools\",\"wait\":\"all\",\"calls\":["
                                   "{\"id\":\"ask\",\"tool\":\"ext\",\"args\":{\"question\":\"6 x 7?\"}},"
                                   "{\"id\":\"nap\",\"tool\":\"sleep\",\"args\":{\"seconds\":0.2}}]}";

/* One request to the console (tw_fx_http_request), always with a Content-Length (0 without a body): its
 * status, and the whole answer, head and body, in *answer. */
static int co_request(int port, const char *method, const char *path, const char *host, const char *body,
                      char **answer)
{
    return tw_fx_http_request(port, method, path, host, body ? body : "", answer);
}

/* The body of an answer (after the blank line), "" when there is none. */
static const char *co_body(const char *answer)
{
    const char *b = answer ? strstr(answer, "\r\n\r\n") : NULL;
    return b ? b + 4 : "";
}

/* GET path: its status; fails the test unless it is `want`. Returns the answer (malloc'd). */
static char *co_get(int port, const char *path, int want)
{
    char *answer;
    int status = co_request(port, "GET", path, NULL, NULL, &answer);
    ck_assert_msg(status == want, "GET %s: %d, wanted %d: %.400s", path, status, want, answer ? answer : "");
    return answer;
}

/* What a write would change: rows of every table the console could touch, and the last change of a turn. */
static char *co_fingerprint(TwFx *fx)
{
    char *s = tw_fx_sql_str(
        fx,
        "SELECT concat_ws(' ', (SELECT count(*) FROM state.turns), (SELECT count(*) FROM state.turn_history),"
        " (SELECT count(*) FROM state.agent_inbox), (SELECT count(*) FROM state.cards),"
        " (SELECT count(*) FROM state.turn_waiting_tools WHERE wait_status = 'waiting'),"
        " (SELECT count(*) FROM state.agents), (SELECT count(*) FROM state.outbox),"
        " (SELECT count(*) FROM state.turn_resume_ledger), (SELECT max(updated_at) FROM state.turns))",
        0);
    ck_assert_ptr_nonnull(s);
    return s;
}

/* puppeteer-core in <build>/tests/console (npm ci from the committed package-lock.json), once. */
static void co_npm_ci(const char *dir)
{
    char *marker = wd_fmt("%s/node_modules/puppeteer-core/package.json", dir);
    if (access(marker, R_OK) != 0) {
        char *out = NULL, *err = NULL;
        const char *argv[] = {"npm", "ci", "--prefix", dir, "--no-audit", "--no-fund", NULL};
        int rc = tw_fx_run_full(argv, NULL, &out, &err, 240000);
        ck_assert_msg(rc == 0, "npm ci --prefix %s exited %d:\n%s\n%s", dir, rc, out ? out : "",
                      err ? err : "");
        free(out);
        free(err);
    }
    free(marker);
}

START_TEST(test_console_browser)
{
    const char *chromium = getenv("CHROMIUM") ? getenv("CHROMIUM") : "/usr/bin/chromium";
    ck_assert_msg(access(chromium, X_OK) == 0,
                  "%s is not there: apt-get install chromium (tools/lib/servers.sh tw_install_deps does)",
                  chromium);
    TwFxStack st = tw_fx_stack_start_events(co_overrides, NULL);
    TwFx *fx = st.fx;

    char *done = wd_submit(fx, "echo", "{\"hello\":\"console\"}");
    char *tools = wd_submit_with(fx, "tools-1", co_tools_input, NULL, NULL, "tester");
    char *tree = wd_submit(fx, "fanout", "{\"n\":3,\"tool\":\"delegate\"}");
    char *ext = wd_submit_with(fx, "waiter-1", co_ext_input, NULL, NULL, "tester");
    WD_STATUS_IS(fx, done, "done");
    WD_STATUS_IS(fx, tools, "done");
    WD_STATUS_IS(fx, tree, "done");
    WD_STATUS_IS(fx, ext, "suspended");
    ck_assert(tw_fx_sql_wait(fx, WD_WAIT_MS, "received",
                             "SELECT wait_status FROM state.turn_waiting_tools WHERE turn_id = $1 AND "
                             "tool_call_id = 'nap'",
                             1, ext));
    /* A turn cancelled before it was dispatched (queued behind the suspended one): a forced end without an
     * epoch, which the page draws as '–'. */
    char *forced = wd_submit_with(fx, "waiter-1", "{\"mode\":\"echo\"}", NULL, NULL, "tester");
    WD_STATUS_IS(fx, forced, "pending");
    char *cancel_out = NULL, *cancel_err = NULL;
    const char *cancel[] = {tw_fx_cli_path(), "-c", tw_fx_config_path(fx), "cancel", forced, NULL};
    ck_assert_msg(tw_fx_run_full(cancel, NULL, &cancel_out, &cancel_err, 60000) == 0, "cancel: %s",
                  cancel_err ? cancel_err : "");
    free(cancel_out);
    free(cancel_err);
    WD_STATUS_IS(fx, forced, "cancelled");
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.force_terminations WHERE turn_id = $1::uuid AND "
                      "turn_epoch IS NULL",
                      1, forced),
        1);

    /* A turn that runs in an hour (docs/schedules.md): pending, its time and its reason on the page. */
    char *later = tw_fx_sql_str(fx,
                                "SELECT tw.submit_turn('echo', 'console', '{}'::jsonb,"
                                " p_not_before => now() + interval '1 hour')::text",
                                0);
    WD_STATUS_IS(fx, later, "pending");

    int port = tw_fx_free_port();
    char *listen = wd_fmt("127.0.0.1:%d", port);
    const char *argv[] = {tw_fx_cli_path(), "-c", tw_fx_config_path(fx), "console", "--listen", listen, NULL};
    TwFxProc *console = tw_fx_spawn(fx, "console", argv);
    char *answer = NULL;
    int64_t deadline = tw_fx_now_ms() + 20000;
    while (co_request(port, "GET", "/", NULL, NULL, &answer) != 200) {
        free(answer);
        answer = NULL;
        if (!tw_fx_poll(deadline)) {
            tw_fx_proc_dump(console);
            ck_abort_msg("the console did not answer GET / on port %d", port);
        }
    }
    ck_assert_msg(strstr(answer, "Content-Security-Policy: default-src 'self'"), "no CSP header: %.600s",
                  answer);
    free(answer);

    /* Every method but GET and HEAD: 405, and nothing changes. The bodies ask for what a write API would. */
    char *before = co_fingerprint(fx);
    char *turn_path = wd_fmt("/api/turns/%s", ext);
    char *hist_path = wd_fmt("/api/turns/%s/history", ext);
    const char *paths[] = {"/",       "/index.html",  "/api/turns",       turn_path,
                           hist_path, "/api/daemons", "/api/dead-letters"};
    const char *methods[] = {"POST", "PUT", "DELETE", "PATCH"};
    char *body = wd_fmt("{\"turn\":\"%s\",\"call\":\"ask\",\"status\":\"cancelled\",\"output\":{}}", ext);
    for (size_t m = 0; m < sizeof methods / sizeof methods[0]; m++)
        for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
            int status = co_request(port, methods[m], paths[p], NULL, body, &answer);
            ck_assert_msg(status == 405, "%s %s: %d, wanted 405: %.400s", methods[m], paths[p], status,
                          answer ? answer : "");
            ck_assert_msg(strstr(answer, "Allow: GET, HEAD"), "%s %s: no Allow header", methods[m], paths[p]);
            free(answer);
        }
    char *after = co_fingerprint(fx);
    ck_assert_msg(strcmp(before, after) == 0, "the refused requests changed the database: %s -> %s", before,
                  after);
    WD_STATUS_IS(fx, ext, "suspended");
    free(body);
    free(before);
    free(after);

    /* Input is validated before any query; a foreign Host is refused (DNS rebinding). */
    free(co_get(port, "/api/turns/not-a-turn", 400));
    free(co_get(port, "/api/turns?agent=bad%20name", 400));
    free(co_get(port, "/api/turns?limit=0", 400));
    free(co_get(port, "/api/turns?limit=501", 400));
    free(co_get(port, "/api/turns?status=sleeping", 400));
    free(co_get(port, "/api/turns?since=yesterday", 400));
    free(co_get(port, "/api/turns?agent=echo&agent=fanout", 400));
    free(co_get(port, "/api/turns?agent=echo%00", 400));
    free(co_get(port, "/api/turns?drop=table", 400));
    free(co_get(port, "/api/dead-letters?limit=x", 400));
    free(co_get(port, "/api/turns/00000000-0000-4000-8000-000000000000", 404));
    free(co_get(port, "/api/turns/00000000-0000-4000-8000-000000000000/history", 404));
    free(co_get(port, "/api/turns/00000000-0000-4000-8000-000000000000/tree", 404));
    free(co_get(port, "/api/nothing", 404));
    free(co_get(port, "/nothing.js", 404));
    ck_assert_int_eq(co_request(port, "GET", "/api/turns", "evil.example:80", NULL, &answer), 403);
    free(answer);
    ck_assert_int_eq(co_request(port, "HEAD", "/", NULL, NULL, &answer), 200);
    free(answer);

    /* The JSON the page reads. */
    char *path = wd_fmt("/api/turns/%s", tools);
    answer = co_get(port, path, 200);
    json_t *t = json_loads(co_body(answer), 0, NULL);
    ck_assert_msg(t, "not JSON: %.300s", co_body(answer));
    ck_assert_str_eq(json_string_value(json_object_get(t, "status")), "done");
    ck_assert_int_eq(json_array_size(json_object_get(t, "tool_calls")), 6);
    ck_assert_int_eq(json_array_size(json_object_get(t, "steps")), 3);
    ck_assert(json_is_object(json_object_get(t, "deliverable")));
    json_decref(t);
    free(answer);
    free(path);
    path = wd_fmt("/api/turns/%s/tree", tree);
    answer = co_get(port, path, 200);
    t = json_loads(co_body(answer), 0, NULL);
    ck_assert_int_eq(json_array_size(json_object_get(t, "children")), 3);
    json_decref(t);
    free(answer);
    free(path);
    answer = co_get(port, "/api/turns?agent=fanout&limit=10", 200);
    ck_assert_msg(strstr(co_body(answer), tree) && !strstr(co_body(answer), done), "%.600s", co_body(answer));
    free(answer);

    /* The browser. */
    char *dir = tw_fx_build_path("tests/console");
    char *script = wd_fmt("%s/console.test.mjs", dir);
    char *shot = wd_fmt("%s/console-timeline.png", dir);
    char *url = wd_fmt("http://127.0.0.1:%d", port);
    co_npm_ci(dir);
    unlink(shot);
    setenv("CONSOLE_URL", url, 1);
    setenv("TW_CLI", tw_fx_cli_path(), 1);
    setenv("TW_CONFIG", tw_fx_config_path(fx), 1);
    setenv("TURN_DONE", done, 1);
    setenv("TURN_TOOLS", tools, 1);
    setenv("TURN_TREE", tree, 1);
    setenv("TURN_EXT", ext, 1);
    setenv("TURN_FORCED", forced, 1);
    setenv("TURN_LATER", later, 1);
    setenv("SHOT_PATH", shot, 1);
    /* The CLI that the script runs is built with sanitizers too; its leaks are checked elsewhere. */
    char *out = NULL, *err = NULL;
    const char *node[] = {"node", script, NULL};
    int64_t started = tw_fx_now_ms();
    int rc = tw_fx_run_full(node, NULL, &out, &err, 120000);
    fprintf(stderr, "---- node %s (%d, %.1f s) ----\n%s%s\n", script, rc, (tw_fx_now_ms() - started) / 1000.0,
            out ? out : "", err ? err : "");
    if (rc != 0)
        tw_fx_proc_dump(console);
    ck_assert_msg(rc == 0, "the browser test failed (exit %d): %s", rc,
                  out && strstr(out, "not ok") ? strstr(out, "not ok") : err);
    ck_assert_msg(access(shot, R_OK) == 0, "no screenshot at %s", shot);
    WD_STATUS_IS(fx, ext, "done");

    /* SIGTERM ends the console cleanly (under ASan: nothing leaked). */
    ck_assert_int_eq(tw_fx_proc_terminate(console, 10000), 0);
    free(out);
    free(err);
    free(url);
    free(shot);
    free(script);
    free(dir);
    free(turn_path);
    free(hist_path);
    free(listen);
    free(done);
    free(tools);
    free(tree);
    free(ext);
    free(forced);
    free(later);
    tw_fx_free(fx);
}
END_TEST

/* A raw request on a connection of its own, left open: the socket, to read the answer from later. */
static int co_send_raw(int port, const char *text)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};

    ck_assert_int_ge(fd, 0);
    ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect: %s", strerror(errno));
    ck_assert_msg(write(fd, text, strlen(text)) == (ssize_t)strlen(text), "write: %s", strerror(errno));
    return fd;
}

/* Everything the server sends on fd until it closes, or 10 s (malloc'd). */
static char *co_read_all(int fd)
{
    size_t len = 0, cap = 65536;
    char *buf = malloc(cap);
    int64_t deadline = tw_fx_now_ms() + 10000;

    ck_assert_ptr_nonnull(buf);
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)(deadline - tw_fx_now_ms());
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        if (cap - len < 4096) {
            buf = realloc(buf, cap *= 2);
            ck_assert_ptr_nonnull(buf);
        }
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    close(fd);
    return buf;
}

/* The security headers of every page, the ones evhttp writes itself too. */
static void co_assert_secure(const char *what, const char *answer)
{
    static const char *const want[] = {"Content-Security-Policy: default-src 'self'",
                                       "X-Content-Type-Options: nosniff", "X-Frame-Options: DENY",
                                       "Referrer-Policy: no-referrer"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(answer, want[i]), "%s: no '%s' header: %.600s", what, want[i], answer);
}

/* Issue 33: a delegation tree of 10,000 children is answered at once, capped, and says so; turn show lists
 * the first children with their count; a request whose query is slow (a history made to wait on an advisory
 * lock the test holds) does not hold up another one; a method evhttp does not know is 405 with Allow, and
 * evhttp's own 400 and 413 pages carry the security headers. Servers and the console only, no daemons. */
START_TEST(test_console_big_tree_and_slow_query)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    const char *root = "00000000-0000-4000-8000-000000000033";
    tw_fx_sql_exec(fx,
                   "INSERT INTO state.turns (turn_id, agent, profile, channel_id, input, status, ended_at)"
                   " VALUES ($1::uuid, 'big-root', 'echo', 'c', '{}', 'done', now())",
                   1, root);
    tw_fx_sql_exec(fx,
                   "INSERT INTO state.turns (agent, profile, channel_id, input, status, ended_at, depth,"
                   " parent_turn_id, root_turn_id, parent_step, parent_tool_call_id)"
                   " SELECT 'kid' || (i % 20), 'echo', 'c', '{}', 'done', now(), 1, $1::uuid, $1::uuid, 0,"
                   " 'call-' || i FROM generate_series(1, 10000) i",
                   1, root);

    /* turn show: the first 100 children, how many there are, and the text says so. */
    char *shown =
        tw_fx_sql_str(fx,
                      "SELECT concat_ws(' ', jsonb_array_length(d -> 'children'), d ->> 'children_total',"
                      " d ->> 'children_truncated') FROM tw.turn_show($1::uuid) d",
                      1, root);
    ck_assert_str_eq(shown, "100 10000 true");
    free(shown);
    char *out = NULL, *err = NULL;
    const char *show[] = {tw_fx_cli_path(), "-c", tw_fx_config_path(fx), "turn", "show", root, NULL};
    int rc = tw_fx_run_full(show, NULL, &out, &err, 60000);
    ck_assert_msg(rc == 0, "turn show exited %d: %s", rc, err ? err : "");
    char *line =
        wd_fmt("children             100 of 10000 shown (turnwatch turn tree %s lists them all)", root);
    ck_assert_msg(strstr(out, line), "turn show does not say the children are cut: %.400s", out);
    free(line);
    free(out);
    free(err);

    int port = tw_fx_free_port();
    char *listen = wd_fmt("127.0.0.1:%d", port);
    const char *argv[] = {tw_fx_cli_path(), "-c", tw_fx_config_path(fx), "console", "--listen", listen, NULL};
    TwFxProc *console = tw_fx_spawn(fx, "console", argv);
    char *answer = NULL;
    int64_t deadline = tw_fx_now_ms() + 20000;
    while (co_request(port, "GET", "/", NULL, NULL, &answer) != 200) {
        free(answer);
        answer = NULL;
        if (!tw_fx_poll(deadline)) {
            tw_fx_proc_dump(console);
            ck_abort_msg("the console did not answer GET / on port %d", port);
        }
    }
    free(answer);

    /* The tree: its first 500 turns, and the root says how many the tree has. */
    char *path = wd_fmt("/api/turns/%s/tree", root);
    int status = co_request(port, "GET", path, NULL, NULL, &answer);
    if (status != 200)
        tw_fx_proc_dump(console);
    ck_assert_msg(status == 200, "GET %s: %d: %.300s", path, status, answer ? answer : "");
    json_t *t = json_loads(co_body(answer), 0, NULL);
    ck_assert_msg(t, "not JSON: %.300s", co_body(answer));
    ck_assert_msg(json_is_true(json_object_get(t, "truncated")), "the tree does not say it is cut: %.300s",
                  co_body(answer));
    ck_assert_int_eq(json_integer_value(json_object_get(t, "tree_turns")), 10001);
    ck_assert_int_eq(json_integer_value(json_object_get(t, "children_total")), 10000);
    ck_assert_int_eq(json_array_size(json_object_get(t, "children")), 499);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(t, "children"), 0),
                                                       "parent_tool_call_id")),
                     "call-1");
    json_decref(t);
    free(answer);
    free(path);

    /* A method evhttp does not know: 405 with Allow, as any other. */
    status = co_request(port, "PROPFIND", "/api/turns", NULL, NULL, &answer);
    ck_assert_msg(status == 405, "PROPFIND: %d, wanted 405: %.400s", status, answer ? answer : "");
    ck_assert_msg(strstr(answer, "Allow: GET, HEAD"), "PROPFIND: no Allow header: %.400s", answer);
    co_assert_secure("PROPFIND", answer);
    free(answer);
    /* evhttp's own pages: a body over the limit (413), a header line it cannot read (400). */
    char big[4096];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    status = co_request(port, "POST", "/api/turns", NULL, big, &answer);
    ck_assert_msg(status == 413, "a 4 KiB body: %d, wanted 413: %.400s", status, answer ? answer : "");
    co_assert_secure("413", answer);
    free(answer);
    char *bad = wd_fmt("GET / HTTP/1.0\r\nHost: 127.0.0.1:%d\r\nthis line has no colon\r\n\r\n", port);
    answer = co_read_all(co_send_raw(port, bad));
    ck_assert_msg(strncmp(answer, "HTTP/1.0 400 ", 13) == 0 || strncmp(answer, "HTTP/1.1 400 ", 13) == 0,
                  "a bad header line: wanted 400: %.400s", answer);
    co_assert_secure("400", answer);
    free(answer);
    free(bad);

    /* One slow request does not hold up the others. The history waits until the test lets it go. */
    tw_fx_sql_exec(
        fx,
        "ALTER FUNCTION tw.turn_history(uuid) RENAME TO turn_history_real;"
        "CREATE FUNCTION tw.turn_history(p uuid) RETURNS jsonb LANGUAGE plpgsql AS $$"
        " BEGIN WHILE NOT pg_try_advisory_xact_lock_shared(3333) LOOP PERFORM pg_sleep(0.01); END LOOP;"
        " RETURN tw.turn_history_real(p); END $$;"
        "SELECT pg_advisory_lock(3333)",
        0);
    char *slow = wd_fmt("GET /api/turns/%s/history HTTP/1.0\r\nHost: 127.0.0.1:%d\r\n\r\n", root, port);
    int slow_fd = co_send_raw(port, slow);
    ck_assert(
        tw_fx_sql_wait_count(fx,
                             "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE "
                             "'%tw.turn_history($1::uuid)%' AND pid <> pg_backend_pid()",
                             1, 20000));
    /* While it waits: another request is answered, and the slow one has not been. */
    status = co_request(port, "GET", "/api/daemons", NULL, NULL, &answer);
    struct pollfd pf = {.fd = slow_fd, .events = POLLIN};
    int ready = poll(&pf, 1, 0);
    ck_assert_msg(status == 200, "GET /api/daemons while a query is slow: %d: %.300s", status,
                  answer ? answer : "");
    ck_assert_msg(ready == 0,
                  "the slow request was answered before the other one could be: the console served "
                  "them one after the other");
    free(answer);
    tw_fx_sql_exec(fx, "SELECT pg_advisory_unlock(3333)", 0);
    answer = co_read_all(slow_fd);
    ck_assert_msg(strstr(answer, " 200 OK") && strstr(co_body(answer), "\"to\""), "the slow request: %.400s",
                  answer);
    free(answer);
    free(slow);

    ck_assert_int_eq(tw_fx_proc_terminate(console, 10000), 0);
    free(listen);
    tw_fx_free(fx);
}
END_TEST

TW_SUITE_DEFINE(console, {
                             {"browser", test_console_browser, 280},
                             {"big_tree", test_console_big_tree_and_slow_query, 120},
                         })
