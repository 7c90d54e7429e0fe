/* The parts of a libpq connection (pgconn.h) that its files share, and no one else includes: the connection
 * and its reconnects (pgconn.c), the query queue (pgconn_query.c), the session's settings, LISTEN and
 * notifications (pgconn_session.c). Everything here runs on the connection's loop. */
#ifndef TW_PGCONN_INT_H
#define TW_PGCONN_INT_H

#include "pgconn.h"

#define PG_RETRY_MIN_MS 100
/* Statements with parameters are prepared once per connection and then only bound and executed: the
 * daemons send a handful of fixed statements thousands of times, and parsing and planning each one
 * again was a tenth of the database's CPU per turn. More distinct texts than this run unprepared. */
#define PG_MAX_PREPARED 32
/* A write on a node that is not (or no longer) the primary: a standby, a demoted primary, one that an
 * operator or a switchover made read-only (default_transaction_read_only). Trying again there fails again. */
#define PG_SQLSTATE_READ_ONLY "25006"

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
    char *reader_sql; /* a reading session's own settings (tw_pg_set_reader); NULL for a daemon's */
    char last_error[256];
    bool logged_down;
    long long denied_logged_ms; /* when a refusal for want of a privilege was last logged (monotonic) */
    PgPrepared prepared[PG_MAX_PREPARED];
    size_t n_prepared;
    unsigned prepared_seq; /* names are never reused on a connection */
};

/* [postgres] query_timeout_seconds: how long a statement may go unanswered before the daemon gives up on it
 * (pgconn_query.c's; the session's statement_timeout is made from it). */
extern int pg_query_timeout_sec;

/* pgconn.c: watch the socket for what (re-creating the event when the socket or what changed). */
void pg_set_io(TwPg *pg, short what);
/* pgconn.c: the connection is gone: fail what was in flight and queued, then reconnect later. */
void pg_broken(TwPg *pg, const char *why);

/* pgconn_query.c: the queue. */
void pg_query_free(PgQuery *q);
PgQuery *pg_make_query(const char *sql, int n, const char *const *params, TwPgCb cb, void *arg);
void pg_enqueue(TwPg *pg, PgQuery *q, bool front);
void pg_fail_later(TwPg *pg, PgQuery *q, const char *err);
/* Deliver the failed queries (pg->fail_ev). */
void pg_fail_cb(evutil_socket_t fd, short what, void *arg);
/* The current query's deadline (pg->timeout). */
void pg_timeout_cb(evutil_socket_t fd, short what, void *arg);
void pg_forget_prepared(TwPg *pg);
bool pg_flush(TwPg *pg);
void pg_send_next(TwPg *pg);
/* The current query's results are all in (pg->result): answer its caller. */
void pg_finish_current(TwPg *pg);

/* pgconn_session.c: the session's settings and LISTENs, queued first on a new connection. */
void pg_connected(TwPg *pg);
bool pg_session_read_only(const PGconn *conn);
void pg_drain_notifies(TwPg *pg);

#endif
