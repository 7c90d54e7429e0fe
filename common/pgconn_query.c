/* A connection's query queue: parameterised statements sent one at a time, prepared once per connection,
 * each with a deadline; failures delivered from the loop; the answers. */
#include "pgconn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "pgconn_int.h"

#define PG_SQLSTATE_FEATURE_NOT_SUPPORTED "0A000"
/* A statement refused for want of a privilege: the daemon's role lacks turnwatch_daemon (docs/security.md).
 */
#define PG_SQLSTATE_DENIED "42501"
#define PG_DENIED_LOG_INTERVAL_MS 60000

int pg_query_timeout_sec = 30;

void pg_query_free(PgQuery *q)
{
    if (!q)
        return;
    for (int i = 0; i < q->n; i++)
        free(q->params[i]);
    free(q->params);
    free(q->sql);
    free(q);
}

void pg_fail_cb(evutil_socket_t fd, short what, void *arg)
{
    TwPg *pg = arg;
    PgQuery *list = pg->failed_head, *q;

    pg->failed_head = pg->failed_tail = NULL;
    while ((q = list)) {
        list = q->next;
        if (q->cb)
            q->cb(pg, NULL, q->err, q->arg);
        pg_query_free(q);
    }
}

/* Fail a query from the loop, never re-entering the caller. The connection owns the queue, so nothing is
 * left behind if it is freed first. */
void pg_fail_later(TwPg *pg, PgQuery *q, const char *err)
{
    snprintf(q->err, sizeof q->err, "%s", err);
    q->next = NULL;
    if (pg->failed_tail)
        pg->failed_tail->next = q;
    else
        pg->failed_head = q;
    pg->failed_tail = q;
    event_active(pg->fail_ev, EV_TIMEOUT, 0);
}

/* A new connection knows no statements. */
void pg_forget_prepared(TwPg *pg)
{
    for (size_t i = 0; i < pg->n_prepared; i++)
        free(pg->prepared[i].sql);
    pg->n_prepared = 0;
}

/* The slot for q's text: found, or a new one (not yet ready), or -1 when q runs unprepared. */
static int prepared_slot(TwPg *pg, const PgQuery *q)
{
    PgPrepared *p;

    if (q->n == 0)
        return -1;
    for (size_t i = 0; i < pg->n_prepared; i++)
        if (strcmp(pg->prepared[i].sql, q->sql) == 0)
            return (int)i;
    if (pg->n_prepared == PG_MAX_PREPARED)
        return -1;
    p = &pg->prepared[pg->n_prepared];
    if (!(p->sql = strdup(q->sql)))
        return -1;
    snprintf(p->name, sizeof p->name, "tw%u", ++pg->prepared_seq);
    p->ready = false;
    return (int)pg->n_prepared++;
}

/* Drop slot i (its statement stays on the server under a name that is never used again). */
static void drop_prepared(TwPg *pg, int i)
{
    free(pg->prepared[i].sql);
    pg->prepared[i] = pg->prepared[--pg->n_prepared];
}

void pg_enqueue(TwPg *pg, PgQuery *q, bool front)
{
    if (front) {
        q->next = pg->head;
        pg->head = q;
        if (!pg->tail)
            pg->tail = q;
        return;
    }
    if (pg->tail)
        pg->tail->next = q;
    else
        pg->head = q;
    pg->tail = q;
}

PgQuery *pg_make_query(const char *sql, int n, const char *const *params, TwPgCb cb, void *arg)
{
    PgQuery *q = calloc(1, sizeof *q);

    if (!q)
        return NULL;
    q->sql = strdup(sql);
    q->n = n;
    q->cb = cb;
    q->arg = arg;
    q->stmt = -1;
    q->params = n ? calloc((size_t)n, sizeof *q->params) : NULL;
    if (!q->sql || (n && !q->params)) {
        pg_query_free(q);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (params[i] && !(q->params[i] = strdup(params[i]))) {
            pg_query_free(q);
            return NULL;
        }
    return q;
}

void pg_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    TwPg *pg = arg;

    pg_broken(pg, "query did not answer in time");
}

/* Push out what libpq has buffered and watch the socket for the rest and for the answer; false when the
 * connection broke (pg_broken has run). */
bool pg_flush(TwPg *pg)
{
    int flush = PQflush(pg->conn);

    if (flush < 0) {
        pg_broken(pg, PQerrorMessage(pg->conn));
        return false;
    }
    pg_set_io(pg, flush ? (EV_READ | EV_WRITE) : EV_READ);
    return true;
}

/* Send the current query: executed if prepared, else its Prepare first (pg_finish_current sends the
 * execution when that succeeds), or unprepared when there is no slot. */
static void send_current(TwPg *pg)
{
    PgQuery *q = pg->current;
    const char *const *params = (const char *const *)q->params;
    int sent;

    q->stmt = prepared_slot(pg, q);
    q->preparing = q->stmt >= 0 && !pg->prepared[q->stmt].ready;
    if (q->stmt < 0)
        sent = PQsendQueryParams(pg->conn, q->sql, q->n, NULL, params, NULL, NULL, 0);
    else if (q->preparing)
        sent = PQsendPrepare(pg->conn, pg->prepared[q->stmt].name, q->sql, q->n, NULL);
    else
        sent = PQsendQueryPrepared(pg->conn, pg->prepared[q->stmt].name, q->n, params, NULL, NULL, 0);
    if (!sent)
        pg_broken(pg, PQerrorMessage(pg->conn));
    else
        pg_flush(pg);
}

void pg_send_next(TwPg *pg)
{
    struct timeval tv = {pg_query_timeout_sec, 0};
    PgQuery *q;

    if (pg->state != PG_IDLE || !pg->head)
        return;
    q = pg->head;
    pg->head = q->next;
    if (!pg->head)
        pg->tail = NULL;
    q->next = NULL;
    pg->current = q;
    pg->state = PG_BUSY;
    evtimer_add(pg->timeout, &tv);
    send_current(pg);
}

/* After the result of a prepared query's step: true when the query was sent again and stays current,
 * which is when its Prepare succeeded (the execution goes next), or when its saved plan no longer fits
 * because a migration changed what a function returns (the server checked that before running anything,
 * so running the statement again is safe; it is prepared afresh, once). */
static bool resend_prepared(TwPg *pg, PgQuery *q, const PGresult *res)
{
    ExecStatusType st = PQresultStatus(res);
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

    if (q->preparing && st == PGRES_COMMAND_OK) {
        pg->prepared[q->stmt].ready = true;
    } else if (!q->preparing && !q->retried && st == PGRES_FATAL_ERROR && state &&
               strcmp(state, PG_SQLSTATE_FEATURE_NOT_SUPPORTED) == 0) {
        q->retried = true;
        drop_prepared(pg, q->stmt);
    } else {
        if (q->preparing)
            drop_prepared(pg, q->stmt);
        return false;
    }
    send_current(pg);
    return true;
}

/* A statement refused with 42501: said as an ERROR naming the role the daemon needs, at most once a minute
 * per connection; the caller logs its own failure and tries again later, as after any error (the grant may
 * come while the daemon runs). */
static void log_denied(TwPg *pg, const PGresult *res)
{
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
    const char *user = PQuser(pg->conn);
    struct timespec now;
    long long now_ms;

    if (pg->reader_sql || !state || strcmp(state, PG_SQLSTATE_DENIED) != 0)
        return;
    clock_gettime(CLOCK_MONOTONIC, &now);
    now_ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    if (pg->denied_logged_ms && now_ms - pg->denied_logged_ms < PG_DENIED_LOG_INTERVAL_MS)
        return;
    pg->denied_logged_ms = now_ms;
    log_error(
        "postgres connection %s: permission denied (SQLSTATE 42501: %s): the daemon's PostgreSQL role %s "
        "needs the role turnwatch_daemon (GRANT turnwatch_daemon TO %s); retrying",
        pg->name, msg ? msg : "-", user ? user : "-", user ? user : "<role>");
}

void pg_finish_current(TwPg *pg)
{
    PgQuery *q = pg->current;
    PGresult *res = pg->result;
    const char *err = NULL;
    char buf[512];

    pg->result = NULL;
    if (q->stmt >= 0 && res && resend_prepared(pg, q, res)) {
        PQclear(res);
        return;
    }
    pg->current = NULL;
    evtimer_del(pg->timeout);
    pg->state = PG_IDLE;
    if (!res) {
        err = "no result";
    } else if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK) {
        log_denied(pg, res);
        snprintf(buf, sizeof buf, "%s", PQresultErrorMessage(res));
        for (char *p = buf; *p; p++)
            if (*p == '\n')
                *p = (p[1] ? ' ' : '\0');
        err = buf;
    }
    /* A write refused because the node is read-only (SQLSTATE 25006), or a session the server now reports
     * read-only: this node is not the primary any more (a failover, a switchover). The session is dropped
     * before the caller hears of it, so that what the caller tries again goes to a new connection, which
     * looks for the primary through the DSN's hosts; every statement queued here fails as "database
     * unavailable" and is tried again by its caller likewise. */
    if (!pg->reader_sql &&
        ((res && PQresultStatus(res) == PGRES_FATAL_ERROR &&
          strcmp(PQresultErrorField(res, PG_DIAG_SQLSTATE) ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : "",
                 PG_SQLSTATE_READ_ONLY) == 0) ||
         pg_session_read_only(pg->conn)))
        pg_broken(pg, "the server is read-only (SQLSTATE 25006: a standby, or a primary being demoted); "
                      "looking for the primary");
    if (q->cb)
        q->cb(pg, res, err, q->arg);
    PQclear(res);
    pg_query_free(q);
}

void tw_pg_set_query_timeout(int seconds)
{
    pg_query_timeout_sec = seconds >= 2 ? seconds : 2;
}

void tw_pg_query(TwPg *pg, const char *sql, int nparams, const char *const *params, TwPgCb cb, void *arg)
{
    PgQuery *q = pg_make_query(sql, nparams, params, cb, arg);

    if (!q) {
        log_error("out of memory queueing a query");
        return;
    }
    if (pg->state == PG_DOWN || pg->state == PG_CLOSED) {
        char msg[300];
        snprintf(msg, sizeof msg, "database unavailable: %s",
                 pg->last_error[0] ? pg->last_error : "not connected");
        pg_fail_later(pg, q, msg);
        return;
    }
    pg_enqueue(pg, q, false);
    pg_send_next(pg);
}

void tw_pg_log_failure(TwLogLimit *lim, const PGresult *res, const char *what, const char *err)
{
    if (res)
        tw_log_warn_limited(lim, "%s failed: %s", what, err);
    else
        log_debug("%s failed: %s", what, err);
}

size_t tw_pg_queued(const TwPg *pg)
{
    size_t n = pg->current ? 1 : 0;

    for (PgQuery *q = pg->head; q; q = q->next)
        n++;
    return n;
}
