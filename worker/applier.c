/* Group commit of applies: agent steps that finish while a batch is in flight wait, and the next batch
 * applies them all in one statement (tw.apply_steps), so that under load one transaction, one WAL flush and a
 * handful of set-based statements serve many turns; at idle a step is applied at once. A batch the database
 * refuses (a lock it could not get in time, a server error) is split: each of its steps is then sent alone,
 * so that one step never holds back the others. A batch does not wait for an agent's row another transaction
 * holds (an application's open submit): tw.apply_steps answers that step "busy", unapplied, and it is handed
 * back and sent alone, to wait for that row (at most lock_timeout) holding no other agent's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "applier.h"
#include "jsondoc.h"
#include "log.h"
#include "outbox.h"

/* Batches in flight at once (each on the least busy connection) and steps per batch. */
#define WRK_APPLY_LANES 2
#define WRK_APPLY_BATCH_MAX 64

typedef struct Batch {
    WrkJobs *js;
    size_t n;
    WrkJob *jobs[];
} Batch;

static void flush(WrkJobs *js);

/* Back at the head of the queue, to go alone. */
static void requeue_one(WrkJobs *js, WrkJob *job)
{
    job->apply_alone = true;
    job->apply_next = js->apply_head;
    js->apply_head = job;
    if (!js->apply_tail)
        js->apply_tail = job;
}

static void requeue_alone(WrkJobs *js, Batch *b)
{
    /* In the same order. */
    for (size_t i = b->n; i-- > 0;)
        requeue_one(js, b->jobs[i]);
}

static void batch_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    Batch *b = arg;
    WrkJobs *js = b->js;
    json_t *out = NULL, *results, *publish, *next, *job_next;
    size_t i, last;

    js->apply_in_flight--;
    if (err || !(out = tw_result_json(res, &err)) ||
        !json_is_array(results = json_object_get(out, "results")) || json_array_size(results) != b->n) {
        if (b->n > 1) {
            log_info("applier: a batch of %zu steps was refused (%s); each goes alone", b->n,
                     err ? err : "an answer that does not fit the batch");
            requeue_alone(js, b);
        } else {
            wrk_job_apply_failed(b->jobs[0], err ? err : "an answer that does not fit the step");
        }
        json_decref(out);
        free(b);
        flush(js);
        return;
    }
    publish = json_object_get(out, "publish");
    /* A step whose agent's row another transaction holds was left out, unapplied (busy): back at the head, in
     * the same order, to go alone. Nothing of it was written, and an agent has one step in flight at most, so
     * no step of its agent can overtake it; it stays APPLYING, and the batch's other steps settle now. */
    for (i = b->n; i-- > 0;)
        if (json_is_true(json_object_get(json_array_get(results, i), "busy"))) {
            log_debug("%s: its agent's row is held by another transaction; the step goes again alone",
                      b->jobs[i]->label);
            requeue_one(js, b->jobs[i]);
            b->jobs[i] = NULL;
        }
    for (last = b->n; last > 0 && !b->jobs[last - 1]; last--)
        ;
    for (i = 0; i < b->n; i++) {
        if (!b->jobs[i])
            continue;
        b->jobs[i]->apply_alone = false;
        b->jobs[i]->retry_ms = 0;
        wrk_job_applied(b->jobs[i], json_array_get(results, i), i + 1 == last ? publish : NULL);
    }
    tw_outbox_publish(pg, js->bus, publish);
    /* The agents' next turns start before the batch's slots are announced free, so that the claim they start
     * counts them. */
    next = json_object_get(out, "next");
    json_array_foreach(next, i, job_next) wrk_job_start(js, job_next);
    for (i = 0; i < b->n; i++)
        if (b->jobs[i])
            wrk_job_done(b->jobs[i]);
    json_decref(out);
    free(b);
    flush(js);
}

/* Up to WRK_APPLY_BATCH_MAX steps from the head of the queue: a step that must go alone goes alone. */
static Batch *take(WrkJobs *js)
{
    Batch *b = malloc(sizeof *b + WRK_APPLY_BATCH_MAX * sizeof(WrkJob *));

    if (!b)
        return NULL;
    b->js = js;
    b->n = 0;
    while (js->apply_head && b->n < WRK_APPLY_BATCH_MAX) {
        WrkJob *job = js->apply_head;
        if (job->apply_alone && b->n > 0)
            break;
        js->apply_head = job->apply_next;
        if (!js->apply_head)
            js->apply_tail = NULL;
        job->apply_next = NULL;
        b->jobs[b->n++] = job;
        if (job->apply_alone)
            break;
    }
    return b;
}

static void batch_send(WrkJobs *js, Batch *b)
{
    json_t *items = json_array();
    char *text;

    for (size_t i = 0; i < b->n; i++)
        json_array_append_new(
            items, json_pack("{s:O,s:O}", "fence", b->jobs[i]->fence, "reply", b->jobs[i]->outcome));
    text = tw_json_dumps(items, JSON_COMPACT);
    json_decref(items);
    if (!text) {
        /* Out of memory: each step tries again later on its own. */
        for (size_t i = 0; i < b->n; i++)
            wrk_job_apply_failed(b->jobs[i], "out of memory");
        free(b);
        return;
    }
    /* With our id, the agents' next turns come back already claimed for this worker (the slots are ours). */
    const char *params[] = {text, js->stopping ? NULL : js->worker_id, js->agents_arr};
    js->apply_in_flight++;
    tw_pg_query(tw_pgpool_pick(js->pool), "SELECT tw.apply_steps($1::jsonb, $2, $3::text[])", 3, params,
                batch_cb, b);
    free(text);
}

static void flush(WrkJobs *js)
{
    while (js->apply_head && js->apply_in_flight < WRK_APPLY_LANES) {
        Batch *b = take(js);
        if (!b) {
            /* Out of memory: leave them queued; the next batch that comes back tries again. */
            if (js->apply_in_flight == 0)
                for (WrkJob *job; (job = js->apply_head);) {
                    js->apply_head = job->apply_next;
                    job->apply_next = NULL;
                    wrk_job_apply_failed(job, "out of memory");
                }
            js->apply_tail = js->apply_head ? js->apply_tail : NULL;
            return;
        }
        batch_send(js, b);
    }
}

void wrk_applier_push(WrkJob *job)
{
    WrkJobs *js = job->set;

    job->apply_next = NULL;
    if (js->apply_tail)
        js->apply_tail->apply_next = job;
    else
        js->apply_head = job;
    js->apply_tail = job;
    flush(js);
}
