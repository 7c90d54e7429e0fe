/* turnwatch-worker: parse arguments, load the configuration, check the programs, run the loop. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon.h"
#include "log.h"
#include "metrics.h"
#include "tw_build.h"
#include "worker.h"

int main(int argc, char **argv)
{
    TwDaemonArgs args;
    TwConfig *cfg;
    TwWorker w;
    struct event_base *base;
    char dsn[512], nats[512];
    int rc;

    tw_daemon_hold_signals();
    if ((rc = tw_daemon_args(argc, argv, "turnwatch-worker",
                             "Claims inbox items, runs agent and tool programs, suspends and resumes turns,\n"
                             "and runs the worker watchdogs (2.1-2.3).",
                             &args)) >= 0)
        return rc;
    tw_log_init("turnwatch-worker", args.verbose ? TW_LOG_DEBUG : TW_LOG_INFO);
    /* Every program this worker would run must exist and be executable: say so at start-up, not mid-turn. */
    args.check_programs = true;
    /* On the heap: the worker owns it from wrk_setup on, a SIGHUP replaces it, running jobs keep theirs. */
    if (!(cfg = calloc(1, sizeof *cfg))) {
        fputs("turnwatch-worker: out of memory\n", stderr);
        return 1;
    }
    if ((rc = tw_daemon_config(&args, "turnwatch-worker", cfg)) != 0 || args.check_config) {
        tw_config_unref(cfg);
        return rc;
    }
    /* Descriptors for its programs, the metrics endpoint and the connections. */
    tw_daemon_fd_limit(cfg, true, true);
    signal(SIGPIPE, SIG_IGN);
    if (tw_bus_global_init() != 0 || !(base = event_base_new())) {
        log_error("cannot set up the event loop");
        return 1;
    }
    if (wrk_setup(&w, base, cfg) != 0) {
        log_error("start-up failed");
        wrk_teardown(&w);
        event_base_free(base);
        tw_metrics_reset();
        return 1;
    }
    log_info("turnwatch-worker %s started: id=%s dsn=\"%s\" nats=%s agents=%s tools=%s concurrency=%d",
             TW_VERSION, w.id, tw_redact_dsn(cfg->pg_dsn, dsn, sizeof dsn),
             tw_redact_urls(cfg->nats_url, nats, sizeof nats), w.agents_arr, w.tools_arr,
             cfg->worker.concurrency);
    tw_daemon_signals_ready();
    event_base_dispatch(base);
    wrk_log_counters(&w);
    rc = w.exit_code; /* 1: the database refused the configuration */
    wrk_teardown(&w); /* drops the configuration in force (running jobs were freed with theirs) */
    event_base_free(base);
    tw_metrics_reset();
    log_info("turnwatch-worker stopped");
    return rc;
}
