/* turnwatch-pmo: parse arguments, load the configuration, run the loop. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon.h"
#include "log.h"
#include "metrics.h"
#include "pmo.h"
#include "tw_build.h"

int main(int argc, char **argv)
{
    TwDaemonArgs args;
    TwConfig *cfg;
    TwPmo pmo;
    struct event_base *base;
    char dsn[512], nats[512];
    int rc;

    tw_daemon_hold_signals();
    if ((rc = tw_daemon_args(argc, argv, "turnwatch-pmo",
                             "Dispatches pending turns to agents, runs the PMO watchdogs (2.4-2.7 and turn\n"
                             "deadlines) and relays unpublished outbox events.",
                             &args)) >= 0)
        return rc;
    tw_log_init("turnwatch-pmo", args.verbose ? TW_LOG_DEBUG : TW_LOG_INFO);
    /* On the heap: the PMO owns it from pmo_setup on, and a SIGHUP replaces it. */
    if (!(cfg = calloc(1, sizeof *cfg))) {
        fputs("turnwatch-pmo: out of memory\n", stderr);
        return 1;
    }
    if ((rc = tw_daemon_config(&args, "turnwatch-pmo", cfg)) != 0 || args.check_config) {
        tw_config_unref(cfg);
        return rc;
    }
    tw_daemon_fd_limit(cfg, false, true);
    signal(SIGPIPE, SIG_IGN);
    if (tw_bus_global_init() != 0 || !(base = event_base_new())) {
        log_error("cannot set up the event loop");
        return 1;
    }
    if (pmo_setup(&pmo, base, cfg) != 0) {
        log_error("start-up failed");
        pmo_teardown(&pmo);
        event_base_free(base);
        tw_metrics_reset();
        return 1;
    }
    log_info("turnwatch-pmo %s started: dsn=\"%s\" nats=%s watchdog_interval=%ds", TW_VERSION,
             tw_redact_dsn(cfg->pg_dsn, dsn, sizeof dsn), tw_redact_urls(cfg->nats_url, nats, sizeof nats),
             cfg->pmo.watchdog_interval_sec);
    tw_daemon_signals_ready();
    event_base_dispatch(base);
    tw_rules_log_counters("pmo", pmo.rules, pmo.n_rules);
    tw_rules_log_counters("pmo liveness", tw_live_rule(pmo.live), 1);
    rc = pmo.exit_code; /* 1: the database refused the configuration */
    pmo_teardown(&pmo); /* drops the configuration in force */
    event_base_free(base);
    tw_metrics_reset();
    log_info("turnwatch-pmo stopped");
    return rc;
}
