/* A worker's capacity in state.daemons (see capacity.h). */
#include "capacity.h"

#include <stdio.h>
#include <time.h>

#include "log.h"

static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void send_state(WrkCapacity *c, int state);

static void written_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    WrkCapacity *c = arg;
    int sent = c->in_flight;

    c->in_flight = -1;
    if (err) {
        static TwLogLimit lim;
        tw_pg_log_failure(&lim, res, "capacity", err);
        c->reported = -1; /* written again at the next change or reconnect */
        return;
    }
    c->reported = sent;
    /* The state moved on while the write was on its way. */
    if (c->free_since_ms == 0 && c->reported != 0)
        send_state(c, 0);
    else if (c->free_since_ms != 0 && c->reported != 1 &&
             mono_ms() - c->free_since_ms >= WRK_CAPACITY_LAZY_MS)
        send_state(c, 1);
}

static void send_state(WrkCapacity *c, int state)
{
    char free_ms[32], slots[16];
    const char *params[] = {c->id, state ? "true" : "false", free_ms, slots};

    if (c->in_flight >= 0)
        return; /* written_cb looks again */
    snprintf(free_ms, sizeof free_ms, "%lld", state ? (long long)(mono_ms() - c->free_since_ms) : 0LL);
    snprintf(slots, sizeof slots, "%d", c->slots);
    c->in_flight = state;
    tw_pg_query(tw_pgpool_pick(c->pool),
                "SELECT tw.daemon_capacity($1, $2::boolean, $3::bigint, $4::integer)", 4, params, written_cb,
                c);
}

static void lazy_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkCapacity *c = arg;

    if (c->free_since_ms != 0 && c->reported != 1)
        send_state(c, 1);
}

int wrk_capacity_init(WrkCapacity *c, struct event_base *base, TwPgPool *pool, const char *id, int slots)
{
    *c = (WrkCapacity){.pool = pool, .id = id, .slots = slots, .reported = -1, .in_flight = -1};
    c->timer = evtimer_new(base, lazy_cb, c);
    return c->timer ? 0 : -1;
}

void wrk_capacity_update(WrkCapacity *c, bool free_now)
{
    if (!c->timer)
        return;
    if (!free_now) {
        c->free_since_ms = 0;
        evtimer_del(c->timer);
        if (c->reported != 0)
            send_state(c, 0);
        return;
    }
    if (c->free_since_ms == 0)
        c->free_since_ms = mono_ms();
    if (c->reported != 1 && !evtimer_pending(c->timer, NULL)) {
        int64_t left = WRK_CAPACITY_LAZY_MS - (mono_ms() - c->free_since_ms);
        struct timeval tv = {0, 0};
        if (left > 0)
            tv = (struct timeval){left / 1000, (left % 1000) * 1000};
        evtimer_add(c->timer, &tv);
    }
}

void wrk_capacity_reset(WrkCapacity *c, bool free_now)
{
    c->reported = -1;
    wrk_capacity_update(c, free_now);
}

void wrk_capacity_free(WrkCapacity *c)
{
    if (c->timer)
        event_free(c->timer);
    c->timer = NULL;
}
