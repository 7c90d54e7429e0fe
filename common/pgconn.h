/* Asynchronous libpq connection on a libevent loop: a FIFO of parameterised queries, LISTEN/NOTIFY,
 * and reconnects with capped backoff. A daemon never blocks on the database and never exits because
 * it is unreachable. */
#ifndef TW_PGCONN_H
#define TW_PGCONN_H

#include <event2/event.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

#include "log.h"

typedef struct TwPg TwPg;

/* The longest wait between two reconnect attempts: after an outage a daemon is back at most this long after
 * the server (after a failover, this long after the standby took writes: docs/high-availability.md's bench
 * wants turnwatch's part of a failover within 1 s). An attempt that finds no server costs a refused TCP
 * connect. */
#define TW_PG_RETRY_MAX_MS 1000

/** Called once per query. On success res is the final result (freed after the call) and err is NULL;
 *  on failure err says why (res may still carry the server's error). */
typedef void (*TwPgCb)(TwPg *pg, const PGresult *res, const char *err, void *arg);
typedef void (*TwPgNotifyCb)(TwPg *pg, const char *channel, const char *payload, void *arg);
/** Called with up=true after every (re)connect (LISTENs already issued) and up=false when it is lost. */
typedef void (*TwPgStateCb)(TwPg *pg, bool up, void *arg);

TwPg *tw_pg_new(struct event_base *base, const char *dsn, const char *name)
    __attribute__((warn_unused_result));
/** The process's identity on every session opened from now on (the setting tw.actor, which the turn history
 *  records): a daemon's id (host:pid). */
void tw_pg_set_actor(const char *actor);
/** [postgres] query_timeout_seconds, for every connection of the process: a statement unanswered this long is
 *  abandoned (the connection is dropped and made again); sessions opened from now on also bound each
 * statement server-side at four fifths of it (statement_timeout) and lock waits at 1 s (lock_timeout), so an
 * abandoned statement never commits later. Default 30. */
void tw_pg_set_query_timeout(int seconds);
/** TCP keepalives on the connection so that a peer that vanished is noticed within about this many seconds,
 *  on both ends (0: the defaults, which take hours). Call before tw_pg_start. */
void tw_pg_set_keepalive(TwPg *pg, int seconds);
void tw_pg_set_callbacks(TwPg *pg, TwPgStateCb on_state, TwPgNotifyCb on_notify, void *arg);
/** A session that only reads (the console's): session_sql (literal, no parameters) is run first on every
 *  session instead of the daemon's settings, a node that takes no writes is as good as the primary, and a
 *  refusal for want of a privilege is left to the caller to report. Call before tw_pg_start. */
int tw_pg_set_reader(TwPg *pg, const char *session_sql);
/** Remember a channel to LISTEN on, now and after every reconnect. Call before tw_pg_start. */
int tw_pg_listen(TwPg *pg, const char *channel);
void tw_pg_start(TwPg *pg);
/** Queue a parameterised statement (text parameters, NULL for SQL NULL). The callback always runs, from
 *  the loop, never from inside this call. */
void tw_pg_query(TwPg *pg, const char *sql, int nparams, const char *const *params, TwPgCb cb, void *arg);
/** Log a failed query the daemon will simply try again: a server error (res set) is a rate-limited warning;
 *  without res the connection failed, which the connection has logged already, so it is debug only. */
void tw_pg_log_failure(TwLogLimit *lim, const PGresult *res, const char *what, const char *err);
bool tw_pg_is_up(const TwPg *pg);
size_t tw_pg_queued(const TwPg *pg);
const char *tw_pg_last_error(const TwPg *pg);
/** The role the session logged in as (libpq's PQuser), "" while there is no session. */
const char *tw_pg_user(const TwPg *pg);
/** Fails queued queries with "shutting down" and closes the connection. Accepts NULL. */
void tw_pg_free(TwPg *pg);

#endif
