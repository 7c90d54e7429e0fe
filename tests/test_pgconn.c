/* test_pgconn.c — the daemons' asynchronous PostgreSQL connection (common/pgconn.c) against a real server:
 * statements with parameters are prepared once per connection, a statement whose saved plan a migration
 * made stale is prepared again and still answers, a statement that cannot be prepared fails alone, and a
 * new connection prepares afresh; a session on a node that turned read-only (SQLSTATE 25006) is dropped at
 * once and made again, never retried there. */
#include "fixture.h"
#include "pgconn.h"
#include "suite.h"

#include <check.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    bool done;
    char *value; /* first column of the first row, or NULL */
    char *err;
} Answer;

static void answered(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    Answer *a = arg;

    (void)pg;
    a->done = true;
    if (err)
        a->err = strdup(err);
    else if (PQntuples(res) > 0 && !PQgetisnull(res, 0, 0))
        a->value = strdup(PQgetvalue(res, 0, 0));
}

/* Turn the loop for 20 ms. */
static void spin(struct event_base *base)
{
    struct timeval slice = {0, 20000};

    event_base_loopexit(base, &slice);
    event_base_loop(base, 0);
}

/* Run one statement on pg and turn the loop until it answers (at most 10 s). */
static Answer ask(struct event_base *base, TwPg *pg, const char *sql, int n, const char *const *params)
{
    Answer a = {0};

    tw_pg_query(pg, sql, n, params, answered, &a);
    for (int i = 0; i < 500 && !a.done; i++)
        spin(base);
    ck_assert_msg(a.done, "no answer to %s", sql);
    return a;
}

static void answer_free(Answer *a)
{
    free(a->value);
    free(a->err);
}

/* Turn the loop until the connection is up (at most 10 s). */
static void wait_up(struct event_base *base, TwPg *pg)
{
    for (int i = 0; i < 500 && !tw_pg_is_up(pg); i++)
        spin(base);
    ck_assert_msg(tw_pg_is_up(pg), "connection not up: %s", tw_pg_last_error(pg));
}

/* A PostgreSQL of its own, a loop, and a connection that is up. */
typedef struct {
    TwFx *fx;
    struct event_base *base;
    TwPg *pg;
} Conn;

static Conn conn_open(void)
{
    Conn c = {.fx = tw_fx_new()};

    tw_fx_pg_init(c.fx);
    c.base = event_base_new();
    ck_assert_ptr_nonnull(c.base);
    c.pg = tw_pg_new(c.base, tw_fx_pg_dsn(c.fx), "test");
    ck_assert_ptr_nonnull(c.pg);
    tw_pg_start(c.pg);
    wait_up(c.base, c.pg);
    return c;
}

static void conn_close(Conn *c)
{
    tw_pg_free(c->pg);
    event_base_free(c->base);
    tw_fx_free(c->fx);
}

/* How many statements this connection has prepared, asked on the connection itself (no parameters, so
 * that statement is not prepared). */
static long prepared_count(struct event_base *base, TwPg *pg)
{
    Answer a = ask(base, pg, "SELECT count(*) FROM pg_prepared_statements", 0, NULL);
    long n;

    ck_assert_msg(a.err == NULL, "%s", a.err);
    n = strtol(a.value, NULL, 10);
    answer_free(&a);
    return n;
}

START_TEST(test_prepared_once_and_revalidated)
{
    Conn conn = conn_open();
    TwFx *fx = conn.fx;
    struct event_base *base = conn.base;
    TwPg *pg = conn.pg;

    tw_fx_sql_exec(
        fx, "CREATE FUNCTION public.twice(x integer) RETURNS integer LANGUAGE sql AS 'SELECT 2 * x'", 0);
    const char *sql = "SELECT public.twice($1::integer)";
    char num[16];
    for (int i = 1; i <= 3; i++) {
        snprintf(num, sizeof num, "%d", i);
        const char *params[] = {num};
        Answer a = ask(base, pg, sql, 1, params);
        ck_assert_msg(a.err == NULL, "%s", a.err);
        snprintf(num, sizeof num, "%d", 2 * i);
        ck_assert_str_eq(a.value, num);
        answer_free(&a);
    }
    /* Three runs, one statement on the server. */
    ck_assert_int_eq(prepared_count(base, pg), 1);

    /* A migration replaces the function with one of another result type: the saved plan no longer fits
     * (the server says "cached plan must not change result type"); the connection prepares it again. */
    tw_fx_sql_exec(fx, "DROP FUNCTION public.twice(integer)", 0);
    tw_fx_sql_exec(fx,
                   "CREATE FUNCTION public.twice(x integer) RETURNS text LANGUAGE sql AS 'SELECT (2 * "
                   "x)::text || ''!'''",
                   0);
    const char *seven[] = {"7"};
    Answer b = ask(base, pg, sql, 1, seven);
    ck_assert_msg(b.err == NULL, "stale statement not prepared again: %s", b.err);
    ck_assert_str_eq(b.value, "14!");
    answer_free(&b);
    ck_assert_int_eq(prepared_count(base, pg), 2);

    /* A statement the server cannot prepare fails alone, is not kept, and the connection goes on. */
    const char *one[] = {"1"};
    Answer c = ask(base, pg, "SELECT public.no_such_function($1::integer)", 1, one);
    ck_assert_ptr_nonnull(c.err);
    ck_assert_ptr_nonnull(strstr(c.err, "no_such_function"));
    answer_free(&c);
    c = ask(base, pg, "SELECT public.no_such_function($1::integer)", 1, one);
    ck_assert_ptr_nonnull(c.err);
    answer_free(&c);
    Answer d = ask(base, pg, sql, 1, one);
    ck_assert_msg(d.err == NULL, "%s", d.err);
    ck_assert_str_eq(d.value, "2!");
    answer_free(&d);
    ck_assert_int_eq(prepared_count(base, pg), 2);

    conn_close(&conn);
}
END_TEST

START_TEST(test_new_connection_prepares_afresh)
{
    Conn conn = conn_open();
    TwFx *fx = conn.fx;
    struct event_base *base = conn.base;
    TwPg *pg = conn.pg;

    const char *sql = "SELECT $1::integer + 1";
    const char *forty[] = {"40"};
    Answer a = ask(base, pg, sql, 1, forty);
    ck_assert_msg(a.err == NULL, "%s", a.err);
    ck_assert_str_eq(a.value, "41");
    answer_free(&a);
    Answer pid = ask(base, pg, "SELECT pg_backend_pid()", 0, NULL);
    ck_assert_ptr_nonnull(pid.value);

    /* The server ends the session: its prepared statements are gone with it. */
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM pg_terminate_backend($1::integer) WHERE 1 = 1", 1, pid.value),
        1);
    answer_free(&pid);
    /* The first query after the loss may fail as "database unavailable" (it finds the socket closed);
     * once reconnected, the statement is prepared on the new session, never executed by a stale name. */
    bool ok = false;
    for (int i = 0; i < 50 && !ok; i++) {
        Answer b = ask(base, pg, sql, 1, forty);
        if (b.err) {
            ck_assert_msg(strstr(b.err, "does not exist") == NULL, "stale statement name used: %s", b.err);
            wait_up(base, pg);
        } else {
            ck_assert_str_eq(b.value, "41");
            ok = true;
        }
        answer_free(&b);
    }
    ck_assert(ok);
    ck_assert_int_eq(prepared_count(base, pg), 1);

    conn_close(&conn);
}
END_TEST

/* [postgres] keepalive_seconds: both ends of the connection probe an idle peer, so that a vanished host's
 * session (and its liveness lock) ends within about that long: libpq's keepalives here, the server session's
 * tcp_keepalives_* and tcp_user_timeout there (seen from the session itself). */
START_TEST(test_keepalives_on_both_ends)
{
    TwFx *fx = tw_fx_new();
    tw_fx_pg_init(fx);
    struct event_base *base = event_base_new();
    TwPg *pg = tw_pg_new(base, tw_fx_pg_dsn(fx), "keepalive");
    ck_assert_ptr_nonnull(pg);
    tw_pg_set_keepalive(pg, 8);
    tw_pg_start(pg);
    wait_up(base, pg);
    Answer a = ask(
        base, pg,
        "SELECT current_setting('tcp_keepalives_idle') || ',' || current_setting('tcp_keepalives_interval')"
        " || ',' || current_setting('tcp_keepalives_count') || ',' || current_setting('tcp_user_timeout')",
        0, NULL);
    ck_assert_msg(a.err == NULL, "%s", a.err);
    /* Probing after half the time, two probes a quarter apart; unacknowledged data gives up after the whole.
     */
    ck_assert_str_eq(a.value, "4,2,2,8000");
    answer_free(&a);
    tw_pg_free(pg);
    event_base_free(base);
    tw_fx_free(fx);
}
END_TEST

/* A write refused with 25006 (the node became read-only: a demoted primary, a switchover) drops the session
 * at once, before the caller hears of it, and the connection stays down while the node is read-only: a
 * caller that keeps trying (as every daemon rule does) gets 25006 once, then "database unavailable", never a
 * loop of 25006 on the same node (issue 27: one session got it 6 times in 5 s). Made real here by turning
 * default_transaction_read_only on for the whole server, as pg_auto_failover's switchover does. */
START_TEST(test_read_only_drops_session)
{
    Conn conn = conn_open();
    TwFx *fx = conn.fx;
    struct event_base *base = conn.base;
    TwPg *pg = conn.pg;
    const char *one[] = {"1"};
    int read_only = 0, unavailable = 0, ok = 0;

    tw_fx_sql_exec(fx, "CREATE TABLE public.w (i integer)", 0);
    Answer a = ask(base, pg, "INSERT INTO public.w VALUES ($1::integer)", 1, one);
    ck_assert_msg(a.err == NULL, "%s", a.err);
    answer_free(&a);
    Answer pid = ask(base, pg, "SELECT pg_backend_pid()", 0, NULL);
    ck_assert_ptr_nonnull(pid.value);

    tw_fx_sql_exec(fx, "ALTER SYSTEM SET default_transaction_read_only = on", 0);
    tw_fx_sql_exec(fx, "SELECT pg_reload_conf()", 0);
    /* Every session has the new setting once it has read the reload. */
    ck_assert(tw_fx_sql_wait(fx, 10000, "on", "SHOW default_transaction_read_only", 0));

    /* Two seconds of a caller trying its write every 20 ms, as a daemon's rule does on every tick. */
    int64_t until = tw_fx_now_ms() + 2000;
    while (tw_fx_now_ms() < until) {
        Answer b = {0};
        tw_pg_query(pg, "INSERT INTO public.w VALUES ($1::integer)", 1, one, answered, &b);
        for (int i = 0; i < 500 && !b.done; i++)
            spin(base);
        ck_assert(b.done);
        if (!b.err) {
            ok++;
        } else if (strstr(b.err, "database unavailable") == NULL && strstr(b.err, "read-only transaction")) {
            read_only++;
            /* Dropped before the caller heard of it. */
            ck_assert_msg(!tw_pg_is_up(pg), "session still up after: %s", b.err);
        } else {
            ck_assert_msg(strstr(b.err, "database unavailable"), "unexpected error: %s", b.err);
            unavailable++;
        }
        answer_free(&b);
        spin(base);
    }
    /* The first write may still have been taken (the session had not read the reload yet); after that, one
     * refusal, and then the connection waits for a node that takes writes. */
    ck_assert_msg(ok <= 1, "%d writes taken on a read-only server", ok);
    ck_assert_msg(read_only == 1, "25006 answered %d times (unavailable %d): the session was not dropped",
                  read_only, unavailable);
    ck_assert_int_ge(unavailable, 10);
    /* The session that got it is gone. */
    ck_assert(tw_fx_sql_wait(fx, 10000, "0", "SELECT count(*) FROM pg_stat_activity WHERE pid = $1::integer",
                             1, pid.value));
    answer_free(&pid);

    /* A primary again: the connection comes back by itself and the write goes through. */
    tw_fx_sql_exec(fx, "ALTER SYSTEM RESET default_transaction_read_only", 0);
    tw_fx_sql_exec(fx, "SELECT pg_reload_conf()", 0);
    wait_up(base, pg);
    bool written = false;
    for (int i = 0; i < 100 && !written; i++) {
        Answer c = ask(base, pg, "INSERT INTO public.w VALUES ($1::integer)", 1, one);
        written = c.err == NULL;
        answer_free(&c);
        if (!written) {
            spin(base);
            wait_up(base, pg);
        }
    }
    ck_assert(written);
    conn_close(&conn);
}
END_TEST

TW_SUITE_DEFINE(pgconn, {
                            {"prepared", test_prepared_once_and_revalidated, 60},
                            {"prepared", test_new_connection_prepares_afresh, 60},
                            {"prepared", test_keepalives_on_both_ends, 60},
                            {"read_only", test_read_only_drops_session, 60},
                        })
