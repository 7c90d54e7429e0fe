/* Start-up shared by turnwatch-pmo and turnwatch-worker. */
#include "daemon.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
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
                   "flight, exit 0; a second signal releases in-flight work at once.\n",
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

int tw_daemon_config(const TwDaemonArgs *args, const char *prog, TwConfig *cfg)
{
    /* The same checks at start-up and with --check-config: a file that passes one passes the other. */
    if (tw_config_load(cfg, args->config_path) != 0 ||
        (args->check_programs && tw_config_check_programs(cfg) != 0)) {
        fputs(cfg->errors ? cfg->errors : "configuration error\n", stderr);
        if (args->check_config)
            fprintf(stderr, "%s: %s: %d error%s\n", prog, args->config_path, cfg->n_errors,
                    cfg->n_errors == 1 ? "" : "s");
        return 1;
    }
    /* [log]: the level (unless -v asked for debug) and the format, before anything is logged. */
    if (!args->verbose)
        tw_log_set_level((TwLogLevel)tw_log_level_parse(cfg->log.level));
    tw_log_set_format(strcmp(cfg->log.format, "json") == 0 ? TW_LOG_JSON : TW_LOG_TEXT);
    if (args->check_config) {
        char dsn[512], nats[512];
        printf("%s: %s is valid: dsn %s, nats %s, %zu agent%s, %zu tool%s\n", prog, args->config_path,
               tw_redact_dsn(cfg->pg_dsn, dsn, sizeof dsn), tw_redact_urls(cfg->nats_url, nats, sizeof nats),
               cfg->n_agents, cfg->n_agents == 1 ? "" : "s", cfg->n_tools, cfg->n_tools == 1 ? "" : "s");
        return 0;
    }
    return 0;
}
