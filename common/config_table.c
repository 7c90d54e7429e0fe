/* The parameter table: every key of every section, its type, bounds, default and flags. The engine
 * (config.c) reads, stores, inherits and frees values by it; nothing else lists keys. And the lookups in a
 * loaded configuration (a key's line, an agent, a tool, what a worker serves) and its list of errors. */
#include "config_table.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry_gen.h" /* TW_RETRY_ON_DEFAULT */
#include "words.h"

#define G(field) offsetof(TwConfig, field)
#define A(field) offsetof(TwAgentConf, field)
#define T(field) offsetof(TwToolConf, field)
#define L(field) offsetof(TwFlowLimitConf, field)

/* The keys that [worker] holds the defaults of and an [agent.NAME] (the policies, the limits) or a
 * [tool.NAME] (the limits) may set for itself, with the same bounds: each group is written once, as rows of
 * section sec whose field F places in its struct, with their defaults (D = DEF, [worker]) or none (NO_DEF:
 * the section inherits [worker]'s). */
#define W(field) G(worker.field)
#define DEF(value) value
#define NO_DEF(value) NULL
/* clang-format off */
#define POLICY_ROWS(sec, F, D)                                                                               \
    {sec, "max_attempts", TW_PT_INT, F(policy.max_attempts), 1, 100, D("1"), 0},                             \
    {sec, "retry_on", TW_PT_LIST, F(policy.retry_on), 0, 0, D(TW_RETRY_ON_DEFAULT), 0},                      \
    {sec, "retry_backoff_seconds", TW_PT_INT, F(policy.retry_backoff_sec), 1, 86400, D("1"), 0},             \
    {sec, "retry_backoff_max_seconds", TW_PT_INT, F(policy.retry_backoff_max_sec), 1, 604800, D("300"), 0},  \
    {sec, "queue_timeout_seconds", TW_PT_INT, F(policy.queue_timeout_sec), 0, 604800, D("0"), 0},            \
    {sec, "warn_at_percent", TW_PT_INT, F(policy.warn_at_percent), 0, 99, D("80"), 0},                       \
    {sec, "tool_timeout_seconds", TW_PT_INT, F(policy.tool_timeout_sec), 1, 604800, D("30"), 0}
#define LIMIT_ROWS(sec, F, D)                                                                                \
    {sec, "memory_limit_mb", TW_PT_INT, F(limits.memory_limit_mb), 0, 1048576, D("0"), 0},                   \
    {sec, "cpu_limit_seconds", TW_PT_INT, F(limits.cpu_limit_sec), 0, 604800, D("0"), 0},                    \
    {sec, "max_open_files", TW_PT_INT, F(limits.max_open_files), 0, 1048576, D("0"), 0},                     \
    {sec, "max_processes", TW_PT_INT, F(limits.max_processes), 0, 4194304, D("0"), 0},                       \
    {sec, "run_as_user", TW_PT_STR, F(limits.run_as_user), 0, 0, D(""), 0}
/* clang-format on */

/* Every key of contract section 3 with its shipped default; config/turnwatch.ini must agree (tested).
 * [postgres] and [nats] are the daemon's connections, made once: TW_PF_RESTART. */
static const TwParam params[] = {
    {TW_SEC_POSTGRES, "dsn", TW_PT_STR, G(pg_dsn), 0, 0, "postgresql:///turnwatch", TW_PF_RESTART},
    {TW_SEC_POSTGRES, "keepalive_seconds", TW_PT_INT, G(pg_keepalive_sec), 0, 3600, "10", TW_PF_RESTART},
    {TW_SEC_POSTGRES, "query_timeout_seconds", TW_PT_INT, G(pg_query_timeout_sec), 2, 3600, "30",
     TW_PF_RESTART},
    {TW_SEC_NATS, "url", TW_PT_STR, G(nats_url), 0, 0, "nats://127.0.0.1:4222", TW_PF_RESTART},
    {TW_SEC_NATS, "events_stream", TW_PT_STR, G(nats_events_stream), 0, 0, "", TW_PF_RESTART},
    {TW_SEC_NATS, "events_max_age_seconds", TW_PT_INT, G(nats_events_max_age_sec), 1, 315360000, "604800",
     TW_PF_RESTART},
    {TW_SEC_NATS, "credentials_file", TW_PT_STR, G(nats_credentials_file), 0, 0, "", TW_PF_RESTART},
    {TW_SEC_NATS, "nkey_seed_file", TW_PT_STR, G(nats_nkey_seed_file), 0, 0, "", TW_PF_RESTART},
    {TW_SEC_NATS, "user", TW_PT_STR, G(nats_user), 0, 0, "", TW_PF_RESTART},
    {TW_SEC_NATS, "password_file", TW_PT_STR, G(nats_password_file), 0, 0, "", TW_PF_RESTART},
    {TW_SEC_NATS, "token_file", TW_PT_STR, G(nats_token_file), 0, 0, "", TW_PF_RESTART},
    {TW_SEC_NATS, "tls_ca_file", TW_PT_STR, G(nats_tls_ca_file), 0, 0, "", TW_PF_RESTART},
    {TW_SEC_NATS, "tls_cert_file", TW_PT_STR, G(nats_tls_cert_file), 0, 0, "", TW_PF_RESTART},
    {TW_SEC_NATS, "tls_key_file", TW_PT_STR, G(nats_tls_key_file), 0, 0, "", TW_PF_RESTART},
    {TW_SEC_NATS, "events_replicas", TW_PT_INT, G(nats_events_replicas), 1, 5, "1", TW_PF_RESTART},
    {TW_SEC_PMO, "watchdog_interval_seconds", TW_PT_INT, G(pmo.watchdog_interval_sec), 1, 86400, "5", 0},
    {TW_SEC_PMO, "dispatched_retry_seconds", TW_PT_INT, G(pmo.dispatched_retry_sec), 1, 86400, "10", 0},
    {TW_SEC_PMO, "dispatched_timeout_seconds", TW_PT_INT, G(pmo.dispatched_timeout_sec), 1, 604800, "30", 0},
    {TW_SEC_PMO, "pending_wakeup_seconds", TW_PT_INT, G(pmo.pending_wakeup_sec), 1, 86400, "5", 0},
    {TW_SEC_PMO, "pending_wakeup_skip_seconds", TW_PT_INT, G(pmo.pending_wakeup_skip_sec), 1, 604800, "300",
     0},
    {TW_SEC_PMO, "active_reap_seconds", TW_PT_INT, G(pmo.active_reap_sec), 1, 604800, "300", 0},
    {TW_SEC_PMO, "metrics_listen", TW_PT_STR, G(pmo.metrics_listen), 0, 0, "", 0},
    {TW_SEC_WORKER, "inbox_processing_timeout_seconds", TW_PT_INT, G(worker.inbox_processing_timeout_sec), 1,
     604800, "300", 0},
    {TW_SEC_WORKER, "watchdog_interval_seconds", TW_PT_INT, G(worker.watchdog_interval_sec), 1, 86400, "5",
     0},
    {TW_SEC_WORKER, "suspend_timeout_seconds", TW_PT_INT, G(worker.suspend_timeout_sec), 1, 604800, "300", 0},
    {TW_SEC_WORKER, "heartbeat_seconds", TW_PT_INT, G(worker.heartbeat_sec), 1, 86400, "10", 0},
    {TW_SEC_WORKER, "concurrency", TW_PT_INT, G(worker.concurrency), 1, 1024, "4", 0},
    {TW_SEC_WORKER, "agents", TW_PT_LIST, G(worker.agents), 0, 0, "*", 0},
    {TW_SEC_WORKER, "max_delegation_depth", TW_PT_INT, G(worker.max_delegation_depth), 0, 64, "8", 0},
    {TW_SEC_WORKER, "max_tree_turns", TW_PT_INT, G(worker.max_tree_turns), 1, 1000000, "10000", 0},
    {TW_SEC_WORKER, "metrics_listen", TW_PT_STR, G(worker.metrics_listen), 0, 0, "", 0},
    /* Timeout policies (contract 11): the defaults of every agent; an [agent.NAME] key of the same name (no
     * default of its own) overrides one. */
    POLICY_ROWS(TW_SEC_WORKER, W, DEF),
    /* Limits on the programs (contract 16): the defaults of every agent and tool; an [agent.NAME] or
     * [tool.NAME] key of the same name (no default of its own) overrides one. */
    LIMIT_ROWS(TW_SEC_WORKER, W, DEF),
    {TW_SEC_LOG, "format", TW_PT_STR, G(log.format), 0, 0, "text", 0},
    {TW_SEC_LOG, "level", TW_PT_STR, G(log.level), 0, 0, "info", 0},
    {TW_SEC_AGENT, "exec", TW_PT_ARGV, A(argv), 0, 0, NULL, 0},
    {TW_SEC_AGENT, "step_timeout_seconds", TW_PT_INT, A(step_timeout_sec), 1, 604800, "120", 0},
    {TW_SEC_AGENT, "kill_grace_seconds", TW_PT_INT, A(kill_grace_sec), 1, 3600, "5", 0},
    POLICY_ROWS(TW_SEC_AGENT, A, NO_DEF),
    {TW_SEC_AGENT, "mode", TW_PT_STR, A(mode), 0, 0, "exec", 0},
    {TW_SEC_AGENT, "max_requests", TW_PT_INT, A(max_requests), 1, 1000000000, "1000", 0},
    LIMIT_ROWS(TW_SEC_AGENT, A, NO_DEF),
    {TW_SEC_TOOL, "exec", TW_PT_ARGV, T(argv), 0, 0, NULL, 0},
    {TW_SEC_TOOL, "external", TW_PT_BOOL, T(external), 0, 0, "false", 0},
    /* No default: a call of a tool without one gets its agent's tool_timeout_seconds (contract 11). */
    {TW_SEC_TOOL, "timeout_seconds", TW_PT_INT, T(timeout_sec), 1, 604800, NULL, 0},
    {TW_SEC_TOOL, "suspend_timeout_seconds", TW_PT_INT, T(suspend_timeout_sec), 1, 604800, "60", 0},
    {TW_SEC_TOOL, "agent_profile", TW_PT_STR, T(agent_profile), 0, 0, NULL, 0},
    {TW_SEC_TOOL, "mode", TW_PT_STR, T(mode), 0, 0, "exec", 0},
    {TW_SEC_TOOL, "max_requests", TW_PT_INT, T(max_requests), 1, 1000000000, "1000", 0},
    LIMIT_ROWS(TW_SEC_TOOL, T, NO_DEF),
    /* Flow control (docs/flow-control.md): the limits a call of the tool holds, and a cap of its own. */
    {TW_SEC_TOOL, "limits", TW_PT_LIST, T(flow_limits), 0, 0, "", 0},
    {TW_SEC_TOOL, "max_concurrent", TW_PT_INT, T(max_concurrent), 0, 1000000, "0", 0},
    {TW_SEC_TOOL, "rate_limited_retries", TW_PT_INT, T(rate_limited_retries), 0, 100, "3", 0},
    {TW_SEC_LIMIT, "max_concurrent", TW_PT_INT, L(max_concurrent), 0, 1000000, "0", 0},
    {TW_SEC_LIMIT, "rate", TW_PT_STR, L(rate), 0, 0, "", 0},
    {TW_SEC_LIMIT, "burst", TW_PT_INT, L(burst), 0, 1000000, "0", 0},
    {TW_SEC_LIMIT, "per_key", TW_PT_BOOL, L(per_key), 0, 0, "false", 0},
    {TW_SEC_LIMIT, "max_wait_seconds", TW_PT_INT, L(max_wait_sec), 0, 604800, "0", 0},
};
#define N_PARAMS (sizeof params / sizeof params[0])
_Static_assert(N_PARAMS <= TW_CONFIG_MAX_PARAMS, "grow TW_CONFIG_MAX_PARAMS");

int tw_config_param_index(TwSection sec, const char *key)
{
    for (size_t i = 0; i < N_PARAMS; i++)
        if (params[i].section == sec && strcmp(params[i].key, key) == 0)
            return (int)i;
    abort(); /* a typo in the caller's code, not a runtime condition */
}

static const char *section_names[] = {"postgres", "nats", "pmo", "worker", "log", "agent", "tool", "limit"};

const TwParam *tw_config_params(size_t *n)
{
    *n = N_PARAMS;
    return params;
}

const char *tw_config_section_name(TwSection s)
{
    return section_names[s];
}

int tw_config_line(const TwConfig *cfg, TwSection sec, const char *key)
{
    for (size_t i = 0; i < N_PARAMS; i++)
        if (params[i].section == sec && strcmp(params[i].key, key) == 0)
            return sec <= TW_SEC_LOG ? cfg->line_of[i] : 0;
    return 0;
}

void tw_config_error(TwConfig *cfg, int line, const char *fmt, ...)
{
    const char *file = cfg->path ? cfg->path : "(config)";
    char msg[1024], *grown;
    va_list ap;
    int n;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0)
        n = snprintf(NULL, 0, "%s:%d: %s\n", file, line, msg);
    else
        n = snprintf(NULL, 0, "%s: %s\n", file, msg);
    grown = realloc(cfg->errors, cfg->errors_len + (size_t)n + 1);
    if (!grown)
        return;
    cfg->errors = grown;
    if (line > 0)
        snprintf(cfg->errors + cfg->errors_len, (size_t)n + 1, "%s:%d: %s\n", file, line, msg);
    else
        snprintf(cfg->errors + cfg->errors_len, (size_t)n + 1, "%s: %s\n", file, msg);
    cfg->errors_len += (size_t)n;
    cfg->n_errors++;
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

const TwFlowLimitConf *tw_config_flow_limit(const TwConfig *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_flow_limits; i++)
        if (strcmp(cfg->flow_limits[i].name, name) == 0)
            return &cfg->flow_limits[i];
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
