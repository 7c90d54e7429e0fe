/* Asynchronous libpq connection: the connect/poll state machine, the socket's events, reconnects with capped
 * backoff, and the connection made, started and freed. The query queue is pgconn_query.c's, the session's
 * settings, LISTEN and notifications pgconn_session.c's. */
#include "pgconn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "pgconn_int.h"

#define PG_RETRY_MAX_MS TW_PG_RETRY_MAX_MS

static void pg_io_cb(evutil_socket_t fd, short what, void *arg);
static void pg_connect_step(TwPg *pg);

void pg_set_io(TwPg *pg, short what)
{
    int fd = PQsocket(pg->conn);

    if (pg->io && (pg->io_fd != fd || pg->io_what != what)) {
        event_free(pg->io);
        pg->io = NULL;
    }
    if (!pg->io && fd >= 0) {
        pg->io = event_new(pg->base, fd, what | EV_PERSIST, pg_io_cb, pg);
        pg->io_fd = fd;
        pg->io_what = what;
        event_add(pg->io, NULL);
    }
}

static void schedule_retry(TwPg *pg)
{
    struct timeval tv = {pg->retry_ms / 1000, (pg->retry_ms % 1000) * 1000};

    evtimer_add(pg->retry, &tv);
    /* Capped backoff: grow by a third each time (systemd's retry rule). */
    pg->retry_ms = pg->retry_ms * 4 / 3;
    if (pg->retry_ms > PG_RETRY_MAX_MS)
        pg->retry_ms = PG_RETRY_MAX_MS;
}

/* The connection is gone: fail what was in flight and queued, then reconnect later. */
void pg_broken(TwPg *pg, const char *why)
{
    PgQuery *q, *list;
    bool was_up = pg->state == PG_IDLE || pg->state == PG_BUSY;
    char msg[300];

    snprintf(pg->last_error, sizeof pg->last_error, "%s", why);
    for (char *p = pg->last_error; *p; p++)
        if (*p == '\n' || *p == '\t')
            *p = ' ';
    /* Once per outage: the first failure, not every retry. */
    if (!pg->logged_down || was_up)
        log_warn("postgres connection %s %s: %s; retrying with backoff", pg->name,
                 was_up ? "lost" : "unavailable", pg->last_error);
    pg->logged_down = true;
    if (pg->io) {
        event_free(pg->io);
        pg->io = NULL;
    }
    evtimer_del(pg->timeout);
    if (pg->result) {
        PQclear(pg->result);
        pg->result = NULL;
    }
    if (pg->conn) {
        PQfinish(pg->conn);
        pg->conn = NULL;
    }
    pg_forget_prepared(pg);
    pg->state = PG_DOWN;
    snprintf(msg, sizeof msg, "database unavailable: %s", pg->last_error);
    list = pg->current;
    pg->current = NULL;
    if (list)
        list->next = pg->head;
    else
        list = pg->head;
    pg->head = pg->tail = NULL;
    while ((q = list)) {
        list = q->next;
        q->next = NULL;
        pg_fail_later(pg, q, msg);
    }
    schedule_retry(pg);
    if (was_up && pg->on_state)
        pg->on_state(pg, false, pg->cb_arg);
}

static void pg_connect_step(TwPg *pg)
{
    switch (PQconnectPoll(pg->conn)) {
    case PGRES_POLLING_READING:
        pg_set_io(pg, EV_READ);
        break;
    case PGRES_POLLING_WRITING:
        pg_set_io(pg, EV_WRITE);
        break;
    case PGRES_POLLING_OK:
        if (pg->io) {
            event_free(pg->io);
            pg->io = NULL;
        }
        pg_connected(pg);
        break;
    default:
        pg_broken(pg, PQerrorMessage(pg->conn));
        break;
    }
}

/* With keepalives, both ends notice a peer that vanished (a host powered off, a network cut) within about
 * keepalive_sec: libpq through its keepalive keywords, and the server through the session's
 * tcp_keepalives_* and tcp_user_timeout settings, so that a vanished worker's session ends there too and its
 * liveness lock is released (docs/watchdogs.md). Every session is named "turnwatch <connection>" in
 * pg_stat_activity (unless the DSN names it). The DSN is expanded last, so anything it sets itself wins. */
static PGconn *pg_connect_start(TwPg *pg)
{
    char idle[16], intvl[16], user_timeout[16], options[256], app[64];
    const char *keys[10], *vals[10];
    int k = pg->keepalive_sec, i = 0;

    snprintf(app, sizeof app, "turnwatch %s", pg->name);
    keys[i] = "fallback_application_name";
    vals[i++] = app;
    if (k > 0) {
        /* Probing starts after half the time, then two unanswered probes a quarter apart end the connection.
         */
        snprintf(idle, sizeof idle, "%d", k / 2 > 0 ? k / 2 : 1);
        snprintf(intvl, sizeof intvl, "%d", k / 4 > 0 ? k / 4 : 1);
        snprintf(user_timeout, sizeof user_timeout, "%d", k * 1000);
        snprintf(options, sizeof options,
                 "-c tcp_keepalives_idle=%s -c tcp_keepalives_interval=%s -c tcp_keepalives_count=2"
                 " -c tcp_user_timeout=%d",
                 idle, intvl, k * 1000);
        keys[i] = "keepalives";
        vals[i++] = "1";
        keys[i] = "keepalives_idle";
        vals[i++] = idle;
        keys[i] = "keepalives_interval";
        vals[i++] = intvl;
        keys[i] = "keepalives_count";
        vals[i++] = "2";
        keys[i] = "tcp_user_timeout";
        vals[i++] = user_timeout;
        keys[i] = "options";
        vals[i++] = options;
    }
    keys[i] = "dbname";
    vals[i++] = pg->dsn;
    keys[i] = NULL;
    vals[i] = NULL;
    return PQconnectStartParams(keys, vals, 1);
}

static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
    TwPg *pg = arg;

    pg->conn = pg_connect_start(pg);
    if (!pg->conn) {
        pg_broken(pg, "out of memory");
        return;
    }
    if (PQstatus(pg->conn) == CONNECTION_BAD) {
        pg_broken(pg, PQerrorMessage(pg->conn));
        return;
    }
    pg->state = PG_CONNECTING;
    pg_connect_step(pg);
}

static void pg_io_cb(evutil_socket_t fd, short what, void *arg)
{
    TwPg *pg = arg;

    if (pg->state == PG_CONNECTING) {
        pg_connect_step(pg);
        return;
    }
    if (pg->state != PG_IDLE && pg->state != PG_BUSY)
        return;
    if ((what & EV_WRITE) && !pg_flush(pg))
        return;
    if (!(what & EV_READ))
        return;
    if (!PQconsumeInput(pg->conn)) {
        pg_broken(pg, PQerrorMessage(pg->conn));
        return;
    }
    pg_drain_notifies(pg);
    while (pg->state == PG_BUSY && !PQisBusy(pg->conn)) {
        PGresult *r = PQgetResult(pg->conn);
        if (!r) {
            pg_finish_current(pg);
            if (pg->state != PG_IDLE)
                return; /* a callback closed us */
            pg_drain_notifies(pg);
            pg_send_next(pg);
            return;
        }
        /* Keep the first error, else the last result. */
        if (pg->result && PQresultStatus(pg->result) == PGRES_FATAL_ERROR) {
            PQclear(r);
        } else {
            PQclear(pg->result);
            pg->result = r;
        }
    }
    if (pg->conn && PQstatus(pg->conn) == CONNECTION_BAD)
        pg_broken(pg, PQerrorMessage(pg->conn));
}

TwPg *tw_pg_new(struct event_base *base, const char *dsn, const char *name)
{
    TwPg *pg = calloc(1, sizeof *pg);

    if (!pg)
        return NULL;
    pg->base = base;
    pg->dsn = strdup(dsn);
    snprintf(pg->name, sizeof pg->name, "%s", name);
    pg->retry = evtimer_new(base, retry_cb, pg);
    pg->timeout = evtimer_new(base, pg_timeout_cb, pg);
    pg->fail_ev = event_new(base, -1, 0, pg_fail_cb, pg);
    pg->retry_ms = PG_RETRY_MIN_MS;
    pg->io_fd = -1;
    if (!pg->dsn || !pg->retry || !pg->timeout || !pg->fail_ev) {
        tw_pg_free(pg);
        return NULL;
    }
    return pg;
}

void tw_pg_set_keepalive(TwPg *pg, int seconds)
{
    pg->keepalive_sec = seconds;
}

void tw_pg_set_callbacks(TwPg *pg, TwPgStateCb on_state, TwPgNotifyCb on_notify, void *arg)
{
    pg->on_state = on_state;
    pg->on_notify = on_notify;
    pg->cb_arg = arg;
}

void tw_pg_start(TwPg *pg)
{
    static const struct timeval zero = {0, 0};

    pg->state = PG_DOWN;
    evtimer_add(pg->retry, &zero);
}

bool tw_pg_is_up(const TwPg *pg)
{
    return pg && (pg->state == PG_IDLE || pg->state == PG_BUSY);
}

const char *tw_pg_last_error(const TwPg *pg)
{
    return pg->last_error;
}

const char *tw_pg_user(const TwPg *pg)
{
    const char *u = pg->conn ? PQuser(pg->conn) : NULL;

    return u ? u : "";
}

void tw_pg_free(TwPg *pg)
{
    PgQuery *q;

    if (!pg)
        return;
    pg->state = PG_CLOSED;
    if (pg->current) {
        if (pg->current->cb)
            pg->current->cb(pg, NULL, "shutting down", pg->current->arg);
        pg_query_free(pg->current);
    }
    while ((q = pg->head)) {
        pg->head = q->next;
        if (q->cb)
            q->cb(pg, NULL, "shutting down", q->arg);
        pg_query_free(q);
    }
    if (pg->fail_ev) {
        pg_fail_cb(-1, 0, pg);
        event_free(pg->fail_ev);
    }
    if (pg->io)
        event_free(pg->io);
    if (pg->retry)
        event_free(pg->retry);
    if (pg->timeout)
        event_free(pg->timeout);
    PQclear(pg->result);
    if (pg->conn)
        PQfinish(pg->conn);
    pg_forget_prepared(pg);
    for (size_t i = 0; i < pg->n_listen; i++)
        free(pg->listen[i]);
    free(pg->listen);
    free(pg->reader_sql);
    free(pg->dsn);
    free(pg);
}
