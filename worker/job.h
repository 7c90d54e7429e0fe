/* A job is one claimed piece of work: an agent step or a tool call. It runs its program (exec mode: a process
 * of its own, runner.c; serve mode: a request to a long-lived process, serve.c), then applies the
 * outcome with a compare-and-set on its claim token and the turn epoch. While the database is away the apply
 * is retried; once the claim is lost (reclaimed, reaped, cancelled) the output is dropped.
 *
 * States (a job's program, when it has one, runs beside them; a job is freed once it is FINISHED and its
 * program has ended):
 *   RUNNING    --program ends-->            APPLYING (or FINISHED when the claim was lost or released)
 *   RUNNING    --program could not start--> APPLYING (that failure is its outcome)
 *   APPLYING   --applied-->                 FINISHED
 *   APPLYING   --database away-->           RETRY_WAIT --timer--> APPLYING
 *   RUNNING / RETRY_WAIT --release_all-->   RELEASING --released--> FINISHED
 *   any --lost (heartbeat)-->               the program is stopped; FINISHED unless an apply is in flight
 * Every change goes through job_set_state (job.c), which logs a move this diagram does not draw.
 * A job never calls into the files above it: what its owner must hear (a slot freed, what an apply
 * published) goes through the callbacks of WrkJobs. */
#ifndef WRK_JOB_H
#define WRK_JOB_H

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "bus.h"
#include "config.h"
#include "mcp.h"
#include "pgpool.h"
#include "runner.h"
#include "serve.h"

typedef enum {
    WRK_JOB_RUNNING,
    WRK_JOB_APPLYING,
    WRK_JOB_RETRY_WAIT,
    WRK_JOB_RELEASING,
    WRK_JOB_FINISHED
} WrkJobState;

typedef struct WrkJobs WrkJobs;

typedef struct WrkJob {
    struct WrkJob *next, *prev;
    WrkJobs *set;
    long id;
    WrkJobState state;
    bool lost;     /* the claim or epoch moved on: drop the output */
    json_t *claim; /* the job object from tw.claim: fence, id, token, turn_id, epoch, step, ... (no doc) */
    json_t *fence; /* the claim without its doc: what applies, heartbeats and releases send back */
    bool is_tool;
    const char *agent;
    const char *turn_id;
    long long epoch;
    /* The configuration it started with (a reference): a reload does not change a running job. */
    TwConfig *cfg;
    const TwAgentConf *agent_conf; /* in cfg */
    const TwToolConf *tool_conf;
    WrkProc *proc;       /* while its program runs (exec mode) */
    WrkServeReq *served; /* while a serve process works on it (serve mode) */
    WrkMcpCall *mcp;     /* while its MCP server works on it (worker/job_mcp.c) */
    json_t *progress;    /* the MCP call's last progress not yet written, and its timer */
    struct event *progress_ev;
    bool progress_busy; /* a write of it is in flight */
    json_t *outcome;    /* what to apply once the program is done */
    struct event *retry;
    int retry_ms; /* the wait before the next try of a failed apply: grows while it keeps failing */
    struct WrkJob *apply_next; /* in the applier's queue (applier.c) */
    bool apply_alone;          /* a batch it was in failed: it goes alone from now on */
    struct event *warn; /* a step's warning at warn_at_percent of its step timeout (docs/timeouts.md) */
    int64_t started_ms; /* monotonic, when its program started */
    char label[256];
} WrkJob;

struct WrkJobs {
    struct event_base *base;
    TwPgPool *pool;
    TwBus *bus;
    TwConfig *cfg;          /* the owner's, for jobs that start now (each takes a reference) */
    const char *worker_id;  /* recorded as claimed_by */
    const char *agents_arr; /* the served agents as a text[] literal */
    const char *tools_arr;  /* the served tools as a text[] literal (set by the owner) */
    WrkServe *serve;        /* the serve-mode processes, one per slot at most */
    WrkMcp *mcp;            /* the MCP servers, one per tool section */
    bool stopping;          /* set by the owner: applies no longer take the agent's next turn */
    bool releasing;         /* set by wrk_jobs_release_all */
    WrkJob *head;
    int n;
    long next_id;
    /* The applier (applier.c): outcomes that wait for a batch, and the batches in flight; [0] agent steps,
     * [1] tool results. */
    struct WrkApplyQueue {
        WrkJob *head, *tail;
        int in_flight;
    } apply[2];
    long steps_run, tools_run;
    /* The owner's callbacks. */
    void (*on_slot_free)(void *arg);                                   /* a job was freed */
    void (*on_count)(void *arg);                                       /* n changed */
    void (*on_applied)(void *arg, const WrkJob *job, json_t *publish); /* before publishing */
    void *arg;
    /* Where a finished job's outcome goes to be applied: the applier's queue (wrk_applier_push, set by the
     * owner), so that jobs never call into the applier, which calls into them. */
    void (*apply_push)(WrkJob *job);
};

int wrk_jobs_init(WrkJobs *js, struct event_base *base, TwPgPool *pool, TwBus *bus, TwConfig *cfg,
                  const char *worker_id, const char *agents_arr) __attribute__((warn_unused_result));
/** Start the job a claim (or an apply's "next") returned: spawn its program. */
void wrk_job_start(WrkJobs *js, json_t *claim);
/** The heartbeat found its claim gone: stop its program, drop its output. */
void wrk_job_lose(WrkJob *job);
WrkJob *wrk_jobs_find(WrkJobs *js, long id);
/** A database connection came up (after an outage, a failover): applies waiting out their retry backoff are
 * tried now, not up to 5 s later. */
void wrk_jobs_retry_now(WrkJobs *js);
/** Second signal: stop every program and hand every claim back at once. */
void wrk_jobs_release_all(WrkJobs *js);
/** Free every job (shutdown), without callbacks, and the serve processes. */
void wrk_jobs_free_all(WrkJobs *js);
/** For the applier: the job's outcome did not land (the database is away, or the job's batch failed alone):
 *  try again after a backoff, or finish it when it was lost meanwhile. */
void wrk_job_apply_failed(WrkJob *job, const char *err);
/** For the applier: what the database said of the job's outcome (out: {"applied"} or {"result"}); the owner
 *  hears of publish (the whole batch's, given with one job of it). */
void wrk_job_applied(WrkJob *job, const json_t *out, json_t *publish);
/** For the applier: the job is done with; its slot is free once its program has ended. */
void wrk_job_done(WrkJob *job);
/** The program's part is over: apply outcome (taken), or when NULL the one r gives. False when the reply
 *  was not usable (a serve process is then replaced). For worker/job_mcp.c. */
bool wrk_job_program_ended(WrkJob *job, const WrkProcResult *r, json_t *outcome);
/** An MCP tool's call (worker/job_mcp.c): start it on the call's document (its args are the arguments);
 *  0, or the errno of a server that could not start. A call whose args are no object gets its error as
 *  job->outcome at once. */
int wrk_job_mcp_start(WrkJob *job, const char *doc, int timeout);
/** What job_mcp.c keeps on a job, freed with it. */
void wrk_job_mcp_free(WrkJob *job);
/** Programs still running: exec runs and serve processes (idle ones too). */
size_t wrk_jobs_programs(const WrkJobs *js);

#endif
