/* A job whose tool is an MCP server (docs/mcp.md): its call goes to the tool's server (worker/mcp.h), its
 * end is applied as any program's, and its progress notifications are written to the call's row, the last one
 * at most once a second, for `turnwatch turn show` and the console's timeline. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job.h"
#include "log.h"
#include "mcp_proto.h"
#include "outbox.h"
#include "utf8.h"

/* A call's progress is written at most this often (a flood of notifications is one write a second). */
#define WRK_MCP_PROGRESS_MS 1000
/* The longest progress message kept. */
#define WRK_MCP_PROGRESS_TEXT 512

static void mcp_done(json_t *outcome, double elapsed_sec, void *arg)
{
    WrkJob *job = arg;
    WrkProcResult r = {.outcome = outcome ? WRK_PROC_OK : WRK_PROC_STOPPED, .elapsed_sec = elapsed_sec};

    job->mcp = NULL;
    if (job->progress_ev)
        evtimer_del(job->progress_ev);
    (void)wrk_job_program_ended(job, &r, outcome);
}

static void progress_written(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    json_t *out;

    if (err || !(out = tw_result_json(res, &err))) {
        static TwLogLimit lim;
        tw_pg_log_failure(&lim, res, "tool progress", err);
        return;
    }
    json_decref(out);
}

static void progress_cb(evutil_socket_t fd, short what, void *arg)
{
    WrkJob *job = arg;
    char *fence, *doc;

    if (!job->progress || job->lost || job->state != WRK_JOB_RUNNING ||
        !(fence = json_dumps(job->fence, JSON_COMPACT)))
        return;
    if ((doc = json_dumps(job->progress, JSON_COMPACT))) {
        const char *params[] = {fence, doc};
        tw_pg_query(tw_pgpool_pick(job->set->pool), "SELECT to_json(tw.tool_progress($1::jsonb, $2::jsonb))",
                    2, params, progress_written, NULL);
    }
    json_decref(job->progress);
    job->progress = NULL;
    free(doc);
    free(fence);
}

/* notifications/progress: {progress, total?, message?}; the last one is written within a second. */
static void mcp_progress(const json_t *params, void *arg)
{
    WrkJob *job = arg;
    const char *msg = json_string_value(json_object_get(params, "message"));
    json_t *p = json_pack("{s:O}", "progress", json_object_get(params, "progress"));

    if (!p)
        return;
    if (json_is_number(json_object_get(params, "total")))
        json_object_set(p, "total", json_object_get(params, "total"));
    if (msg) {
        char text[WRK_MCP_PROGRESS_TEXT];
        tw_utf8_clean(text, sizeof text, msg, strlen(msg));
        json_object_set_new(p, "message", json_string(text));
    }
    json_decref(job->progress);
    job->progress = p;
    if (!job->progress_ev && !(job->progress_ev = evtimer_new(job->set->base, progress_cb, job)))
        return;
    if (!evtimer_pending(job->progress_ev, NULL)) {
        struct timeval tv = {0, WRK_MCP_PROGRESS_MS * 1000};
        evtimer_add(job->progress_ev, &tv);
    }
}

int wrk_job_mcp_start(WrkJob *job, const char *doc, int timeout)
{
    const TwToolConf *t = job->tool_conf;
    json_t *d = json_loads(doc, 0, NULL), *args = json_object_get(d, "args");
    int err = 0;

    if (!args || json_is_null(args)) {
        json_decref(d);
        d = json_pack("{s:{}}", "args");
        args = json_object_get(d, "args");
    }
    if (!json_is_object(args)) {
        job->outcome = wrk_mcp_error_outcome("error", "mcp_tool_error",
                                             "the call's args must be an object: they are the MCP tool's "
                                             "arguments");
        json_decref(d);
        return 0;
    }
    WrkMcpProgram prog = {.tool = t->name,
                          .exec = t->mcp_exec,
                          .argv = t->mcp_argv,
                          .mcp_tool = t->mcp_tool ? t->mcp_tool : t->name,
                          .grace_sec = t->kill_grace_sec,
                          .max_inflight = t->mcp_max_inflight,
                          .limits = &t->limits};
    job->mcp = wrk_mcp_call(job->set->mcp, &prog, args, timeout, job->label, mcp_done, mcp_progress, job);
    if (!job->mcp)
        err = errno;
    json_decref(d);
    return err;
}

void wrk_job_mcp_free(WrkJob *job)
{
    if (job->progress_ev)
        event_free(job->progress_ev);
    json_decref(job->progress);
}
