/* A daemon's main and what it does before its loop: the flags, and the signals held until the loop handles
 * them; the configuration's part is daemon_conf.c's. */
#include "daemon.h"

#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"
#include "tw_build.h"

int tw_daemon_args(int argc, char **argv, const char *prog, const char *summary, TwDaemonArgs *args)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'}, {"check-config", no_argument, NULL, 'C'},
        {"version", no_argument, NULL, 'V'},      {"help", no_argument, NULL, 'h'},
        {"verbose", no_argument, NULL, 'v'},      {NULL, 0, NULL, 0},
    };
    int c;

    memset(args, 0, sizeof *args);
    args->config_path = TW_DEFAULT_CONFIG;
    while ((c = getopt_long(argc, argv, "c:vh", longopts, NULL)) != -1) {
        switch (c) {
        case 'c':
            args->config_path = optarg;
            break;
        case 'C':
            args->check_config = true;
            break;
        case 'v':
            args->verbose = true;
            break;
        case 'V':
            printf("%s %s\n", prog, TW_VERSION);
            return 0;
        case 'h':
            printf("Usage: %s [-c FILE] [--check-config] [-v] [--version] [--help]\n\n%s\n\n"
                   "Options:\n"
                   "  -c, --config FILE   INI configuration (default %s)\n"
                   "      --check-config  validate the configuration, print what is wrong, exit 0 or 1\n"
                   "  -v, --verbose       log debug lines too\n"
                   "      --version       print the version and exit\n"
                   "  -h, --help          print this help and exit\n\n"
                   "Logs go to stderr. SIGTERM or SIGINT: stop taking work, finish or release what is in\n"
                   "flight, exit 0; a second signal releases in-flight work at once. SIGHUP: read the\n"
                   "configuration again and apply it (running steps keep theirs); a file with errors is\n"
                   "logged and the running configuration kept. [pmo]/[worker] metrics_listen serves\n"
                   "/metrics and /healthz over HTTP. Under systemd (Type=notify) it sends READY=1 once\n"
                   "connected, STATUS, RELOADING, STOPPING and WATCHDOG keep-alives.\n",
                   prog, summary, TW_DEFAULT_CONFIG);
            return 0;
        default:
            fprintf(stderr, "%s: try --help\n", prog);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'; try --help\n", prog, argv[optind]);
        return 2;
    }
    return -1;
}

static sigset_t held_signals(void)
{
    sigset_t set;

    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    return set;
}

void tw_daemon_hold_signals(void)
{
    sigset_t set = held_signals();
    const char *pause = getenv("TW_TEST_STARTUP_PAUSE_MS");

    pthread_sigmask(SIG_BLOCK, &set, NULL);
    /* tests/test_startup.c: a start-up that takes long enough to be signalled in, whatever the machine. */
    if (pause && atoi(pause) > 0 && atoi(pause) <= 10000)
        usleep((useconds_t)atoi(pause) * 1000);
}

void tw_daemon_signals_ready(void)
{
    sigset_t set = held_signals();

    /* One that came meanwhile is delivered now, to the handler libevent installed. */
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

int tw_daemon_main(int argc, char **argv, const TwDaemonOps *ops, void *self, TwDaemon *d)
{
    TwDaemonArgs args;
    TwConfig *cfg;
    struct event_base *base;
    int rc;

    tw_daemon_hold_signals();
    if ((rc = tw_daemon_args(argc, argv, ops->prog, ops->summary, &args)) >= 0)
        return rc;
    tw_log_init(ops->prog, args.verbose ? TW_LOG_DEBUG : TW_LOG_INFO);
    /* Every program a worker would run must exist and be executable: say so at start-up, not mid-turn. */
    args.check_programs = ops->runs_programs;
    /* On the heap: the daemon owns it from setup on, a SIGHUP replaces it, a worker's running jobs keep
     * theirs. */
    if (!(cfg = calloc(1, sizeof *cfg))) {
        fprintf(stderr, "%s: out of memory\n", ops->prog);
        return 1;
    }
    if ((rc = tw_daemon_config(&args, ops->prog, cfg)) != 0 || args.check_config) {
        tw_config_unref(cfg);
        return rc;
    }
    /* Descriptors for the connections, the metrics endpoint and a worker's programs. */
    tw_daemon_fd_limit(cfg, ops->runs_programs, true);
    signal(SIGPIPE, SIG_IGN);
    if (tw_bus_global_init() != 0 || !(base = event_base_new())) {
        log_error("cannot set up the event loop");
        return 1;
    }
    if (ops->setup(self, base, cfg) != 0) {
        log_error("start-up failed");
        ops->teardown(self);
        event_base_free(base);
        tw_metrics_reset();
        return 1;
    }
    tw_daemon_signals_ready();
    event_base_dispatch(base);
    tw_daemon_log_counters(d);
    rc = d->exit_code; /* 1: the database refused the configuration */
    /* Drops the configuration in force (a worker's running jobs were freed with theirs). */
    ops->teardown(self);
    event_base_free(base);
    tw_metrics_reset();
    log_info("%s stopped", ops->prog);
    return rc;
}
