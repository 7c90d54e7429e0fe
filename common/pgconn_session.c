/* A connection's session: what is set on it first (who we are, the statement bounds), its LISTENs, the
 * notifications that come, and whether the node it reached takes writes. */
#include "pgconn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "pgconn_int.h"

/* A daemon's session waits at most this long for a row or advisory lock (lock_timeout): the locks a daemon
 * can meet that are held for long are an application's, taken by tw.submit_turn inside a transaction the
 * application keeps open. The statement fails (55P03) and its caller tries again later, so that connection
 * serves other work meanwhile. Locks the daemons take among themselves are held for milliseconds. */
#define PG_LOCK_TIMEOUT_MS 1000

/* Who this process is, set on every session (tw.actor): what the turn history records as the actor. */
static char pg_actor[128];

/* The session is on a node that takes no writes: a hot standby, or one whose default_transaction_read_only a
 * switchover or an operator turned on. The server reports both (GUC_REPORT, PostgreSQL 14 and later) at
 * connect and whenever they change, so this costs no round trip. */
bool pg_session_read_only(const PGconn *conn)
{
    const char *standby = PQparameterStatus(conn, "in_hot_standby");
    const char *ro = PQparameterStatus(conn, "default_transaction_read_only");

    return (standby && strcmp(standby, "on") == 0) || (ro && strcmp(ro, "on") == 0);
}

static void listen_done(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    if (err)
        return; /* pg_broken has run or will run; the reconnect issues LISTEN again */
    if (pg->listens_left && --pg->listens_left == 0 && pg->on_state)
        pg->on_state(pg, true, pg->cb_arg);
}

void pg_connected(TwPg *pg)
{
    /* A node that takes no writes is no use to a daemon, whose every transaction writes: drop it and try
     * the DSN's hosts again after the backoff (target_session_attrs=read-write in the DSN makes libpq skip
     * such a node itself; this covers a DSN without it). Never retried in a loop on that node. */
    if (!pg->reader_sql && pg_session_read_only(pg->conn)) {
        pg_broken(pg, "the server is read-only (a standby, or a primary being demoted); looking for the "
                      "primary");
        return;
    }
    log_info("postgres connection %s up", pg->name);
    pg->logged_down = false;
    pg->retry_ms = PG_RETRY_MIN_MS;
    pg->last_error[0] = '\0';
    PQsetnonblocking(pg->conn, 1);
    pg->state = PG_IDLE;
    pg_set_io(pg, EV_READ);
    pg->listens_left = pg->n_listen;
    /* LISTEN first, ahead of anything queued while we were connecting. */
    for (size_t i = pg->n_listen; i-- > 0;) {
        char *ident = PQescapeIdentifier(pg->conn, pg->listen[i], strlen(pg->listen[i]));
        char sql[160];
        snprintf(sql, sizeof sql, "LISTEN %s", ident ? ident : "\"\"");
        PQfreemem(ident);
        PgQuery *q = pg_make_query(sql, 0, NULL, listen_done, NULL);
        if (q)
            pg_enqueue(pg, q, true);
    }
    /* First of all, who we are, and the server-side bounds of every later statement on this session. The
     * server gives a statement up (statement_timeout) before the daemon does, so a statement the daemon has
     * abandoned (query_timeout_seconds) can never commit behind its back and leave it holding work it does
     * not know about: an answer that comes is an error, and the connection stays. No sequential scans: a
     * daemon's statements look rows up through indexes, and the plans PL/pgSQL caches for a session are made
     * once, possibly while a table is still small (a new database, stale statistics); a plan that scanned a
     * table whole then would scan it whole for the rest of the session, however large it grew. And that this
     * session's dispatches need no NOTIFY tw_due: a daemon wakes the PMOs itself (tw.dispatch_arms). A reader
     * (the console's sessions) has settings of its own instead. */
    if (pg->reader_sql) {
        PgQuery *q = pg_make_query(pg->reader_sql, 0, NULL, NULL, NULL);
        if (q)
            pg_enqueue(pg, q, true);
    } else {
        /* Literal values and no parameters: the statement runs once per session and is not prepared. */
        char *actor = PQescapeLiteral(pg->conn, pg_actor, strlen(pg_actor)), sql[768];
        snprintf(
            sql, sizeof sql,
            "SELECT set_config('tw.actor', %s, false), set_config('statement_timeout', '%lld', false),"
            " set_config('lock_timeout', '%d', false), set_config('enable_seqscan', 'off', false),"
            " set_config('plan_cache_mode', 'force_generic_plan', false), set_config('jit', 'off', false),"
            " set_config('tw.wakes', 'nats', false)",
            actor ? actor : "''", (long long)pg_query_timeout_sec * 800, PG_LOCK_TIMEOUT_MS);
        PQfreemem(actor);
        PgQuery *q = pg_make_query(sql, 0, NULL, NULL, NULL);
        if (q)
            pg_enqueue(pg, q, true);
    }
    if (pg->n_listen == 0 && pg->on_state)
        pg->on_state(pg, true, pg->cb_arg);
    pg_send_next(pg);
}

void pg_drain_notifies(TwPg *pg)
{
    PGnotify *n;

    while (pg->conn && (n = PQnotifies(pg->conn))) {
        if (pg->on_notify)
            pg->on_notify(pg, n->relname, n->extra, pg->cb_arg);
        PQfreemem(n);
    }
}

int tw_pg_set_reader(TwPg *pg, const char *session_sql)
{
    free(pg->reader_sql);
    return (pg->reader_sql = strdup(session_sql)) ? 0 : -1;
}

void tw_pg_set_actor(const char *actor)
{
    snprintf(pg_actor, sizeof pg_actor, "%s", actor ? actor : "");
}

int tw_pg_listen(TwPg *pg, const char *channel)
{
    char **g = realloc(pg->listen, (pg->n_listen + 1) * sizeof *g);

    if (!g)
        return -1;
    pg->listen = g;
    if (!(pg->listen[pg->n_listen] = strdup(channel)))
        return -1;
    pg->n_listen++;
    return 0;
}
