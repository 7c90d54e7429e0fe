/* test_roles.c — issue 26 parts 1 and 2 (contract section 16) against a real PostgreSQL and nats-server: the
 * roles turnwatch_daemon, turnwatch_client and turnwatch_observer that `turnwatch migrate` makes, what each
 * may do (every function of tw and every table of state enumerated from the catalog, so that a new one cannot
 * slip through), the daemons running under turnwatch_daemon alone, a hostile search_path against the SECURITY
 * DEFINER functions, the CLI under least privilege, and the grants surviving migrate again, a re-made code
 * set and a role created by someone else at the same moment. */
#include "suite.h"
#include "turn_helpers.h"

#include <libpq-fe.h>

/* The functions of tw a client or an observer may execute, reviewed one by one: the SQL API and what the
 * CLI's commands call (README "Security"). The test enumerates every function the catalog says either role
 * may execute and fails on one that is not here, so that a grant added to sql/grants/roles.sql without review
 * fails. Each entry says how the function checks its own input (a client may call it with anything): a
 * function whose checks live in its caller (tw.deliver_posted_result, behind tw.post_tool_result) or that
 * lets a client mark events published (tw.outbox_mark_published) is never on this list. Every entry has at
 * least one behavioural probe in `probes` below. */
typedef struct Granted {
    const char *name;
    bool observer; /* an observer may call it too (a reader) */
    const char *checks;
} Granted;
static const Granted granted[] = {
    {"submit_turn", false, "tw.submit_turn_ex's checks (it is one call of it)"},
    {"submit_turns", false,
     "arrays of equal length, at most 10,000 turns a call; each element checked as tw.submit_turn_ex does"},
    {"submit_turn_ex", false,
     "names and identifiers (check_name/check_ident), input required and at most 1 MiB, timeout 1 s to 1 "
     "year;"
     " p_known only compared with the new agent's profile, published through publish_profiles' checks"},
    {"post_tool_result", false, "tw.post_tool_result_ex's checks (it is one call of it)"},
    {"post_tool_result_ex", false,
     "status ok|error only, output required and at most 1 MiB, call id checked; external calls only"},
    {"cancel_turn", false, "a turn id only; the status, code and reason are fixed by the function"},
    {"cancel_turn_ex", false, "a turn id only; the status, code and reason are fixed by the function"},
    {"add_agent", false, "names checked, metadata a JSON object of at most 64 KiB, the profile must exist"},
    {"retire_agent", false, "the name checked; only sets retired_at"},
    {"replay_turn", false, "only a failed or timeout turn; the new turn goes through tw.submit_turn_ex"},
    {"publish_profiles", false, "each name checked, at most 10,000 names a call"},
    {"turn_wait", false, "a turn id; one row read, and this session's waiter row until the turn ends"},
    {"set_limit", false,
     "the name against the name pattern, every number against its bounds (tw.flow_check); changes only "
     "state.limits and the grants of waiting calls"},
    {"remove_limit", false, "the name checked; removes that limit only"},
    {"add_schedule", false,
     "every setting checked (tw.schedule_check: names, cron and time zone by the cron engine, input a JSON "
     "object of at most 1 MiB, the enums and bounds); an INI schedule refused; changes only state.schedules"},
    {"remove_schedule", false, "the name checked; removes that run-time schedule only (an INI one refused)"},
    {"turn_outcome", true, "a turn id; one row"},
    {"turn_show", true, "a turn id; one row"},
    {"turn_history", true, "a turn id; that turn's rows"},
    {"turn_tree", true, "a turn id; a tree of at most max_tree_turns"},
    {"turns_list", true, "limit 1 to 100,000 (as the CLI's --limit)"},
    {"agent_info", true, "an agent id; one row"},
    {"agents_list", true, "limit 1 to 100,000 (as the CLI's --limit)"},
    {"profiles", true, "no input"},
    {"daemons", true, "no input; at most 100 turn ids per daemon"},
    {"dead_letters", true, "limit 1 to 100,000 (as the CLI's --limit)"},
    {"console_turns", true, "limit 1 to 500, at most 20,000 turns read a page"},
    {"console_turn", true, "a turn id; one row"},
    {"timeouts_suggest", true, "names checked, days 1 to 3650, sample 100 to 1,000,000"},
    {"limit_show", true, "a name, only compared; one row"},
    {"limits_list", true, "no input; the limits an operator made"},
    {"schedule_show", true, "a name, only compared; one row"},
    {"schedules_list", true, "no input; every schedule"},
};
/* A statement a client (or an observer, for the readers) runs and the SQLSTATE it must get: out-of-range and
 * oversize input is refused (22023) by the function itself; the rest runs. `%s` is a turn id. */
typedef struct Probe {
    const char *sql;
    const char *want;
} Probe;
static const Probe probes[] = {
    {"SELECT tw.submit_turn(agent => 'echo', channel => 'c', input => jsonb_build_object('x', repeat('a', "
     "1200000)))",
     "22023"},
    {"SELECT tw.submit_turn(agent => 'echo', channel => 'c', input => '{}', timeout_seconds => 0)", "22023"},
    {"SELECT tw.submit_turn(agent => 'no such/agent', channel => 'c', input => '{}')", "22023"},
    {"SELECT count(*) FROM tw.submit_turns(array_fill('echo'::text, ARRAY[10001]), array_fill('c'::text, "
     "ARRAY[10001]), array_fill('{}'::jsonb, ARRAY[10001]))",
     "22023"},
    {"SELECT count(*) FROM tw.submit_turns(ARRAY['echo'], ARRAY['c', 'd'], ARRAY['{}'::jsonb])", "22023"},
    {"SELECT tw.submit_turn_ex('echo', 'c', jsonb_build_object('x', repeat('a', 1200000)), NULL, NULL, NULL, "
     "NULL)",
     "22023"},
    {"SELECT tw.post_tool_result(turn => '%s', call => 'q', status => 'timeout', output => '{}')", "22023"},
    {"SELECT tw.post_tool_result(turn => '%s', call => 'q', status => 'cancelled', output => '{}')", "22023"},
    {"SELECT tw.post_tool_result(turn => '%s', call => 'q', status => NULL, output => '{}')", "22023"},
    {"SELECT tw.post_tool_result(turn => '%s', call => 'q', status => 'ok', output => "
     "jsonb_build_object('x', "
     "repeat('a', 1200000)))",
     "22023"},
    {"SELECT tw.post_tool_result_ex('%s', 'q', 'timeout', '{}')", "22023"},
    {"SELECT tw.post_tool_result_ex('%s', 'q', 'ok', jsonb_build_object('x', repeat('a', 1200000)))",
     "22023"},
    {"SELECT tw.post_tool_result_ex('%s', 'q', 'ok', '{}') ->> 'result'", "00000"},
    {"SELECT tw.cancel_turn(NULL)", "22023"},
    {"SELECT tw.cancel_turn_ex(gen_random_uuid()) ->> 'result'", "00000"},
    {"SELECT tw.add_agent(agent => 'big', profile => 'echo', metadata => jsonb_build_object('x', repeat('a', "
     "70000)))",
     "22023"},
    {"SELECT tw.add_agent(agent => 'x', profile => 'echo', metadata => '[1]')", "22023"},
    {"SELECT tw.retire_agent(agent => 'no such/agent')", "22023"},
    {"SELECT * FROM tw.replay_turn('%s')", "22023"},
    {"SELECT tw.publish_profiles(ARRAY['bad/name'])", "22023"},
    {"SELECT tw.publish_profiles(ARRAY(SELECT 'p' || i FROM generate_series(1, 10001) i))", "22023"},
    {"SELECT tw.turn_outcome('%s')", "00000"},
    {"SELECT tw.turn_wait('%s')", "00000"},
    {"SELECT tw.set_limit('bad/name', 1)", "22023"},
    {"SELECT tw.set_limit('roles_probe', -1)", "22023"},
    {"SELECT tw.remove_limit('bad/name')", "22023"},
    {"SELECT tw.limit_show('no_such_limit')", "00000"},
    {"SELECT tw.limits_list()", "00000"},
    {"SELECT tw.add_schedule('bad/name', 'echo', '* * * * *')", "22023"},
    {"SELECT tw.add_schedule('roles_probe', 'echo', 'not a cron')", "22023"},
    {"SELECT tw.add_schedule('roles_probe', 'echo', '* * * * *', p_input => jsonb_build_object('x', "
     "repeat('a', "
     "1200000)))",
     "22023"},
    {"SELECT tw.remove_schedule('bad/name')", "22023"},
    {"SELECT tw.schedule_show('no_such_schedule')", "00000"},
    {"SELECT tw.schedules_list()", "00000"},
    {"SELECT tw.turn_show('%s')", "00000"},
    {"SELECT tw.turn_history('%s')", "00000"},
    {"SELECT tw.turn_tree('%s')", "00000"},
    {"SELECT tw.turns_list(NULL, NULL, NULL)", "22023"},
    {"SELECT tw.turns_list(NULL, NULL, 100001)", "22023"},
    {"SELECT tw.turns_list(NULL, NULL, 0)", "22023"},
    {"SELECT tw.agent_info('echo')", "00000"},
    {"SELECT tw.agents_list(NULL, NULL, NULL, NULL)", "22023"},
    {"SELECT tw.agents_list(NULL, NULL, NULL, 100001)", "22023"},
    {"SELECT tw.profiles()", "00000"},
    {"SELECT tw.daemons()", "00000"},
    {"SELECT tw.dead_letters(NULL, NULL)", "22023"},
    {"SELECT tw.dead_letters(NULL, 100001)", "22023"},
    {"SELECT tw.console_turns(NULL, NULL, NULL, NULL, NULL, NULL, 501)", "22023"},
    {"SELECT tw.console_turn('%s')", "00000"},
    {"SELECT tw.timeouts_suggest(NULL, NULL, 0)", "22023"},
    {"SELECT tw.timeouts_suggest('bad/name')", "22023"},
};
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- helpers
 * ----------------------------------------------------------------------------------------------------- */

/* A login role holding only `group` (NULL: nothing at all). */
static void make_login(TwFx *fx, const char *login, const char *group)
{
    char *sql = wd_fmt("CREATE ROLE %s LOGIN", login);
    tw_fx_sql_exec(fx, sql, 0);
    free(sql);
    if (group) {
        sql = wd_fmt("GRANT %s TO %s", group, login);
        tw_fx_sql_exec(fx, sql, 0);
        free(sql);
    }
}

static char *login_dsn(TwFx *fx, const char *login)
{
    return wd_fmt("postgresql://%s@127.0.0.1:%d/turnwatch", login, tw_fx_pg_port(fx));
}

/* A session of its own as `login` (trust authentication, as the fixture's cluster has). */
static PGconn *login_conn(TwFx *fx, const char *login)
{
    char *dsn = login_dsn(fx, login);
    PGconn *c = PQconnectdb(dsn);
    ck_assert_msg(PQstatus(c) == CONNECTION_OK, "cannot connect as %s: %s", login, PQerrorMessage(c));
    free(dsn);
    return c;
}

/* The SQLSTATE of running sql on c ("00000" when it succeeded), malloc'd; the message into *msg if given. */
static char *sqlstate_of(PGconn *c, const char *sql, char **msg)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    char *out = strdup(st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK ? "00000" : state ? state : "?????");
    if (msg)
        *msg = strdup(PQresultErrorMessage(r));
    PQclear(r);
    /* A failed statement in a transaction block would poison the rest. */
    if (PQtransactionStatus(c) != PQTRANS_IDLE)
        PQclear(PQexec(c, "ROLLBACK"));
    return out;
}

/* sql on c must fail with SQLSTATE `want`. */
static void expect_state(PGconn *c, const char *who, const char *sql, const char *want)
{
    char *msg = NULL;
    char *got = sqlstate_of(c, sql, &msg);
    ck_assert_msg(strcmp(got, want) == 0, "%s: %s: SQLSTATE %s, expected %s: %s", who, sql, got, want, msg);
    free(got);
    free(msg);
}

/* sql on c must succeed. */
static void expect_ok(PGconn *c, const char *who, const char *sql)
{
    expect_state(c, who, sql, "00000");
}

/* The one value of sql on c, which must succeed (malloc'd; NULL for SQL NULL). */
static char *value_of(PGconn *c, const char *who, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1, "%s: %s failed: %s", who, sql,
                  PQresultErrorMessage(r));
    char *v = PQgetisnull(r, 0, 0) ? NULL : strdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    return v;
}

/* Statements built by the fixture's (superuser) session, one per row of `sql`'s first column. */
static json_t *statements(TwFx *fx, const char *sql, int nparams, const char *p1)
{
    char *wrapped = wd_fmt("SELECT coalesce(json_agg(s), '[]')::text FROM (%s) x (s)", sql);
    char *text = tw_fx_sql_str(fx, wrapped, nparams, p1);
    json_t *list = json_loads(text, 0, NULL);
    ck_assert_ptr_nonnull(list);
    free(text);
    free(wrapped);
    return list;
}

/* Every statement of list must fail on c with 42501; returns how many there were. */
static size_t expect_denied_all(PGconn *c, const char *who, json_t *list)
{
    size_t i;
    json_t *s;
    json_array_foreach(list, i, s) expect_state(c, who, json_string_value(s), "42501");
    return json_array_size(list);
}

/* INSERT, UPDATE, DELETE and SELECT on every table of schema state, as the catalog lists them. */
static json_t *state_table_statements(TwFx *fx)
{
    return statements(fx,
                      "SELECT format(q, format('%I.%I', n.nspname, c.relname), a.attname)"
                      "  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                      "  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = 1"
                      " CROSS JOIN unnest(ARRAY['INSERT INTO %1$s DEFAULT VALUES',"
                      "                         'UPDATE %1$s SET %2$I = %2$I',"
                      "                         'DELETE FROM %1$s', 'SELECT 1 FROM %1$s LIMIT 1']) q"
                      " WHERE n.nspname = 'state' AND c.relkind IN ('r', 'p')",
                      0, NULL);
}

/* A call with NULL arguments of every function of tw whose name is not in `allowed` (a text[] literal),
 * trigger functions left out (they cannot be called). Each argument a subquery, so that the planner cannot
 * fold a strict or immutable call to a constant without running, and so checking, it. */
static json_t *other_function_calls(TwFx *fx, const char *allowed)
{
    return statements(fx,
                      "SELECT format('SELECT tw.%I(%s)', p.proname,"
                      "              (SELECT coalesce(string_agg('(SELECT NULL::' || format_type(t, NULL) || "
                      "')', ', '), '')"
                      "                 FROM unnest(p.proargtypes) t))"
                      "  FROM pg_proc p"
                      " WHERE p.pronamespace = 'tw'::regnamespace AND p.prorettype <> 'trigger'::regtype"
                      "   AND NOT (p.proname = ANY ($1::text[]))",
                      1, allowed);
}

/* The reviewed entry for name, NULL when it has none. */
static const Granted *granted_entry(const char *name)
{
    for (size_t i = 0; i < N_OF(granted); i++)
        if (strcmp(name, granted[i].name) == 0)
            return &granted[i];
    return NULL;
}

/* '{a,b,c}': a text[] literal of the reviewed names (the readers only, or all). */
static char *granted_array(bool readers_only)
{
    char *s = wd_fmt("{");
    for (size_t i = 0, n = 0; i < N_OF(granted); i++)
        if (!readers_only || granted[i].observer)
            wd_append(&s, "%s%s", n++ ? "," : "", granted[i].name);
    wd_append(&s, "}");
    return s;
}

/* Every function of schemas tw and state, as the catalog lists them, against the reviewed list: the daemons
 * execute all of tw; a client exactly the reviewed ones, an observer exactly the reviewed readers (a function
 * either may execute that is not on the list fails, naming it); PUBLIC nothing; and every function a client
 * or observer may execute runs as its owner with the fixed search_path. */
static void check_function_grants(TwFx *fx)
{
    char *text = tw_fx_sql_str(
        fx,
        "SELECT json_agg(json_build_object('f', p.proname, 'schema', p.pronamespace::regnamespace::text,"
        "  'sig', p.oid::regprocedure::text,"
        "  'daemon', has_function_privilege('turnwatch_daemon', p.oid, 'EXECUTE'),"
        "  'client', has_function_privilege('turnwatch_client', p.oid, 'EXECUTE'),"
        "  'observer', has_function_privilege('turnwatch_observer', p.oid, 'EXECUTE'),"
        "  'public', EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a"
        "                     WHERE a.grantee = 0),"
        "  'definer', p.prosecdef, 'stable', p.provolatile IN ('s', 'i'),"
        "  'fixed', coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)))::text"
        "  FROM pg_proc p WHERE p.pronamespace IN ('tw'::regnamespace, 'state'::regnamespace)",
        0);
    json_t *all = json_loads(text, 0, NULL), *f;
    size_t i, n_client = 0, n_observer = 0;
    ck_assert_ptr_nonnull(all);
    ck_assert_uint_gt(json_array_size(all), 100);
    json_array_foreach(all, i, f)
    {
        const char *name = json_string_value(json_object_get(f, "f"));
        const char *sig = json_string_value(json_object_get(f, "sig"));
        bool tw = strcmp(json_string_value(json_object_get(f, "schema")), "tw") == 0;
        const Granted *g = tw ? granted_entry(name) : NULL;
        bool reader = g && g->observer;
        bool client = g != NULL;
        if (tw)
            ck_assert_msg(json_is_true(json_object_get(f, "daemon")), "turnwatch_daemon may not execute %s",
                          sig);
        ck_assert_msg(!json_is_true(json_object_get(f, "public")), "PUBLIC may execute %s", sig);
        ck_assert_msg(json_is_true(json_object_get(f, "client")) == client,
                      client ? "turnwatch_client may not execute %s"
                             : "turnwatch_client may execute %s, which is not on the reviewed list of "
                               "tests/test_roles.c (how does it check its own input?)",
                      sig);
        ck_assert_msg(json_is_true(json_object_get(f, "observer")) == reader,
                      reader ? "turnwatch_observer may not execute %s"
                             : "turnwatch_observer may execute %s, which is not a reviewed reader of "
                               "tests/test_roles.c",
                      sig);
        if (client)
            ck_assert_msg(json_is_true(json_object_get(f, "definer")) &&
                              json_is_true(json_object_get(f, "fixed")),
                          "%s is not SECURITY DEFINER with search_path = pg_catalog, pg_temp", sig);
        if (reader)
            ck_assert_msg(json_is_true(json_object_get(f, "stable")), "the reader %s is not STABLE", sig);
        n_client += client;
        n_observer += reader;
    }
    /* Every name of the list is a function that exists. */
    size_t n_readers = 0;
    for (size_t k = 0; k < N_OF(granted); k++)
        n_readers += granted[k].observer;
    ck_assert_uint_ge(n_client, N_OF(granted));
    ck_assert_uint_ge(n_observer, n_readers);
    json_decref(all);
    free(text);
}

/* sql with turn in place of its "%s", if it has one (malloc'd). */
static char *with_turn(const char *sql, const char *turn)
{
    const char *at = strstr(sql, "%s");
    return at ? wd_fmt("%.*s%s%s", (int)(at - sql), sql, turn, at + 2) : strdup(sql);
}

/* Each probe on c (its turn id in place of %s): the SQLSTATE it must get. Every reviewed function is probed
 * at least once, so that an entry of the list cannot go untried. */
static void run_probes(PGconn *c, const char *who, const char *turn, bool readers_only)
{
    for (size_t i = 0; i < N_OF(granted); i++) {
        char *call = wd_fmt("tw.%s(", granted[i].name);
        bool found = false;
        for (size_t k = 0; k < N_OF(probes) && !found; k++)
            found = strstr(probes[k].sql, call) != NULL;
        ck_assert_msg(found, "no probe of tw.%s in tests/test_roles.c", granted[i].name);
        free(call);
    }
    for (size_t k = 0; k < N_OF(probes); k++) {
        const char *name = probes[k].sql + strcspn(probes[k].sql, ".") + 1;
        const Granted *g = NULL;
        for (size_t i = 0; i < N_OF(granted) && !g; i++)
            if (strncmp(name, granted[i].name, strlen(granted[i].name)) == 0 &&
                name[strlen(granted[i].name)] == '(')
                g = &granted[i];
        if (readers_only && !(g && g->observer))
            continue;
        char *sql = with_turn(probes[k].sql, turn);
        expect_state(c, who, sql, probes[k].want);
        free(sql);
    }
}

/* The logins every case uses: one per group role, and one with nothing. */
static void make_logins(TwFx *fx)
{
    make_login(fx, "app_client", "turnwatch_client");
    make_login(fx, "app_observer", "turnwatch_observer");
    make_login(fx, "app_daemon", "turnwatch_daemon");
    make_login(fx, "app_nobody", NULL);
}

/* ---- migrate makes the roles; each may do exactly its part
 * ------------------------------------------------------------------------------- */

START_TEST(test_grants_enumerated)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    /* Three group roles that cannot log in. */
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM pg_roles WHERE NOT rolcanlogin AND rolname IN "
                                   "('turnwatch_daemon', 'turnwatch_client', 'turnwatch_observer')",
                                   0),
                     3);
    check_function_grants(fx);
    make_logins(fx);

    /* No table of state, for anyone but the daemons: 42501 for every statement. */
    json_t *tables = state_table_statements(fx);
    ck_assert_uint_ge(json_array_size(tables), 4 * 20);
    PGconn *client = login_conn(fx, "app_client"), *observer = login_conn(fx, "app_observer"),
           *nobody = login_conn(fx, "app_nobody"), *daemon = login_conn(fx, "app_daemon");
    expect_denied_all(client, "app_client", tables);
    expect_denied_all(observer, "app_observer", tables);
    expect_denied_all(nobody, "app_nobody", tables);
    /* The daemons read and write them (a statement that changes no row, to leave the data alone). */
    expect_ok(daemon, "app_daemon", "UPDATE state.turns SET status = status WHERE false");
    expect_ok(daemon, "app_daemon", "DELETE FROM state.agent_inbox WHERE false");
    /* ... but not the migrations' own. */
    expect_state(daemon, "app_daemon", "DELETE FROM state.schema_migrations", "42501");

    /* Every other function, called for real with NULL arguments: 42501 before anything runs. */
    char *client_ok = granted_array(false);
    char *observer_ok = granted_array(true);
    json_t *not_client = other_function_calls(fx, client_ok),
           *not_observer = other_function_calls(fx, observer_ok), *any = other_function_calls(fx, "{}");
    ck_assert_uint_gt(expect_denied_all(client, "app_client", not_client), 90);
    ck_assert_uint_gt(expect_denied_all(observer, "app_observer", not_observer), 100);
    ck_assert_uint_gt(expect_denied_all(nobody, "app_nobody", any), 110);
    /* A few by hand: a step's apply, a watchdog action, a dispatch. */
    expect_state(client, "app_client", "SELECT tw.apply_steps('[]', 'w', '{}')", "42501");
    expect_state(client, "app_client", "SELECT tw.wd_tool_timeouts(10)", "42501");
    expect_state(client, "app_client", "SELECT tw.dispatch_next('echo')", "42501");
    expect_state(observer, "app_observer", "SELECT tw.cancel_turn(gen_random_uuid())", "42501");
    expect_state(nobody, "app_nobody", "SELECT tw.turn_show(gen_random_uuid())", "42501");
    json_decref(not_client);
    json_decref(not_observer);
    json_decref(any);
    json_decref(tables);
    free(client_ok);
    free(observer_ok);
    PQfinish(client);
    PQfinish(observer);
    PQfinish(nobody);
    PQfinish(daemon);
    wd_done(fx);
}
END_TEST

/* ---- a client submits, cancels, adds and retires agents; an observer reads and cannot write
 * ----------------------------------------------------------------------------------------------------------
 */

START_TEST(test_client_and_observer)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    make_logins(fx);
    PGconn *client = login_conn(fx, "app_client"), *observer = login_conn(fx, "app_observer");

    /* The SQL API by named parameters (no daemon runs: the turns wait). */
    char *t = value_of(client, "app_client",
                       "SELECT tw.submit_turn(agent => 'echo', channel => 'c1', input => '{\"x\": 1}', "
                       "timeout_seconds => 600, idempotency_key => 'k1')");
    ck_assert_ptr_nonnull(t);
    char *again = value_of(client, "app_client",
                           "SELECT tw.submit_turn(agent => 'echo', channel => 'c1', input => '{}', "
                           "idempotency_key => 'k1')");
    ck_assert_str_eq(again, t);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turns WHERE turn_id = $1 AND agent = 'echo'"
                                   " AND deadline_at = created_at + interval '600 seconds'",
                                   1, t),
                     1);
    char *added =
        value_of(client, "app_client",
                 "SELECT tw.add_agent(agent => 'helper-1', profile => 'echo', metadata => '{\"a\": 1}')");
    ck_assert_str_eq(added, "t");
    char *many = value_of(client, "app_client",
                          "SELECT count(*) FROM tw.submit_turns(ARRAY['helper-1', 'echo'], ARRAY['c2', 'c3'],"
                          " ARRAY['{}', '{}']::jsonb[])");
    ck_assert_str_eq(many, "2");
    char *q = wd_fmt("SELECT tw.cancel_turn(turn => '%s')", t);
    char *cancelled = value_of(client, "app_client", q);
    ck_assert_str_eq(cancelled, "cancelled");
    char *retired = value_of(client, "app_client", "SELECT tw.retire_agent(agent => 'helper-1')");
    ck_assert_str_eq(retired, "t");
    /* A result for a call nobody waits for: an answer, not a refusal. */
    char *q2 =
        wd_fmt("SELECT tw.post_tool_result(turn => '%s', call => 'x', status => 'ok', output => '{}')", t);
    char *posted = value_of(client, "app_client", q2);
    ck_assert_str_eq(posted, "unknown_call");
    /* The client reads its turn. */
    char *q3 = wd_fmt("SELECT tw.turn_outcome('%s') ->> 'status'", t);
    char *status = value_of(client, "app_client", q3);
    ck_assert_str_eq(status, "cancelled");
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.agents WHERE agent = 'helper-1' AND "
                                   "retired_at IS NOT NULL",
                                   0),
                     1);

    /* The observer reads every reader ... */
    char *reads[] = {
        wd_fmt("SELECT tw.turn_show('%s') ->> 'status'", t),
        wd_fmt("SELECT jsonb_array_length(tw.turn_history('%s'))", t),
        wd_fmt("SELECT tw.turn_tree('%s') IS NOT NULL", t),
        wd_fmt("SELECT tw.turn_outcome('%s') ->> 'status'", t),
        wd_fmt("SELECT tw.console_turn('%s') ->> 'status'", t),
        wd_fmt("SELECT jsonb_array_length(tw.turns_list(NULL, NULL, 10))"),
        wd_fmt(
            "SELECT jsonb_array_length(tw.console_turns(NULL, NULL, NULL, NULL, NULL, NULL, 10) -> 'turns')"),
        wd_fmt("SELECT tw.agent_info('helper-1') ->> 'profile'"),
        wd_fmt("SELECT jsonb_array_length(tw.agents_list(NULL, NULL, NULL, 10))"),
        wd_fmt("SELECT jsonb_array_length(tw.profiles())"),
        wd_fmt("SELECT jsonb_array_length(tw.daemons())"),
        wd_fmt("SELECT jsonb_array_length(tw.dead_letters(NULL, 10))"),
    };
    const char *want[] = {"cancelled", NULL,   "t",  "cancelled", "cancelled", "3",
                          "3",         "echo", NULL, NULL,        "0",         "0"};
    for (size_t i = 0; i < N_OF(reads); i++) {
        char *v = value_of(observer, "app_observer", reads[i]);
        if (want[i])
            ck_assert_msg(v && strcmp(v, want[i]) == 0, "%s gave %s, not %s", reads[i], v ? v : "NULL",
                          want[i]);
        else
            ck_assert_msg(v && atoi(v) > 0, "%s gave %s", reads[i], v ? v : "NULL");
        free(v);
        free(reads[i]);
    }
    /* ... and writes nothing. */
    expect_state(observer, "app_observer",
                 "SELECT tw.submit_turn(agent => 'echo', channel => 'c', input => '{}')", "42501");
    expect_state(observer, "app_observer", "SELECT tw.add_agent(agent => 'x', profile => 'echo')", "42501");
    expect_state(observer, "app_observer", "SELECT tw.retire_agent(agent => 'echo')", "42501");
    char *q4 =
        wd_fmt("SELECT tw.post_tool_result(turn => '%s', call => 'x', status => 'ok', output => '{}')", t);
    expect_state(observer, "app_observer", q4, "42501");
    /* A client's read-only session cannot write through the API either (the console's, read only, stays so).
     */
    PQclear(PQexec(observer, "SET default_transaction_read_only = on"));
    char *v = value_of(observer, "app_observer", "SELECT jsonb_array_length(tw.turns_list(NULL, NULL, 10))");
    ck_assert_str_eq(v, "3");
    free(v);

    free(q);
    free(q2);
    free(q3);
    free(q4);
    free(t);
    free(again);
    free(added);
    free(many);
    free(cancelled);
    free(retired);
    free(posted);
    free(status);
    PQfinish(client);
    PQfinish(observer);
    wd_done(fx);
}
END_TEST

/* ---- what a client may call can neither suppress nor forge
 * ----------------------------------------------------------------------------------------------------------
 */

/* The value of the history's column `col` of turn t's rows that match `cond`, joined by '|' (NULL: none). */
static char *history_of(TwFx *fx, const char *t, const char *col, const char *cond)
{
    char *sql =
        wd_fmt("SELECT string_agg(%s, '|' ORDER BY id) FROM state.turn_history WHERE turn_id = $1 AND %s",
               col, cond);
    char *v = tw_fx_sql_str(fx, sql, 1, t);
    free(sql);
    return v;
}

START_TEST(test_client_cannot_suppress_or_forge)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    make_logins(fx);
    PGconn *client = login_conn(fx, "app_client"), *observer = login_conn(fx, "app_observer");
    /* No daemon runs: the turns wait. */
    char *t = value_of(client, "app_client",
                       "SELECT tw.submit_turn(agent => 'echo', channel => 'c', input => '{}')");

    /* Every reviewed function refuses what is out of its range by itself. */
    run_probes(client, "app_client", t, false);
    run_probes(observer, "app_observer", t, true);

    /* Hiding a cancel's events: mark them published in the transaction that wrote them. Refused, and with it
     * the cancel. */
    char *attack =
        wd_fmt("SELECT tw.outbox_mark_published(ARRAY(SELECT (e->>'event_id')::uuid FROM "
               "jsonb_array_elements(tw.cancel_turn_ex('%s'::uuid)->'publish') e WHERE e ? 'event_id'))",
               t);
    expect_state(client, "app_client", attack, "42501");
    char *q = wd_fmt("SELECT tw.turn_outcome('%s') ->> 'status'", t);
    char *status = value_of(client, "app_client", q);
    ck_assert_str_ne(status, "cancelled"); /* dispatched by its submit: the agent was idle */
    free(status);
    /* A result past tw.post_tool_result's checks (status timeout, any size): refused. */
    char *deliver = wd_fmt("SELECT tw.deliver_posted_result('%s'::uuid, 'q', 'timeout', NULL, NULL)", t);
    expect_state(client, "app_client", deliver, "42501");
    expect_state(client, "app_client", "SELECT tw.outbox_mark_published(ARRAY[gen_random_uuid()])", "42501");

    /* A reason and an actor that claim a watchdog's act, set in the session and in the transaction: the
     * history has the client's actor (sql) and the cancel's own reason. */
    expect_ok(client, "app_client", "SET tw.reason = 'timeout_reaped_by_watchdog: forged by a client'");
    expect_ok(client, "app_client", "SET tw.actor = 'pmo-host:4242'");
    PQclear(PQexec(client, "BEGIN"));
    PQclear(PQexec(client, "SELECT set_config('tw.reason', 'turn_deadline_exceeded: forged too', true)"));
    char *cq = wd_fmt("SELECT tw.cancel_turn(turn => '%s')", t);
    char *cancelled = value_of(client, "app_client", cq);
    PQclear(PQexec(client, "COMMIT"));
    ck_assert_str_eq(cancelled, "cancelled");
    char *forged = history_of(fx, t, "reason", "reason LIKE '%forged%'");
    ck_assert_msg(!forged, "the history has the client's forged reason: %s", forged ? forged : "");
    char *actors = history_of(fx, t, "actor", "actor = 'pmo-host:4242'");
    ck_assert_msg(!actors, "the history has the client's forged actor: %s", actors ? actors : "");
    char *row = history_of(fx, t, "actor || ' ' || reason", "to_status = 'cancelled'");
    ck_assert_msg(row && strcmp(row, "sql cancelled: cancelled by request") == 0,
                  "the cancel's history row is '%s'", row ? row : "NULL");
    free(row);
    /* The CLI's own name is the client's to give. */
    expect_ok(client, "app_client", "SET tw.actor = 'cli'");
    char *t2 = value_of(client, "app_client",
                        "SELECT tw.submit_turn(agent => 'echo', channel => 'c', input => '{}')");
    row = history_of(fx, t2, "actor || ' ' || reason", "from_status IS NULL");
    ck_assert_msg(row && strcmp(row, "cli submitted") == 0, "the submit's history row is '%s'",
                  row ? row : "NULL");
    free(row);

    free(t);
    free(t2);
    free(attack);
    free(q);
    free(deliver);
    free(cq);
    free(cancelled);
    PQfinish(client);
    PQfinish(observer);
    wd_done(fx);
}
END_TEST

/* Subjects of interest by turn id: evt.agent.tester.task cancelled and evt.agent.tester.state idle. */
typedef struct Seen {
    const char *turn, *subject, *status;
} Seen;

static bool seen_pred(const char *subject, const json_t *data, void *arg)
{
    const Seen *s = arg;
    const char *turn = json_string_value(json_object_get(data, "turn_id"));
    const char *status = json_string_value(json_object_get(data, "status"));
    return strcmp(subject, s->subject) == 0 && turn && strcmp(turn, s->turn) == 0 && status &&
           strcmp(status, s->status) == 0;
}

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

/* With the daemons running: the attack from the SQL API still fails, and a client's `turnwatch cancel` (which
 * leaves its events to the PMO's relay: a client may not mark events published) is seen by an observer on
 * evt.agent.>: the task event cancelled and the agent's state idle. Also measured, not asserted: from the
 * start of `turnwatch cancel` to the task event's arrival, under the client role (relayed) and under the
 * daemon role (published by the CLI itself, then marked). */
START_TEST(test_client_cancel_events_relayed)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    make_logins(fx);
    char *d_dsn = login_dsn(fx, "app_daemon"), *c_dsn = login_dsn(fx, "app_client");
    char *d_ovr = wd_fmt("[postgres]\ndsn = %s\n", d_dsn), *c_ovr = wd_fmt("[postgres]\ndsn = %s\n", c_dsn);
    const char *d_cfg = tw_fx_write_config(fx, "daemon.ini", d_ovr);
    const char *c_cfg = tw_fx_write_config(fx, "client.ini", c_ovr);
    TwFxEvents *ev = tw_fx_events_new(fx, "evt.agent.>");
    TwFxProc *pmo = tw_fx_start_pmo(fx, d_cfg), *w = tw_fx_start_worker(fx, d_cfg);
    PGconn *client = login_conn(fx, "app_client");
    enum { RUNS = 6 };
    long long took[2][RUNS];

    for (int role = 0; role < 2; role++)
        for (int i = 0; i < RUNS; i++) {
            char *t = value_of(client, "app_client",
                               "SELECT tw.submit_turn(agent => 'tester', channel => 'c', input => "
                               "'{\"mode\":\"sleep\",\"seconds\":60}')");
            WD_STATUS_IS(fx, t, "running");
            if (role == 0 && i == 0) {
                char *attack =
                    wd_fmt("SELECT tw.outbox_mark_published(ARRAY(SELECT (e->>'event_id')::uuid FROM "
                           "jsonb_array_elements(tw.cancel_turn_ex('%s'::uuid)->'publish') e WHERE e ? "
                           "'event_id'))",
                           t);
                expect_state(client, "app_client", attack, "42501");
                free(attack);
                ck_assert_int_eq(
                    tw_fx_sql_int(
                        fx, "SELECT count(*) FROM state.turns WHERE turn_id = $1 AND status = 'running'", 1,
                        t),
                    1);
            }
            char *out = NULL, *err = NULL;
            int64_t t0 = tw_fx_now_ms();
            int rc = tw_fx_cli(fx, &out, &err, "-c", role == 0 ? c_cfg : d_cfg, "cancel", t, NULL);
            ck_assert_msg(rc == 0, "cancel as %s exited %d: %s", role == 0 ? "app_client" : "app_daemon", rc,
                          err);
            free(out);
            free(err);
            Seen task = {t, "evt.agent.tester.task", "cancelled"},
                 idle = {t, "evt.agent.tester.state", "idle"};
            if (!tw_fx_events_wait_if(ev, seen_pred, &task, 1, WD_WAIT_MS) ||
                !tw_fx_events_wait_if(ev, seen_pred, &idle, 1, WD_WAIT_MS)) {
                tw_fx_events_dump(ev);
                ck_abort_msg("the observer did not see %s's task cancelled and idle events", t);
            }
            int64_t at = 0;
            json_t *e = tw_fx_events_get_if(ev, seen_pred, &task, 0, NULL, &at);
            json_decref(e);
            took[role][i] = at - t0;
            free(t);
        }
    for (int role = 0; role < 2; role++) {
        qsort(took[role], RUNS, sizeof took[role][0], cmp_ll);
        fprintf(stderr,
                "roles: turnwatch cancel to its task event on NATS, %s: median %lld ms, min %lld, max %lld "
                "(%d runs)\n",
                role == 0 ? "client role (the PMO's relay publishes)"
                          : "daemon role (the CLI publishes and marks)",
                took[role][RUNS / 2], took[role][0], took[role][RUNS - 1], RUNS);
    }
    ck_assert_int_eq(tw_fx_proc_terminate(w, 30000), 0);
    ck_assert_int_eq(tw_fx_proc_terminate(pmo, 30000), 0);
    PQfinish(client);
    free(d_dsn);
    free(c_dsn);
    free(d_ovr);
    free(c_ovr);
    wd_done(fx);
}
END_TEST

/* ---- the daemons under turnwatch_daemon alone
 * ----------------------------------------------------------------------------------------------------------
 */

START_TEST(test_daemons_under_daemon_role)
{
    /* The fixture migrates as postgres (the owner); the daemons get a config whose DSN is app_daemon's, the
     * CLI one whose DSN is app_client's. */
    const char *ovr = "[worker]\nsuspend_timeout_seconds = 2\n"
                      "[tool.xa]\nexternal = true\ntimeout_seconds = 1\nsuspend_timeout_seconds = 1\n";
    TwFx *fx = tw_fx_new_migrated(ovr);
    make_logins(fx);
    char *d_dsn = login_dsn(fx, "app_daemon"), *c_dsn = login_dsn(fx, "app_client");
    char *d_ovr = wd_fmt("%s[postgres]\ndsn = %s\n", ovr, d_dsn);
    char *c_ovr = wd_fmt("%s[postgres]\ndsn = %s\n", ovr, c_dsn);
    const char *d_cfg = tw_fx_write_config(fx, "daemon.ini", d_ovr);
    const char *c_cfg = tw_fx_write_config(fx, "client.ini", c_ovr);
    TwFxEvents *ev = tw_fx_events_new(fx, "evt.>");
    TwFxProc *pmo = tw_fx_start_pmo(fx, d_cfg), *w = tw_fx_start_worker(fx, d_cfg);
    PGconn *client = login_conn(fx, "app_client");

    /* A turn with a tool call a program runs, submitted through the CLI as app_client. */
    char *out = NULL, *err = NULL;
    int rc = tw_fx_cli(
        fx, &out, &err, "-c", c_cfg, "submit", "--agent", "tester", "--channel", "c1", "--input",
        "{\"mode\":\"tools\",\"calls\":[{\"id\":\"e\",\"tool\":\"echo\",\"args\":{\"v\":1}}]}", NULL);
    ck_assert_msg(rc == 0, "submit as app_client exited %d: %s", rc, err);
    out[strcspn(out, "\n")] = '\0';
    char *t1 = strdup(out);
    free(out);
    free(err);
    /* One whose call of an external tool no one answers: rule 2.2's report ends the wait. */
    char *t2 = value_of(client, "app_client",
                        "SELECT tw.submit_turn(agent => 'tester', channel => 'c2', input => "
                        "'{\"mode\":\"tools\",\"calls\":[{\"id\":\"a\",\"tool\":\"xa\",\"args\":{}}]}')");
    /* One whose external call the client answers (CLI, then SQL). */
    char *t3 = value_of(client, "app_client",
                        "SELECT tw.submit_turn(agent => 'tester', channel => 'c3', input => "
                        "'{\"mode\":\"tools\",\"calls\":[{\"id\":\"q\",\"tool\":\"ext\",\"args\":{}}]}')");
    WD_STATUS_IS(fx, t1, "done");
    WD_STATUS_IS(fx, t3, "suspended");
    out = err = NULL;
    rc = tw_fx_cli(fx, &out, &err, "-c", c_cfg, "tool-result", "--turn", t3, "--call", "q", "--output",
                   "{\"answer\":42}", NULL);
    ck_assert_msg(rc == 0, "tool-result as app_client exited %d: %s", rc, err);
    free(out);
    free(err);
    WD_STATUS_IS(fx, t3, "done");
    WD_STATUS_IS(fx, t2, "done");
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1 "
                                   "AND wait_status = 'timeout' AND error ->> 'code' = 'tool_timeout'",
                                   1, t2),
                     1);
    TwFxProc *procs[] = {w, pmo};
    ck_assert_uint_ge(wd_action_count(procs, 2, "2.2 tool_timeouts"), 1);
    /* Their events arrived: the final ones and the tool's. */
    const char *turns[] = {t1, t2, t3};
    for (size_t i = 0; i < 3; i++)
        if (!tw_fx_events_wait(ev, "evt.agent.tester.task", turns[i], 1, WD_WAIT_MS)) {
            tw_fx_events_dump(ev);
            ck_abort_msg("no task event for %s", turns[i]);
        }
    /* A turn deadline, the PMO's rule. */
    char *t4 = value_of(client, "app_client",
                        "SELECT tw.submit_turn(agent => 'tester', channel => 'c4', input => "
                        "'{\"mode\":\"sleep\",\"seconds\":8}', timeout_seconds => 1)");
    WD_STATUS_IS(fx, t4, "timeout");
    ck_assert_msg(tw_fx_events_wait(ev, "evt.agent.tester.task", t4, 1, WD_WAIT_MS), "no task event for %s",
                  t4);
    /* The daemons' sessions were app_daemon's, and nobody was refused anything: no permission error in
     * either log. */
    ck_assert_int_ge(
        tw_fx_sql_int(fx, "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app_daemon'", 0), 4);
    for (size_t i = 0; i < 2; i++) {
        char *log = tw_fx_proc_log(procs[i]);
        if (strstr(log, "permission denied") || strstr(log, "42501")) {
            tw_fx_proc_dump(procs[i]);
            ck_abort_msg("a daemon was refused something under turnwatch_daemon");
        }
        free(log);
    }
    ck_assert_int_eq(tw_fx_proc_terminate(w, 30000), 0);
    ck_assert_int_eq(tw_fx_proc_terminate(pmo, 30000), 0);
    free(t1);
    free(t2);
    free(t3);
    free(t4);
    PQfinish(client);
    free(d_dsn);
    free(c_dsn);
    free(d_ovr);
    free(c_ovr);
    wd_done(fx);
}
END_TEST

/* ---- a hostile search_path cannot change what a SECURITY DEFINER function does
 * ----------------------------------------------------------------------------------------------------------
 */

/* Functions named like those our functions call, in a schema the client puts first, each a better match for
 * the arguments than pg_catalog's; each records who called it (run as the owner, it could do anything the
 * owner may). */
static const char evil_sql[] =
    "CREATE SCHEMA evil;"
    "CREATE TABLE evil.calls (fn text, who text);"
    "GRANT USAGE ON SCHEMA evil TO PUBLIC; GRANT INSERT, SELECT ON evil.calls TO PUBLIC;"
    /* submit_turn_ex: make_interval(secs => integer) is an exact match where pg_catalog's wants a double */
    "CREATE FUNCTION evil.make_interval(secs integer) RETURNS interval LANGUAGE sql AS"
    " $$ INSERT INTO evil.calls VALUES ('make_interval', current_user) RETURNING interval '100 years' $$;"
    "CREATE FUNCTION evil.jsonb_build_object(text, text, text, jsonb) RETURNS jsonb LANGUAGE sql AS"
    " $$ INSERT INTO evil.calls VALUES ('jsonb_build_object', current_user) RETURNING '{\"code\": "
    "\"evil\"}'::jsonb "
    "$$;"
    /* and a table named like ours */
    "CREATE TABLE evil.turns (LIKE state.turns); GRANT ALL ON evil.turns TO PUBLIC;"
    /* (made by the owner, whose new functions start closed since migrate) */
    "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA evil TO PUBLIC;";

START_TEST(test_hostile_search_path)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    make_logins(fx);
    tw_fx_sql_exec(fx, evil_sql, 0);
    PGconn *client = login_conn(fx, "app_client");
    PQclear(PQexec(client, "SET search_path = evil, public"));
    /* The traps work: in this session calls as our functions write them land in evil. */
    char *trap = value_of(client, "app_client", "SELECT make_interval(secs => 60)::text");
    ck_assert_str_eq(trap, "100 years");
    free(trap);
    trap = value_of(client, "app_client",
                    "SELECT jsonb_build_object('code', 'tool_error', 'message', '\"m\"'::jsonb) ->> 'code'");
    ck_assert_str_eq(trap, "evil");
    free(trap);
    tw_fx_sql_exec(fx, "TRUNCATE evil.calls", 0);

    char *t = value_of(client, "app_client",
                       "SELECT tw.submit_turn(agent => 'tester', channel => 'c1', input => "
                       "'{\"mode\":\"tools\",\"calls\":[{\"id\":\"q\",\"tool\":\"ext\",\"args\":{}}]}', "
                       "timeout_seconds => 60)");
    char *deadline = tw_fx_sql_str(
        fx, "SELECT (deadline_at - created_at)::text FROM state.turns WHERE turn_id = $1", 1, t);
    ck_assert_msg(deadline && strcmp(deadline, "00:01:00") == 0,
                  "the turn's deadline is %s after its submit, not 60 s", deadline ? deadline : "NULL");
    free(deadline);
    char *added = value_of(client, "app_client", "SELECT tw.add_agent(agent => 'h1', profile => 'echo')");
    ck_assert_str_eq(added, "t");
    char *q = wd_fmt("SELECT tw.post_tool_result(turn => '%s', call => 'q', status => 'error', output => "
                     "'{\"message\": \"m\"}'::jsonb #> '{message}')",
                     t);
    char *posted = value_of(client, "app_client", q);
    ck_assert_str_ne(posted, "accepted"); /* no worker ran the step: the call was never issued */
    char *q2 = wd_fmt("SELECT tw.cancel_turn(turn => '%s')", t);
    char *cancelled = value_of(client, "app_client", q2);
    ck_assert_str_eq(cancelled, "cancelled");
    char *shown = wd_fmt("SELECT tw.turn_show('%s') ->> 'status'", t);
    char *status = value_of(client, "app_client", shown);
    ck_assert_str_eq(status, "cancelled");
    /* None of the evil functions ran, as the owner or anyone. */
    char *calls = tw_fx_sql_str(fx, "SELECT string_agg(fn || ' as ' || who, ', ') FROM evil.calls", 0);
    ck_assert_msg(!calls, "evil functions ran inside turnwatch's functions: %s", calls ? calls : "");
    free(t);
    free(added);
    free(q);
    free(posted);
    free(q2);
    free(cancelled);
    free(shown);
    free(status);
    PQfinish(client);
    wd_done(fx);
}
END_TEST

/* ---- the CLI under least privilege
 * ----------------------------------------------------------------------------------------------------------
 */

/* `turnwatch ARGS` under the config cfg: its exit code; stdout and stderr into *out and *err (malloc'd). */
static int cli_as(TwFx *fx, const char *cfg, char **out, char **err, const char *a1, const char *a2,
                  const char *a3, const char *a4, const char *a5, const char *a6, const char *a7)
{
    *out = *err = NULL;
    return tw_fx_cli(fx, out, err, "-c", cfg, a1, a2, a3, a4, a5, a6, a7, NULL);
}

START_TEST(test_cli_least_privilege)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    make_logins(fx);
    const char *logins[] = {"app_observer", "app_client", "app_nobody"};
    const char *cfg[3];
    for (size_t i = 0; i < 3; i++) {
        char *dsn = login_dsn(fx, logins[i]);
        char *ovr = wd_fmt("[postgres]\ndsn = %s\n", dsn);
        char *name = wd_fmt("%s.ini", logins[i]);
        cfg[i] = tw_fx_write_config(fx, name, ovr);
        free(dsn);
        free(ovr);
        free(name);
    }
    const char *observer = cfg[0], *client = cfg[1], *nobody = cfg[2];
    char *out, *err;

    /* The observer may not submit: exit 1, naming the role it lacks and the grant. */
    int rc = cli_as(fx, observer, &out, &err, "submit", "--agent", "echo", "--channel", "c", "--input", "{}");
    ck_assert_msg(rc == 1 && strstr(err, "`turnwatch submit` needs the role turnwatch_client") &&
                      strstr(err, "GRANT turnwatch_client TO app_observer"),
                  "submit as app_observer exited %d: %s", rc, err);
    ck_assert_int_eq(strchr(err, '\n') - err + 1, (long)strlen(err)); /* one line */
    free(out);
    free(err);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns", 0), 0);

    /* The client submits, adds and retires an agent, cancels. */
    rc = cli_as(fx, client, &out, &err, "submit", "--agent", "echo", "--channel", "c", "--input", "{}");
    ck_assert_msg(rc == 0, "submit as app_client exited %d: %s", rc, err);
    out[strcspn(out, "\n")] = '\0';
    char *t = strdup(out);
    free(out);
    free(err);
    rc = cli_as(fx, client, &out, &err, "agent", "add", "h1", "--profile", "echo", NULL, NULL);
    ck_assert_msg(rc == 0, "agent add as app_client exited %d: %s", rc, err);
    free(out);
    free(err);
    rc = cli_as(fx, client, &out, &err, "agent", "retire", "h1", NULL, NULL, NULL, NULL);
    ck_assert_msg(rc == 0, "agent retire as app_client exited %d: %s", rc, err);
    free(out);
    free(err);
    rc = cli_as(fx, client, &out, &err, "cancel", t, NULL, NULL, NULL, NULL, NULL);
    ck_assert_msg(rc == 0, "cancel as app_client exited %d: %s", rc, err);
    free(out);
    free(err);

    /* Every read command works for the observer (and the client). */
    const char *reads[][4] = {
        {"turn", "show", t, NULL},     {"turn", "history", t, NULL},   {"turn", "tree", t, NULL},
        {"turns", "list", NULL},       {"dead-letters", "list", NULL}, {"daemons", NULL},
        {"agent", "show", "h1", NULL}, {"agents", "list", NULL},       {"profiles", NULL},
    };
    for (size_t i = 0; i < N_OF(reads); i++)
        for (size_t k = 0; k < 2; k++) {
            rc = cli_as(fx, k ? client : observer, &out, &err, reads[i][0], reads[i][1], reads[i][2], NULL,
                        NULL, NULL, NULL);
            ck_assert_msg(rc == 0, "%s %s as %s exited %d: %s", reads[i][0], reads[i][1] ? reads[i][1] : "",
                          k ? "app_client" : "app_observer", rc, err);
            if (i == 0)
                ck_assert_msg(strstr(out, "cancelled"), "turn show: %s", out);
            free(out);
            free(err);
        }
    /* A role with none of them reads nothing, and is told which it needs. */
    rc = cli_as(fx, nobody, &out, &err, "turns", "list", NULL, NULL, NULL, NULL, NULL);
    ck_assert_msg(rc == 1 && strstr(err, "`turnwatch turns list` needs the role turnwatch_observer") &&
                      strstr(err, "GRANT turnwatch_observer TO app_nobody"),
                  "turns list as app_nobody exited %d: %s", rc, err);
    free(out);
    free(err);
    /* The client and the observer may not write what is not theirs: the client's migrate names the owner. */
    rc = cli_as(fx, client, &out, &err, "migrate", NULL, NULL, NULL, NULL, NULL, NULL);
    ck_assert_msg(rc == 1 && strstr(err, "belong to the role postgres") && strstr(err, "not as app_client"),
                  "migrate as app_client exited %d: %s", rc, err);
    free(out);
    free(err);
    rc = cli_as(fx, observer, &out, &err, "cancel", t, NULL, NULL, NULL, NULL, NULL);
    ck_assert_msg(rc == 1 && strstr(err, "needs the role turnwatch_client"),
                  "cancel as app_observer exited %d: %s", rc, err);
    free(out);
    free(err);
    /* Each command's help names its role. */
    rc = cli_as(fx, observer, &out, &err, "help", "submit", NULL, NULL, NULL, NULL, NULL);
    ck_assert_msg(rc == 0 && strstr(out, "PostgreSQL role: turnwatch_client"), "help submit: %s", out);
    free(out);
    free(err);
    free(t);
    wd_done(fx);
}
END_TEST

/* A daemon whose role lacks turnwatch_daemon says so, naming the role, keeps running, and works once granted.
 */
START_TEST(test_daemon_without_role)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    make_logins(fx);
    char *dsn = login_dsn(fx, "app_nobody");
    char *ovr = wd_fmt("[postgres]\ndsn = %s\n", dsn);
    const char *cfg = tw_fx_write_config(fx, "nobody.ini", ovr);
    TwFxProc *pmo = tw_fx_start_pmo(fx, cfg), *w = tw_fx_start_worker(fx, cfg);
    TwFxProc *procs[] = {pmo, w};
    for (size_t i = 0; i < 2; i++) {
        WdLogHas h = {procs[i], "needs the role turnwatch_daemon", "GRANT turnwatch_daemon TO app_nobody"};
        if (!tw_fx_wait_until(wd_log_line_has, &h, WD_WAIT_MS)) {
            tw_fx_proc_dump(procs[i]);
            ck_abort_msg("no ERROR naming turnwatch_daemon and the role in the log");
        }
    }
    char *t = wd_submit(fx, "echo", "{}");
    tw_fx_sleep_ms(1500);
    ck_assert(tw_fx_proc_alive(pmo) && tw_fx_proc_alive(w));
    /* The grant while they run: the turn goes on to done. */
    tw_fx_sql_exec(fx, "GRANT turnwatch_daemon TO app_nobody", 0);
    WD_STATUS_IS(fx, t, "done");
    ck_assert_int_eq(tw_fx_proc_terminate(w, 30000), 0);
    ck_assert_int_eq(tw_fx_proc_terminate(pmo, 30000), 0);
    free(t);
    free(dsn);
    free(ovr);
    wd_done(fx);
}
END_TEST

/* ---- migrate again, a code set made anew, a role created at the same moment
 * ----------------------------------------------------------------------------------------------------------
 */

START_TEST(test_migrate_keeps_grants)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    make_logins(fx);
    /* Again, unchanged. */
    tw_fx_migrate(fx);
    check_function_grants(fx);
    /* A code set that differs from the database's: schema tw is dropped and made anew. */
    char *before = tw_fx_sql_str(fx, "SELECT 'tw.submit_turn'::regproc::oid::text", 0);
    tw_fx_sql_exec(fx, "UPDATE state.code_version SET checksum = 'another'", 0);
    tw_fx_migrate(fx);
    char *after = tw_fx_sql_str(fx, "SELECT 'tw.submit_turn'::regproc::oid::text", 0);
    ck_assert_str_ne(before, after);
    check_function_grants(fx);
    PGconn *client = login_conn(fx, "app_client"), *observer = login_conn(fx, "app_observer");
    char *t = value_of(client, "app_client",
                       "SELECT tw.submit_turn(agent => 'echo', channel => 'c', input => '{}')");
    char *q = wd_fmt("SELECT tw.turn_show('%s') ->> 'agent'", t);
    char *agent = value_of(observer, "app_observer", q);
    ck_assert_str_eq(agent, "echo");
    PQfinish(client);
    PQfinish(observer);

    /* A role that someone else creates at the same moment (another database's migrate, an operator): migrate
     * finds it missing, waits for that transaction and goes on when it commits. */
    tw_fx_sql_exec(
        fx, "DROP OWNED BY turnwatch_observer; DROP ROLE app_observer; DROP ROLE turnwatch_observer", 0);
    PGconn *other = login_conn(fx, "postgres");
    PQclear(PQexec(other, "BEGIN"));
    PQclear(PQexec(other, "CREATE ROLE turnwatch_observer NOLOGIN"));
    const char *argv[] = {tw_fx_cli_path(), "-c", tw_fx_config_path(fx), "migrate", NULL};
    TwFxProc *m = tw_fx_spawn(fx, "migrate-race", argv);
    ck_assert_msg(tw_fx_sql_wait(fx, WD_WAIT_MS, "1",
                                 "SELECT count(*)::text FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                 "AND query LIKE '%turnwatch_observer%'",
                                 0),
                  "migrate did not come to wait for the role being created");
    PQclear(PQexec(other, "COMMIT"));
    int status = 0;
    ck_assert(tw_fx_proc_wait(m, WD_WAIT_MS, &status));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        tw_fx_proc_dump(m);
        ck_abort_msg("migrate failed on a role created meanwhile");
    }
    check_function_grants(fx);
    PQfinish(other);
    free(before);
    free(after);
    free(t);
    free(q);
    free(agent);
    wd_done(fx);
}
END_TEST

/* The console under turnwatch_observer answers; under a role with nothing, a 503 naming the role it needs. */
START_TEST(test_console_roles)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    make_logins(fx);
    char *t = wd_submit(fx, "echo", "{}");
    const char *logins[] = {"app_observer", "app_nobody"};
    for (size_t i = 0; i < 2; i++) {
        char *dsn = login_dsn(fx, logins[i]);
        char *ovr = wd_fmt("[postgres]\ndsn = %s\n", dsn);
        char *name = wd_fmt("console-%s.ini", logins[i]);
        const char *cfg = tw_fx_write_config(fx, name, ovr);
        int port = tw_fx_free_port();
        char *listen = wd_fmt("127.0.0.1:%d", port);
        const char *argv[] = {tw_fx_cli_path(), "-c", cfg, "console", "--listen", listen, NULL};
        TwFxProc *console = tw_fx_spawn(fx, name, argv);
        char *body = NULL;
        int code = -1;
        int64_t deadline = tw_fx_now_ms() + WD_WAIT_MS;
        /* Up once it serves its page (no database in that). */
        while ((code = tw_fx_http_get(port, "/", &body)) < 0) {
            free(body);
            body = NULL;
            ck_assert_msg(tw_fx_poll(deadline), "the console did not answer");
        }
        const char *paths[] = {"/api/turns", "/api/daemons", "/api/dead-letters", NULL, NULL};
        char *turn_path = wd_fmt("/api/turns/%s", t), *hist_path = wd_fmt("/api/turns/%s/history", t);
        paths[3] = turn_path;
        paths[4] = hist_path;
        for (size_t k = 0; k < N_OF(paths); k++) {
            free(body);
            code = tw_fx_http_get(port, paths[k], &body);
            if (code < 0)
                tw_fx_proc_dump(console);
            if (i == 0)
                ck_assert_msg(code == 200, "%s as app_observer: %d %s", paths[k], code, body ? body : "");
            else
                ck_assert_msg(code == 503 && body &&
                                  strstr(body, "the console needs the role turnwatch_observer (GRANT "
                                               "turnwatch_observer TO app_nobody)"),
                              "%s as app_nobody: %d %s", paths[k], code, body ? body : "");
        }
        free(body);
        ck_assert_int_eq(tw_fx_proc_terminate(console, 10000), 0);
        free(turn_path);
        free(hist_path);
        free(listen);
        free(dsn);
        free(ovr);
        free(name);
    }
    free(t);
    wd_done(fx);
}
END_TEST

TW_SUITE_DEFINE(roles, {
                           {"grants", test_grants_enumerated, 120},
                           {"client", test_client_and_observer, 120},
                           {"no_forgery", test_client_cannot_suppress_or_forge, 120},
                           {"cancel_relayed", test_client_cancel_events_relayed, 240},
                           {"daemons", test_daemons_under_daemon_role, 180},
                           {"hostile", test_hostile_search_path, 120},
                           {"cli", test_cli_least_privilege, 180},
                           {"daemon_denied", test_daemon_without_role, 120},
                           {"migrate", test_migrate_keeps_grants, 180},
                           {"console", test_console_roles, 120},
                       })
