/* turnwatch-worker: parse arguments, load the configuration, check the programs, run the loop. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "daemon.h"
#include "log.h"
#include "tw_build.h"
#include "worker.h"

/* Every program this worker would run must exist and be executable: say so at start-up, not mid-turn. */
static int check_programs(const TwConfig *cfg)
{
    int bad = 0;

    for (size_t i = 0; i < cfg->n_agents; i++)
        if (tw_config_serves(cfg, cfg->agents[i].name) && access(cfg->agents[i].argv[0], X_OK) != 0) {
            log_error("%s: [agent.%s] exec: %s is not an executable file", cfg->path, cfg->agents[i].name,
                      cfg->agents[i].argv[0]);
            bad++;
        }
    for (size_t i = 0; i < cfg->n_tools; i++)
        if (!cfg->tools[i].external && tw_config_serves(cfg, cfg->tools[i].name) &&
            access(cfg->tools[i].argv[0], X_OK) != 0) {
            log_error("%s: [tool.%s] exec: %s is not an executable file", cfg->path, cfg->tools[i].name,
                      cfg->tools[i].argv[0]);
            bad++;
        }
    return bad ? -1 : 0;
}

int main(int argc, char **argv)
{
    TwDaemonArgs args;
    TwConfig cfg;
    TwWorker w;
    struct event_base *base;
    char dsn[512];
    int rc;

    if ((rc = tw_daemon_args(argc, argv, "turnwatch-worker",
                             "Claims inbox items, runs agent and tool programs, suspends and resumes turns,\n"
                             "and runs the worker watchdogs (2.1-2.3).",
                             &args)) >= 0)
        return rc;
    tw_log_init("turnwatch-worker", args.verbose ? TW_LOG_DEBUG : TW_LOG_INFO);
    if ((rc = tw_daemon_config(&args, "turnwatch-worker", &cfg)) != 0 || args.check_config) {
        tw_config_free(&cfg);
        return rc;
    }
    if (check_programs(&cfg) != 0) {
        tw_config_free(&cfg);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    if (tw_bus_global_init() != 0 || !(base = event_base_new())) {
        log_error("cannot set up the event loop");
        return 1;
    }
    if (wrk_setup(&w, base, &cfg) != 0) {
        log_error("start-up failed");
        return 1;
    }
    log_info("turnwatch-worker %s started: id=%s dsn=\"%s\" nats=%s agents=%s tools=%s concurrency=%d",
             TW_VERSION, w.id, tw_redact_dsn(cfg.pg_dsn, dsn, sizeof dsn), cfg.nats_url, w.agents_arr,
             w.tools_arr, cfg.worker.concurrency);
    event_base_dispatch(base);
    wrk_log_counters(&w);
    wrk_teardown(&w);
    event_base_free(base);
    tw_config_free(&cfg);
    log_info("turnwatch-worker stopped");
    return 0;
}
