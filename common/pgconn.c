/* Asynchronous libpq connection: connect/poll state machine, query FIFO, notifications, reconnects. */
#include "pgconn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"

#define PG_RETRY_MIN_MS 100
#define PG_RETRY_MAX_MS TW_PG_RETRY_MAX_MS
/* A daemon's session waits at most this long for a row or advisory lock (lock_timeout): the locks a daemon
 * can meet that are held for long are an application's, taken by tw.submit_turn inside a transaction the
 * application keeps open. The statement fails (55P03) and its caller tries again later, so that connection
 * serves other work meanwhile. Locks the daemons take among themselves are held for milliseconds. */
#define PG_LOCK_TIMEOUT_MS 1000
/* Statements with parameters are prepared once per connection and then only bound and executed: the
 * daemons send a handful of fixed statements thousands of times, and parsing and planning each one
 * again was a tenth of the database's CPU per turn. More distinct texts than this run unprepared. */
#define PG_MAX_PREPARED 32
#define PG_SQLSTATE_FEATURE_NOT_SUPPORTED "0A000"
/* A write on a node that is not (or no longer) the primary: a standby, a demoted primary, one that an
 * operator or a switchover made read-only (default_transaction_read_only). Trying again there fails again. */
#define PG_SQLSTATE_READ_ONLY "25006"
/* A statement refused for want of a privilege: the daemon's role lacks turnwatch_daemon (contract 16). */
#define PG_SQLSTATE_DENIED "42501"
#define PG_DENIED_LOG_INTERVAL_MS 60000

typedef enum { PG_DOWN, PG_CONNECTING, PG_IDLE, PG_BUSY, PG_CLOSED } PgState;

typedef struct PgQuery {
    struct PgQuery *next;
    char *sql;
    int n;
    char **params;
    TwPgCb cb;
    void *arg;
    int stmt;       /* index into TwPg.prepared while it runs prepared, else -1 */
    bool preparing; /* its Prepare is in flight; the execution follows */
    bool retried;   /* re-prepared once after its plan was invalidated */
    char err[300];  /* why it failed, while on the failed queue */
} PgQuery;

typedef struct PgPrepared {
    char *sql;
    char name[16];
    bool ready; /* the server has it */
} PgPrepared;

struct TwPg {
    struct event_base *base;
    char *dsn;
    char name[32];
    int keepalive_sec; /* 0: libpq's and the server's defaults */
    PGconn *conn;
    PgState state;
    struct event *io; /* socket events, re-created when the socket changes */
    int io_fd;
    short io_what;
    struct event *retry;   /* reconnect backoff */
    struct event *timeout; /* current query deadline */
    struct event *fail_ev; /* delivers failed_head..tail */
    PgQuery *failed_head, *failed_tail;
    int retry_ms;
    PgQuery *head, *tail, *current;
    PGresult *result; /* result being gathered for current */
    char **listen;
    size_t n_listen;
    size_t listens_left;
    TwPgStateCb on_state;
    TwPgNotifyCb on_notify;
    void *cb_arg;
    char last_error[256];
    bool logged_down;
    long long denied_logged_ms; /* when a refusal for want of a privilege was last logged (monotonic) */
    PgPrepared prepared[PG_MAX_PREPARED];
    size_t n_prepared;
    unsigned prepared_seq; /* names are never reused on a connection */
};

/* Who this process is, set on every session (tw.actor): what the turn history records as the actor. */
static char pg_actor[128];
/* [postgres] query_timeout_seconds: how long a statement may go unanswered before the daemon gives up on it.
 */
static int pg_query_timeout_sec = 30;

static void pg_io_cb(evutil_socket_t fd, short what, void *arg);
static void pg_connect_step(TwPg *pg);
static void pg_send_next(TwPg *pg);
static void forget_prepared(TwPg *pg);

static void query_free(PgQuery *q)
{
    if (!q)
        return;
    for (int i = 0; i < q->n; i++)
        free(q->params[i]);
    free(q->params);
    free(q->sql);
    free(q);
}

static void fail_cb(evutil_socket_t fd, short what, void *arg)
{
    TwPg *pg = arg;
    PgQuery *list = pg->failed_head, *q;

    pg->failed_head = pg->failed_tail = NULL;
    while ((q = list)) {
        list = q->next;
        if (q->cb)
            q->cb(pg, NULL, q->err, q->arg);
        query_free(q);
    }
}

/* Fail a query from the loop, never re-entering the caller. The connection owns the queue, so nothing is
 * left behind if it is freed first. */
static void fail_later(TwPg *pg, PgQuery *q, const char *err)
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

static void set_io(TwPg *pg, short what)
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
static void pg_broken(TwPg *pg, const char *why)
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
    forget_prepared(pg);
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
        fail_later(pg, q, msg);
    }
    schedule_retry(pg);
    if (was_up && pg->on_state)
        pg->on_state(pg, false, pg->cb_arg);
}

/* A new connection knows no statements. */
static void forget_prepared(TwPg *pg)
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

static void enqueue(TwPg *pg, PgQuery *q, bool front)
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

static PgQuery *make_query(const char *sql, int n, const char *const *params, TwPgCb cb, void *arg)
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
        query_free(q);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (params[i] && !(q->params[i] = strdup(params[i]))) {
            query_free(q);
            return NULL;
        }
    return q;
}

/* The session is on a node that takes no writes: a hot standby, or one whose default_transaction_read_only a
 * switchover or an operator turned on. The server reports both (GUC_REPORT, PostgreSQL 14 and later) at
 * connect and whenever they change, so this costs no round trip. */
static bool session_read_only(const PGconn *conn)
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

static void pg_connected(TwPg *pg)
{
    /* A node that takes no writes is no use to a daemon, whose every transaction writes: drop it and try
     * the DSN's hosts again after the backoff (target_session_attrs=read-write in the DSN makes libpq skip
     * such a node itself; this covers a DSN without it). Never retried in a loop on that node. */
    if (session_read_only(pg->conn)) {
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
    set_io(pg, EV_READ);
    pg->listens_left = pg->n_listen;
    /* LISTEN first, ahead of anything queued while we were connecting. */
    for (size_t i = pg->n_listen; i-- > 0;) {
        char *ident = PQescapeIdentifier(pg->conn, pg->listen[i], strlen(pg->listen[i]));
        char sql[160];
        snprintf(sql, sizeof sql, "LISTEN %s", ident ? ident : "\"\"");
        PQfreemem(ident);
        PgQuery *q = make_query(sql, 0, NULL, listen_done, NULL);
        if (q)
            enqueue(pg, q, true);
    }
    /* First of all, who we are, and the server-side bounds of every later statement on this session. The
     * server gives a statement up (statement_timeout) before the daemon does, so a statement the daemon has
     * abandoned (query_timeout_seconds) can never commit behind its back and leave it holding work it does
     * not know about: an answer that comes is an error, and the connection stays. No sequential scans: a
     * daemon's statements look rows up through indexes, and the plans PL/pgSQL caches for a session are made
     * once, possibly while a table is still small (a new database, stale statistics); a plan that scanned a
     * table whole then would scan it whole for the rest of the session, however large it grew. */
    {
        /* Literal values and no parameters: the statement runs once per session and is not prepared. */
        char *actor = PQescapeLiteral(pg->conn, pg_actor, strlen(pg_actor)), sql[512];
        snprintf(
            sql, sizeof sql,
            "SELECT set_config('tw.actor', %s, false), set_config('statement_timeout', '%lld', false),"
            " set_config('lock_timeout', '%d', false), set_config('enable_seqscan', 'off', false),"
            " set_config('plan_cache_mode', 'force_generic_plan', false), set_config('jit', 'off', false)",
            actor ? actor : "''", (long long)pg_query_timeout_sec * 800, PG_LOCK_TIMEOUT_MS);
        PQfreemem(actor);
        PgQuery *q = make_query(sql, 0, NULL, NULL, NULL);
        if (q)
            enqueue(pg, q, true);
    }
    if (pg->n_listen == 0 && pg->on_state)
        pg->on_state(pg, true, pg->cb_arg);
    pg_send_next(pg);
}

static void pg_connect_step(TwPg *pg)
{
    switch (PQconnectPoll(pg->conn)) {
    case PGRES_POLLING_READING:
        set_io(pg, EV_READ);
        break;
    case PGRES_POLLING_WRITING:
        set_io(pg, EV_WRITE);
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
 * liveness lock is released (contract section 9). Every session is named "turnwatch <connection>" in
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

static void timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    TwPg *pg = arg;

    pg_broken(pg, "query did not answer in time");
}

/* Push out what libpq has buffered and watch the socket for the rest and for the answer; false when the
 * connection broke (pg_broken has run). */
static bool pg_flush(TwPg *pg)
{
    int flush = PQflush(pg->conn);

    if (flush < 0) {
        pg_broken(pg, PQerrorMessage(pg->conn));
        return false;
    }
    set_io(pg, flush ? (EV_READ | EV_WRITE) : EV_READ);
    return true;
}

/* Send the current query: executed if prepared, else its Prepare first (finish_current sends the
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

static void pg_send_next(TwPg *pg)
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

static void drain_notifies(TwPg *pg)
{
    PGnotify *n;

    while (pg->conn && (n = PQnotifies(pg->conn))) {
        if (pg->on_notify)
            pg->on_notify(pg, n->relname, n->extra, pg->cb_arg);
        PQfreemem(n);
    }
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

    if (!state || strcmp(state, PG_SQLSTATE_DENIED) != 0)
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

static void finish_current(TwPg *pg)
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
    if ((res && PQresultStatus(res) == PGRES_FATAL_ERROR &&
         strcmp(PQresultErrorField(res, PG_DIAG_SQLSTATE) ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : "",
                PG_SQLSTATE_READ_ONLY) == 0) ||
        session_read_only(pg->conn))
        pg_broken(pg, "the server is read-only (SQLSTATE 25006: a standby, or a primary being demoted); "
                      "looking for the primary");
    if (q->cb)
        q->cb(pg, res, err, q->arg);
    PQclear(res);
    query_free(q);
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
    drain_notifies(pg);
    while (pg->state == PG_BUSY && !PQisBusy(pg->conn)) {
        PGresult *r = PQgetResult(pg->conn);
        if (!r) {
            finish_current(pg);
            if (pg->state != PG_IDLE)
                return; /* a callback closed us */
            drain_notifies(pg);
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
    pg->timeout = evtimer_new(base, timeout_cb, pg);
    pg->fail_ev = event_new(base, -1, 0, fail_cb, pg);
    pg->retry_ms = PG_RETRY_MIN_MS;
    pg->io_fd = -1;
    if (!pg->dsn || !pg->retry || !pg->timeout || !pg->fail_ev) {
        tw_pg_free(pg);
        return NULL;
    }
    return pg;
}

void tw_pg_set_actor(const char *actor)
{
    snprintf(pg_actor, sizeof pg_actor, "%s", actor ? actor : "");
}

void tw_pg_set_query_timeout(int seconds)
{
    pg_query_timeout_sec = seconds >= 2 ? seconds : 2;
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

void tw_pg_start(TwPg *pg)
{
    static const struct timeval zero = {0, 0};

    pg->state = PG_DOWN;
    evtimer_add(pg->retry, &zero);
}

void tw_pg_query(TwPg *pg, const char *sql, int nparams, const char *const *params, TwPgCb cb, void *arg)
{
    PgQuery *q = make_query(sql, nparams, params, cb, arg);

    if (!q) {
        log_error("out of memory queueing a query");
        return;
    }
    if (pg->state == PG_DOWN || pg->state == PG_CLOSED) {
        char msg[300];
        snprintf(msg, sizeof msg, "database unavailable: %s",
                 pg->last_error[0] ? pg->last_error : "not connected");
        fail_later(pg, q, msg);
        return;
    }
    enqueue(pg, q, false);
    pg_send_next(pg);
}

void tw_pg_log_failure(TwLogLimit *lim, const PGresult *res, const char *what, const char *err)
{
    if (res)
        tw_log_warn_limited(lim, "%s failed: %s", what, err);
    else
        log_debug("%s failed: %s", what, err);
}

bool tw_pg_is_up(const TwPg *pg)
{
    return pg && (pg->state == PG_IDLE || pg->state == PG_BUSY);
}

size_t tw_pg_queued(const TwPg *pg)
{
    size_t n = pg->current ? 1 : 0;

    for (PgQuery *q = pg->head; q; q = q->next)
        n++;
    return n;
}

const char *tw_pg_last_error(const TwPg *pg)
{
    return pg->last_error;
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
        query_free(pg->current);
    }
    while ((q = pg->head)) {
        pg->head = q->next;
        if (q->cb)
            q->cb(pg, NULL, "shutting down", q->arg);
        query_free(q);
    }
    if (pg->fail_ev) {
        fail_cb(-1, 0, pg);
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
    forget_prepared(pg);
    for (size_t i = 0; i < pg->n_listen; i++)
        free(pg->listen[i]);
    free(pg->listen);
    free(pg->dsn);
    free(pg);
}
