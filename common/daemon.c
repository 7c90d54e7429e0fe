/* Start-up shared by turnwatch-pmo and turnwatch-worker. */
#include "daemon.h"

#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>

#include "httpd.h"
#include "log.h"
#include "metrics.h"
#include "natsopts.h"
#include "profiles.h"
#include "tw_build.h"

/* Descriptors a daemon holds besides its metrics connections and a worker's programs: the loop, the log, the
 * PostgreSQL and NATS connections and what their libraries keep. Generous on purpose. */
#define TW_DAEMON_FDS_BASE 64
/* Per slot of [worker] concurrency: a step's program and a serve process, three pipes each. */
#define TW_DAEMON_FDS_PER_SLOT 6

/* -v: debug whatever [log] level says, at start-up and after every reload. */
static bool daemon_verbose;

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
    if (tw_config_load(cfg, path) != 0 || (check_programs && tw_config_check_programs(cfg) != 0)) {
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

typedef struct Reload {
    TwApplyConfigFn apply;
    void *daemon;
    TwNotify *notify;
    TwConfig *cfg;
    bool runs_programs;
    bool *busy;
    const bool *stopping;
} Reload;

static void reload_done(TwNotify *notify, bool ok)
{
    tw_metrics_reload_result(ok);
    tw_notify_reloaded(notify, ok);
}

/* The database's answer to the new file's profiles: apply it, or refuse it (issue 23). */
static void reload_vetted(TwProfilesOutcome outcome, const char *why, void *arg)
{
    Reload r = *(Reload *)arg;

    free(arg);
    *r.busy = false;
    if (*r.stopping) {
        tw_config_unref(r.cfg);
        return;
    }
    if (outcome == TW_PROFILES_REFUSED) {
        log_error("reload refused: %s: %s; the running configuration is kept", r.cfg->path, why);
        tw_config_unref(r.cfg);
        reload_done(r.notify, false);
        return;
    }
    if (outcome == TW_PROFILES_UNKNOWN)
        log_warn("reload: the profiles of %s could not be checked against the roster (%s); applying it, they "
                 "are published when the database answers",
                 r.cfg->path, why ? why : "no answer");
    bool ok = r.apply(r.daemon, r.cfg) == 0;
    if (ok)
        tw_daemon_fd_limit(r.cfg, r.runs_programs, false); /* r.cfg is the one in force now */
    reload_done(r.notify, ok);
}

void tw_daemon_sighup(const char *path, bool check_programs, TwApplyConfigFn apply, void *daemon,
                      TwNotify *notify, TwPg *pg, bool *busy, const bool *stopping)
{
    TwConfig *cfg;
    Reload *r;

    if (*busy) {
        log_warn(
            "SIGHUP: the last reload is still being checked against the database; ignored (send it again "
            "once that one is applied or refused)");
        return;
    }
    log_info("SIGHUP: reading %s again", path);
    tw_notify_reloading(notify);
    if (!(cfg = tw_daemon_reload(path, check_programs))) {
        reload_done(notify, false);
        return;
    }
    if (!(r = malloc(sizeof *r))) {
        log_error("reload refused: out of memory; the running configuration is kept");
        tw_config_unref(cfg);
        reload_done(notify, false);
        return;
    }
    *r = (Reload){apply, daemon, notify, cfg, check_programs, busy, stopping};
    *busy = true;
    tw_profiles_publish(pg, cfg, reload_vetted, r);
}

/* A global key's value as text, for the change log. */
static void param_text(const TwParam *p, const void *base, char *buf, size_t size)
{
    const char *at = (const char *)base + p->offset;

    switch (p->type) {
    case TW_PT_INT:
        snprintf(buf, size, "%d", *(const int *)at);
        break;
    case TW_PT_BOOL:
        snprintf(buf, size, "%s", *(const bool *)at ? "true" : "false");
        break;
    case TW_PT_STR:
    case TW_PT_LIST:
        snprintf(buf, size, "%s", *(char *const *)at ? *(char *const *)at : "");
        break;
    case TW_PT_ARGV:
        snprintf(buf, size, "(program)");
        break;
    }
}

static bool limits_same(const TwLimitsConf *a, const TwLimitsConf *b)
{
    return a->memory_limit_mb == b->memory_limit_mb && a->cpu_limit_sec == b->cpu_limit_sec &&
           a->max_open_files == b->max_open_files && a->max_processes == b->max_processes &&
           strcmp(a->run_as_user ? a->run_as_user : "", b->run_as_user ? b->run_as_user : "") == 0;
}

static bool agent_same(const TwAgentConf *a, const TwAgentConf *b)
{
    return strcmp(a->exec ? a->exec : "", b->exec ? b->exec : "") == 0 &&
           a->step_timeout_sec == b->step_timeout_sec && a->kill_grace_sec == b->kill_grace_sec &&
           limits_same(&a->limits, &b->limits);
}

static bool tool_same(const TwToolConf *a, const TwToolConf *b)
{
    return strcmp(a->exec ? a->exec : "", b->exec ? b->exec : "") == 0 && a->external == b->external &&
           a->timeout_sec == b->timeout_sec && a->suspend_timeout_sec == b->suspend_timeout_sec &&
           limits_same(&a->limits, &b->limits);
}

void tw_daemon_log_changes(const TwConfig *old, const TwConfig *cfg)
{
    size_t np;
    const TwParam *params = tw_config_params(&np);
    int changes = 0;

    for (size_t i = 0; i < np; i++) {
        const TwParam *p = &params[i];
        char a[512], b[512];
        if (p->section > TW_SEC_LOG)
            continue;
        param_text(p, old, a, sizeof a);
        param_text(p, cfg, b, sizeof b);
        if (strcmp(a, b) == 0)
            continue;
        changes++;
        if (p->flags & TW_PF_RESTART)
            /* The connections stay as they are (and a DSN or URL may hold a password: no values). */
            log_warn("reload: [%s] %s changed; it takes effect at the next restart",
                     tw_config_section_name(p->section), p->key);
        else
            log_info("reload: [%s] %s: %s -> %s", tw_config_section_name(p->section), p->key, a, b);
    }
    for (size_t i = 0; i < cfg->n_agents; i++) {
        const TwAgentConf *was = tw_config_agent(old, cfg->agents[i].name);
        if (!was || !agent_same(was, &cfg->agents[i])) {
            changes++;
            log_info("reload: [agent.%s] %s", cfg->agents[i].name, was ? "changed" : "added");
        }
    }
    for (size_t i = 0; i < old->n_agents; i++)
        if (!tw_config_agent(cfg, old->agents[i].name)) {
            changes++;
            log_info("reload: [agent.%s] removed", old->agents[i].name);
        }
    for (size_t i = 0; i < cfg->n_tools; i++) {
        const TwToolConf *was = tw_config_tool(old, cfg->tools[i].name);
        if (!was || !tool_same(was, &cfg->tools[i])) {
            changes++;
            log_info("reload: [tool.%s] %s", cfg->tools[i].name, was ? "changed" : "added");
        }
    }
    for (size_t i = 0; i < old->n_tools; i++)
        if (!tw_config_tool(cfg, old->tools[i].name)) {
            changes++;
            log_info("reload: [tool.%s] removed", old->tools[i].name);
        }
    if (changes == 0)
        log_info("reload: nothing changed");
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
