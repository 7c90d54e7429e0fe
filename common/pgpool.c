/* A few connections used as one. */
#include "pgpool.h"

#include <stdio.h>
#include <string.h>

int tw_pgpool_init(TwPgPool *pool, struct event_base *base, const char *dsn, int keepalive_sec,
                   const char *name, int n, TwPgStateCb on_state, void *arg)
{
    memset(pool, 0, sizeof *pool);
    if (n < 1 || n > TW_PGPOOL_MAX)
        return -1;
    for (int i = 0; i < n; i++) {
        char cname[32];
        snprintf(cname, sizeof cname, "%s/%d", name, i);
        if (!(pool->conns[i] = tw_pg_new(base, dsn, cname)))
            return -1;
        pool->n++;
        tw_pg_set_keepalive(pool->conns[i], keepalive_sec);
        tw_pg_set_callbacks(pool->conns[i], on_state, NULL, arg);
    }
    return 0;
}

void tw_pgpool_start(TwPgPool *pool)
{
    for (int i = 0; i < pool->n; i++)
        tw_pg_start(pool->conns[i]);
}

TwPg *tw_pgpool_pick(const TwPgPool *pool)
{
    TwPg *best = NULL;

    for (int i = 0; i < pool->n; i++)
        if (tw_pg_is_up(pool->conns[i]) && (!best || tw_pg_queued(pool->conns[i]) < tw_pg_queued(best)))
            best = pool->conns[i];
    return best ? best : pool->conns[0];
}

bool tw_pgpool_any_up(const TwPgPool *pool)
{
    for (int i = 0; i < pool->n; i++)
        if (tw_pg_is_up(pool->conns[i]))
            return true;
    return false;
}

bool tw_pgpool_all_up(const TwPgPool *pool)
{
    for (int i = 0; i < pool->n; i++)
        if (!tw_pg_is_up(pool->conns[i]))
            return false;
    return pool->n > 0;
}

size_t tw_pgpool_queued(const TwPgPool *pool)
{
    size_t q = 0;

    for (int i = 0; i < pool->n; i++)
        if (tw_pg_is_up(pool->conns[i]))
            q += tw_pg_queued(pool->conns[i]);
    return q;
}

void tw_pgpool_free(TwPgPool *pool)
{
    /* The last first, out of the pool's count before it is freed: the callbacks of its queries in flight,
     * which run now, pick only connections that still exist (a watchdog's run answered on one asks on
     * another; the first connection, the fallback of tw_pgpool_pick, goes last). */
    while (pool->n > 0) {
        pool->n--;
        tw_pg_free(pool->conns[pool->n]);
    }
}
