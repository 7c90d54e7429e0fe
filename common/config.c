/* The INI configuration: one table of parameters, inih for the syntax, our own rules for the values. */
#include "config.h"
#include "log.h"

#include <errno.h>
#include <ini.h>
#include <libpq-fe.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "names.h"

#define G(field) offsetof(TwConfig, field)
#define A(field) offsetof(TwAgentConf, field)
#define T(field) offsetof(TwToolConf, field)

#define TW_RETRY_ON_DEFAULT "step_timeout,agent_exit,timeout_reaped_by_watchdog,dispatch_timeout"

/* Every key of contract section 3 with its shipped default; config/turnwatch.ini must agree (tested). */
static const TwParam params[] = {
    {TW_SEC_POSTGRES, "dsn", TW_PT_STR, G(pg_dsn), 0, 0, "postgresql:///turnwatch"},
    {TW_SEC_POSTGRES, "keepalive_seconds", TW_PT_INT, G(pg_keepalive_sec), 0, 3600, "10"},
    {TW_SEC_POSTGRES, "query_timeout_seconds", TW_PT_INT, G(pg_query_timeout_sec), 2, 3600, "30"},
    {TW_SEC_NATS, "url", TW_PT_STR, G(nats_url), 0, 0, "nats://127.0.0.1:4222"},
    {TW_SEC_NATS, "events_stream", TW_PT_STR, G(nats_events_stream), 0, 0, ""},
    {TW_SEC_NATS, "events_max_age_seconds", TW_PT_INT, G(nats_events_max_age_sec), 1, 315360000, "604800"},
    {TW_SEC_NATS, "credentials_file", TW_PT_STR, G(nats_credentials_file), 0, 0, ""},
    {TW_SEC_NATS, "nkey_seed_file", TW_PT_STR, G(nats_nkey_seed_file), 0, 0, ""},
    {TW_SEC_NATS, "user", TW_PT_STR, G(nats_user), 0, 0, ""},
    {TW_SEC_NATS, "password_file", TW_PT_STR, G(nats_password_file), 0, 0, ""},
    {TW_SEC_NATS, "token_file", TW_PT_STR, G(nats_token_file), 0, 0, ""},
    {TW_SEC_NATS, "tls_ca_file", TW_PT_STR, G(nats_tls_ca_file), 0, 0, ""},
    {TW_SEC_NATS, "tls_cert_file", TW_PT_STR, G(nats_tls_cert_file), 0, 0, ""},
    {TW_SEC_NATS, "tls_key_file", TW_PT_STR, G(nats_tls_key_file), 0, 0, ""},
    {TW_SEC_NATS, "events_replicas", TW_PT_INT, G(nats_events_replicas), 1, 5, "1"},
    {TW_SEC_PMO, "watchdog_interval_seconds", TW_PT_INT, G(pmo.watchdog_interval_sec), 1, 86400, "5"},
    {TW_SEC_PMO, "dispatched_retry_seconds", TW_PT_INT, G(pmo.dispatched_retry_sec), 1, 86400, "10"},
    {TW_SEC_PMO, "dispatched_timeout_seconds", TW_PT_INT, G(pmo.dispatched_timeout_sec), 1, 604800, "30"},
    {TW_SEC_PMO, "pending_wakeup_seconds", TW_PT_INT, G(pmo.pending_wakeup_sec), 1, 86400, "5"},
    {TW_SEC_PMO, "pending_wakeup_skip_seconds", TW_PT_INT, G(pmo.pending_wakeup_skip_sec), 1, 604800, "300"},
    {TW_SEC_PMO, "active_reap_seconds", TW_PT_INT, G(pmo.active_reap_sec), 1, 604800, "300"},
    {TW_SEC_PMO, "metrics_listen", TW_PT_STR, G(pmo.metrics_listen), 0, 0, ""},
    {TW_SEC_WORKER, "inbox_processing_timeout_seconds", TW_PT_INT, G(worker.inbox_processing_timeout_sec), 1,
     604800, "300"},
    {TW_SEC_WORKER, "watchdog_interval_seconds", TW_PT_INT, G(worker.watchdog_interval_sec), 1, 86400, "5"},
    {TW_SEC_WORKER, "suspend_timeout_seconds", TW_PT_INT, G(worker.suspend_timeout_sec), 1, 604800, "300"},
    {TW_SEC_WORKER, "heartbeat_seconds", TW_PT_INT, G(worker.heartbeat_sec), 1, 86400, "10"},
    {TW_SEC_WORKER, "concurrency", TW_PT_INT, G(worker.concurrency), 1, 1024, "4"},
    {TW_SEC_WORKER, "agents", TW_PT_LIST, G(worker.agents), 0, 0, "*"},
    {TW_SEC_WORKER, "max_delegation_depth", TW_PT_INT, G(worker.max_delegation_depth), 0, 64, "8"},
    {TW_SEC_WORKER, "max_tree_turns", TW_PT_INT, G(worker.max_tree_turns), 1, 1000000, "10000"},
    {TW_SEC_WORKER, "metrics_listen", TW_PT_STR, G(worker.metrics_listen), 0, 0, ""},
    /* Timeout policies (contract 11): the defaults of every agent; an [agent.NAME] key of the same name (no
     * default of its own) overrides one. */
    {TW_SEC_WORKER, "max_attempts", TW_PT_INT, G(worker.policy.max_attempts), 1, 100, "1"},
    {TW_SEC_WORKER, "retry_on", TW_PT_LIST, G(worker.policy.retry_on), 0, 0, TW_RETRY_ON_DEFAULT},
    {TW_SEC_WORKER, "retry_backoff_seconds", TW_PT_INT, G(worker.policy.retry_backoff_sec), 1, 86400, "1"},
    {TW_SEC_WORKER, "retry_backoff_max_seconds", TW_PT_INT, G(worker.policy.retry_backoff_max_sec), 1, 604800,
     "300"},
    {TW_SEC_WORKER, "queue_timeout_seconds", TW_PT_INT, G(worker.policy.queue_timeout_sec), 0, 604800, "0"},
    {TW_SEC_WORKER, "warn_at_percent", TW_PT_INT, G(worker.policy.warn_at_percent), 0, 99, "80"},
    {TW_SEC_WORKER, "tool_timeout_seconds", TW_PT_INT, G(worker.policy.tool_timeout_sec), 1, 604800, "30"},
    /* Limits on the programs (contract 16): the defaults of every agent and tool; an [agent.NAME] or
     * [tool.NAME] key of the same name (no default of its own) overrides one. */
    {TW_SEC_WORKER, "memory_limit_mb", TW_PT_INT, G(worker.limits.memory_limit_mb), 0, 1048576, "0"},
    {TW_SEC_WORKER, "cpu_limit_seconds", TW_PT_INT, G(worker.limits.cpu_limit_sec), 0, 604800, "0"},
    {TW_SEC_WORKER, "max_open_files", TW_PT_INT, G(worker.limits.max_open_files), 0, 1048576, "0"},
    {TW_SEC_WORKER, "max_processes", TW_PT_INT, G(worker.limits.max_processes), 0, 4194304, "0"},
    {TW_SEC_WORKER, "run_as_user", TW_PT_STR, G(worker.limits.run_as_user), 0, 0, ""},
    {TW_SEC_LOG, "format", TW_PT_STR, G(log.format), 0, 0, "text"},
    {TW_SEC_LOG, "level", TW_PT_STR, G(log.level), 0, 0, "info"},
    {TW_SEC_AGENT, "exec", TW_PT_ARGV, A(argv), 0, 0, NULL},
    {TW_SEC_AGENT, "step_timeout_seconds", TW_PT_INT, A(step_timeout_sec), 1, 604800, "120"},
    {TW_SEC_AGENT, "kill_grace_seconds", TW_PT_INT, A(kill_grace_sec), 1, 3600, "5"},
    {TW_SEC_AGENT, "max_attempts", TW_PT_INT, A(policy.max_attempts), 1, 100, NULL},
    {TW_SEC_AGENT, "retry_on", TW_PT_LIST, A(policy.retry_on), 0, 0, NULL},
    {TW_SEC_AGENT, "retry_backoff_seconds", TW_PT_INT, A(policy.retry_backoff_sec), 1, 86400, NULL},
    {TW_SEC_AGENT, "retry_backoff_max_seconds", TW_PT_INT, A(policy.retry_backoff_max_sec), 1, 604800, NULL},
    {TW_SEC_AGENT, "queue_timeout_seconds", TW_PT_INT, A(policy.queue_timeout_sec), 0, 604800, NULL},
    {TW_SEC_AGENT, "warn_at_percent", TW_PT_INT, A(policy.warn_at_percent), 0, 99, NULL},
    {TW_SEC_AGENT, "tool_timeout_seconds", TW_PT_INT, A(policy.tool_timeout_sec), 1, 604800, NULL},
    {TW_SEC_AGENT, "mode", TW_PT_STR, A(mode), 0, 0, "exec"},
    {TW_SEC_AGENT, "max_requests", TW_PT_INT, A(max_requests), 1, 1000000000, "1000"},
    {TW_SEC_AGENT, "memory_limit_mb", TW_PT_INT, A(limits.memory_limit_mb), 0, 1048576, NULL},
    {TW_SEC_AGENT, "cpu_limit_seconds", TW_PT_INT, A(limits.cpu_limit_sec), 0, 604800, NULL},
    {TW_SEC_AGENT, "max_open_files", TW_PT_INT, A(limits.max_open_files), 0, 1048576, NULL},
    {TW_SEC_AGENT, "max_processes", TW_PT_INT, A(limits.max_processes), 0, 4194304, NULL},
    {TW_SEC_AGENT, "run_as_user", TW_PT_STR, A(limits.run_as_user), 0, 0, NULL},
    {TW_SEC_TOOL, "exec", TW_PT_ARGV, T(argv), 0, 0, NULL},
    {TW_SEC_TOOL, "external", TW_PT_BOOL, T(external), 0, 0, "false"},
    /* No default: a call of a tool without one gets its agent's tool_timeout_seconds (contract 11). */
    {TW_SEC_TOOL, "timeout_seconds", TW_PT_INT, T(timeout_sec), 1, 604800, NULL},
    {TW_SEC_TOOL, "suspend_timeout_seconds", TW_PT_INT, T(suspend_timeout_sec), 1, 604800, "60"},
    {TW_SEC_TOOL, "agent_profile", TW_PT_STR, T(agent_profile), 0, 0, NULL},
    {TW_SEC_TOOL, "mode", TW_PT_STR, T(mode), 0, 0, "exec"},
    {TW_SEC_TOOL, "max_requests", TW_PT_INT, T(max_requests), 1, 1000000000, "1000"},
    {TW_SEC_TOOL, "memory_limit_mb", TW_PT_INT, T(limits.memory_limit_mb), 0, 1048576, NULL},
    {TW_SEC_TOOL, "cpu_limit_seconds", TW_PT_INT, T(limits.cpu_limit_sec), 0, 604800, NULL},
    {TW_SEC_TOOL, "max_open_files", TW_PT_INT, T(limits.max_open_files), 0, 1048576, NULL},
    {TW_SEC_TOOL, "max_processes", TW_PT_INT, T(limits.max_processes), 0, 4194304, NULL},
    {TW_SEC_TOOL, "run_as_user", TW_PT_STR, T(limits.run_as_user), 0, 0, NULL},
};
#define N_PARAMS (sizeof params / sizeof params[0])
_Static_assert(N_PARAMS <= TW_CONFIG_MAX_PARAMS, "grow TW_CONFIG_MAX_PARAMS");

static int pidx(TwSection sec, const char *key)
{
    for (size_t i = 0; i < N_PARAMS; i++)
        if (params[i].section == sec && strcmp(params[i].key, key) == 0)
            return (int)i;
    abort(); /* a typo in this file, not a runtime condition */
}

static const char *section_names[] = {"postgres", "nats", "pmo", "worker", "log", "agent", "tool"};

const TwParam *tw_config_params(size_t *n)
{
    *n = N_PARAMS;
    return params;
}

const char *tw_config_section_name(TwSection s)
{
    return section_names[s];
}

typedef struct ParseState {
    TwConfig *cfg;
    const char *file;
    FILE *fp;
    const char *text; /* or a string */
    size_t text_off;
    int line; /* line being parsed */
    bool at_line_start;
    size_t line_len;   /* bytes of the current line read so far */
    int overlong_line; /* the first line longer than TW_CONFIG_MAX_LINE; reading stopped there */
    char head[256];    /* the current line's first bytes, to name the key of an overlong line */
    size_t head_len;
    char section[200]; /* the last section header read */
    size_t errors_len;
} ParseState;

static void vadd_error(TwConfig *cfg, const char *file, size_t *errors_len, int line, const char *fmt,
                       va_list ap) __attribute__((format(printf, 5, 0)));

static void vadd_error(TwConfig *cfg, const char *file, size_t *errors_len, int line, const char *fmt,
                       va_list ap)
{
    char msg[1024];
    char *grown;
    int n;

    vsnprintf(msg, sizeof msg, fmt, ap);
    if (line > 0)
        n = snprintf(NULL, 0, "%s:%d: %s\n", file, line, msg);
    else
        n = snprintf(NULL, 0, "%s: %s\n", file, msg);
    grown = realloc(cfg->errors, *errors_len + (size_t)n + 1);
    if (!grown)
        return;
    cfg->errors = grown;
    if (line > 0)
        snprintf(cfg->errors + *errors_len, (size_t)n + 1, "%s:%d: %s\n", file, line, msg);
    else
        snprintf(cfg->errors + *errors_len, (size_t)n + 1, "%s: %s\n", file, msg);
    *errors_len += (size_t)n;
    cfg->n_errors++;
}

static void add_error(ParseState *ps, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void add_error(ParseState *ps, int line, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vadd_error(ps->cfg, ps->file, &ps->errors_len, line, fmt, ap);
    va_end(ap);
}

void tw_config_error(TwConfig *cfg, int line, const char *fmt, ...)
{
    size_t len = cfg->errors ? strlen(cfg->errors) : 0;
    va_list ap;

    va_start(ap, fmt);
    vadd_error(cfg, cfg->path ? cfg->path : "(config)", &len, line, fmt, ap);
    va_end(ap);
}

int tw_config_line(const TwConfig *cfg, TwSection sec, const char *key)
{
    for (size_t i = 0; i < N_PARAMS; i++)
        if (params[i].section == sec && strcmp(params[i].key, key) == 0)
            return sec <= TW_SEC_LOG ? cfg->line_of[i] : 0;
    return 0;
}

char **tw_argv_split(const char *line, const char **err)
{
    size_t cap = 8, n = 0, len = strlen(line);
    char **argv = calloc(cap, sizeof *argv);
    char *word = malloc(len + 1);
    size_t wl = 0;
    bool in_word = false;
    char quote = 0;

    *err = NULL;
    if (!argv || !word)
        goto oom;
    for (size_t i = 0; i <= len; i++) {
        char c = line[i];
        if (c == '\0' || (!quote && (c == ' ' || c == '\t'))) {
            if (c == '\0' && quote) {
                *err = "unterminated quote";
                goto fail;
            }
            if (in_word) {
                if (n + 2 > cap) {
                    char **g = realloc(argv, (cap *= 2) * sizeof *argv);
                    if (!g)
                        goto oom;
                    argv = g;
                }
                word[wl] = '\0';
                if (!(argv[n++] = strdup(word)))
                    goto oom;
                argv[n] = NULL;
                wl = 0;
                in_word = false;
            }
            continue;
        }
        in_word = true;
        if (quote) {
            if (c == quote)
                quote = 0;
            else if (c == '\\' && quote == '"' && (line[i + 1] == '"' || line[i + 1] == '\\'))
                word[wl++] = line[++i];
            else
                word[wl++] = c;
        } else if (c == '\'' || c == '"') {
            quote = c;
        } else if (c == '\\' && line[i + 1]) {
            word[wl++] = line[++i];
        } else {
            word[wl++] = c;
        }
    }
    free(word);
    if (n == 0) {
        *err = "is empty";
        tw_argv_free(argv);
        return NULL;
    }
    return argv;
oom:
    *err = "out of memory";
fail:
    free(word);
    tw_argv_free(argv);
    return NULL;
}

void tw_argv_free(char **argv)
{
    if (!argv)
        return;
    for (char **a = argv; *a; a++)
        free(*a);
    free(argv);
}

static bool parse_bool(const char *v, bool *out)
{
    static const char *yes[] = {"true", "yes", "on", "1"}, *no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0)
            return *out = true, true;
        if (strcasecmp(v, no[i]) == 0)
            return *out = false, true;
    }
    return false;
}

static bool list_valid(const char *v)
{
    char *copy, *save = NULL;
    bool ok = true;
    int n = 0;

    if (strcmp(v, "*") == 0)
        return true;
    if (!(copy = strdup(v)))
        return false;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ' || *tok == '\t')
            tok++;
        for (char *e = tok + strlen(tok); e > tok && (e[-1] == ' ' || e[-1] == '\t');)
            *--e = '\0';
        if (!tw_name_valid(tok))
            ok = false;
        n++;
    }
    free(copy);
    return ok && n > 0;
}

/* Store one value; the same code path serves defaults and file values. */
static bool set_value(ParseState *ps, const TwParam *p, void *base, const char *value, const char *secname,
                      int line)
{
    void *dst = (char *)base + p->offset;

    switch (p->type) {
    case TW_PT_INT: {
        char *end;
        long v;
        errno = 0;
        v = strtol(value, &end, 10);
        if (errno || end == value || *end != '\0') {
            add_error(ps, line, "[%s] %s: '%s' is not a whole number", secname, p->key, value);
            return false;
        }
        if (v < p->min || v > p->max) {
            add_error(ps, line, "[%s] %s: %ld is out of range (%ld to %ld)", secname, p->key, v, p->min,
                      p->max);
            return false;
        }
        *(int *)dst = (int)v;
        return true;
    }
    case TW_PT_BOOL:
        if (!parse_bool(value, (bool *)dst)) {
            add_error(ps, line, "[%s] %s: '%s' is not true or false", secname, p->key, value);
            return false;
        }
        return true;
    case TW_PT_STR:
    case TW_PT_LIST: {
        char *copy;
        /* A key whose default is empty may be empty (it means off). */
        if (!*value && !(p->def && !*p->def)) {
            add_error(ps, line, "[%s] %s: must not be empty", secname, p->key);
            return false;
        }
        if (p->type == TW_PT_LIST && !list_valid(value)) {
            add_error(ps, line, "[%s] %s: '%s' must be * or a comma list of names ([A-Za-z0-9_-]{1,64})",
                      secname, p->key, value);
            return false;
        }
        if (!(copy = strdup(value)))
            return false;
        free(*(char **)dst);
        *(char **)dst = copy;
        return true;
    }
    case TW_PT_ARGV: {
        const char *err;
        char **argv = tw_argv_split(value, &err);
        char *copy;
        if (!argv) {
            add_error(ps, line, "[%s] %s: %s", secname, p->key, err);
            return false;
        }
        if (argv[0][0] != '/') {
            add_error(ps, line,
                      "[%s] %s: the program '%s' must be an absolute path (no PATH search, no shell)",
                      secname, p->key, argv[0]);
            tw_argv_free(argv);
            return false;
        }
        tw_argv_free(*(char ***)dst);
        *(char ***)dst = argv;
        /* Keep the line as written, for logs and --check-config. */
        copy = strdup(value);
        if (p->section == TW_SEC_AGENT) {
            free(((TwAgentConf *)base)->exec);
            ((TwAgentConf *)base)->exec = copy;
        } else {
            free(((TwToolConf *)base)->exec);
            ((TwToolConf *)base)->exec = copy;
        }
        return true;
    }
    }
    return false;
}

static void apply_defaults(ParseState *ps, TwSection sec, void *base)
{
    for (size_t i = 0; i < N_PARAMS; i++)
        if (params[i].section == sec && params[i].def)
            (void)set_value(ps, &params[i], base, params[i].def, section_names[sec], 0);
}

/* Find or create the [agent.NAME] / [tool.NAME] entry. */
static void *named_section(ParseState *ps, TwSection sec, const char *name, int line)
{
    TwConfig *cfg = ps->cfg;

    if (sec == TW_SEC_AGENT) {
        for (size_t i = 0; i < cfg->n_agents; i++)
            if (strcmp(cfg->agents[i].name, name) == 0)
                return &cfg->agents[i];
        TwAgentConf *g = realloc(cfg->agents, (cfg->n_agents + 1) * sizeof *g);
        if (!g)
            return NULL;
        cfg->agents = g;
        TwAgentConf *a = &cfg->agents[cfg->n_agents++];
        memset(a, 0, sizeof *a);
        snprintf(a->name, sizeof a->name, "%s", name);
        a->section_line = line;
        apply_defaults(ps, TW_SEC_AGENT, a);
        return a;
    }
    for (size_t i = 0; i < cfg->n_tools; i++)
        if (strcmp(cfg->tools[i].name, name) == 0)
            return &cfg->tools[i];
    TwToolConf *g = realloc(cfg->tools, (cfg->n_tools + 1) * sizeof *g);
    if (!g)
        return NULL;
    cfg->tools = g;
    TwToolConf *t = &cfg->tools[cfg->n_tools++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->section_line = line;
    apply_defaults(ps, TW_SEC_TOOL, t);
    return t;
}

/* Map a section header to its kind; for agent/tool, name gets the part after the dot. */
static int classify_section(const char *section, const char **name)
{
    *name = NULL;
    for (int s = TW_SEC_POSTGRES; s <= TW_SEC_LOG; s++)
        if (strcmp(section, section_names[s]) == 0)
            return s;
    if (strncmp(section, "agent.", 6) == 0) {
        *name = section + 6;
        return TW_SEC_AGENT;
    }
    if (strncmp(section, "tool.", 5) == 0) {
        *name = section + 5;
        return TW_SEC_TOOL;
    }
    return -1;
}

/* Called for every section header seen by the reader, so that empty sections are known too. */
static void on_section(ParseState *ps, const char *section)
{
    const char *name;
    int sec = classify_section(section, &name);

    snprintf(ps->section, sizeof ps->section, "%s", section);
    if (sec < 0) {
        add_error(ps, ps->line,
                  "[%s]: unknown section (expected postgres, nats, pmo, worker, agent.NAME, tool.NAME)",
                  section);
        return;
    }
    if (name && !tw_name_valid(name)) {
        add_error(ps, ps->line, "[%s]: invalid %s name '%s' (allowed: [A-Za-z0-9_-]{1,64})", section,
                  section_names[sec], name);
        return;
    }
    if (name) {
        void *existing = NULL;
        if (sec == TW_SEC_AGENT)
            existing = (void *)tw_config_agent(ps->cfg, name);
        else
            existing = (void *)tw_config_tool(ps->cfg, name);
        if (existing)
            add_error(ps, ps->line, "[%s]: section appears twice", section);
        else
            (void)named_section(ps, (TwSection)sec, name, ps->line);
    }
}

static int on_key(void *user, const char *section, const char *key, const char *value)
{
    ParseState *ps = user;
    const char *name;
    int sec = classify_section(section, &name);
    void *base;
    int *line_of;

    if (ps->overlong_line)
        return 1; /* the head of a line that is refused as a whole */
    if (sec < 0 || (name && !tw_name_valid(name)))
        return 1; /* reported once at the header */
    if (sec == TW_SEC_AGENT || sec == TW_SEC_TOOL) {
        base = named_section(ps, (TwSection)sec, name, ps->line);
        if (!base)
            return 0;
        line_of = sec == TW_SEC_AGENT ? ((TwAgentConf *)base)->line_of : ((TwToolConf *)base)->line_of;
    } else {
        base = ps->cfg;
        line_of = ps->cfg->line_of;
    }
    for (size_t i = 0; i < N_PARAMS; i++) {
        if ((int)params[i].section != sec || strcmp(params[i].key, key) != 0)
            continue;
        if (line_of[i]) {
            add_error(ps, ps->line, "[%s] %s: set twice (first on line %d)", section, key, line_of[i]);
            return 1;
        }
        line_of[i] = ps->line;
        (void)set_value(ps, &params[i], base, value, section, ps->line);
        return 1;
    }
    add_error(ps, ps->line, "[%s] %s: unknown key", section, key);
    return 1;
}

/* inih reads through us, so that we know the line number of every key and every section header. */
static char *reader(char *buf, int size, void *stream)
{
    ParseState *ps = stream;
    char *got;

    if (ps->overlong_line)
        return NULL;
    if (ps->fp) {
        got = fgets(buf, size, ps->fp);
    } else {
        const char *s = ps->text + ps->text_off;
        const char *nl;
        size_t n;
        if (!*s)
            return NULL;
        nl = strchr(s, '\n');
        n = nl ? (size_t)(nl - s + 1) : strlen(s);
        if (n > (size_t)size - 1)
            n = (size_t)size - 1;
        memcpy(buf, s, n);
        buf[n] = '\0';
        ps->text_off += n;
        got = buf;
    }
    if (!got)
        return NULL;
    if (ps->at_line_start) {
        ps->line++;
        ps->line_len = 0;
        ps->head_len = 0;
    }
    /* The line's head without its leading blanks, however many pieces they take. */
    const char *from = buf;
    while (ps->head_len == 0 && (*from == ' ' || *from == '\t'))
        from++;
    size_t keep = strlen(from);
    if (keep > sizeof ps->head - 1 - ps->head_len)
        keep = sizeof ps->head - 1 - ps->head_len;
    memcpy(ps->head + ps->head_len, from, keep);
    ps->head_len += keep;
    ps->head[ps->head_len] = '\0';
    /* inih reads a long line in pieces and, past its buffer, hands the rest over as a new line: refuse the
     * line instead and stop reading, so that no tail of it is ever parsed. */
    size_t n = strlen(buf);
    bool ends = n > 0 && buf[n - 1] == '\n';
    ps->line_len += n;
    if (ps->line_len - (ends ? 1 : 0) - (ends && n > 1 && buf[n - 2] == '\r' ? 1 : 0) > TW_CONFIG_MAX_LINE) {
        ps->overlong_line = ps->line;
        return NULL;
    }
    if (ps->at_line_start) {
        const char *p = buf;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '[') {
            const char *end = strchr(p, ']');
            if (end) {
                char section[200];
                snprintf(section, sizeof section, "%.*s", (int)(end - p - 1), p + 1);
                on_section(ps, section);
            }
        }
    }
    ps->at_line_start = strchr(buf, '\n') != NULL;
    return got;
}

/* The key an overlong line sets, as inih would read it from the line's head: NULL for a comment, a section
 * header, or a head that holds no "key =" (or ':') with a key that is a name ([A-Za-z0-9_-]{1,64}), so that
 * the message quotes nothing but a key. */
static const char *overlong_key(ParseState *ps)
{
    char *p = ps->head, *end = p + strcspn(p, "=:");

    if (strchr(";#[", *p) || !*end)
        return NULL;
    while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    *end = '\0';
    return tw_name_valid(p) ? p : NULL;
}

/* The keys of an [agent.NAME] or [tool.NAME] section without a default of their own (the timeout policies,
 * the limits) that it does not set come from [worker], the same key there. */
static void inherit_from_worker(ParseState *ps)
{
    TwConfig *cfg = ps->cfg;

    for (size_t k = 0; k < N_PARAMS; k++) {
        const TwParam *ap = &params[k], *wp = NULL;
        if ((ap->section != TW_SEC_AGENT && ap->section != TW_SEC_TOOL) || ap->def || ap->type == TW_PT_ARGV)
            continue;
        for (size_t j = 0; j < N_PARAMS && !wp; j++)
            if (params[j].section == TW_SEC_WORKER && strcmp(params[j].key, ap->key) == 0)
                wp = &params[j];
        if (!wp)
            continue;
        size_t n = ap->section == TW_SEC_AGENT ? cfg->n_agents : cfg->n_tools;
        for (size_t i = 0; i < n; i++) {
            char *base = ap->section == TW_SEC_AGENT ? (char *)&cfg->agents[i] : (char *)&cfg->tools[i];
            const int *line_of = ap->section == TW_SEC_AGENT ? cfg->agents[i].line_of : cfg->tools[i].line_of;
            void *dst = base + ap->offset;
            const void *src = (const char *)cfg + wp->offset;
            if (line_of[k])
                continue;
            if (ap->type == TW_PT_INT)
                *(int *)dst = *(const int *)src;
            else if (ap->type == TW_PT_STR || ap->type == TW_PT_LIST) {
                free(*(char **)dst);
                *(char **)dst = strdup(*(char *const *)src);
            }
        }
    }
}

static void check_policy(ParseState *ps, const TwPolicyConf *p, const char *section, const int *line_of,
                         int section_line)
{
    int i_base = pidx(p == &ps->cfg->worker.policy ? TW_SEC_WORKER : TW_SEC_AGENT, "retry_backoff_seconds");
    int i_max =
        pidx(p == &ps->cfg->worker.policy ? TW_SEC_WORKER : TW_SEC_AGENT, "retry_backoff_max_seconds");

    if (p->retry_backoff_max_sec < p->retry_backoff_sec)
        add_error(ps,
                  line_of[i_max]    ? line_of[i_max]
                  : line_of[i_base] ? line_of[i_base]
                                    : section_line,
                  "[%s] retry_backoff_max_seconds: %d must not be less than retry_backoff_seconds (%d)",
                  section, p->retry_backoff_max_sec, p->retry_backoff_sec);
}

static int line_or_section(int line, int section_line)
{
    return line ? line : section_line;
}

static bool mode_valid(const char *mode, bool *serve)
{
    *serve = mode && strcmp(mode, "serve") == 0;
    return mode && (*serve || strcmp(mode, "exec") == 0);
}

/* [nats] security keys (contract 16): one way to authenticate, a user with its password file, a client
 * certificate with its key. Whether the files can be read is tw_nats_check's (the daemons' start, and
 * --check-config), not the CLI's every command. */
static void check_nats(ParseState *ps)
{
    TwConfig *cfg = ps->cfg;
    const char *auth[] = {"credentials_file", "nkey_seed_file", "user", "token_file"};
    const char *vals[] = {cfg->nats_credentials_file, cfg->nats_nkey_seed_file, cfg->nats_user,
                          cfg->nats_token_file};
    const char *first = NULL;

    for (size_t i = 0; i < sizeof auth / sizeof auth[0]; i++) {
        if (!*vals[i])
            continue;
        if (first)
            add_error(
                ps, cfg->line_of[pidx(TW_SEC_NATS, auth[i])],
                "[nats] %s: %s is set already: choose one of credentials_file, nkey_seed_file, user (with "
                "password_file) or token_file",
                auth[i], first);
        else
            first = auth[i];
    }
    if (*cfg->nats_user && !*cfg->nats_password_file)
        add_error(ps, cfg->line_of[pidx(TW_SEC_NATS, "user")],
                  "[nats] user: needs password_file (a file holding the password: it is never written in "
                  "the INI)");
    if (!*cfg->nats_user && *cfg->nats_password_file)
        add_error(ps, cfg->line_of[pidx(TW_SEC_NATS, "password_file")],
                  "[nats] password_file: needs user (the user name the password belongs to)");
    if (!*cfg->nats_tls_cert_file != !*cfg->nats_tls_key_file)
        add_error(
            ps, cfg->line_of[pidx(TW_SEC_NATS, *cfg->nats_tls_cert_file ? "tls_cert_file" : "tls_key_file")],
            "[nats] %s: a client certificate needs both tls_cert_file and tls_key_file",
            *cfg->nats_tls_cert_file ? "tls_cert_file" : "tls_key_file");
}

static void check_rules(ParseState *ps)
{
    TwConfig *cfg = ps->cfg;
    int i_retry = pidx(TW_SEC_PMO, "dispatched_retry_seconds"),
        i_timeout = pidx(TW_SEC_PMO, "dispatched_timeout_seconds");
    int i_wake = pidx(TW_SEC_PMO, "pending_wakeup_seconds"),
        i_skip = pidx(TW_SEC_PMO, "pending_wakeup_skip_seconds");
    int i_reap = pidx(TW_SEC_PMO, "active_reap_seconds"), i_hb = pidx(TW_SEC_WORKER, "heartbeat_seconds");
    int i_inbox = pidx(TW_SEC_WORKER, "inbox_processing_timeout_seconds");
    PQconninfoOption *opts;
    char *err = NULL;

    if (strcmp(cfg->log.format, "text") != 0 && strcmp(cfg->log.format, "json") != 0)
        add_error(ps, cfg->line_of[pidx(TW_SEC_LOG, "format")], "[log] format: '%s' is not text or json",
                  cfg->log.format);
    if (tw_log_level_parse(cfg->log.level) < 0)
        add_error(ps, cfg->line_of[pidx(TW_SEC_LOG, "level")],
                  "[log] level: '%s' is not debug, info, warn or error", cfg->log.level);
    /* A JetStream stream name is one subject token at most; ours are as strict as agent names. */
    if (cfg->nats_events_stream[0] && !tw_name_valid(cfg->nats_events_stream))
        add_error(ps, cfg->line_of[pidx(TW_SEC_NATS, "events_stream")],
                  "[nats] events_stream: '%s' is not a valid stream name ([A-Za-z0-9_-], 1 to 64 characters)",
                  cfg->nats_events_stream);
    if (cfg->pmo.dispatched_retry_sec >= cfg->pmo.dispatched_timeout_sec)
        add_error(ps, cfg->line_of[i_retry] ? cfg->line_of[i_retry] : cfg->line_of[i_timeout],
                  "[pmo] dispatched_retry_seconds: %d must be less than dispatched_timeout_seconds (%d)",
                  cfg->pmo.dispatched_retry_sec, cfg->pmo.dispatched_timeout_sec);
    if (cfg->pmo.pending_wakeup_sec >= cfg->pmo.pending_wakeup_skip_sec)
        add_error(ps, cfg->line_of[i_wake] ? cfg->line_of[i_wake] : cfg->line_of[i_skip],
                  "[pmo] pending_wakeup_seconds: %d must be less than pending_wakeup_skip_seconds (%d)",
                  cfg->pmo.pending_wakeup_sec, cfg->pmo.pending_wakeup_skip_sec);
    if (cfg->worker.heartbeat_sec * 2 >= cfg->pmo.active_reap_sec)
        add_error(ps, cfg->line_of[i_hb] ? cfg->line_of[i_hb] : cfg->line_of[i_reap],
                  "[worker] heartbeat_seconds: %d must be less than half of [pmo] active_reap_seconds (%d)",
                  cfg->worker.heartbeat_sec, cfg->pmo.active_reap_sec);
    if (cfg->worker.heartbeat_sec * 2 >= cfg->worker.inbox_processing_timeout_sec)
        add_error(
            ps, cfg->line_of[i_hb] ? cfg->line_of[i_hb] : cfg->line_of[i_inbox],
            "[worker] heartbeat_seconds: %d must be less than half of inbox_processing_timeout_seconds (%d)",
            cfg->worker.heartbeat_sec, cfg->worker.inbox_processing_timeout_sec);

    opts = PQconninfoParse(cfg->pg_dsn, &err);
    if (!opts) {
        char *nl = err ? strchr(err, '\n') : NULL;
        if (nl)
            *nl = '\0';
        add_error(ps, cfg->line_of[pidx(TW_SEC_POSTGRES, "dsn")],
                  "[postgres] dsn: not a valid libpq connection string: %s", err ? err : "out of memory");
        PQfreemem(err);
    }
    PQconninfoFree(opts);
    if (strpbrk(cfg->nats_url, " \t") || strstr(cfg->nats_url, ",,") || cfg->nats_url[0] == ',' ||
        cfg->nats_url[strlen(cfg->nats_url) - 1] == ',')
        add_error(ps, cfg->line_of[pidx(TW_SEC_NATS, "url")],
                  "[nats] url: '%s' must be a comma-separated list of URLs without spaces", cfg->nats_url);

    for (int w = 0; w < 2; w++) {
        const char *listen = w ? cfg->worker.metrics_listen : cfg->pmo.metrics_listen;
        char host[256];
        int port;
        if (*listen && !tw_listen_parse(listen, host, sizeof host, &port))
            add_error(
                ps, cfg->line_of[pidx(w ? TW_SEC_WORKER : TW_SEC_PMO, "metrics_listen")],
                "[%s] metrics_listen: '%s' is not host:port (e.g. 127.0.0.1:9464, [::1]:9464; empty: off)",
                w ? "worker" : "pmo", listen);
    }
    check_nats(ps);
    check_policy(ps, &cfg->worker.policy, "worker", cfg->line_of, 0);
    for (size_t i = 0; i < cfg->n_agents; i++) {
        TwAgentConf *a = &cfg->agents[i];
        char section[80];
        if (!a->argv)
            add_error(ps, a->section_line, "[agent.%s] exec: required (the agent program and its arguments)",
                      a->name);
        snprintf(section, sizeof section, "agent.%s", a->name);
        check_policy(ps, &a->policy, section, a->line_of, a->section_line);
        if (!mode_valid(a->mode, &a->serve))
            add_error(ps, line_or_section(a->line_of[pidx(TW_SEC_AGENT, "mode")], a->section_line),
                      "[agent.%s] mode: '%s' is not exec or serve", a->name, a->mode);
    }
    for (size_t i = 0; i < cfg->n_tools; i++) {
        TwToolConf *t = &cfg->tools[i];
        int exec_line = t->line_of[pidx(TW_SEC_TOOL, "exec")],
            ext_line = t->line_of[pidx(TW_SEC_TOOL, "external")];
        int prof_line = t->line_of[pidx(TW_SEC_TOOL, "agent_profile")];
        if (t->agent_profile) {
            /* Delegation (contract section 14): the call runs as a child turn of that profile, no program. */
            if (!tw_name_valid(t->agent_profile))
                add_error(ps, prof_line,
                          "[tool.%s] agent_profile: '%s' is not a profile name ([A-Za-z0-9_-]{1,64})",
                          t->name, t->agent_profile);
            else if (!tw_config_agent(cfg, t->agent_profile))
                add_error(ps, prof_line,
                          "[tool.%s] agent_profile: no [agent.%s] section (the profile its calls run as)",
                          t->name, t->agent_profile);
            if (t->argv || t->external)
                add_error(ps, prof_line,
                          "[tool.%s] agent_profile: a delegating tool has no program and is not external "
                          "(remove %s)",
                          t->name, t->argv ? "exec" : "external");
            continue;
        }
        if (t->external && t->argv)
            add_error(ps, line_or_section(exec_line, t->section_line),
                      "[tool.%s] exec: an external tool has no program (remove exec or set external = false)",
                      t->name);
        if (!t->external && !t->argv)
            add_error(ps, line_or_section(ext_line, t->section_line),
                      "[tool.%s] exec: required unless external = true or agent_profile is set", t->name);
        if (!mode_valid(t->mode, &t->serve))
            add_error(ps, line_or_section(t->line_of[pidx(TW_SEC_TOOL, "mode")], t->section_line),
                      "[tool.%s] mode: '%s' is not exec or serve", t->name, t->mode);
        else if (t->external && t->serve)
            add_error(ps, line_or_section(t->line_of[pidx(TW_SEC_TOOL, "mode")], t->section_line),
                      "[tool.%s] mode: an external tool has no program to serve (remove mode)", t->name);
    }
    if (strcmp(cfg->worker.agents, "*") != 0) {
        char *copy = strdup(cfg->worker.agents), *save = NULL;
        for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; tok; tok = strtok_r(NULL, ",", &save)) {
            while (*tok == ' ' || *tok == '\t')
                tok++;
            for (char *e = tok + strlen(tok); e > tok && (e[-1] == ' ' || e[-1] == '\t');)
                *--e = '\0';
            if (!tw_config_agent(cfg, tok) && !tw_config_tool(cfg, tok))
                add_error(ps, cfg->line_of[pidx(TW_SEC_WORKER, "agents")],
                          "[worker] agents: '%s' has no [agent.%s] or [tool.%s] section", tok, tok, tok);
        }
        free(copy);
    }
}

static int load(TwConfig *cfg, ParseState *ps)
{
    int rc;

    ps->cfg = cfg;
    ps->at_line_start = true;
    for (int s = TW_SEC_POSTGRES; s <= TW_SEC_LOG; s++)
        apply_defaults(ps, (TwSection)s, cfg);
    /* Long exec lines must not be cut: heap line buffer that grows, to one line of TW_CONFIG_MAX_LINE bytes
     * plus "\r\n" and the NUL; the reader refuses longer lines. No multi-line values, so that every key has
     * exactly one line number. */
    ini_use_stack = false;
    ini_allow_realloc = true;
    ini_max_line = TW_CONFIG_MAX_LINE + 3;
    ini_allow_multiline = false;
    ini_allow_no_value = false;
    rc = ini_parse_stream(reader, ps, on_key, ps);
    const char *key = ps->overlong_line ? overlong_key(ps) : NULL;
    if (key && ps->section[0])
        add_error(ps, ps->overlong_line,
                  "[%s] %s: line is longer than %d bytes (the rest of the file was not read)", ps->section,
                  key, TW_CONFIG_MAX_LINE);
    else if (key)
        add_error(ps, ps->overlong_line,
                  "%s: line is longer than %d bytes (the rest of the file was not read)", key,
                  TW_CONFIG_MAX_LINE);
    else if (ps->overlong_line)
        add_error(ps, ps->overlong_line, "line is longer than %d bytes (the rest of the file was not read)",
                  TW_CONFIG_MAX_LINE);
    else if (rc > 0)
        add_error(ps, rc, "syntax error (expected [section], key = value, or a ; comment)");
    else if (rc < 0 || (ps->fp && ferror(ps->fp)))
        add_error(ps, 0, "cannot read the file");
    if (cfg->n_errors == 0) {
        inherit_from_worker(ps);
        check_rules(ps);
    }
    return cfg->n_errors ? -1 : 0;
}

int tw_config_load(TwConfig *cfg, const char *path)
{
    ParseState ps = {.file = path};
    int rc;

    memset(cfg, 0, sizeof *cfg);
    cfg->path = strdup(path);
    ps.cfg = cfg;
    ps.fp = fopen(path, "r");
    if (!ps.fp) {
        add_error(&ps, 0, "cannot open: %s", strerror(errno));
        return -1;
    }
    /* fopen opens a directory and reading it looks like an empty file, which would be valid. */
    struct stat st;
    if (fstat(fileno(ps.fp), &st) == 0 && S_ISDIR(st.st_mode)) {
        add_error(&ps, 0, "is a directory, not a configuration file");
        fclose(ps.fp);
        return -1;
    }
    rc = load(cfg, &ps);
    fclose(ps.fp);
    return rc;
}

int tw_config_load_string(TwConfig *cfg, const char *name, const char *text)
{
    ParseState ps = {.file = name, .text = text};

    memset(cfg, 0, sizeof *cfg);
    cfg->path = strdup(name);
    return load(cfg, &ps);
}

void tw_config_free(TwConfig *cfg)
{
    if (!cfg)
        return;
    free(cfg->path);
    free(cfg->pg_dsn);
    free(cfg->nats_url);
    free(cfg->nats_events_stream);
    free(cfg->worker.agents);
    free(cfg->pmo.metrics_listen);
    free(cfg->worker.metrics_listen);
    free(cfg->worker.policy.retry_on);
    free(cfg->log.format);
    free(cfg->log.level);
    char **nats_keys[] = {&cfg->nats_credentials_file, &cfg->nats_nkey_seed_file, &cfg->nats_user,
                          &cfg->nats_password_file,    &cfg->nats_token_file,     &cfg->nats_tls_ca_file,
                          &cfg->nats_tls_cert_file,    &cfg->nats_tls_key_file};
    for (size_t i = 0; i < sizeof nats_keys / sizeof nats_keys[0]; i++)
        free(*nats_keys[i]);
    free(cfg->worker.limits.run_as_user);
    for (size_t i = 0; i < cfg->n_agents; i++) {
        tw_argv_free(cfg->agents[i].argv);
        free(cfg->agents[i].exec);
        free(cfg->agents[i].policy.retry_on);
        free(cfg->agents[i].mode);
        free(cfg->agents[i].limits.run_as_user);
    }
    for (size_t i = 0; i < cfg->n_tools; i++) {
        tw_argv_free(cfg->tools[i].argv);
        free(cfg->tools[i].exec);
        free(cfg->tools[i].agent_profile);
        free(cfg->tools[i].mode);
        free(cfg->tools[i].limits.run_as_user);
    }
    free(cfg->agents);
    free(cfg->tools);
    free(cfg->errors);
    memset(cfg, 0, sizeof *cfg);
}

/* One served program: why it cannot be run, or NULL. why_buf holds a message built from errno. */
static const char *program_problem(const char *path, char *why_buf, size_t why_len)
{
    struct stat st;

    if (stat(path, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return "does not exist";
        snprintf(why_buf, why_len, "cannot be checked: %s", strerror(errno));
        return why_buf;
    }
    /* access(X_OK) alone passes a directory (search permission) and, for root, any file with an x bit. */
    if (S_ISDIR(st.st_mode))
        return "is a directory, not a program";
    if (!S_ISREG(st.st_mode))
        return "is not a regular file";
    if (access(path, X_OK) != 0) {
        snprintf(why_buf, why_len, "is not executable (%s)", strerror(errno));
        return why_buf;
    }
    return NULL;
}

int tw_config_check_programs(TwConfig *cfg)
{
    ParseState ps = {.cfg = cfg, .file = cfg->path, .errors_len = cfg->errors ? strlen(cfg->errors) : 0};
    int i_agent = pidx(TW_SEC_AGENT, "exec"), i_tool = pidx(TW_SEC_TOOL, "exec");
    int before = cfg->n_errors;
    char why_buf[256];
    const char *why;

    for (size_t i = 0; i < cfg->n_agents; i++) {
        const TwAgentConf *a = &cfg->agents[i];
        if (!a->argv || !tw_config_serves(cfg, a->name) ||
            !(why = program_problem(a->argv[0], why_buf, sizeof why_buf)))
            continue;
        add_error(&ps, line_or_section(a->line_of[i_agent], a->section_line), "[agent.%s] exec: %s %s",
                  a->name, a->argv[0], why);
    }
    for (size_t i = 0; i < cfg->n_tools; i++) {
        const TwToolConf *t = &cfg->tools[i];
        if (t->external || !t->argv || !tw_config_serves(cfg, t->name) ||
            !(why = program_problem(t->argv[0], why_buf, sizeof why_buf)))
            continue;
        add_error(&ps, line_or_section(t->line_of[i_tool], t->section_line), "[tool.%s] exec: %s %s", t->name,
                  t->argv[0], why);
    }
    if (tw_config_check_limits(cfg, geteuid()) != 0)
        return -1;
    return cfg->n_errors > before ? -1 : 0;
}

/* The line of a limits key of a section: its own, else [worker]'s it inherited, else the section header. */
static int limit_line(const TwConfig *cfg, TwSection sec, const int *line_of, int section_line,
                      const char *key)
{
    int own = line_of[pidx(sec, key)], dflt = cfg->line_of[pidx(TW_SEC_WORKER, key)];

    return own ? own : dflt ? dflt : section_line;
}

static void check_one_limits(TwConfig *cfg, TwSection sec, const char *name, const TwLimitsConf *l,
                             const int *line_of, int section_line, uid_t euid)
{
    const char *kind = section_names[sec];
    bool as_root = euid == 0;

    if (l->run_as_user && *l->run_as_user) {
        struct passwd pw, *found = NULL;
        char buf[4096];
        int rc = getpwnam_r(l->run_as_user, &pw, buf, sizeof buf, &found);
        int line = limit_line(cfg, sec, line_of, section_line, "run_as_user");
        if (euid != 0)
            tw_config_error(cfg, line,
                            "[%s.%s] run_as_user: the worker must run as root to start a program as another "
                            "user (it runs as uid %u)",
                            kind, name, (unsigned)euid);
        else if (!found)
            tw_config_error(cfg, line, "[%s.%s] run_as_user: %s", kind, name,
                            rc ? strerror(rc) : "no such user");
        as_root = found && pw.pw_uid == 0;
    }
    /* RLIMIT_NPROC does not hold a process of root (nor one with CAP_SYS_RESOURCE): a silent no-op. */
    if (l->max_processes > 0 && as_root)
        tw_config_error(
            cfg, limit_line(cfg, sec, line_of, section_line, "max_processes"),
            "[%s.%s] max_processes: does not apply to a program that runs as root; set run_as_user "
            "as well",
            kind, name);
}

int tw_config_check_limits(TwConfig *cfg, uid_t euid)
{
    int before = cfg->n_errors;

    for (size_t i = 0; i < cfg->n_agents; i++) {
        const TwAgentConf *a = &cfg->agents[i];
        if (a->argv && tw_config_serves(cfg, a->name))
            check_one_limits(cfg, TW_SEC_AGENT, a->name, &a->limits, a->line_of, a->section_line, euid);
    }
    for (size_t i = 0; i < cfg->n_tools; i++) {
        const TwToolConf *t = &cfg->tools[i];
        if (t->argv && !t->external && tw_config_serves(cfg, t->name))
            check_one_limits(cfg, TW_SEC_TOOL, t->name, &t->limits, t->line_of, t->section_line, euid);
    }
    return cfg->n_errors > before ? -1 : 0;
}

const TwAgentConf *tw_config_agent(const TwConfig *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_agents; i++)
        if (strcmp(cfg->agents[i].name, name) == 0)
            return &cfg->agents[i];
    return NULL;
}

const TwToolConf *tw_config_tool(const TwConfig *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_tools; i++)
        if (strcmp(cfg->tools[i].name, name) == 0)
            return &cfg->tools[i];
    return NULL;
}

bool tw_config_serves(const TwConfig *cfg, const char *name)
{
    const char *p = cfg->worker.agents;
    size_t n = strlen(name);

    const char *item;
    size_t len;

    if (strcmp(p, "*") == 0)
        return true;
    while ((p = tw_list_next(p, &item, &len)))
        if (len == n && strncmp(item, name, n) == 0)
            return true;
    return false;
}

const char *tw_list_next(const char *p, const char **item, size_t *len)
{
    while (p && *p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        const char *end = p;
        while (*end && *end != ',')
            end++;
        const char *e = end;
        while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        if (e > p) {
            *item = p;
            *len = (size_t)(e - p);
            return end;
        }
        p = end;
    }
    return NULL;
}

int tw_config_tool_timeout(const TwConfig *cfg, const TwAgentConf *agent, const TwToolConf *tool,
                           int call_sec, const char **source)
{
    const char *src = "global";
    int s = cfg->worker.policy.tool_timeout_sec;

    if (call_sec > 0) {
        src = "call";
        s = call_sec;
    } else if (tool && tool->timeout_sec > 0) {
        src = "tool";
        s = tool->timeout_sec;
    } else if (agent && agent->line_of[pidx(TW_SEC_AGENT, "tool_timeout_seconds")]) {
        src = "agent";
        s = agent->policy.tool_timeout_sec;
    }
    if (source)
        *source = src;
    return s;
}

int tw_config_wait_seconds(const TwConfig *cfg, const TwToolConf *tool, int timeout_sec)
{
    int s = cfg->worker.suspend_timeout_sec;

    if (tool && tool->suspend_timeout_sec > s)
        s = tool->suspend_timeout_sec;
    if (timeout_sec > s)
        s = timeout_sec;
    return s;
}

TwConfig *tw_config_ref(TwConfig *cfg)
{
    if (cfg)
        cfg->refs++;
    return cfg;
}

void tw_config_unref(TwConfig *cfg)
{
    if (!cfg)
        return;
    if (cfg->refs-- > 0)
        return;
    tw_config_free(cfg);
    free(cfg);
}

const TwPolicyConf *tw_config_policy(const TwConfig *cfg, const char *agent)
{
    const TwAgentConf *a = agent ? tw_config_agent(cfg, agent) : NULL;

    return a ? &a->policy : &cfg->worker.policy;
}
