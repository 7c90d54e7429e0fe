/* Claiming work: one tw.claim call for as many free slots as the worker has. */
#include <stdio.h>

#include "log.h"
#include "outbox.h"
#include "worker.h"

static void claimed_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    TwWorker *w = arg;
    json_t *out, *job;
    size_t i;

    w->claim_busy = false;
    if (err || !(out = tw_result_json(res, &err))) {
        log_debug("claim failed: %s", err);
        return; /* the poll timer or the reconnect tries again */
    }
    tw_outbox_publish(pg, w->bus, json_object_get(out, "publish"));
    json_array_foreach(json_object_get(out, "jobs"), i, job)
        wrk_job_start(w, job);
    if (json_is_true(json_object_get(out, "more")))
        w->claim_dirty = true;
    json_decref(out);
    wrk_claim_kick(w);
}

void wrk_claim_kick(TwWorker *w)
{
    char slots[16], lease[16];
    const char *params[] = {w->id, w->agents_arr, w->tools_arr, slots, lease};
    int free_slots = w->cfg->worker.concurrency - w->n_jobs;

    if (w->claim_busy || !w->claim_dirty || w->stopping || free_slots <= 0 || !tw_pg_is_up(wrk_pg(w)))
        return;
    w->claim_dirty = false;
    w->claim_busy = true;
    snprintf(slots, sizeof slots, "%d", free_slots);
    snprintf(lease, sizeof lease, "%d", w->cfg->worker.inbox_processing_timeout_sec);
    tw_pg_query(wrk_pg(w), "SELECT tw.claim($1, $2::text[], $3::text[], $4::integer, $5::integer)", 5, params,
                claimed_cb, w);
}
