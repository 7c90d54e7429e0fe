/* A job is one claimed piece of work: an agent step or a tool call. It runs its program, then applies
 * the outcome with a compare-and-set on its claim token and the turn epoch. While the database is away
 * the apply is retried; once the claim is lost (reclaimed, reaped, cancelled) the output is dropped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "outbox.h"
#include "worker.h"

#define WRK_TOOL_KILL_GRACE_SEC 5
#define WRK_APPLY_RETRY_MS 500

static void job_apply(WrkJob *job);

static json_t *job_outcome(const WrkJob *job, const WrkProcResult *r)
{
    if (job->is_tool)
        return wrk_tool_outcome((int)json_integer_value(json_object_get(job->claim, "timeout_seconds")), r);
    return wrk_step_outcome(job->w->cfg, job->agent_conf, r);
}

void wrk_job_free(WrkJob *job)
{
    TwWorker *w;

    if (!job)
        return;
    w = job->w;
    if (job->prev)
        job->prev->next = job->next;
    else if (w->jobs == job)
        w->jobs = job->next;
    if (job->next)
        job->next->prev = job->prev;
    w->n_jobs--;
    if (job->retry)
        event_free(job->retry);
    json_decref(job->outcome);
    json_decref(job->claim);
    json_decref(job->fence);
    free(job);
    /* A slot is free: take more work if some may be waiting. */
    wrk_claim_kick(w);
}

/* Doorbells for targets we serve ourselves need no round trip through NATS. */
static void note_own_doorbells(TwWorker *w, json_t *publish)
{
    size_t i;
    json_t *it;

    json_array_foreach(publish, i, it)
    {
        const char *subject = json_string_value(json_object_get(it, "subject"));
        const char *target = json_string_value(json_object_get(json_object_get(it, "data"), "target"));
        if (!subject || !target || json_object_get(it, "event_id"))
            continue;
        if ((strncmp(subject, "cmd.agent.", 10) == 0 && tw_config_agent(w->cfg, target)) ||
            (strncmp(subject, "cmd.tool.", 9) == 0 && tw_config_tool(w->cfg, target)))
            if (tw_config_serves(w->cfg, target))
                w->claim_dirty = true;
    }
}

static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
    job_apply(arg);
}

static void applied_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    WrkJob *job = arg;
    TwWorker *w = job->w;
    json_t *out;

    job->applying = false;
    if (err || !(out = tw_result_json(res, &err))) {
        if (job->lost || w->releasing) {
            wrk_job_free(job);
            return;
        }
        struct timeval tv = {0, WRK_APPLY_RETRY_MS * 1000};
        log_warn("%s: could not apply the result yet (%s); retrying", job->label, err);
        evtimer_add(job->retry, &tv);
        return;
    }
    if (job->is_tool) {
        const char *result = json_string_value(json_object_get(out, "result"));
        if (result && strcmp(result, "accepted") == 0)
            log_info("%s: result delivered status=%s", job->label,
                     json_string_value(json_object_get(job->outcome, "status")));
        else
            log_info("%s: result not used (%s)", job->label, result ? result : "?");
    } else if (json_is_true(json_object_get(out, "applied"))) {
        const char *kind = json_object_get(job->outcome, "complete")     ? "complete"
                           : json_object_get(job->outcome, "tool_calls") ? "tool_calls"
                                                                         : "fail";
        log_info("%s: step applied: %s%s%s", job->label, kind, strcmp(kind, "fail") == 0 ? " error=" : "",
                 strcmp(kind, "fail") == 0
                     ? json_string_value(json_object_get(json_object_get(job->outcome, "fail"), "error"))
                     : "");
    } else {
        log_info("%s: step output dropped: the turn moved on (reclaimed, reaped or cancelled)", job->label);
    }
    note_own_doorbells(w, json_object_get(out, "publish"));
    tw_outbox_publish(pg, w->bus, json_object_get(out, "publish"));
    /* Start the next turn before freeing this job, so that the claim this free kicks off counts it. */
    if (json_is_object(json_object_get(out, "next")))
        wrk_job_start(w, json_object_get(out, "next"));
    json_decref(out);
    wrk_job_free(job);
}

static void job_apply(WrkJob *job)
{
    TwWorker *w = job->w;
    char *fence = NULL, *a = NULL, *b = NULL;

    if (job->lost) {
        wrk_job_free(job);
        return;
    }
    job->applying = true;
    fence = json_dumps(job->fence, JSON_COMPACT);
    if (job->is_tool) {
        json_t *o = job->outcome;
        a = json_dumps(json_object_get(o, "output"), JSON_COMPACT | JSON_ENCODE_ANY);
        b = json_dumps(json_object_get(o, "error"), JSON_COMPACT | JSON_ENCODE_ANY);
        const char *params[] = {
            job->turn_id,
            json_string_value(json_object_get(job->claim, "tool_call_id")),
            json_string_value(json_object_get(o, "status")),
            json_is_null(json_object_get(o, "output")) || !json_object_get(o, "output") ? NULL : a,
            json_object_get(o, "error") ? b : NULL,
            fence};
        tw_pg_query(
            wrk_pg(w),
            "SELECT tw.deliver_result($1::uuid, $2, $3, $4::jsonb, $5::jsonb, $6::jsonb, 'tool.result')", 6,
            params, applied_cb, job);
    } else {
        a = json_dumps(job->outcome, JSON_COMPACT);
        /* With our id, the agent's next turn comes back already claimed for this worker (its slot is ours).
         */
        const char *params[] = {fence, a, w->stopping ? NULL : w->id, w->agents_arr};
        tw_pg_query(wrk_pg(w), "SELECT tw.apply_step($1::jsonb, $2::jsonb, $3, $4::text[])", 4, params,
                    applied_cb, job);
    }
    free(fence);
    free(a);
    free(b);
}

static void proc_done(WrkProc *proc, const WrkProcResult *r, void *arg)
{
    WrkJob *job = arg;

    job->proc = NULL;
    if (job->lost || job->w->releasing) {
        log_info("%s: program ended after its claim was lost or released; output dropped", job->label);
        if (!job->release_pending)
            wrk_job_free(job);
        return;
    }
    log_debug("%s: program ended outcome=%d in %.3fs", job->label, (int)r->outcome, r->elapsed_sec);
    job->outcome = job_outcome(job, r);
    if (!job->outcome) {
        log_error("%s: out of memory building the outcome", job->label);
        wrk_job_free(job);
        return;
    }
    job_apply(job);
}

void wrk_job_start(TwWorker *w, json_t *claim)
{
    WrkJob *job = calloc(1, sizeof *job);
    char env_turn[80], env_agent[96], env_epoch[48], env_call[320];
    char *env[5] = {env_turn, env_agent, env_epoch, NULL, NULL};
    char *const *argv;
    int timeout, grace;
    char *input;

    if (!job)
        return;
    job->w = w;
    job->id = ++w->next_job_id;
    job->claim = json_incref(claim);
    /* The step document can be 1 MiB: never send it back with every apply and heartbeat. */
    job->fence = json_copy(claim);
    json_object_del(job->fence, "doc");
    job->is_tool = strcmp(json_string_value(json_object_get(claim, "kind")), "tool") == 0;
    job->agent = json_string_value(json_object_get(claim, "agent"));
    job->turn_id = json_string_value(json_object_get(claim, "turn_id"));
    job->epoch = json_integer_value(json_object_get(claim, "epoch"));
    job->retry = evtimer_new(w->base, retry_cb, job);
    job->next = w->jobs;
    if (w->jobs)
        w->jobs->prev = job;
    w->jobs = job;
    w->n_jobs++;

    snprintf(env_turn, sizeof env_turn, "TURNWATCH_TURN_ID=%s", job->turn_id);
    snprintf(env_agent, sizeof env_agent, "TURNWATCH_AGENT=%s", job->agent);
    snprintf(env_epoch, sizeof env_epoch, "TURNWATCH_EPOCH=%lld", job->epoch);
    if (job->is_tool) {
        const char *tool = json_string_value(json_object_get(claim, "tool"));
        const char *call = json_string_value(json_object_get(claim, "tool_call_id"));
        job->tool_conf = tw_config_tool(w->cfg, tool);
        snprintf(job->label, sizeof job->label, "tool=%s call=%s turn=%s epoch=%lld", tool, call,
                 job->turn_id, job->epoch);
        snprintf(env_call, sizeof env_call, "TURNWATCH_TOOL_CALL_ID=%s", call);
        env[3] = env_call;
        argv = job->tool_conf ? job->tool_conf->argv : NULL;
        timeout = (int)json_integer_value(json_object_get(claim, "timeout_seconds"));
        grace = WRK_TOOL_KILL_GRACE_SEC;
        w->tools_run++;
    } else {
        job->agent_conf = tw_config_agent(w->cfg, job->agent);
        snprintf(job->label, sizeof job->label, "agent=%s turn=%s epoch=%lld step=%lld", job->agent,
                 job->turn_id, job->epoch, json_integer_value(json_object_get(claim, "step")));
        argv = job->agent_conf ? job->agent_conf->argv : NULL;
        timeout = job->agent_conf ? job->agent_conf->step_timeout_sec : 1;
        grace = job->agent_conf ? job->agent_conf->kill_grace_sec : 1;
        w->steps_run++;
    }
    if (timeout <= 0)
        timeout = 1;
    log_info("%s: claimed", job->label);
    input = json_dumps(json_object_get(claim, "doc"), JSON_COMPACT);
    if (argv && input)
        job->proc = wrk_proc_start(w->base, argv, env, input, strlen(input), timeout, grace, job->label,
                                   proc_done, job);
    free(input);
    json_object_del(job->claim, "doc"); /* the program has its copy */
    if (!job->proc) {
        /* Could not start it: that is the step's (or call's) failure, said plainly. */
        WrkProcResult r = {.outcome = WRK_PROC_SPAWN, .stderr_tail = "", .output = ""};
        job->outcome = job_outcome(job, &r);
        job_apply(job);
    }
}

typedef struct Release {
    TwWorker *w;
    WrkJob *job;
} Release;

static void released_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    WrkJob *job = arg;
    json_t *pub;

    if (!err && (pub = tw_result_json(res, &err))) {
        tw_outbox_publish(pg, job->w->bus, pub);
        json_decref(pub);
        log_info("%s: released for another worker", job->label);
    } else {
        log_warn("%s: could not release (%s); the reclaim watchdog (2.1/2.3) will", job->label, err);
    }
    job->release_pending = false;
    job->lost = true;
    if (!job->proc)
        wrk_job_free(job);
    /* else: freed when its program ends */
}

/* Second signal: stop every program and hand the claims back at once. */
void wrk_jobs_release_all(TwWorker *w)
{
    w->releasing = true;
    for (WrkJob *job = w->jobs, *next; job; job = next) {
        next = job->next;
        if (job->proc)
            wrk_proc_stop(job->proc, "worker shutting down");
        if (job->applying)
            continue; /* its result is on the way in; let it land */
        char id[32], token[32];
        const char *params[] = {json_string_value(json_object_get(job->claim, "fence")), id, token};
        snprintf(id, sizeof id, "%lld", json_integer_value(json_object_get(job->claim, "id")));
        snprintf(token, sizeof token, "%lld", json_integer_value(json_object_get(job->claim, "token")));
        evtimer_del(job->retry);
        job->release_pending = true;
        tw_pg_query(wrk_pg(w), "SELECT tw.release($1, $2::bigint, $3::bigint)", 3, params, released_cb, job);
    }
}
