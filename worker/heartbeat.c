/* Heartbeats: one tw.heartbeat call for everything the worker holds; what comes back lost is stopped. */
#include "heartbeat.h"

#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "outbox.h"

typedef struct Beat {
    WrkBeat *b;
    long *ids; /* job ids in the order sent */
    size_t n;
} Beat;

static void beat_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    Beat *beat = arg;
    WrkBeat *b = beat->b;
    json_t *out, *lost, *released, *idx, *act;
    size_t i;

    b->busy = false;
    if (err || !(out = tw_result_json(res, &err))) {
        static TwLogLimit lim;
        tw_pg_log_failure(&lim, res, "heartbeat", err);
        goto out;
    }
    lost = json_object_get(out, "lost");
    json_array_foreach(lost, i, idx)
    {
        json_int_t k = json_integer_value(idx);
        WrkJob *job = (k >= 0 && (size_t)k < beat->n) ? wrk_jobs_find(b->jobs, beat->ids[k]) : NULL;
        if (job)
            wrk_job_lose(job);
    }
    released = json_object_get(json_object_get(out, "released"), "actions");
    json_array_foreach(released, i, act)
    {
        char *text = json_dumps(act, JSON_COMPACT);
        log_warn("heartbeat: %s was recorded as claimed by this worker, which never heard of it (an answer "
                 "lost with its connection); given back for another worker %s",
                 json_string_value(json_object_get(act, "fence")), text ? text : "");
        free(text);
    }
    tw_outbox_publish(pg, b->jobs->bus, json_object_get(json_object_get(out, "released"), "publish"));
    json_decref(out);
out:
    free(beat->ids);
    free(beat);
}

void wrk_heartbeat_tick(WrkBeat *b)
{
    WrkJobs *js = b->jobs;
    TwPg *pg = tw_pgpool_pick(js->pool);
    json_t *holdings;
    Beat *beat;
    char *doc, lease[16], grace[16];
    size_t i = 0;

    if (b->busy || !tw_pg_is_up(pg))
        return;
    if (!(beat = calloc(1, sizeof *beat)) ||
        (js->n > 0 && !(beat->ids = calloc((size_t)js->n, sizeof *beat->ids)))) {
        free(beat);
        return;
    }
    beat->b = b;
    holdings = json_array();
    for (WrkJob *j = js->head; j; j = j->next, i++) {
        json_array_append(holdings, j->fence);
        beat->ids[i] = j->id;
    }
    beat->n = i;
    doc = json_dumps(holdings, JSON_COMPACT);
    json_decref(holdings);
    snprintf(lease, sizeof lease, "%d", b->lease_sec);
    snprintf(grace, sizeof grace, "%d", b->unknown_grace_sec > 0 ? b->unknown_grace_sec : 60);
    const char *params[] = {js->worker_id, doc, lease, grace};
    b->busy = true;
    /* Holding nothing, there is nothing to renew, but something of ours may still be recorded. */
    tw_pg_query(pg,
                "SELECT json_build_object('lost', CASE WHEN $2::jsonb = '[]' THEN '[]'::jsonb ELSE "
                "tw.heartbeat($1, $2::jsonb, $3::integer) END, 'released', tw.release_unknown($1, $2::jsonb, "
                "$4::integer))",
                4, params, beat_cb, beat);
    free(doc);
}
