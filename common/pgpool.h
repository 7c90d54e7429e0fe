/* A few TwPg connections used as one: each query goes to the connection with the least queued work among
 * those that are up. Claims, applies, heartbeats and watchdog rules are independent transactions, and more
 * than one connection lets the database use more than one core for a busy daemon. */
#ifndef TW_PGPOOL_H
#define TW_PGPOOL_H

#include <stdbool.h>
#include <stddef.h>

#include "pgconn.h"

#define TW_PGPOOL_MAX 8

typedef struct TwPgPool {
    TwPg *conns[TW_PGPOOL_MAX];
    int n;
} TwPgPool;

/** n connections named "<name>/<i>" with keepalives (tw_pg_set_keepalive); each reports to on_state. */
int tw_pgpool_init(TwPgPool *pool, struct event_base *base, const char *dsn, int keepalive_sec,
                   const char *name, int n, TwPgStateCb on_state, void *arg)
    __attribute__((warn_unused_result));
void tw_pgpool_start(TwPgPool *pool);
/** The connection with the least queued work among those that are up (the first one when none is). */
TwPg *tw_pgpool_pick(const TwPgPool *pool);
bool tw_pgpool_any_up(const TwPgPool *pool);
/** Every connection is up (for /healthz). */
bool tw_pgpool_all_up(const TwPgPool *pool);
/** Queries queued or running on the connections that are up. */
size_t tw_pgpool_queued(const TwPgPool *pool);
/** Frees every connection (their queued queries fail with "shutting down"). */
void tw_pgpool_free(TwPgPool *pool);

#endif
