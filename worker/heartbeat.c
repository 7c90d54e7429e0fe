/* Heartbeats: renew every claim, lease and running turn this worker holds, in one call. Whatever comes
 * back lost (reclaimed, reaped, cancelled, a tool call no longer waited for) is stopped at once and its
 * output dropped: this is how fencing reaches a program that is still running. */
#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "outbox.h"
#include "worker.h"

typedef struct Beat {
    TwWorker *w;
    long *ids; /* job ids in the order sent */
    size_t n;
} Beat;

static WrkJob *find_job(TwWorker *w, long id)
{
    for (WrkJob *j = w->jobs; j; j = j->next)
        if (j->id == id)
            return j;
    return NULL;
}

static void beat_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    Beat *b = arg;
    TwWorker *w = b->w;
    json_t *lost, *idx;
    size_t i;

    w->heartbeat_busy = false;
    if (err || !(lost = tw_result_json(res, &err))) {
        static TwLogLimit lim;
        tw_pg_log_failure(&lim, res, "heartbeat", err);
        goto out;
    }
    json_array_foreach(lost, i, idx)
    {
        json_int_t k = json_integer_value(idx);
        WrkJob *job = (k >= 0 && (size_t)k < b->n) ? find_job(w, b->ids[k]) : NULL;
        if (!job || job->lost)
            continue;
        job->lost = true;
        log_warn("%s: lost its claim (reclaimed, reaped, cancelled or no longer waited for); stopping it",
                 job->label);
        if (job->proc)
            wrk_proc_stop(job->proc, "claim lost");
        else if (!job->applying && !job->release_pending)
            wrk_job_free(job);
    }
    json_decref(lost);
out:
    free(b->ids);
    free(b);
}

void wrk_heartbeat_tick(TwWorker *w)
{
    json_t *holdings;
    Beat *b;
    char *doc, lease[16];
    size_t i = 0;

    if (w->heartbeat_busy || w->n_jobs == 0 || !tw_pg_is_up(wrk_pg(w)))
        return;
    if (!(b = calloc(1, sizeof *b)) || !(b->ids = calloc((size_t)w->n_jobs, sizeof *b->ids))) {
        free(b);
        return;
    }
    b->w = w;
    holdings = json_array();
    for (WrkJob *j = w->jobs; j; j = j->next, i++) {
        json_array_append(holdings, j->fence);
        b->ids[i] = j->id;
    }
    b->n = i;
    doc = json_dumps(holdings, JSON_COMPACT);
    json_decref(holdings);
    snprintf(lease, sizeof lease, "%d", w->cfg->worker.inbox_processing_timeout_sec);
    const char *params[] = {w->id, doc, lease};
    w->heartbeat_busy = true;
    tw_pg_query(wrk_pg(w), "SELECT tw.heartbeat($1, $2::jsonb, $3::integer)", 3, params, beat_cb, b);
    free(doc);
}
