/* Jobs: run the program, apply its outcome under the claim's fence, retry while the database is away. */
#include "job.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jsondoc.h"
#include "log.h"
#include "metrics.h"
#include "outbox.h"
#include "steps.h"

/* A failed apply is tried again after 500 ms, then twice as long each time up to 5 s: a turn whose agent row
 * an application keeps locked (tw.submit_turn in a long transaction) waits for it without taking its
 * connection from other work for more than the lock timeout (common/pgconn.c) every few seconds. */
#define WRK_APPLY_RETRY_MS 500
#define WRK_APPLY_RETRY_MAX_MS 5000

static void job_apply(WrkJob *job);

static const char *const state_names[] = {"RUNNING", "APPLYING", "RETRY_WAIT", "RELEASING", "FINISHED"};

/* The moves job.h's state diagram draws, [from][to]. A new job (calloc: RUNNING) starts RUNNING; a FINISHED
 * one is finished again when its program ends (then it is freed). */
static const bool state_moves[5][5] = {
    [WRK_JOB_RUNNING] = {[WRK_JOB_RUNNING] = true,
                         [WRK_JOB_APPLYING] = true,
                         [WRK_JOB_RELEASING] = true,
                         [WRK_JOB_FINISHED] = true},
    [WRK_JOB_APPLYING] = {[WRK_JOB_RETRY_WAIT] = true, [WRK_JOB_FINISHED] = true},
    [WRK_JOB_RETRY_WAIT] = {[WRK_JOB_APPLYING] = true, [WRK_JOB_RELEASING] = true, [WRK_JOB_FINISHED] = true},
    [WRK_JOB_RELEASING] = {[WRK_JOB_FINISHED] = true},
    [WRK_JOB_FINISHED] = {[WRK_JOB_FINISHED] = true},
};

/* Every change of a job's state goes through here (as PgBouncer's change_server_state): a move the diagram
 * does not draw is logged, so that job.h stays true. */
static void job_set_state(WrkJob *job, WrkJobState to)
{
    if (!state_moves[job->state][to])
        log_error("%s: job state %s -> %s is not a move of the diagram (worker/job.h)", job->label,
                  state_names[job->state], state_names[to]);
    log_debug("%s: job state %s -> %s", job->label, state_names[job->state], state_names[to]);
    job->state = to;
}

static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int wrk_jobs_init(WrkJobs *js, struct event_base *base, TwPgPool *pool, TwBus *bus, TwConfig *cfg,
                  const char *worker_id, const char *agents_arr)
{
    memset(js, 0, sizeof *js);
    js->base = base;
    js->pool = pool;
    js->bus = bus;
    js->cfg = cfg;
    js->worker_id = worker_id;
    js->agents_arr = agents_arr;
    /* One serve process per slot: the claim never starts more jobs than slots. */
    js->serve = wrk_serve_new(base, cfg->worker.concurrency);
    js->mcp = wrk_mcp_new(base);
    return js->serve && js->mcp ? 0 : -1;
}

static void job_unlink_free(WrkJob *job)
{
    WrkJobs *js = job->set;

    if (job->prev)
        job->prev->next = job->next;
    else if (js->head == job)
        js->head = job->next;
    if (job->next)
        job->next->prev = job->prev;
    js->n--;
    if (js->on_count)
        js->on_count(js->arg);
    if (job->retry)
        event_free(job->retry);
    if (job->warn)
        event_free(job->warn);
    wrk_job_mcp_free(job);
    json_decref(job->outcome);
    json_decref(job->claim);
    json_decref(job->fence);
    tw_config_unref(job->cfg);
    free(job);
}

/* FINISHED, and freed as soon as its program (if any) has ended; the owner hears of the free slot. */
static void job_finish(WrkJob *job)
{
    WrkJobs *js = job->set;

    job_set_state(job, WRK_JOB_FINISHED);
    if (job->proc || job->served || job->mcp)
        return; /* freed when the program ends */
    job_unlink_free(job);
    if (js->on_slot_free)
        js->on_slot_free(js->arg);
}

WrkJob *wrk_jobs_find(WrkJobs *js, long id)
{
    for (WrkJob *j = js->head; j; j = j->next)
        if (j->id == id)
            return j;
    return NULL;
}

static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
    job_apply(arg);
}

void wrk_job_apply_failed(WrkJob *job, const char *err)
{
    WrkJobs *js = job->set;

    if (job->lost || js->releasing) {
        job_finish(job);
        return;
    }
    job->retry_ms = job->retry_ms ? job->retry_ms * 2 : WRK_APPLY_RETRY_MS;
    if (job->retry_ms > WRK_APPLY_RETRY_MAX_MS)
        job->retry_ms = WRK_APPLY_RETRY_MAX_MS;
    struct timeval tv = {job->retry_ms / 1000, (job->retry_ms % 1000) * 1000};
    log_warn("%s: could not apply the result yet (%s); retrying in %d ms", job->label, err, job->retry_ms);
    job_set_state(job, WRK_JOB_RETRY_WAIT);
    evtimer_add(job->retry, &tv);
}

void wrk_job_applied(WrkJob *job, const json_t *out, json_t *publish)
{
    WrkJobs *js = job->set;

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
    if (js->on_applied)
        js->on_applied(js->arg, job, publish);
}

void wrk_job_done(WrkJob *job)
{
    job_finish(job);
}

static void warned_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    WrkJobs *js = arg; /* not the job: it may be gone by now */
    json_t *pub;

    if (err || !(pub = tw_result_json(res, &err))) {
        static TwLogLimit lim;
        tw_pg_log_failure(&lim, res, "step warning", err);
        return;
    }
    tw_outbox_publish(pg, js->bus, pub);
    json_decref(pub);
}

/* warn_at_percent of the step timeout has passed and the program still runs: one warning event. */
static void warn_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkJob *job = arg;
    WrkJobs *js = job->set;
    char *fence, limit[32], elapsed[32];

    if (job->state != WRK_JOB_RUNNING || job->lost || !job->proc ||
        !(fence = json_dumps(job->fence, JSON_COMPACT)))
        return;
    snprintf(limit, sizeof limit, "%d", job->agent_conf->step_timeout_sec);
    snprintf(elapsed, sizeof elapsed, "%.3f", (double)(mono_ms() - job->started_ms) / 1000.0);
    const char *params[] = {fence, limit, elapsed};
    log_info("%s: %s of its %s s step timeout passed; warning", job->label, elapsed, limit);
    tw_pg_query(tw_pgpool_pick(js->pool), "SELECT tw.warn_step($1::jsonb, $2::numeric, $3::numeric)", 3,
                params, warned_cb, js);
    free(fence);
}

static void job_apply(WrkJob *job)
{
    if (job->lost) {
        job_finish(job);
        return;
    }
    job_set_state(job, WRK_JOB_APPLYING);
    /* To the applier (applier.c): a step's outcome goes in a batch with every other that finished meanwhile,
     * a tool result alone, each kind in at most WRK_APPLY_LANES statements at once. */
    job->set->apply_push(job);
}

static json_t *job_outcome(const WrkJob *job, const WrkProcResult *r)
{
    if (job->is_tool)
        return wrk_tool_outcome((int)json_integer_value(json_object_get(job->claim, "timeout_seconds")), r);
    return wrk_step_outcome(job->cfg, job->agent_conf, r);
}

/* An outcome that says the program's reply was not a reply object: a serve process that wrote it is out of
 * step and is replaced. */
static bool outcome_bad_output(const WrkJob *job)
{
    json_t *e = job->is_tool ? json_object_get(job->outcome, "error") : json_object_get(job->outcome, "fail");
    const char *code = json_string_value(json_object_get(e, job->is_tool ? "code" : "error"));

    return code && strcmp(code, "bad_output") == 0;
}

/* The program's part is over (exec: it exited; serve: its reply line came, or its process ended): apply the
 * outcome. False when the reply was not usable. */
bool wrk_job_program_ended(WrkJob *job, const WrkProcResult *r, json_t *outcome)
{
    bool usable;

    if (job->warn)
        evtimer_del(job->warn);
    if (job->state != WRK_JOB_RUNNING || job->lost || job->set->releasing) {
        log_info("%s: program ended after its claim was lost or released; output dropped", job->label);
        json_decref(outcome);
        if (job->state == WRK_JOB_RUNNING || job->state == WRK_JOB_FINISHED)
            job_finish(job);
        return true; /* RELEASING: freed when the release answers */
    }
    log_debug("%s: program ended outcome=%d in %.3fs", job->label, (int)r->outcome, r->elapsed_sec);
    if (!(job->outcome = outcome ? outcome : job_outcome(job, r))) {
        log_error("%s: out of memory building the outcome", job->label);
        job_finish(job);
        return true;
    }
    /* The program ended by itself (the worker stopped none of these): its run time counts. */
    if (job->is_tool)
        tw_metrics_tool_call(job->tool_conf ? job->tool_conf->name : NULL,
                             json_string_value(json_object_get(job->outcome, "status")), r->elapsed_sec);
    else
        tw_metrics_step(job->agent_conf ? job->agent_conf->name : NULL, r->elapsed_sec);
    usable = r->outcome != WRK_PROC_OK || !outcome_bad_output(job);
    job_apply(job);
    return usable;
}

static void proc_done(WrkProc *proc, const WrkProcResult *r, void *arg)
{
    WrkJob *job = arg;

    job->proc = NULL;
    (void)wrk_job_program_ended(job, r, NULL);
}

static bool serve_done(const WrkProcResult *r, void *arg)
{
    WrkJob *job = arg;

    job->served = NULL;
    return wrk_job_program_ended(job, r, NULL);
}

/* What a job runs: its program as configured, the variables of exec mode and its time limits. */
typedef struct JobProgram {
    char env_turn[80], env_agent[96], env_profile[96], env_epoch[48], env_call[320];
    char *env[6];
    char *const *argv; /* NULL: not configured (any more) */
    const char *exec;
    int timeout, grace, max_requests;
    bool serve, mcp;
    const TwLimitsConf *limits;
} JobProgram;

/* Decode a claim into a new job (RUNNING, as calloc leaves it), in the set. */
static WrkJob *job_new(WrkJobs *js, json_t *claim)
{
    WrkJob *job = calloc(1, sizeof *job);

    if (!job)
        return NULL;
    job->set = js;
    job->id = ++js->next_id;
    job->claim = json_incref(claim);
    /* The step document can be 1 MiB: never send it back with every apply and heartbeat. */
    job->fence = json_copy(claim);
    json_object_del(job->fence, "doc");
    job->is_tool = strcmp(json_string_value(json_object_get(claim, "kind")), "tool") == 0;
    job->agent = json_string_value(json_object_get(claim, "agent"));
    job->turn_id = json_string_value(json_object_get(claim, "turn_id"));
    job->epoch = json_integer_value(json_object_get(claim, "epoch"));
    job->retry = evtimer_new(js->base, retry_cb, job);
    job->cfg = tw_config_ref(js->cfg);
    job->next = js->head;
    if (js->head)
        js->head->prev = job;
    js->head = job;
    js->n++;
    if (js->on_count)
        js->on_count(js->arg);
    return job;
}

/* Choose its program (the tool's, or the agent profile's: docs/roster.md) and name the job. */
static void job_program(WrkJob *job, JobProgram *pg)
{
    WrkJobs *js = job->set;
    const json_t *claim = job->claim;
    const char *profile;

    *pg = (JobProgram){.env = {pg->env_turn, pg->env_agent, pg->env_profile, pg->env_epoch, NULL, NULL}};
    snprintf(pg->env_turn, sizeof pg->env_turn, "TURNWATCH_TURN_ID=%s", job->turn_id);
    snprintf(pg->env_agent, sizeof pg->env_agent, "TURNWATCH_AGENT=%s", job->agent);
    /* The agent's profile picks the program (docs/roster.md); before the roster a step had none. */
    profile = json_string_value(json_object_get(claim, "profile"));
    if (!profile)
        profile = job->agent;
    snprintf(pg->env_profile, sizeof pg->env_profile, "TURNWATCH_PROFILE=%s", profile);
    snprintf(pg->env_epoch, sizeof pg->env_epoch, "TURNWATCH_EPOCH=%lld", job->epoch);
    if (job->is_tool) {
        const char *tool = json_string_value(json_object_get(claim, "tool"));
        const char *call = json_string_value(json_object_get(claim, "tool_call_id"));
        job->tool_conf = tw_config_tool(job->cfg, tool);
        snprintf(job->label, sizeof job->label, "tool=%s call=%s turn=%s epoch=%lld", tool, call,
                 job->turn_id, job->epoch);
        snprintf(pg->env_call, sizeof pg->env_call, "TURNWATCH_TOOL_CALL_ID=%s", call);
        pg->env[4] = pg->env_call;
        pg->argv = job->tool_conf ? job->tool_conf->argv : NULL;
        pg->timeout = (int)json_integer_value(json_object_get(claim, "timeout_seconds"));
        pg->grace = job->tool_conf ? job->tool_conf->kill_grace_sec : 5;
        if (job->tool_conf && job->tool_conf->mcp_argv) {
            pg->mcp = true;
            pg->argv = job->tool_conf->mcp_argv;
        } else if (job->tool_conf) {
            pg->serve = job->tool_conf->serve;
            pg->max_requests = job->tool_conf->max_requests;
            pg->exec = job->tool_conf->exec;
            pg->limits = &job->tool_conf->limits;
        }
        js->tools_run++;
    } else {
        job->agent_conf = tw_config_agent(job->cfg, profile);
        snprintf(job->label, sizeof job->label, "agent=%s turn=%s epoch=%lld step=%lld profile=%s",
                 job->agent, job->turn_id, job->epoch, json_integer_value(json_object_get(claim, "step")),
                 profile);
        pg->argv = job->agent_conf ? job->agent_conf->argv : NULL;
        pg->timeout = job->agent_conf ? job->agent_conf->step_timeout_sec : 1;
        pg->grace = job->agent_conf ? job->agent_conf->kill_grace_sec : 1;
        if (job->agent_conf) {
            pg->serve = job->agent_conf->serve;
            pg->max_requests = job->agent_conf->max_requests;
            pg->exec = job->agent_conf->exec;
            pg->limits = &job->agent_conf->limits;
        }
        js->steps_run++;
    }
    if (pg->timeout <= 0)
        pg->timeout = 1;
}

/* Start its program on the step document (input): a serve process's request, or a process of its own.
 * Returns 0, or the errno of the failure (0 too when there is nothing to start). */
static int job_run(WrkJob *job, const JobProgram *pg, const char *input)
{
    WrkJobs *js = job->set;

    job->started_ms = mono_ms();
    if (pg->argv && input && pg->mcp)
        return wrk_job_mcp_start(job, input, pg->timeout);
    if (pg->argv && input && pg->serve) {
        /* The per-step variables of exec mode are all in the document. */
        WrkServeProgram prog = {.kind = job->is_tool ? "tool" : "agent",
                                .exec = pg->exec,
                                .argv = pg->argv,
                                .grace_sec = pg->grace,
                                .max_requests = pg->max_requests,
                                .limits = pg->limits};
        job->served =
            wrk_serve_call(js->serve, &prog, input, strlen(input), pg->timeout, job->label, serve_done, job);
        return job->served ? 0 : errno;
    }
    if (pg->argv && input) {
        job->proc = wrk_proc_start(js->base, pg->argv, pg->env, pg->limits, input, strlen(input), pg->timeout,
                                   pg->grace, job->label, proc_done, job);
        return job->proc ? 0 : errno;
    }
    return 0;
}

/* A step's warning before its timeout (docs/timeouts.md): the step timeout is this timer's, so is the
 * warning. */
static void job_arm_warning(WrkJob *job, int timeout)
{
    if ((job->proc || job->served) && !job->is_tool && job->agent_conf &&
        job->agent_conf->policy.warn_at_percent > 0 &&
        (job->warn = evtimer_new(job->set->base, warn_cb, job))) {
        int64_t ms = (int64_t)timeout * 10 * job->agent_conf->policy.warn_at_percent;
        struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
        /* A timer counts from the loop's cached time, taken when the loop last woke: behind started_ms by the
         * work done since (the spawn), so a warning could fire that much before its percent (a loaded machine
         * saw 2.389 s for 80 % of 3 s). Count from now, which is no earlier than started_ms. */
        event_base_update_cache_time(job->set->base);
        evtimer_add(job->warn, &tv);
    }
}

void wrk_job_start(WrkJobs *js, json_t *claim)
{
    WrkJob *job = job_new(js, claim);
    JobProgram pg;
    int spawn_errno;

    if (!job)
        return;
    job_program(job, &pg);
    job_set_state(job, WRK_JOB_RUNNING);
    log_info("%s: claimed", job->label);
    /* The document's text, as the database has it. */
    spawn_errno = job_run(job, &pg, json_string_value(json_object_get(claim, "doc")));
    job_arm_warning(job, pg.timeout);
    json_object_del(job->claim, "doc"); /* the program has its copy */
    if (!job->proc && !job->served && !job->mcp) {
        /* Could not start it: that is the step's (or call's) failure, said plainly. */
        WrkProcResult r = wrk_spawn_result(spawn_errno);
        if (!job->outcome)
            job->outcome = job_outcome(job, &r);
        job_apply(job);
    }
}

void wrk_job_lose(WrkJob *job)
{
    if (job->lost || job->state == WRK_JOB_FINISHED)
        return;
    job->lost = true;
    /* APPLYING: its program is done and its outcome on the way; a heartbeat that crossed it finds the call
     * settled (most often by that very outcome): no program to stop, nothing wrong. */
    if (job->state == WRK_JOB_APPLYING)
        log_info("%s: lost its claim while its outcome was applied (most often settled by that outcome)",
                 job->label);
    else
        log_warn("%s: lost its claim (reclaimed, reaped, cancelled or no longer waited for); stopping it",
                 job->label);
    if (job->proc)
        wrk_proc_stop(job->proc, "claim lost");
    else if (job->served)
        wrk_serve_cancel(job->served, "claim lost");
    else if (job->mcp)
        wrk_mcp_cancel(job->mcp, "the call is no longer wanted (its turn was cancelled, or moved on)");
    else if (job->state == WRK_JOB_RETRY_WAIT)
        job_finish(job);
    /* RUNNING: finished when its program ends; APPLYING: its apply lands or is refused by the fence. */
}

static void released_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    WrkJob *job = arg;
    json_t *pub;

    if (!err && (pub = tw_result_json(res, &err))) {
        tw_outbox_publish(pg, job->set->bus, pub);
        json_decref(pub);
        log_info("%s: released for another worker", job->label);
    } else {
        log_warn("%s: could not release (%s); the reclaim watchdog (2.1/2.3) will", job->label, err);
    }
    job->lost = true;
    job_finish(job); /* freed now, or when its program ends */
}

void wrk_jobs_retry_now(WrkJobs *js)
{
    static const struct timeval now = {0, 0};

    for (WrkJob *job = js->head; job; job = job->next)
        if (job->state == WRK_JOB_RETRY_WAIT && !js->releasing) {
            job->retry_ms = 0; /* the backoff starts over: the database is back */
            evtimer_add(job->retry, &now);
        }
}

void wrk_jobs_release_all(WrkJobs *js)
{
    js->releasing = true;
    for (WrkJob *job = js->head, *next; job; job = next) {
        next = job->next;
        if (job->proc)
            wrk_proc_stop(job->proc, "worker shutting down");
        else if (job->served)
            wrk_serve_cancel(job->served, "worker shutting down");
        if (job->state != WRK_JOB_RUNNING && job->state != WRK_JOB_RETRY_WAIT)
            continue; /* an apply is on its way in (let it land), or it is done */
        char id[32], token[32];
        const char *params[] = {json_string_value(json_object_get(job->claim, "fence")), id, token};
        snprintf(id, sizeof id, "%lld", json_integer_value(json_object_get(job->claim, "id")));
        snprintf(token, sizeof token, "%lld", json_integer_value(json_object_get(job->claim, "token")));
        evtimer_del(job->retry);
        job_set_state(job, WRK_JOB_RELEASING);
        tw_pg_query(tw_pgpool_pick(js->pool), "SELECT tw.release($1, $2::bigint, $3::bigint)", 3, params,
                    released_cb, job);
        if (job->mcp) /* now: its end, told at once, finds the job RELEASING and leaves it to released_cb */
            wrk_mcp_cancel(job->mcp, "the worker is shutting down");
    }
}

void wrk_jobs_free_all(WrkJobs *js)
{
    while (js->head)
        job_unlink_free(js->head);
    wrk_serve_free(js->serve);
    js->serve = NULL;
    wrk_mcp_free(js->mcp);
    js->mcp = NULL;
}

size_t wrk_jobs_programs(const WrkJobs *js)
{
    return wrk_proc_count() + wrk_serve_count(js->serve) + wrk_mcp_count(js->mcp);
}
