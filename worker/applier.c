/* The applier: outcomes wait here and go to the database in lanes, at most WRK_APPLY_LANES statements of each
 * kind in flight, so that under load the worker's claims and heartbeats always find a connection of the pool
 * that is not waiting for a lock (with a limit, every result that gives a slot back waits for the limit's
 * row; a claim queued behind them kept a granted call from starting for 240 ms, docs/performance.md). Agent
 * steps go in batches, a group commit: steps that finish while a batch is in flight wait, and the next batch
 * applies them all in one statement (tw.apply_steps), so that one transaction, one WAL flush and a handful of
 * set-based statements serve many turns; at idle a step is applied at once. A batch the database refuses (a
 * lock it could not get in time, a server error) is split: each of its steps is then sent alone, so that one
 * step never holds back the others. A batch does not wait for an agent's row another transaction holds (an
 * application's open submit): tw.apply_steps answers that step "busy", unapplied, and it is handed back and
 * sent alone, to wait for that row (at most lock_timeout) holding no other agent's. Tool results go one per
 * statement (tw.deliver_result): delivered together, they would hold all their rows while waiting for a
 * limit's. */
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
    bool tools; /* its queue is js->apply[tools] */
    size_t n;
    WrkJob *jobs[];
} Batch;

static void flush(WrkJobs *js, bool tools);

/* Back at the head of the queue, to go alone. */
static void requeue_one(struct WrkApplyQueue *q, WrkJob *job)
{
    job->apply_alone = true;
    job->apply_next = q->head;
    q->head = job;
    if (!q->tail)
        q->tail = job;
}

static void requeue_alone(Batch *b)
{
    /* In the same order. */
    for (size_t i = b->n; i-- > 0;)
        requeue_one(&b->js->apply[b->tools], b->jobs[i]);
}

static void batch_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    Batch *b = arg;
    WrkJobs *js = b->js;
    json_t *out = NULL, *results, *publish, *next, *job_next;
    size_t i, last;

    js->apply[b->tools].in_flight--;
    if (!err && b->tools && (out = tw_result_json(res, &err))) {
        /* One tool result: tw.deliver_result's answer is the item's, with the publish of all, and the call it
         * took for this worker in the slot it frees (its "jobs") is the batch's next. */
        json_t *one =
            json_pack("{s:[O],s:O,s:O}", "results", out, "publish",
                      json_object_get(out, "publish") ? json_object_get(out, "publish") : json_null(), "next",
                      json_object_get(out, "jobs") ? json_object_get(out, "jobs") : json_null());
        json_decref(out);
        if (!(out = one))
            err = "out of memory";
    }
    if (err || (!out && !(out = tw_result_json(res, &err))) ||
        !json_is_array(results = json_object_get(out, "results")) || json_array_size(results) != b->n) {
        if (b->n > 1) {
            log_info("applier: a batch of %zu %s was refused (%s); each goes alone", b->n,
                     b->tools ? "tool results" : "steps",
                     err ? err : "an answer that does not fit the batch");
            requeue_alone(b);
        } else {
            wrk_job_apply_failed(b->jobs[0], err ? err : "an answer that does not fit the job");
        }
        json_decref(out);
        flush(js, b->tools);
        free(b);
        return;
    }
    publish = json_object_get(out, "publish");
    /* A job whose row another transaction holds was left out, unapplied (busy): back at the head, in the same
     * order, to go alone. Nothing of it was written (an agent has one step in flight at most, a call one
     * result, so nothing of theirs can overtake it); it stays APPLYING, and the batch's other jobs settle
     * now. */
    for (i = b->n; i-- > 0;)
        if (json_is_true(json_object_get(json_array_get(results, i), "busy"))) {
            log_debug("%s: a row it needs is held by another transaction; it goes again alone",
                      b->jobs[i]->label);
            requeue_one(&js->apply[b->tools], b->jobs[i]);
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
    flush(js, b->tools);
    free(b);
}

/* Up to WRK_APPLY_BATCH_MAX steps from the head of the queue, one tool result: a job that must go alone goes
 * alone. */
static Batch *take(WrkJobs *js, bool tools)
{
    struct WrkApplyQueue *q = &js->apply[tools];
    Batch *b = malloc(sizeof *b + WRK_APPLY_BATCH_MAX * sizeof(WrkJob *));

    if (!b)
        return NULL;
    b->js = js;
    b->tools = tools;
    b->n = 0;
    while (q->head && b->n < (tools ? 1 : WRK_APPLY_BATCH_MAX)) {
        WrkJob *job = q->head;
        if (job->apply_alone && b->n > 0)
            break;
        q->head = job->apply_next;
        if (!q->head)
            q->tail = NULL;
        job->apply_next = NULL;
        b->jobs[b->n++] = job;
        if (job->apply_alone)
            break;
    }
    return b;
}

/* One tool job's result (tw.deliver_result). */
static void result_send(WrkJobs *js, Batch *b)
{
    const WrkJob *job = b->jobs[0];
    const json_t *o = job->outcome, *output = json_object_get(o, "output"),
                 *error = json_object_get(o, "error");
    char *fence = tw_json_dumps(job->fence, JSON_COMPACT);
    char *a = output && !json_is_null(output) ? tw_json_dumps(output, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    char *e = error ? tw_json_dumps(error, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;

    if (!fence || (output && !json_is_null(output) && !a) || (error && !e)) {
        wrk_job_apply_failed(b->jobs[0], "out of memory");
        free(b);
    } else {
        const char *params[] = {job->turn_id,
                                json_string_value(json_object_get(job->claim, "tool_call_id")),
                                json_string_value(json_object_get(o, "status")),
                                a,
                                e,
                                fence,
                                js->stopping ? NULL : js->worker_id,
                                js->tools_arr,
                                js->agents_arr};
        js->apply[b->tools].in_flight++;
        /* With our id, a call that the limits this result gives back grant to one of our tools comes back
         * taken for us, in the slot this result frees, and the result is consumed for its turn when we serve
         * its profile (no doorbell for every worker of it). */
        tw_pg_query(
            tw_pgpool_pick(js->pool),
            "SELECT tw.deliver_result($1::uuid, $2, $3, $4::jsonb, $5::jsonb, $6::jsonb, 'tool.result', $7,"
            " $8::text[], $9::text[])",
            9, params, batch_cb, b);
    }
    free(fence);
    free(a);
    free(e);
}

static void batch_send(WrkJobs *js, Batch *b)
{
    json_t *items;
    char *text;

    if (b->tools) {
        result_send(js, b);
        return;
    }
    items = json_array();
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
    js->apply[b->tools].in_flight++;
    tw_pg_query(tw_pgpool_pick(js->pool), "SELECT tw.apply_steps($1::jsonb, $2, $3::text[])", 3, params,
                batch_cb, b);
    free(text);
}

static void flush(WrkJobs *js, bool tools)
{
    struct WrkApplyQueue *q = &js->apply[tools];

    while (q->head && q->in_flight < WRK_APPLY_LANES) {
        Batch *b = take(js, tools);
        if (!b) {
            /* Out of memory: leave them queued; the next batch that comes back tries again. */
            if (q->in_flight == 0)
                for (WrkJob *job; (job = q->head);) {
                    q->head = job->apply_next;
                    job->apply_next = NULL;
                    wrk_job_apply_failed(job, "out of memory");
                }
            q->tail = q->head ? q->tail : NULL;
            return;
        }
        batch_send(js, b);
    }
}

void wrk_applier_push(WrkJob *job)
{
    WrkJobs *js = job->set;
    struct WrkApplyQueue *q = &js->apply[job->is_tool];

    job->apply_next = NULL;
    if (q->tail)
        q->tail->apply_next = job;
    else
        q->head = job;
    q->tail = job;
    flush(js, job->is_tool);
}
