/* test_cli.c — the turnwatch CLI and the common flags against real servers: migrate (idempotent, safe when
 * two run at once), submit with an idempotency key, bad input refused with exit 2 and nothing changed, SQL
 * metacharacters stored verbatim, `turn show` / `turns list` JSON (escaped correctly), --check-config of
 * all three programs, --version, --help and each command's help, `events` JSON lines. */
#include "fixture.h"
#include "migrate.h"
#include "suite.h"

#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define WAIT_MS 20000

/* ---- helpers
 * ---------------------------------------------------------------------------------------------------- */

/* argv for the CLI with the fixture's config and the NULL-terminated arguments in ap; returns argc. */
static size_t cli_argv(TwFx *fx, const char *argv[64], va_list ap)
{
    size_t n = 0;
    argv[n++] = tw_fx_cli_path();
    argv[n++] = "-c";
    argv[n++] = tw_fx_config_path(fx);
    for (const char *a = va_arg(ap, const char *); a && n < 63; a = va_arg(ap, const char *))
        argv[n++] = a;
    argv[n] = NULL;
    return n;
}

/* Runs the CLI with the fixture's config; checks the exit code; returns stdout (caller frees), stderr in
 * *err. */
#define CLI_EXPECT(fx, want, err, ...) cli_expect((fx), (want), (err), __FILE__, __LINE__, __VA_ARGS__, NULL)

static char *cli_expect(TwFx *fx, int want, char **err_out, const char *file, int line, ...)
{
    const char *argv[64];
    va_list ap;
    va_start(ap, line);
    size_t n = cli_argv(fx, argv, ap);
    va_end(ap);
    char *out = NULL, *err = NULL;
    int rc = tw_fx_run(argv, &out, &err);
    if (rc != want) {
        fprintf(stderr, "%s:%d: turnwatch", file, line);
        for (size_t i = 3; i < n; i++)
            fprintf(stderr, " '%.100s'", argv[i]);
        fprintf(stderr, " exited %d, want %d\nstdout: %s\nstderr: %s\n", rc, want, out, err);
    }
    ck_assert_msg(rc == want, "%s:%d: turnwatch %s exited %d, want %d: %s", file, line, argv[3], rc, want,
                  err);
    if (err_out)
        *err_out = err;
    else
        free(err);
    return out;
}

/* A refusal: exit 2, one line on stderr that starts with "turnwatch: " and contains `phrase`. */
#define CLI_REFUSED(fx, phrase, ...) cli_refused((fx), (phrase), __LINE__, __VA_ARGS__, NULL)

static void cli_refused(TwFx *fx, const char *phrase, int line, ...)
{
    const char *argv[64];
    va_list ap;
    va_start(ap, line);
    cli_argv(fx, argv, ap);
    va_end(ap);
    char *out = NULL, *err = NULL;
    int rc = tw_fx_run(argv, &out, &err);
    ck_assert_msg(rc == 2, "line %d: exit %d, want 2; stderr: %s", line, rc, err);
    ck_assert_msg(strncmp(err, "turnwatch: ", 11) == 0, "line %d: stderr '%s'", line, err);
    ck_assert_msg(strchr(err, '\n') == err + strlen(err) - 1, "line %d: stderr is not one line: '%s'", line,
                  err);
    ck_assert_msg(strstr(err, phrase), "line %d: stderr '%s' lacks '%s'", line, err, phrase);
    ck_assert_msg(*out == '\0', "line %d: stdout '%s'", line, out);
    free(out);
    free(err);
}

/* Row counts of every state table, as one string, to show that a refused command changed nothing. */
static char *snapshot(TwFx *fx)
{
    return tw_fx_sql_str(
        fx,
        "SELECT concat_ws('/', (SELECT count(*) FROM state.turns), (SELECT count(*) FROM state.agents),"
        " (SELECT count(*) FROM state.agent_inbox), (SELECT count(*) FROM state.outbox),"
        " (SELECT count(*) FROM state.cards), (SELECT count(*) FROM state.turn_waiting_tools),"
        " (SELECT string_agg(status || turn_epoch, ',' ORDER BY agent) FROM state.agents))",
        0);
}

static json_t *parse(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    ck_assert_msg(j != NULL, "not JSON (%s): %s", e.text, text);
    return j;
}

static char *submit_json(TwFx *fx, const char *agent, const char *channel, const char *input, bool *created)
{
    char *out =
        CLI_EXPECT(fx, 0, NULL, "submit", "--json", "--agent", agent, "--channel", channel, "--input", input);
    json_t *j = parse(out);
    ck_assert(json_is_boolean(json_object_get(j, "created")));
    if (created)
        *created = json_is_true(json_object_get(j, "created"));
    char *id = strdup(json_string_value(json_object_get(j, "turn_id")));
    json_decref(j);
    free(out);
    return id;
}

static char *wait_ended(TwFx *fx, const char *turn)
{
    ck_assert_msg(tw_fx_sql_wait(fx, WAIT_MS, "t",
                                 "SELECT status IN ('done','failed','timeout','cancelled') FROM state.turns "
                                 "WHERE turn_id = $1",
                                 1, turn),
                  "turn %s did not end", turn);
    return tw_fx_sql_str(fx, "SELECT status FROM state.turns WHERE turn_id = $1", 1, turn);
}

/* Waits for `turn` to end and checks that it ended `want`; the daemons' logs go to stderr when not. */
static void expect_ended(TwFx *fx, const char *turn, const char *want, TwFxProc *pmo, TwFxProc *worker)
{
    char *st = wait_ended(fx, turn);
    if (strcmp(st, want) != 0) {
        tw_fx_proc_dump(worker);
        tw_fx_proc_dump(pmo);
    }
    ck_assert_str_eq(st, want);
    free(st);
}

/* ---- migrate
 * ---------------------------------------------------------------------------------------------------- */

static int applied_of(const char *log)
{
    const char *p = strstr(log, "{\"applied\":");
    ck_assert_msg(p != NULL, "no JSON answer in '%s'", log);
    return atoi(p + strlen("{\"applied\":"));
}

START_TEST(test_migrate_concurrent_and_idempotent)
{
    TwFx *fx = tw_fx_new_all();
    /* Two runs at once on an empty database: both succeed and the migrations are applied once between them.
     */
    const char *argv[] = {tw_fx_cli_path(), "-c", tw_fx_config_path(fx), "--json", "migrate", NULL};
    TwFxProc *a = tw_fx_spawn(fx, "migrate-a", argv), *b = tw_fx_spawn(fx, "migrate-b", argv);
    int sa = 0, sb = 0;
    ck_assert(tw_fx_proc_wait(a, 60000, &sa) && tw_fx_proc_wait(b, 60000, &sb));
    if (!(WIFEXITED(sa) && WEXITSTATUS(sa) == 0 && WIFEXITED(sb) && WEXITSTATUS(sb) == 0)) {
        tw_fx_proc_dump(a);
        tw_fx_proc_dump(b);
    }
    ck_assert(WIFEXITED(sa) && WEXITSTATUS(sa) == 0);
    ck_assert(WIFEXITED(sb) && WEXITSTATUS(sb) == 0);
    char *la = tw_fx_proc_log(a), *lb = tw_fx_proc_log(b);
    /* Every schema file once, and the code set (functions and rules) once. */
    int n_schema = (int)tw_fx_sql_int(fx, "SELECT count(*) FROM state.schema_migrations", 0);
    ck_assert_int_ge(n_schema, 2);
    ck_assert_int_eq(applied_of(la) + applied_of(lb), n_schema + 1);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.code_version", 0), 1);
    int version = (int)tw_fx_sql_int(fx, "SELECT max(version) FROM state.schema_migrations", 0);
    ck_assert_int_eq(version, tw_schema_version_built());
    free(la);
    free(lb);

    /* Again, twice: nothing to do, nothing changed, same version. */
    for (int i = 0; i < 2; i++) {
        char *out = CLI_EXPECT(fx, 0, NULL, "--json", "migrate");
        json_t *j = parse(out);
        ck_assert_int_eq(json_integer_value(json_object_get(j, "applied")), 0);
        ck_assert_int_eq(json_integer_value(json_object_get(j, "version")), version);
        json_decref(j);
        free(out);
    }
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.schema_migrations", 0), n_schema);
    /* The plain form says so in words. */
    char *out = CLI_EXPECT(fx, 0, NULL, "migrate");
    ck_assert_ptr_nonnull(strstr(out, "applied 0 migrations"));
    free(out);
    char *t = tw_fx_sql_str(fx, "SELECT to_regclass('state.turns')::text", 0);
    ck_assert_str_eq(t, "state.turns");
    free(t);
    /* The code is one set: when the recorded set differs (older binaries wrote it), migrate makes schema tw
     * anew from this build's, and a function this build does not have is gone afterwards. Here one of ours is
     * missing, one that no file defines is there, and the recorded checksum is an old one. */
    tw_fx_sql_exec(fx, "DROP FUNCTION tw.outbox_mark_published(uuid[])", 0);
    tw_fx_sql_exec(fx, "CREATE FUNCTION tw.left_behind() RETURNS integer LANGUAGE sql AS 'SELECT 1'", 0);
    tw_fx_sql_exec(fx, "UPDATE state.code_version SET checksum = 'older'", 0);
    out = CLI_EXPECT(fx, 0, NULL, "--json", "migrate");
    ck_assert_ptr_nonnull(strstr(out, "\"applied\":1,"));
    free(out);
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM pg_proc WHERE proname = 'outbox_mark_published'", 0), 1);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM pg_proc WHERE proname = 'left_behind'", 0), 0);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.code_version WHERE checksum = 'older'", 0),
                     0);
    out = CLI_EXPECT(fx, 0, NULL, "--json", "migrate");
    ck_assert_ptr_nonnull(strstr(out, "\"applied\":0,"));
    free(out);
    /* Extra arguments are a usage error. */
    CLI_REFUSED(fx, "migrate takes no arguments", "migrate", "now");
    tw_fx_free(fx);
}
END_TEST

/* An upgrade: a database as release 2 left it (tests/data/release2.sql: a turn done, one suspended on an
 * external tool, one running whose worker was killed, one pending, one queued) is migrated by this build and
 * its turns run to their end under this build's daemons, each with one final event. */
START_TEST(test_migrate_from_release2)
{
    TwFx *fx = tw_fx_new();
    tw_fx_pg_init(fx);
    tw_fx_nats_start(fx);
    char *exec = tw_fx_build_path("examples/agents/tw-echo-agent");
    char *ovr = NULL;
    ck_assert_int_gt(asprintf(&ovr, "[agent.idle]\nexec = %s\n", exec), 0);
    tw_fx_write_config(fx, NULL, ovr);
    free(ovr);
    free(exec);
    char *path = NULL, *dump = NULL;
    ck_assert_int_gt(asprintf(&path, "%s/tests/data/release2.sql", tw_fx_source_dir()), 0);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    size_t len = 0;
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    len = (size_t)ftell(f);
    rewind(f);
    dump = calloc(1, len + 1);
    ck_assert_uint_eq(fread(dump, 1, len, f), len);
    fclose(f);
    tw_fx_sql_exec(fx, dump, 0);
    tw_fx_sql_exec(fx, "RESET ALL", 0);
    free(dump);
    free(path);
    /* The database as release 2 left it seconds ago, not when the dump was made: every time in it moves by
     * the dump's age, so that its leases, heartbeats and deadlines are as near as they were then. */
    tw_fx_sql_exec(
        fx,
        "DO $$ DECLARE r record; v_shift interval; BEGIN"
        " SELECT now() - interval '5 seconds' - max(greatest(created_at, updated_at)) INTO v_shift"
        " FROM state.turns;"
        " FOR r IN SELECT c.table_name, c.column_name FROM information_schema.columns c"
        " JOIN information_schema.tables t USING (table_schema, table_name)"
        " WHERE c.table_schema = 'state' AND c.data_type = 'timestamp with time zone'"
        " AND t.table_type = 'BASE TABLE' LOOP"
        " EXECUTE format('UPDATE state.%I SET %I = %I + $1', r.table_name, r.column_name, r.column_name)"
        " USING v_shift; END LOOP; END $$",
        0);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT max(version) FROM state.schema_migrations", 0), 9);
    int64_t turns = tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns", 0);
    ck_assert_int_eq(turns, 5);

    char *out = CLI_EXPECT(fx, 0, NULL, "--json", "migrate");
    json_t *j = parse(out);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "version")), tw_schema_version_built());
    json_decref(j);
    free(out);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns", 0), turns);

    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL), *worker = tw_fx_start_worker(fx, NULL);
    char *suspended =
        tw_fx_sql_str(fx, "SELECT turn_id::text FROM state.turns WHERE channel_id = 'r2-suspended'", 0);
    out =
        CLI_EXPECT(fx, 0, NULL, "tool-result", "--turn", suspended, "--call", "x1", "--output", "{\"a\":1}");
    free(out);
    /* The running turn's worker is long gone: rule 2.6 reaps it, or its step runs again; the others run. */
    if (!tw_fx_sql_wait_count(fx,
                              "SELECT count(*) FROM state.turns WHERE status = 'done'"
                              " OR (channel_id = 'r2-roster' AND error = 'timeout_reaped_by_watchdog')",
                              turns, 60000)) {
        tw_fx_proc_dump(pmo);
        tw_fx_proc_dump(worker);
        char *st =
            tw_fx_sql_str(fx, "SELECT string_agg(channel_id || '=' || status, ', ') FROM state.turns", 0);
        ck_abort_msg("after the upgrade not every turn ended as it should: %s", st ? st : "?");
    }
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turns t WHERE (SELECT count(*) FROM state.outbox o"
                      " WHERE o.turn_id = t.turn_id AND o.kind = 'task') = 1",
                      0),
        turns);
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.agent_inbox WHERE status = 'processing'", 0), 0);
    free(suspended);
    ck_assert_int_eq(tw_fx_proc_terminate(worker, 20000), 0);
    ck_assert_int_eq(tw_fx_proc_terminate(pmo, 20000), 0);
    tw_fx_free(fx);
}
END_TEST

/* ---- submit
 * ----------------------------------------------------------------------------------------------------- */

START_TEST(test_idempotency_key)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    char *ids[2];
    for (int i = 0; i < 2; i++) {
        char *out = CLI_EXPECT(fx, 0, NULL, "submit", "--json", "--agent", "echo", "--channel", "c1",
                               "--input", "{\"n\":1}", "--idempotency-key", "order-42");
        json_t *j = parse(out);
        ck_assert(json_is_true(json_object_get(j, "created")) == (i == 0));
        ids[i] = strdup(json_string_value(json_object_get(j, "turn_id")));
        json_decref(j);
        free(out);
    }
    ck_assert_str_eq(ids[0], ids[1]);
    /* Plain output: the same id again. */
    char *out = CLI_EXPECT(fx, 0, NULL, "submit", "--agent", "echo", "--channel", "c1", "--idempotency-key",
                           "order-42");
    ck_assert_int_eq(strncmp(out, ids[0], 36), 0);
    free(out);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns", 0), 1);
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns WHERE idempotency_key = 'order-42'", 0), 1);

    /* The same key for another channel is a conflict, refused without changes. */
    char *before = snapshot(fx);
    CLI_REFUSED(fx, "order-42", "submit", "--agent", "echo", "--channel", "other", "--idempotency-key",
                "order-42");
    char *after = snapshot(fx);
    ck_assert_str_eq(after, before);
    /* Another key is another turn. */
    char *other = submit_json(fx, "echo", "c1", "{}", NULL);
    ck_assert_str_ne(other, ids[0]);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns", 0), 2);
    free(other);
    free(before);
    free(after);
    free(ids[0]);
    free(ids[1]);
    tw_fx_free(fx);
}
END_TEST

/* Writes `size` bytes of one JSON document ({"pad":"xxx…"}) to a file in the fixture dir. */
static char *write_doc(TwFx *fx, const char *name, size_t size)
{
    char *path = NULL;
    ck_assert_int_gt(asprintf(&path, "%s/%s", tw_fx_dir(fx), name), 0);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    const char *head = "{\"pad\":\"", *tail = "\"}";
    ck_assert_uint_gt(size, strlen(head) + strlen(tail));
    fputs(head, f);
    for (size_t i = strlen(head) + strlen(tail); i < size; i++)
        fputc('x', f);
    fputs(tail, f);
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

START_TEST(test_bad_input_changes_nothing)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    char *first = submit_json(fx, "echo", "c", "{}", NULL);
    char *before = snapshot(fx);
    char name65[66], name64[65], chan257[258];
    memset(name65, 'a', 65);
    name65[65] = '\0';
    memset(name64, 'b', 64);
    name64[64] = '\0';
    memset(chan257, 'c', 257);
    chan257[257] = '\0';
    char *big = write_doc(fx, "big.json", 1024 * 1024 + 1);
    char *exact = write_doc(fx, "exact.json", 1024 * 1024);

    CLI_REFUSED(fx, "invalid agent name", "submit", "--agent", "bad name!", "--channel", "c");
    CLI_REFUSED(fx, "invalid agent name", "submit", "--agent", "a.b", "--channel", "c");
    CLI_REFUSED(fx, "invalid agent name", "submit", "--agent", name65, "--channel", "c");
    CLI_REFUSED(fx, "invalid agent name", "submit", "--agent", "", "--channel", "c");
    CLI_REFUSED(fx, "invalid agent name", "submit", "--agent", "echo>", "--channel", "c");
    /* Valid names without an [agent.NAME] section. */
    CLI_REFUSED(fx, "unknown agent 'ghost'", "submit", "--agent", "ghost", "--channel", "c");
    CLI_REFUSED(fx, "unknown agent", "submit", "--agent", name64, "--channel", "c");
    CLI_REFUSED(fx, "not valid JSON", "submit", "--agent", "echo", "--channel", "c", "--input", "{\"a\":");
    CLI_REFUSED(fx, "not valid JSON", "submit", "--agent", "echo", "--channel", "c", "--input", "{'a': 1}");
    CLI_REFUSED(fx, "not valid JSON", "submit", "--agent", "echo", "--channel", "c", "--input", "");
    CLI_REFUSED(fx, "over the 1048576 byte limit", "submit", "--agent", "echo", "--channel", "c",
                "--input-file", big);
    CLI_REFUSED(fx, "no-such-file.json", "submit", "--agent", "echo", "--channel", "c", "--input-file",
                "/nonexistent/no-such-file.json");
    CLI_REFUSED(fx, "--input or --input-file", "submit", "--agent", "echo", "--channel", "c", "--input", "{}",
                "--input-file", exact);
    CLI_REFUSED(fx, "--channel", "submit", "--agent", "echo", "--channel", "");
    CLI_REFUSED(fx, "--channel", "submit", "--agent", "echo", "--channel", chan257);
    CLI_REFUSED(fx, "--channel", "submit", "--agent", "echo", "--channel", "line\nbreak");
    CLI_REFUSED(fx, "--channel are required", "submit", "--agent", "echo");
    CLI_REFUSED(fx, "--box", "submit", "--agent", "echo", "--channel", "c", "--box", "tab\there");
    CLI_REFUSED(fx, "--idempotency-key", "submit", "--agent", "echo", "--channel", "c", "--idempotency-key",
                "");
    CLI_REFUSED(fx, "--timeout", "submit", "--agent", "echo", "--channel", "c", "--timeout", "0");
    CLI_REFUSED(fx, "--timeout", "submit", "--agent", "echo", "--channel", "c", "--timeout", "ten");
    CLI_REFUSED(fx, "unexpected argument", "submit", "--agent", "echo", "--channel", "c", "extra");
    /* A wrong option is named in one line (getopt's own message would be a second one). */
    CLI_REFUSED(fx, "submit: unknown option '--bogus'", "submit", "--agent", "echo", "--channel", "c",
                "--bogus=1");
    CLI_REFUSED(fx, "submit: option '--channel' needs a value", "submit", "--agent", "echo", "--channel");
    CLI_REFUSED(fx, "turns list: unknown option '-x'", "turns", "list", "-x");
    CLI_REFUSED(fx, "tool-result: unknown option '--turns'", "tool-result", "--turns", "x");
    CLI_REFUSED(fx, "unknown subcommand 'shwo'", "turn", "shwo", first);
    CLI_REFUSED(fx, "turns: which one?", "turns");
    CLI_REFUSED(fx, "unknown command", "frobnicate");
    CLI_REFUSED(fx, "not a turn id", "turn", "show", "not-a-uuid");
    CLI_REFUSED(fx, "turn show: no turn 00000000-0000-4000-8000-000000000000", "turn", "show",
                "00000000-0000-4000-8000-000000000000");
    CLI_REFUSED(fx, "turn history: 'nope' is not a turn id", "turn", "history", "nope");
    CLI_REFUSED(fx, "turn history: no turn", "turn", "history", "00000000-0000-4000-8000-000000000000");
    CLI_REFUSED(fx, "turn tree: 'nope' is not a turn id", "turn", "tree", "nope");
    CLI_REFUSED(fx, "turn tree: no turn", "turn", "tree", "00000000-0000-4000-8000-000000000000");
    CLI_REFUSED(fx, "usage: turnwatch turn tree ID", "turn", "tree", first, "extra");
    CLI_REFUSED(fx, "invalid agent name", "turns", "list", "--agent", "x'; --");
    CLI_REFUSED(fx, "--status must be one of", "turns", "list", "--status", "finished");
    char *after = snapshot(fx);
    ck_assert_str_eq(after, before);
    free(after);

    /* Exactly at the limit is accepted. */
    char *out = CLI_EXPECT(fx, 0, NULL, "submit", "--agent", "echo", "--channel", "c", "--input-file", exact);
    out[strcspn(out, "\n")] = '\0';
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT octet_length(input->>'pad') FROM state.turns WHERE turn_id = $1::uuid", 1,
                      out),
        1024 * 1024 - 10);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns", 0), 2);
    free(out);
    free(big);
    free(exact);
    free(before);
    free(first);
    tw_fx_free(fx);
}
END_TEST

START_TEST(test_sql_metacharacters_are_data)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    TwFxEvents *ev = tw_fx_events_new(fx, "evt.agent.*.task");
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL), *worker = tw_fx_start_worker(fx, NULL);
    const char *channel = "x'); DROP TABLE state.turns; --";
    const char *box = "'; DELETE FROM state.cards; -- \"quoted\" \\ back";
    const char *key = "k' OR '1'='1";
    const char *input = "{\"q\":\"'; DROP SCHEMA state CASCADE; --\",\"$1\":\"%s%n\"}";
    char *out = CLI_EXPECT(fx, 0, NULL, "submit", "--json", "--agent", "echo", "--channel", channel, "--box",
                           box, "--idempotency-key", key, "--input", input);
    json_t *j = parse(out);
    char *turn = strdup(json_string_value(json_object_get(j, "turn_id")));
    json_decref(j);
    free(out);
    expect_ended(fx, turn, "done", pmo, worker);

    char *s = tw_fx_sql_str(fx, "SELECT channel_id FROM state.turns WHERE turn_id = $1", 1, turn);
    ck_assert_str_eq(s, channel);
    free(s);
    s = tw_fx_sql_str(fx, "SELECT output_box_id FROM state.turns WHERE turn_id = $1", 1, turn);
    ck_assert_str_eq(s, box);
    free(s);
    s = tw_fx_sql_str(fx, "SELECT idempotency_key FROM state.turns WHERE turn_id = $1", 1, turn);
    ck_assert_str_eq(s, key);
    free(s);
    s = tw_fx_sql_str(fx, "SELECT input->>'q' FROM state.turns WHERE turn_id = $1", 1, turn);
    ck_assert_str_eq(s, "'; DROP SCHEMA state CASCADE; --");
    free(s);
    s = tw_fx_sql_str(fx, "SELECT input->>'$1' FROM state.turns WHERE turn_id = $1", 1, turn);
    ck_assert_str_eq(s, "%s%n");
    free(s);
    s = tw_fx_sql_str(
        fx,
        "SELECT c.output_box_id FROM state.cards c JOIN state.turns t ON c.card_id = t.deliverable_card_id"
        " WHERE t.turn_id = $1",
        1, turn);
    ck_assert_str_eq(s, box);
    free(s);
    /* The echo agent got the input as data too. */
    s = tw_fx_sql_str(fx,
                      "SELECT c.content #>> '{output,echo,q}' FROM state.cards c JOIN state.turns t"
                      " ON c.card_id = t.deliverable_card_id WHERE t.turn_id = $1",
                      1, turn);
    ck_assert_str_eq(s, "'; DROP SCHEMA state CASCADE; --");
    free(s);
    /* Every table is still there and nothing else changed. */
    s = tw_fx_sql_str(
        fx,
        "SELECT string_agg(to_regclass(n)::text, ',' ORDER BY n) FROM unnest(ARRAY['state.turns',"
        "'state.cards','state.agents','state.agent_inbox','state.outbox']) n",
        0);
    ck_assert_str_eq(s, "state.agent_inbox,state.agents,state.cards,state.outbox,state.turns");
    free(s);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns", 0), 1);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.cards", 0), 1);
    /* The final event carries the channel verbatim. */
    ck_assert(tw_fx_events_wait(ev, "evt.agent.echo.task", turn, 1, WAIT_MS));
    json_t *e = tw_fx_events_get(ev, "evt.agent.echo.task", turn, 0, NULL, NULL);
    ck_assert_str_eq(json_string_value(json_object_get(e, "channel_id")), channel);
    json_decref(e);
    /* The key finds its turn again, metacharacters and all. */
    out =
        CLI_EXPECT(fx, 0, NULL, "submit", "--agent", "echo", "--channel", channel, "--idempotency-key", key);
    ck_assert_int_eq(strncmp(out, turn, 36), 0);
    free(out);
    /* So does a listing filtered by a status. */
    out = CLI_EXPECT(fx, 0, NULL, "--json", "turns", "list", "--status", "done");
    j = parse(out);
    ck_assert_int_eq(json_array_size(j), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(j, 0), "channel_id")), channel);
    json_decref(j);
    free(out);
    free(turn);
    tw_fx_free(fx);
}
END_TEST

/* ---- turn show / turns list
 * ------------------------------------------------------------------------------------- */

static bool has_keys(json_t *o, const char *const *keys)
{
    for (; *keys; keys++)
        if (!json_object_get(o, *keys)) {
            char *dump = json_dumps(o, JSON_COMPACT);
            fprintf(stderr, "missing key %s in %s\n", *keys, dump);
            free(dump);
            return false;
        }
    return true;
}

static const char *jstr(json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

START_TEST(test_show_and_list_json)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL), *worker = tw_fx_start_worker(fx, NULL);
    (void)pmo, (void)worker;
    char *done = submit_json(fx, "echo", "show-1", "{\"x\":1}", NULL);
    char *failed = submit_json(fx, "failer", "show-2", "{}", NULL);
    char *tools = submit_json(
        fx, "tester", "show-3",
        "{\"mode\":\"tools\",\"calls\":[{\"id\":\"c1\",\"tool\":\"echo\",\"args\":{\"v\":7}}]}", NULL);
    const char *ids[] = {done, failed, tools};
    const char *want[] = {"done", "failed", "done"};
    for (int i = 0; i < 3; i++) {
        char *st = wait_ended(fx, ids[i]);
        ck_assert_msg(strcmp(st, want[i]) == 0, "turn %d ended %s", i, st);
        free(st);
    }

    static const char *const show_keys[] = {"turn_id",
                                            "agent",
                                            "channel_id",
                                            "status",
                                            "turn_epoch",
                                            "error",
                                            "error_message",
                                            "deliverable_card_id",
                                            "created_at",
                                            "dispatched_at",
                                            "started_at",
                                            "ended_at",
                                            "tool_calls",
                                            "force_terminations",
                                            NULL};
    /* done */
    char *out = CLI_EXPECT(fx, 0, NULL, "--json", "turn", "show", done);
    json_t *t = parse(out);
    ck_assert(has_keys(t, show_keys));
    ck_assert_str_eq(jstr(t, "turn_id"), done);
    ck_assert_str_eq(jstr(t, "status"), "done");
    ck_assert_str_eq(jstr(t, "agent"), "echo");
    ck_assert_str_eq(jstr(t, "channel_id"), "show-1");
    ck_assert(json_is_integer(json_object_get(t, "turn_epoch")));
    ck_assert_int_ge(json_integer_value(json_object_get(t, "turn_epoch")), 1);
    ck_assert(json_is_null(json_object_get(t, "error")));
    for (const char *const *k =
             (const char *const[]){"created_at", "dispatched_at", "started_at", "ended_at", NULL};
         *k; k++)
        ck_assert_msg(jstr(t, *k) && strlen(jstr(t, *k)) >= 19, "%s is %s", *k, jstr(t, *k));
    char *card =
        tw_fx_sql_str(fx, "SELECT deliverable_card_id::text FROM state.turns WHERE turn_id = $1", 1, done);
    ck_assert_str_eq(jstr(t, "deliverable_card_id"), card);
    free(card);
    ck_assert(json_is_array(json_object_get(t, "tool_calls")));
    ck_assert_int_eq(json_array_size(json_object_get(t, "tool_calls")), 0);
    json_decref(t);
    free(out);

    /* failed: the error and its words, no deliverable */
    out = CLI_EXPECT(fx, 0, NULL, "turn", "show", failed, "--json");
    t = parse(out);
    ck_assert(has_keys(t, show_keys));
    ck_assert_str_eq(jstr(t, "status"), "failed");
    ck_assert_str_eq(jstr(t, "agent"), "failer");
    ck_assert_str_eq(jstr(t, "error"), "agent_failed");
    ck_assert(jstr(t, "error_message") && *jstr(t, "error_message"));
    ck_assert(json_is_null(json_object_get(t, "deliverable_card_id")));
    json_decref(t);
    free(out);

    /* with a tool call: its id, tool and state */
    out = CLI_EXPECT(fx, 0, NULL, "--json", "turn", "show", tools);
    t = parse(out);
    ck_assert(has_keys(t, show_keys));
    json_t *calls = json_object_get(t, "tool_calls");
    ck_assert_int_eq(json_array_size(calls), 1);
    json_t *c = json_array_get(calls, 0);
    ck_assert_str_eq(jstr(c, "tool_call_id"), "c1");
    ck_assert_str_eq(jstr(c, "tool"), "echo");
    ck_assert_str_eq(jstr(c, "status"), "received");
    ck_assert_str_eq(jstr(c, "result_status"), "ok");
    ck_assert_ptr_nonnull(jstr(c, "settled_at"));
    json_decref(t);
    free(out);

    /* The human form says the same. */
    out = CLI_EXPECT(fx, 0, NULL, "turn", "show", tools);
    ck_assert_ptr_nonnull(strstr(out, "status"));
    ck_assert_ptr_nonnull(strstr(out, "done"));
    ck_assert_ptr_nonnull(strstr(out, "id=c1"));
    free(out);

    /* turns list: all three, with the contract's fields; filters narrow it. */
    static const char *const list_keys[] = {"turn_id",    "agent",    "status",
                                            "turn_epoch", "error",    "deliverable_card_id",
                                            "created_at", "ended_at", NULL};
    out = CLI_EXPECT(fx, 0, NULL, "--json", "turns", "list");
    json_t *rows = parse(out);
    ck_assert(json_is_array(rows));
    ck_assert_int_eq(json_array_size(rows), 3);
    size_t i;
    json_t *r;
    int found = 0;
    json_array_foreach(rows, i, r)
    {
        ck_assert(has_keys(r, list_keys));
        for (int k = 0; k < 3; k++)
            if (strcmp(jstr(r, "turn_id"), ids[k]) == 0) {
                ck_assert_str_eq(jstr(r, "status"), want[k]);
                found++;
            }
    }
    ck_assert_int_eq(found, 3);
    json_decref(rows);
    free(out);
    out = CLI_EXPECT(fx, 0, NULL, "--json", "turns", "list", "--agent", "failer");
    rows = parse(out);
    ck_assert_int_eq(json_array_size(rows), 1);
    ck_assert_str_eq(jstr(json_array_get(rows, 0), "turn_id"), failed);
    ck_assert_str_eq(jstr(json_array_get(rows, 0), "error"), "agent_failed");
    json_decref(rows);
    free(out);
    out = CLI_EXPECT(fx, 0, NULL, "--json", "turns", "list", "--status", "done");
    rows = parse(out);
    ck_assert_int_eq(json_array_size(rows), 2);
    json_decref(rows);
    free(out);
    out = CLI_EXPECT(fx, 0, NULL, "--json", "turns", "list", "--agent", "nobody");
    rows = parse(out);
    ck_assert_int_eq(json_array_size(rows), 0);
    json_decref(rows);
    free(out);
    out = CLI_EXPECT(fx, 0, NULL, "turns", "list");
    ck_assert_ptr_nonnull(strstr(out, failed));
    free(out);
    free(done);
    free(failed);
    free(tools);
    tw_fx_free(fx);
}
END_TEST

/* Values from the user and the database that need escaping in JSON (quote, backslash, newline, a tab) come
 * out as valid JSON, one document per line, and parse back to exactly what was stored. */
START_TEST(test_json_escaping)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL), *worker = tw_fx_start_worker(fx, NULL);
    const char *channel = "a\"b\\c";
    const char *key = "k\"\\{}";
    const char *reason = "line one\nline \"two\"\t\\ end";
    json_t *input = json_pack("{s:s,s:s}", "mode", "fail", "error", reason);
    char *input_s = json_dumps(input, JSON_COMPACT);
    json_decref(input);
    char *out = CLI_EXPECT(fx, 0, NULL, "submit", "--json", "--agent", "tester", "--channel", channel,
                           "--box", channel, "--idempotency-key", key, "--input", input_s);
    json_t *j = parse(out);
    char *turn = strdup(jstr(j, "turn_id"));
    json_decref(j);
    free(out);
    free(input_s);
    expect_ended(fx, turn, "failed", pmo, worker);
    char *want_msg = tw_fx_sql_str(fx, "SELECT error_message FROM state.turns WHERE turn_id = $1", 1, turn);
    ck_assert_ptr_nonnull(want_msg);
    ck_assert_msg(strstr(want_msg, reason), "error_message '%s' lacks the agent's words", want_msg);

    out = CLI_EXPECT(fx, 0, NULL, "--json", "turn", "show", turn);
    ck_assert_msg(strchr(out, '\n') == out + strlen(out) - 1, "not one line: %s", out);
    json_t *t = parse(out);
    ck_assert_str_eq(jstr(t, "turn_id"), turn);
    ck_assert_str_eq(jstr(t, "channel_id"), channel);
    ck_assert_str_eq(jstr(t, "output_box_id"), channel);
    ck_assert_str_eq(jstr(t, "idempotency_key"), key);
    ck_assert_str_eq(jstr(t, "error_message"), want_msg);
    json_decref(t);
    free(out);

    out = CLI_EXPECT(fx, 0, NULL, "--json", "turns", "list", "--agent", "tester");
    ck_assert_msg(strchr(out, '\n') == out + strlen(out) - 1, "not one line: %s", out);
    json_t *rows = parse(out);
    ck_assert_int_eq(json_array_size(rows), 1);
    ck_assert_str_eq(jstr(json_array_get(rows, 0), "turn_id"), turn);
    ck_assert_str_eq(jstr(json_array_get(rows, 0), "channel_id"), channel);
    ck_assert_str_eq(jstr(json_array_get(rows, 0), "error"), "agent_failed");
    json_decref(rows);
    free(out);

    /* The same key again answers with the same turn, in JSON too. */
    out = CLI_EXPECT(fx, 0, NULL, "submit", "--json", "--agent", "tester", "--channel", channel,
                     "--idempotency-key", key);
    j = parse(out);
    ck_assert_str_eq(jstr(j, "turn_id"), turn);
    ck_assert(json_is_false(json_object_get(j, "created")));
    json_decref(j);
    free(out);
    free(want_msg);
    free(turn);
    tw_fx_free(fx);
}
END_TEST

/* The JSON answers of tool-result and cancel, for a call id that needs escaping: accepted with its card, a
 * second result refused, a cancel of a suspended turn, and of an ended one (exit 1, and still the answer). */
static char *submit_external(TwFx *fx, const char *call_id)
{
    json_t *input =
        json_pack("{s:s,s:[{s:s,s:s,s:{}}]}", "mode", "tools", "calls", "id", call_id, "tool", "ext", "args");
    char *text = json_dumps(input, JSON_COMPACT);
    json_decref(input);
    char *turn = submit_json(fx, "tester", "ext-json", text, NULL);
    free(text);
    ck_assert_msg(tw_fx_sql_wait(fx, WAIT_MS, "suspended",
                                 "SELECT status FROM state.turns WHERE turn_id = $1", 1, turn),
                  "turn %s did not suspend on its external call", turn);
    return turn;
}

/* No byte of text from outside reaches the terminal or the log as a control character: an agent's fail
 * message with a CR, an OSC sequence and a BEL ("\\r\\x1b]0;x\\x07ERROR: forged line") and a tool result's
 * error from a client with ESC, DEL and C1 CSI appear escaped in `turnwatch turn show`; a program's stderr
 * with the same, a NUL and C1 CSI, escaped and whole in the worker's text log (the worker logs a fail's code,
 * not its message); --json keeps the text itself. */
static void expect_no_controls(const char *what, const char *text)
{
    for (const char *p = text; *p; p++)
        ck_assert_msg(*p == '\n' || ((unsigned char)*p >= 0x20 && *p != 0x7f &&
                                     !((unsigned char)p[0] == 0xc2 && (unsigned char)p[1] < 0xa0)),
                      "%s has the control character 0x%02x at byte %td: %s", what, (unsigned char)*p,
                      p - text, text);
}

START_TEST(test_text_escaping)
{
    TwFx *fx = tw_fx_new();
    /* A tool that says on stderr, with a NUL, a CR, CSI (ESC [ and C1 9B), then fails. */
    char *script = NULL, *ov = NULL;
    ck_assert_int_gt(asprintf(&script, "%s/noisy.sh", tw_fx_dir(fx)), 0);
    FILE *f = fopen(script, "w");
    ck_assert_ptr_nonnull(f);
    fputs("printf 'noisy-stderr a\\000b\\r\\033]0;x\\007ERROR: forged line\\302\\233 tail\\n' >&2\nexit 3\n",
          f);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_gt(asprintf(&ov, "[tool.noisy]\nexec = /bin/sh %s\ntimeout_seconds = 20\n", script), 0);
    tw_fx_pg_init(fx);
    tw_fx_nats_start(fx);
    tw_fx_write_config(fx, NULL, ov);
    tw_fx_migrate(fx);
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL), *worker = tw_fx_start_worker(fx, NULL);
    const char *forged = "\r\x1b]0;x\x07"
                         "ERROR: forged line";
    json_t *input = json_pack("{s:s,s:s}", "mode", "fail", "error", forged);
    char *input_s = json_dumps(input, JSON_COMPACT);
    json_decref(input);
    char *out = CLI_EXPECT(fx, 0, NULL, "submit", "--json", "--agent", "tester", "--channel", "esc",
                           "--input", input_s);
    json_t *j = parse(out);
    char *failed = strdup(jstr(j, "turn_id"));
    json_decref(j);
    free(out);
    free(input_s);
    expect_ended(fx, failed, "failed", pmo, worker);

    /* turn show: the message escaped, in a line of its own. */
    out = CLI_EXPECT(fx, 0, NULL, "turn", "show", failed);
    expect_no_controls("turn show", out);
    const char *line = strstr(out, "\nerror_message ");
    if (!line || !strstr(line, "\\r\\x1b]0;x\\x07ERROR: forged line\n"))
        fputs(out, stderr);
    ck_assert_msg(line && strstr(line, "\\r\\x1b]0;x\\x07ERROR: forged line\n"), "turn show: %s", out);
    free(out);
    /* --json: the text itself, JSON-escaped. */
    out = CLI_EXPECT(fx, 0, NULL, "--json", "turn", "show", failed);
    expect_no_controls("turn show --json", out);
    j = parse(out);
    ck_assert_msg(strstr(jstr(j, "error_message"), forged), "%s", jstr(j, "error_message"));
    json_decref(j);
    free(out);

    /* A tool result's error posted by a client, and a program's stderr. */
    char *ext = submit_external(fx, "e1");
    free(CLI_EXPECT(fx, 0, NULL, "tool-result", "--turn", ext, "--call", "e1", "--status", "error",
                    "--output",
                    "{\"code\":\"bad\",\"message\":\"esc \\u001b[2J del \\u007f c1 \\u009b end\"}"));
    char *st = wait_ended(fx, ext);
    free(st);
    out = CLI_EXPECT(fx, 0, NULL, "turn", "show", ext);
    expect_no_controls("turn show of a client's error", out);
    if (!strstr(out, "(esc \\x1b[2J del \\x7f c1 \\xc2\\x9b end)"))
        fputs(out, stderr);
    ck_assert_msg(strstr(out, "(esc \\x1b[2J del \\x7f c1 \\xc2\\x9b end)"), "turn show: %s", out);
    free(out);
    char *noisy =
        submit_json(fx, "tester", "noisy",
                    "{\"mode\":\"tools\",\"calls\":[{\"id\":\"n1\",\"tool\":\"noisy\",\"args\":{}}]}", NULL);
    st = wait_ended(fx, noisy);
    free(st);
    out = CLI_EXPECT(fx, 0, NULL, "turn", "show", noisy);
    expect_no_controls("turn show of a program's stderr", out);
    ck_assert_msg(strstr(out, "noisy-stderr"), "%s", out);
    free(out);

    /* The worker's log: the same, escaped, and the NUL does not cut the stderr line. */
    ck_assert_int_eq(tw_fx_proc_terminate(worker, 30000), 0);
    char *log = tw_fx_proc_log(worker);
    const char *said =
        strstr(log, "stderr: noisy-stderr a\\x00b\\r\\x1b]0;x\\x07ERROR: forged line\\xc2\\x9b tail\n");
    if (!said)
        tw_fx_proc_dump(worker);
    expect_no_controls("the worker's log", log);
    ck_assert_msg(said, "the worker's log lacks the program's escaped stderr line");
    free(log);
    free(noisy);
    free(ext);
    free(failed);
    free(script);
    free(ov);
    tw_fx_free(fx);
}
END_TEST

START_TEST(test_result_and_cancel_json)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, NULL);
    const char *call = "q\"1\\";
    char *answered = submit_external(fx, call);

    char *out = CLI_EXPECT(fx, 0, NULL, "--json", "tool-result", "--turn", answered, "--call", call,
                           "--output", "{\"v\":\"x\\\"y\"}");
    json_t *j = parse(out);
    ck_assert_str_eq(jstr(j, "result"), "accepted");
    char *card =
        tw_fx_sql_str(fx,
                      "SELECT card_id::text FROM state.cards WHERE turn_id = $1 AND tool_call_id = $2"
                      " AND card_type = 'tool.result'",
                      2, answered, call);
    ck_assert_ptr_nonnull(card);
    ck_assert_str_eq(jstr(j, "card_id"), card);
    char *v = tw_fx_sql_str(fx, "SELECT content #>> '{output,v}' FROM state.cards WHERE card_id = $1::uuid",
                            1, card);
    ck_assert_str_eq(v, "x\"y");
    free(v);
    json_decref(j);
    free(out);
    free(card);
    /* A second result: refused in words (the call has its result, or by now the turn has ended), nothing on
     * stdout. */
    char *err = NULL;
    out = CLI_EXPECT(fx, 1, &err, "--json", "tool-result", "--turn", answered, "--call", call, "--output",
                     "{}");
    ck_assert_str_eq(out, "");
    ck_assert_msg(strstr(err, "nothing changed") &&
                      (strstr(err, "already has a result") || strstr(err, "has already ended")),
                  "stderr: %s", err);
    free(out);
    free(err);

    /* Cancelling the ended turn: exit 1, and the answer on stdout all the same. */
    char *st = wait_ended(fx, answered);
    ck_assert_str_eq(st, "done");
    free(st);
    out = CLI_EXPECT(fx, 1, &err, "cancel", "--json", answered);
    j = parse(out);
    ck_assert_str_eq(jstr(j, "turn_id"), answered);
    ck_assert_str_eq(jstr(j, "result"), "already_ended");
    ck_assert_str_eq(jstr(j, "status"), "done");
    ck_assert_ptr_nonnull(strstr(err, "has already ended"));
    json_decref(j);
    free(out);
    free(err);

    /* One turn at a time per agent: the second suspends only now that the first has ended. */
    char *cancelled = submit_external(fx, call);
    out = CLI_EXPECT(fx, 0, NULL, "cancel", "--json", cancelled);
    j = parse(out);
    ck_assert_str_eq(jstr(j, "turn_id"), cancelled);
    ck_assert_str_eq(jstr(j, "result"), "cancelled");
    ck_assert_str_eq(jstr(j, "status"), "cancelled");
    json_decref(j);
    free(out);
    st = wait_ended(fx, cancelled);
    ck_assert_str_eq(st, "cancelled");
    free(st);
    free(answered);
    free(cancelled);
    tw_fx_free(fx);
}
END_TEST

/* `turnwatch daemons` says what each daemon holds: the turn ids of its steps and of its tool calls (the first
 * 100 of each, by turn id, and the counts), so that an operator can tell whether a frozen worker matters. */
static json_t *daemon_of(json_t *list, const char *id, const char *kind)
{
    size_t i;
    json_t *d;
    json_array_foreach(list, i, d)
    {
        if ((id && strcmp(jstr(d, "daemon_id"), id) == 0) ||
            (kind && strcmp(jstr(d, "kind"), kind) == 0 && json_is_true(json_object_get(d, "alive"))))
            return d;
    }
    ck_abort_msg("no daemon %s in the list", id ? id : kind);
    return NULL;
}

static bool ids_have(json_t *ids, const char *turn)
{
    size_t i;
    json_t *v;
    json_array_foreach(ids, i, v)
    {
        if (json_is_string(v) && strcmp(json_string_value(v), turn) == 0)
            return true;
    }
    return false;
}

START_TEST(test_daemons_holds)
{
    char *agent = tw_fx_build_path("examples/agents/tw-test-agent"), *ovr = NULL;
    ck_assert_int_gt(asprintf(&ovr,
                              "[agent.caller]\nexec = %s\nstep_timeout_seconds = 10\nkill_grace_seconds = 1\n"
                              "[agent.tester]\nstep_timeout_seconds = 60\n"
                              "[tool.sleep]\ntimeout_seconds = 60\nsuspend_timeout_seconds = 90\n",
                              agent),
                     0);
    TwFx *fx = tw_fx_new_migrated(ovr);
    free(ovr);
    free(agent);

    /* A daemon gone unmarked that held 130 steps and 3 tool calls: the first 100 step turns, in order. */
    tw_fx_sql_exec(fx,
                   "INSERT INTO state.daemons (daemon_id, kind, host, pid, incarnation)"
                   " VALUES ('gone-host:1', 'worker', 'gone-host', 1, 'x')",
                   0);
    tw_fx_sql_exec(
        fx,
        "INSERT INTO state.agent_inbox (target_kind, target, message_type, turn_id, status, claimed_by)"
        " SELECT k, 'held', 'turn', gen_random_uuid(), 'processing', 'gone-host:1'"
        " FROM (SELECT 'agent' FROM generate_series(1, 130) UNION ALL"
        "       SELECT 'tool' FROM generate_series(1, 3)) AS g(k)",
        0);
    char *first = tw_fx_sql_str(fx,
                                "SELECT turn_id::text FROM state.agent_inbox WHERE target_kind = 'agent'"
                                " ORDER BY turn_id LIMIT 1",
                                0);
    char *hundredth = tw_fx_sql_str(fx,
                                    "SELECT turn_id::text FROM state.agent_inbox WHERE target_kind = 'agent'"
                                    " ORDER BY turn_id OFFSET 99 LIMIT 1",
                                    0);
    char *out = CLI_EXPECT(fx, 0, NULL, "--json", "daemons");
    json_t *list = parse(out), *holds = json_object_get(daemon_of(list, "gone-host:1", NULL), "holds");
    ck_assert_int_eq(json_integer_value(json_object_get(holds, "steps")), 130);
    ck_assert_int_eq(json_integer_value(json_object_get(holds, "tool_calls")), 3);
    json_t *steps = json_object_get(holds, "step_turn_ids"),
           *calls = json_object_get(holds, "tool_call_turn_ids");
    ck_assert_msg(json_is_array(steps) && json_is_array(calls), "daemons --json: no turn ids in %s", out);
    ck_assert_uint_eq(json_array_size(steps), 100);
    ck_assert_uint_eq(json_array_size(calls), 3);
    ck_assert_str_eq(json_string_value(json_array_get(steps, 0)), first);
    ck_assert_str_eq(json_string_value(json_array_get(steps, 99)), hundredth);
    json_decref(list);
    free(out);
    out = CLI_EXPECT(fx, 0, NULL, "daemons");
    ck_assert_msg(strstr(out, first) && strstr(out, hundredth), "daemons: the held turns missing: %s", out);
    ck_assert_msg(strstr(out, "30 more steps"), "daemons: no count of the steps left out: %s", out);
    free(out);
    free(first);
    free(hundredth);
    tw_fx_sql_exec(fx, "DELETE FROM state.agent_inbox WHERE claimed_by = 'gone-host:1'", 0);

    /* A live worker holding one turn's step (the agent sleeps until the gate opens) and another's two tool
     * calls. */
    tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, NULL);
    char *gate = NULL, *input = NULL;
    ck_assert_int_gt(asprintf(&gate, "%s/gate", tw_fx_dir(fx)), 0);
    ck_assert_int_gt(asprintf(&input, "{\"mode\":\"sleep\",\"seconds\":50,\"gate\":\"%s\"}", gate), 0);
    char *sleeper = submit_json(fx, "tester", "holds-1", input, NULL);
    char *caller =
        submit_json(fx, "caller", "holds-2",
                    "{\"mode\":\"tools\",\"calls\":[{\"id\":\"a\",\"tool\":\"sleep\",\"args\":"
                    "{\"seconds\":50}},{\"id\":\"b\",\"tool\":\"sleep\",\"args\":{\"seconds\":50}}]}",
                    NULL);
    ck_assert_msg(tw_fx_sql_wait(fx, WAIT_MS, "t",
                                 "SELECT (SELECT count(*) FROM state.agent_inbox WHERE status = 'processing'"
                                 " AND target_kind = 'agent' AND turn_id = $1::uuid) = 1"
                                 " AND (SELECT count(*) FROM state.agent_inbox WHERE status = 'processing'"
                                 " AND target_kind = 'tool' AND turn_id = $2::uuid) = 2",
                                 2, sleeper, caller),
                  "the worker did not take the step and the two tool calls");
    out = CLI_EXPECT(fx, 0, NULL, "--json", "daemons");
    list = parse(out);
    holds = json_object_get(daemon_of(list, NULL, "worker"), "holds");
    ck_assert_int_eq(json_integer_value(json_object_get(holds, "steps")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(holds, "tool_calls")), 2);
    ck_assert_msg(ids_have(json_object_get(holds, "step_turn_ids"), sleeper), "step turn missing: %s", out);
    calls = json_object_get(holds, "tool_call_turn_ids");
    ck_assert_msg(json_array_size(calls) == 2 && ids_have(calls, caller), "tool call turns: %s", out);
    holds = json_object_get(daemon_of(list, NULL, "pmo"), "holds");
    ck_assert_uint_eq(json_array_size(json_object_get(holds, "step_turn_ids")), 0);
    json_decref(list);
    free(out);
    out = CLI_EXPECT(fx, 0, NULL, "daemons");
    ck_assert_msg(strstr(out, sleeper) && strstr(out, caller), "daemons: the held turns missing: %s", out);
    free(out);
    FILE *f = fopen(gate, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    free(gate);
    free(input);
    free(sleeper);
    free(caller);
    tw_fx_free(fx);
}
END_TEST

/* ---- events
 * ----------------------------------------------------------------------------------------------------- */

typedef struct LogHas {
    TwFxProc *proc;
    const char *a, *b;
} LogHas;

/* True once the process's log has a line containing both a and b (b may be NULL). */
static bool log_has(void *arg)
{
    LogHas *w = arg;
    char *log = tw_fx_proc_log(w->proc);
    bool found = false;
    for (char *line = strtok(log, "\n"); line && !found; line = strtok(NULL, "\n"))
        found = strstr(line, w->a) && (!w->b || strstr(line, w->b));
    free(log);
    return found;
}

/* `turnwatch events` prints one JSON object per line, the payload with its subject, with the values from
 * the user escaped; it ends with exit 0 on SIGTERM. */
START_TEST(test_events_json_lines)
{
    TwFxStack st = tw_fx_stack_start_events(NULL, NULL);
    const char *argv[] = {tw_fx_cli_path(), "-c", tw_fx_config_path(st.fx), "-v", "events", "--agent",
                          "echo",           NULL};
    TwFxProc *ev = tw_fx_spawn(st.fx, "events", argv);
    /* -v says on stderr when the subscription is in place. */
    LogHas listening = {ev, "listening on evt.agent.echo.>", NULL};
    ck_assert_msg(tw_fx_wait_until(log_has, &listening, WAIT_MS), "events never subscribed");
    const char *channel = "ev\"\\/";
    char *turn = submit_json(st.fx, "echo", channel, "{\"say\":\"a\\nb\"}", NULL);
    LogHas task = {ev, "\"subject\":\"evt.agent.echo.task\"", turn};
    ck_assert_msg(tw_fx_wait_until(log_has, &task, WAIT_MS), "no task event for %s", turn);
    ck_assert_int_eq(tw_fx_proc_terminate(ev, 10000), 0);

    char *log = tw_fx_proc_log(ev);
    int n_task = 0;
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "turnwatch: ", 11) == 0)
            continue; /* -v's lines on stderr */
        json_t *e = parse(line);
        ck_assert_msg(jstr(e, "subject") && strncmp(jstr(e, "subject"), "evt.agent.echo.", 15) == 0, "%s",
                      line);
        if (strcmp(jstr(e, "subject"), "evt.agent.echo.task") == 0 && jstr(e, "turn_id") &&
            strcmp(jstr(e, "turn_id"), turn) == 0) {
            ck_assert_str_eq(jstr(e, "channel_id"), channel);
            ck_assert_str_eq(jstr(e, "status"), "done");
            n_task++;
        }
        json_decref(e);
    }
    ck_assert_int_eq(n_task, 1);
    free(log);
    free(turn);
    tw_fx_free(st.fx);
}
END_TEST

/* ---- --check-config, --version, --help
 * -------------------------------------------------------------------------- */

/* Line number (1-based) of the first line of `path` equal to `text`. */
static int line_of(const char *path, const char *text)
{
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char buf[4096];
    int n = 0, found = 0;
    while (!found && fgets(buf, sizeof buf, f)) {
        n++;
        buf[strcspn(buf, "\n")] = '\0';
        if (strcmp(buf, text) == 0)
            found = n;
    }
    fclose(f);
    ck_assert_msg(found, "no line '%s' in %s", text, path);
    return found;
}

typedef struct BadConf {
    const char *name, *overrides, *line, *key, *why;
} BadConf;

START_TEST(test_check_config)
{
    TwFx *fx = tw_fx_new_all();
    const char *progs[] = {tw_fx_pmo_path(), tw_fx_worker_path(), tw_fx_cli_path()};
    static const BadConf bad[] = {
        {"unknown-key.ini", "[pmo]\nbogus_knob = 1\n", "bogus_knob = 1", "bogus_knob", "unknown key"},
        {"bad-value.ini", "[worker]\nconcurrency = lots\n", "concurrency = lots", "concurrency",
         "not a whole number"},
        {"range.ini", "[agent.echo]\nstep_timeout_seconds = 0\n", "step_timeout_seconds = 0",
         "step_timeout_seconds", "out of range"},
        {"retry.ini", "[pmo]\ndispatched_retry_seconds = 6\n", "dispatched_retry_seconds = 6",
         "dispatched_retry_seconds", "dispatched_timeout_seconds"},
        {"retry-above.ini", "[pmo]\ndispatched_retry_seconds = 7\n", "dispatched_retry_seconds = 7",
         "dispatched_retry_seconds", "must be less than"},
    };
    for (size_t p = 0; p < 3; p++) {
        char *out = NULL, *err = NULL;
        const char *good[] = {progs[p], "-c", tw_fx_config_path(fx), "--check-config", NULL};
        int rc = tw_fx_run(good, &out, &err);
        ck_assert_msg(rc == 0, "%s --check-config on the good file exited %d: %.500s", progs[p], rc, err);
        ck_assert_msg(strstr(out, "valid"), "%s --check-config printed '%s'", progs[p], out);
        free(out);
        free(err);
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            const char *path = tw_fx_write_config(fx, bad[b].name, bad[b].overrides);
            char where[1024];
            snprintf(where, sizeof where, "%s:%d:", path, line_of(path, bad[b].line));
            const char *argv[] = {progs[p], "-c", path, "--check-config", NULL};
            rc = tw_fx_run(argv, &out, &err);
            ck_assert_msg(rc == 1, "%s --check-config on %s exited %d, want 1: %.500s", progs[p], bad[b].name,
                          rc, err);
            ck_assert_msg(strstr(err, where) && strstr(err, bad[b].key) && strstr(err, bad[b].why),
                          "%s on %s: stderr '%.500s' lacks '%s', '%s' or '%s'", progs[p], bad[b].name, err,
                          where, bad[b].key, bad[b].why);
            free(out);
            free(err);
        }
        const char *missing[] = {progs[p], "-c", "/nonexistent/turnwatch.ini", "--check-config", NULL};
        rc = tw_fx_run(missing, &out, &err);
        ck_assert_msg(rc == 1 && strstr(err, "/nonexistent/turnwatch.ini"),
                      "%s: missing file: exit %d, %.500s", progs[p], rc, err);
        free(out);
        free(err);
    }
    /* The worker's --check-config applies the checks of its start-up: a served program that is missing,
     * not executable or a directory is an error naming section, line, program and why. The PMO and the
     * CLI run no programs and accept the file. */
    char *noexec = NULL;
    ck_assert_int_gt(asprintf(&noexec, "%s/not-executable", tw_fx_dir(fx)), 0);
    FILE *nf = fopen(noexec, "w");
    ck_assert_ptr_nonnull(nf);
    fputs("#!/bin/sh\n", nf);
    ck_assert_int_eq(fclose(nf), 0);
    ck_assert_int_eq(chmod(noexec, 0644), 0);
    static const struct {
        const char *name, *section, *exec, *why;
    } progs_bad[] = {
        {"exec-missing.ini", "agent.echo", "/nonexistent/agent", "does not exist"},
        {"exec-dir.ini", "agent.echo", "/tmp", "is a directory"},
        {"exec-noexec.ini", "tool.echo", NULL, "is not executable"},
    };
    for (size_t b = 0; b < sizeof progs_bad / sizeof progs_bad[0]; b++) {
        const char *exec = progs_bad[b].exec ? progs_bad[b].exec : noexec;
        char ovr[512], line[512], where[1024];
        snprintf(ovr, sizeof ovr, "[%s]\nexec = %s\n", progs_bad[b].section, exec);
        snprintf(line, sizeof line, "exec = %s", exec);
        const char *path = tw_fx_write_config(fx, progs_bad[b].name, ovr);
        snprintf(where, sizeof where, "%s:%d: [%s] exec: %s %s", path, line_of(path, line),
                 progs_bad[b].section, exec, progs_bad[b].why);
        for (size_t p = 0; p < 3; p++) {
            char *out = NULL, *err = NULL;
            const char *argv[] = {progs[p], "-c", path, "--check-config", NULL};
            int rc = tw_fx_run(argv, &out, &err);
            if (p == 1)
                ck_assert_msg(rc == 1 && strstr(err, where),
                              "worker --check-config on %s: exit %d, want 1 and '%s': %.500s",
                              progs_bad[b].name, rc, where, err);
            else
                ck_assert_msg(rc == 0, "%s --check-config on %s: exit %d: %.500s", progs[p],
                              progs_bad[b].name, rc, err);
            free(out);
            free(err);
        }
        /* Start-up refuses it the same way (before connecting to anything). */
        const char *argv[] = {tw_fx_worker_path(), "-c", path, NULL};
        char *out = NULL, *err = NULL;
        int rc = tw_fx_run_full(argv, NULL, &out, &err, 20000);
        ck_assert_msg(rc == 1 && strstr(err, where), "worker start on %s: exit %d, want 1 and '%s': %.500s",
                      progs_bad[b].name, rc, where, err);
        free(out);
        free(err);
    }
    free(noexec);
    /* A directory given as the file is an error for every program, naming it. */
    for (size_t p = 0; p < 3; p++) {
        char *out = NULL, *err = NULL;
        const char *argv[] = {progs[p], "-c", tw_fx_dir(fx), "--check-config", NULL};
        int rc = tw_fx_run(argv, &out, &err);
        char want[1024];
        snprintf(want, sizeof want, "%s: is a directory", tw_fx_dir(fx));
        ck_assert_msg(rc == 1 && strstr(err, want),
                      "%s -c DIR --check-config: exit %d, want 1 and '%s': %.500s", progs[p], rc, want, err);
        free(out);
        free(err);
    }

    /* A CLI command with a bad file is refused, naming the problem. */
    const char *path = tw_fx_write_config(fx, "unknown-key.ini", bad[0].overrides);
    const char *argv[] = {tw_fx_cli_path(), "-c", path, "turns", "list", NULL};
    char *out = NULL, *err = NULL;
    int rc = tw_fx_run(argv, &out, &err);
    ck_assert_msg(rc == 2 && strstr(err, "bogus_knob"), "exit %d: %.500s", rc, err);
    free(out);
    free(err);
    tw_fx_free(fx);
}
END_TEST

START_TEST(test_version_and_help)
{
    const char *progs[] = {tw_fx_pmo_path(), tw_fx_worker_path(), tw_fx_cli_path()};
    const char *names[] = {"turnwatch-pmo", "turnwatch-worker", "turnwatch"};
    for (size_t p = 0; p < 3; p++) {
        char *out = NULL, *err = NULL;
        const char *version[] = {progs[p], "--version", NULL};
        ck_assert_int_eq(tw_fx_run(version, &out, &err), 0);
        ck_assert_msg(strncmp(out, names[p], strlen(names[p])) == 0 && strlen(out) > strlen(names[p]) + 2,
                      "%s --version printed '%s'", names[p], out);
        free(out);
        free(err);
        const char *help[] = {progs[p], "--help", NULL};
        ck_assert_int_eq(tw_fx_run(help, &out, &err), 0);
        ck_assert_msg(strstr(out, "Usage") && strstr(out, "-c") && strstr(out, "--check-config"),
                      "%s --help printed '%s'", names[p], out);
        free(out);
        free(err);
        const char *bogus[] = {progs[p], "--no-such-option", NULL};
        ck_assert_int_eq(tw_fx_run(bogus, &out, &err), 2);
        ck_assert_msg(*err, "%s: no message for an unknown option", names[p]);
        free(out);
        free(err);
    }
    /* The CLI lists its commands and exit codes; no command at all is a usage error. */
    char *out = NULL, *err = NULL;
    const char *help[] = {tw_fx_cli_path(), "--help", NULL};
    ck_assert_int_eq(tw_fx_run(help, &out, &err), 0);
    for (const char *const *w =
             (const char *const[]){"migrate", "submit", "turn show", "turn history ID", "turns list",
                                   "tool-result", "cancel", "events", "dead-letters list",
                                   "dead-letters replay ID [--again]", "--json", NULL};
         *w; w++)
        ck_assert_msg(strstr(out, *w), "turnwatch --help lacks %s", *w);
    free(out);
    free(err);
    const char *none[] = {tw_fx_cli_path(), NULL};
    ck_assert_int_eq(tw_fx_run(none, &out, &err), 2);
    free(out);
    free(err);
    /* `turnwatch help` is --help; each command's help is its synopsis, description and options from the
     * command table, with no configuration needed (the default file does not exist here). */
    static const struct {
        const char *argv[5], *want[3];
    } helps[] = {
        {{"help"}, {"Usage", "turns list", "--check-config"}},
        {{"submit", "--help"},
         {"turnwatch [-c FILE] [--json] [-v] submit --agent A", "--idempotency-key K", "bytes"}},
        {{"help", "submit"}, {"submit --agent A", "--input-file F", NULL}},
        {{"turn", "show", "--help"}, {"turn show ID", NULL}},
        {{"help", "turn", "show"}, {"turn show ID", NULL}},
        {{"turn", "--help"}, {"turn show ID", "turn history ID", NULL}},
        {{"dead-letters", "--help"},
         {"dead-letters list [--agent A]", "dead-letters replay ID [--again]", NULL}},
        {{"dead-letters", "replay", "--help"}, {"--again", "replay_of", NULL}},
        {{"turns", "list", "-h"}, {"turns list [--agent A]", "--limit N", NULL}},
        {{"cancel", "--help"}, {"cancel ID", NULL}},
        /* A command's description (the table's, which turnwatch(1) prints too) and its options. */
        {{"help", "cancel"}, {"cancel ID", "tw.cancel_turn_ex", "exits 1"}},
        {{"submit", "--help"}, {"tw.submit_turn", "Options:\n  --agent A", NULL}},
        {{"timeouts", "suggest", "--help"},
         {"timeouts suggest [--profile P] [--tool T] [--days N]", "x 1.5", NULL}},
        {{"events", "--agent", "x", "--help"}, {"events [--agent A]", NULL}},
    };
    for (size_t h = 0; h < sizeof helps / sizeof helps[0]; h++) {
        const char *argv[8] = {tw_fx_cli_path()};
        for (size_t a = 0; helps[h].argv[a]; a++)
            argv[a + 1] = helps[h].argv[a];
        int rc = tw_fx_run(argv, &out, &err);
        ck_assert_msg(rc == 0, "turnwatch %s ... exited %d: %s", helps[h].argv[0], rc, err);
        for (size_t w = 0; w < 3 && helps[h].want[w]; w++)
            ck_assert_msg(strstr(out, helps[h].want[w]), "turnwatch %s %s: '%s' lacks '%s'", helps[h].argv[0],
                          helps[h].argv[1] ? helps[h].argv[1] : "", out, helps[h].want[w]);
        free(out);
        free(err);
    }
    const char *unknown[] = {tw_fx_cli_path(), "help", "frobnicate", NULL};
    ck_assert_int_eq(tw_fx_run(unknown, &out, &err), 2);
    ck_assert_ptr_nonnull(strstr(err, "unknown command 'frobnicate'"));
    free(out);
    free(err);
}
END_TEST

/* A DSN listing several hosts with target_session_attrs=read-write (a pg_auto_failover formation, contract
 * section 17): the CLI goes through them to the one that takes writes. On a server that turned read-only
 * (25006: a demoted primary), a write is tried again once on a new connection and then refused in words that
 * say what happened, nothing changed. */
START_TEST(test_multi_host_and_read_only)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    char *dsn = NULL, *out = NULL, *err = NULL, *overrides = NULL;
    int dead = tw_fx_free_port();

    ck_assert_int_gt(asprintf(&dsn,
                              "postgresql://postgres@127.0.0.1:%d,127.0.0.1:%d/turnwatch"
                              "?target_session_attrs=read-write&connect_timeout=2",
                              dead, tw_fx_pg_port(fx)),
                     0);
    ck_assert_int_gt(asprintf(&overrides, "[postgres]\ndsn = %s\nquery_timeout_seconds = 2\n", dsn), 0);
    const char *ini = tw_fx_write_config(fx, "multi.ini", overrides);
    const char *submit[] = {
        tw_fx_cli_path(),    "-c", ini, "submit", "--agent", "echo", "--channel", "c1", "--input", "{}",
        "--idempotency-key", "k1", NULL};
    ck_assert_int_eq(tw_fx_run(submit, &out, &err), 0);
    ck_assert_int_eq(strlen(out), 37);
    free(out);
    free(err);

    tw_fx_sql_exec(fx, "ALTER SYSTEM SET default_transaction_read_only = on", 0);
    tw_fx_sql_exec(fx, "SELECT pg_reload_conf()", 0);
    ck_assert(tw_fx_sql_wait(fx, 10000, "on", "SHOW default_transaction_read_only", 0));
    /* The default DSN (one host, no target_session_attrs): the connection lands on the read-only node. */
    char *before = snapshot(fx);
    int rc = tw_fx_cli(fx, &out, &err, "submit", "--agent", "echo", "--channel", "c2", "--input", "{}", NULL);
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(strstr(err, "read-only (SQLSTATE 25006") && strstr(err, "nothing changed") &&
                      strstr(err, "target_session_attrs=read-write"),
                  "stderr: %s", err);
    free(out);
    free(err);
    /* The multi-host DSN: no host takes writes; the CLI looks for a primary for query_timeout_seconds. */
    submit[11] = "k2";
    int64_t t0 = tw_fx_now_ms();
    ck_assert_int_eq(tw_fx_run(submit, &out, &err), 1);
    ck_assert_int_lt(tw_fx_now_ms() - t0, 30000);
    ck_assert_msg(strstr(err, "cannot connect") || strstr(err, "no primary answered"), "stderr: %s", err);
    ck_assert_msg(strstr(err, "read-only") || strstr(err, "read-write"), "stderr: %s", err);
    free(out);
    free(err);
    tw_fx_sql_exec(fx, "ALTER SYSTEM RESET default_transaction_read_only", 0);
    tw_fx_sql_exec(fx, "SELECT pg_reload_conf()", 0);
    char *after = snapshot(fx);
    ck_assert_str_eq(after, before);
    free(before);
    free(after);
    free(overrides);
    free(dsn);
    tw_fx_free(fx);
}
END_TEST

/* A secret file of [nats] that group or others may read is accepted with a warning naming the file and its
 * mode (as ssh does for a key), by every program's --check-config; this user's only, no warning. */
START_TEST(test_check_config_secret_modes)
{
    TwFx *fx = tw_fx_new_all();
    const char *progs[] = {tw_fx_pmo_path(), tw_fx_worker_path(), tw_fx_cli_path()};
    char *token = NULL, *ovr = NULL, *want = NULL;
    ck_assert_int_gt(asprintf(&token, "%s/nats.token", tw_fx_dir(fx)), 0);
    FILE *f = fopen(token, "w");
    ck_assert_ptr_nonnull(f);
    fputs("s3cretToken\n", f);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_gt(asprintf(&ovr, "[nats]\ntoken_file = %s\n", token), 0);
    const char *path = tw_fx_write_config(fx, "token.ini", ovr);
    ck_assert_int_gt(
        asprintf(&want, "[nats] token_file: %s has mode 0644: group or others may read it", token), 0);
    static const mode_t modes[] = {0600, 0644};
    for (size_t m = 0; m < 2; m++) {
        ck_assert_int_eq(chmod(token, modes[m]), 0);
        for (size_t p = 0; p < 3; p++) {
            char *out = NULL, *err = NULL;
            const char *argv[] = {progs[p], "-c", path, "--check-config", NULL};
            int rc = tw_fx_run(argv, &out, &err);
            ck_assert_msg(rc == 0, "%s --check-config exited %d: %.500s", progs[p], rc, err);
            if (modes[m] == 0600)
                ck_assert_msg(!strstr(err, "token_file"), "%s warned for a 0600 file: %.500s", progs[p], err);
            else
                ck_assert_msg(strstr(err, want), "%s --check-config on a 0644 secret: no '%s' in '%.500s'",
                              progs[p], want, err);
            ck_assert_ptr_null(strstr(err, "s3cretToken"));
            free(out);
            free(err);
        }
    }
    free(want);
    free(ovr);
    free(token);
    tw_fx_free(fx);
}
END_TEST

TW_SUITE_DEFINE(cli, {
                         {"migrate", test_migrate_concurrent_and_idempotent, 90},
                         {"migrate_from_release2", test_migrate_from_release2, 120},
                         {"submit", test_idempotency_key, 90},
                         {"submit", test_bad_input_changes_nothing, 90},
                         {"submit", test_sql_metacharacters_are_data, 90},
                         {"submit", test_multi_host_and_read_only, 90},
                         {"inspect", test_show_and_list_json, 90},
                         {"inspect", test_json_escaping, 90},
                         {"inspect", test_result_and_cancel_json, 90},
                         {"inspect", test_text_escaping, 90},
                         {"inspect", test_events_json_lines, 90},
                         {"inspect", test_daemons_holds, 90},
                         {"flags", test_check_config, 90},
                         {"flags", test_check_config_secret_modes, 90},
                         {"flags", test_version_and_help, 90},
                     })
