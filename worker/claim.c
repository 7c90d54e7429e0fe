/* Claiming work: one tw.claim call for as many free slots as the worker has (none: results only). */
#include "claim.h"

#include <event2/event.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "outbox.h"

/* True when the claim wrote a resume ledger entry (its doorbell): under wait any/n that cancelled the calls
 * still waiting, and some of their programs may run here. */
static bool resumed_any(json_t *publish)
{
    size_t i;
    json_t *it;

    json_array_foreach(publish, i, it)
    {
        const char *reason = json_string_value(json_object_get(json_object_get(it, "data"), "reason"));
        if (reason && strcmp(reason, "resume") == 0)
            return true;
    }
    return false;
}

enum { WRK_CLAIM_RETRY_MIN_MS = 2, WRK_CLAIM_RETRY_MAX_MS = 64 };

static void claimed_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    WrkClaim *c = arg;
    json_t *out, *job;
    size_t i;

    c->busy = false;
    if (err || !(out = tw_result_json(res, &err))) {
        static TwLogLimit lim;
        tw_pg_log_failure(&lim, res, "claim", err);
        return; /* the poll timer or the reconnect tries again */
    }
    tw_outbox_publish(pg, c->jobs->bus, json_object_get(out, "publish"));
    json_array_foreach(json_object_get(out, "jobs"), i, job) wrk_job_start(c->jobs, job);
    c->full = json_is_true(json_object_get(out, "more"));
    if (c->full)
        c->dirty = true;
    if (json_is_true(json_object_get(out, "busy")) && !c->full) {
        /* What was busy is held by a transaction that is about to end: look again in a moment. */
        struct timeval tv = {0, c->retry_ms * 1000};
        if (c->retry && !event_pending(c->retry, EV_TIMEOUT, NULL))
            event_add(c->retry, &tv);
        c->retry_ms = c->retry_ms * 2 > WRK_CLAIM_RETRY_MAX_MS ? WRK_CLAIM_RETRY_MAX_MS : c->retry_ms * 2;
    } else {
        c->retry_ms = WRK_CLAIM_RETRY_MIN_MS;
    }
    if (json_array_size(json_object_get(out, "jobs")) > 0 && c->on_claimed)
        c->on_claimed(c->arg, (int)json_array_size(json_object_get(out, "jobs")));
    /* Stop the programs of cancelled calls now rather than at the next heartbeat: they may hold the slots the
     * resumed step needs. */
    if (resumed_any(json_object_get(out, "publish")) && c->on_resumed)
        c->on_resumed(c->arg);
    json_decref(out);
    if (c->on_settled)
        c->on_settled(c->arg);
    wrk_claim_kick(c);
}

void wrk_claim_kick(WrkClaim *c)
{
    WrkJobs *js = c->jobs;
    TwPg *pg = tw_pgpool_pick(js->pool);
    char slots[16], lease[16];
    const char *params[] = {js->worker_id, js->agents_arr, c->tools_arr, slots, lease};
    int free_slots = c->concurrency - js->n;

    if (c->busy || !c->dirty || c->stopped || !tw_pg_is_up(pg))
        return;
    if (free_slots <= 0) {
        /* Every slot is taken, but consuming results takes none: do it now (once per agent doorbell), for a
         * resume under wait any/n cancels calls whose programs may be the very ones holding the slots (the
         * heartbeat then stops them). Other work stays flagged for the next free slot. */
        if (!c->results_dirty)
            return;
        free_slots = 0;
    } else {
        c->dirty = false;
    }
    c->results_dirty = false;
    c->busy = true;
    snprintf(slots, sizeof slots, "%d", free_slots);
    snprintf(lease, sizeof lease, "%d", c->lease_sec);
    tw_pg_query(pg, "SELECT tw.claim($1, $2::text[], $3::text[], $4::integer, $5::integer)", 5, params,
                claimed_cb, c);
}

static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkClaim *c = arg;

    c->dirty = true;
    c->results_dirty = true;
    wrk_claim_kick(c);
}

int wrk_claim_init(WrkClaim *c, struct event_base *base)
{
    c->retry_ms = WRK_CLAIM_RETRY_MIN_MS;
    c->retry = evtimer_new(base, retry_cb, c);
    return c->retry ? 0 : -1;
}

void wrk_claim_free(WrkClaim *c)
{
    if (c->retry)
        event_free(c->retry);
    c->retry = NULL;
}
