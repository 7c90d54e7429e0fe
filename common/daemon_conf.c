/* The configuration a daemon runs by: loaded at start-up and read again at a reload with the same checks, its
 * [log] settings, and the open-files limit it needs. */
#include "daemon_conf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "httpd.h"
#include "log.h"
#include "natsopts.h"

/* Descriptors a daemon holds besides its metrics connections and a worker's programs: the loop, the log, the
 * PostgreSQL and NATS connections and what their libraries keep. Generous on purpose. */
#define TW_DAEMON_FDS_BASE 64
/* Per slot of [worker] concurrency: a step's program and a serve process, three pipes each. */
#define TW_DAEMON_FDS_PER_SLOT 6

/* -v: debug whatever [log] level says, at start-up and after every reload. */
static bool daemon_verbose;

/* The [nats] files as the start read them: the NATS connection was made from these, so a reload says which
 * changed since. */
static TwNatsFiles daemon_nats_files;

void tw_daemon_apply_log(const TwConfig *cfg)
{
    if (!daemon_verbose)
        tw_log_set_level((TwLogLevel)tw_log_level_parse(cfg->log.level));
    tw_log_set_format(strcmp(cfg->log.format, "json") == 0 ? TW_LOG_JSON : TW_LOG_TEXT);
}

int tw_daemon_config(const TwDaemonArgs *args, const char *prog, TwConfig *cfg)
{
    /* The same checks at start-up and with --check-config: a file that passes one passes the other. The
     * [nats] files (TLS, credentials) are read here too: one that cannot be is the configuration's fault. */
    if (tw_config_load(cfg, args->config_path) != 0 ||
        (args->check_programs && tw_config_check_programs(cfg) != 0) || tw_nats_check(cfg) != 0) {
        fputs(cfg->errors ? cfg->errors : "configuration error\n", stderr);
        if (args->check_config)
            fprintf(stderr, "%s: %s: %d error%s\n", prog, args->config_path, cfg->n_errors,
                    cfg->n_errors == 1 ? "" : "s");
        return 1;
    }
    /* [log]: the level (unless -v asked for debug) and the format, before anything is logged. */
    daemon_verbose = args->verbose;
    tw_daemon_apply_log(cfg);
    tw_nats_warn_modes(cfg);
    if (!args->check_config)
        tw_nats_files_stamp(cfg, &daemon_nats_files);
    if (args->check_config) {
        char dsn[512], nats[512];
        printf("%s: %s is valid: dsn %s, nats %s, %zu agent%s, %zu tool%s\n", prog, args->config_path,
               tw_redact_dsn(cfg->pg_dsn, dsn, sizeof dsn), tw_redact_urls(cfg->nats_url, nats, sizeof nats),
               cfg->n_agents, cfg->n_agents == 1 ? "" : "s", cfg->n_tools, cfg->n_tools == 1 ? "" : "s");
        return 0;
    }
    return 0;
}

TwConfig *tw_daemon_reload(const char *path, bool check_programs)
{
    TwConfig *cfg = calloc(1, sizeof *cfg);

    if (!cfg) {
        log_error("reload: out of memory; the running configuration is kept");
        return NULL;
    }
    /* The [nats] files with the checks of a start: one the daemon could not start with is an error here
     * too, not a reload that says "applied" and a restart that fails. */
    if (tw_config_load(cfg, path) != 0 || (check_programs && tw_config_check_programs(cfg) != 0) ||
        tw_nats_check(cfg) != 0) {
        /* One line per error, so that each reaches the log whole (JSON lines too). */
        char *save = NULL;
        for (char *line = cfg->errors ? strtok_r(cfg->errors, "\n", &save) : NULL; line;
             line = strtok_r(NULL, "\n", &save))
            log_error("reload: %s", line);
        log_error("reload refused: %s has %d error%s; the running configuration is kept", path, cfg->n_errors,
                  cfg->n_errors == 1 ? "" : "s");
        tw_config_unref(cfg);
        return NULL;
    }
    tw_nats_warn_modes(cfg);
    tw_nats_files_report(&daemon_nats_files, cfg);
    return cfg;
}

void tw_daemon_fd_limit(const TwConfig *cfg, bool runs_programs, bool raise)
{
    const char *listen = runs_programs ? cfg->worker.metrics_listen : cfg->pmo.metrics_listen;
    long need = TW_DAEMON_FDS_BASE, metrics = *listen ? TW_HTTPD_MAX_CONNECTIONS + 1 : 0;
    long programs = runs_programs ? (long)TW_DAEMON_FDS_PER_SLOT * cfg->worker.concurrency : 0;
    struct rlimit rl;
    rlim_t was;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        log_warn("open files: cannot read the limit: %s", strerror(errno));
        return;
    }
    was = rl.rlim_cur;
    if (raise && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) == 0) {
            log_info("open files: limit raised from %llu to the hard limit, %llu", (unsigned long long)was,
                     (unsigned long long)rl.rlim_cur);
        } else {
            log_warn("open files: cannot raise the limit from %llu to %llu: %s", (unsigned long long)was,
                     (unsigned long long)rl.rlim_max, strerror(errno));
            rl.rlim_cur = was;
        }
    }
    need += metrics + programs;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (rlim_t)need)
        log_warn(
            "open files: the limit is %llu, below the %ld this configuration may use at once (%d for the "
            "daemon itself, %ld for metrics_listen, %ld for programs: %d per slot of concurrency); raise it "
            "(LimitNOFILE= in the systemd unit, ulimit -n)",
            (unsigned long long)rl.rlim_cur, need, TW_DAEMON_FDS_BASE, metrics, programs,
            TW_DAEMON_FDS_PER_SLOT);
}
