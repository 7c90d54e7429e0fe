/* The agents' timeout policies: which applies to an agent or a tool call (the hierarchy of docs/timeouts.md),
 * and publishing them to state.policies. */
#include "policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "words.h"

int tw_policy_tool_timeout(const TwConfig *cfg, const TwAgentConf *agent, const TwToolConf *tool,
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
    } else if (agent && agent->line_of[tw_config_param_index(TW_SEC_AGENT, "tool_timeout_seconds")]) {
        src = "agent";
        s = agent->policy.tool_timeout_sec;
    }
    if (source)
        *source = src;
    return s;
}

int tw_policy_wait_seconds(const TwConfig *cfg, const TwToolConf *tool, int timeout_sec)
{
    int s = cfg->worker.suspend_timeout_sec;

    if (tool && tool->suspend_timeout_sec > s)
        s = tool->suspend_timeout_sec;
    if (timeout_sec > s)
        s = timeout_sec;
    return s;
}

const TwPolicyConf *tw_policy_of(const TwConfig *cfg, const char *agent)
{
    const TwAgentConf *a = agent ? tw_config_agent(cfg, agent) : NULL;

    return a ? &a->policy : &cfg->worker.policy;
}

/* "a, b,c" -> ["a","b","c"] (the list was validated at load). */
static json_t *code_list(const char *list)
{
    json_t *out = json_array();
    const char *item;
    size_t len;

    while (out && (list = tw_list_next(list, &item, &len)))
        json_array_append_new(out, json_stringn(item, len));
    return out;
}

json_t *tw_policy_doc(const TwConfig *cfg, bool served_only)
{
    json_t *doc = json_array();

    for (size_t i = 0; doc && i < cfg->n_agents; i++) {
        const TwAgentConf *a = &cfg->agents[i];
        const TwPolicyConf *p = &a->policy;
        if (served_only && !tw_config_serves(cfg, a->name))
            continue;
        json_t *one = json_pack("{s:s,s:i,s:o,s:i,s:i,s:i,s:i,s:i,s:i}", "profile", a->name, "max_attempts",
                                p->max_attempts, "retry_on", code_list(p->retry_on), "retry_backoff_seconds",
                                p->retry_backoff_sec, "retry_backoff_max_seconds", p->retry_backoff_max_sec,
                                "queue_timeout_seconds", p->queue_timeout_sec, "warn_at_percent",
                                p->warn_at_percent, "tool_timeout_seconds", p->tool_timeout_sec,
                                "step_timeout_seconds", a->step_timeout_sec);
        if (!one || json_array_append_new(doc, one) != 0) {
            json_decref(doc);
            return NULL;
        }
    }
    return doc;
}

static void published_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    static TwLogLimit lim;

    if (err) {
        tw_pg_log_failure(&lim, res, "publish policies", err);
        return;
    }
    if (res && PQntuples(res) == 1 && atoi(PQgetvalue(res, 0, 0)) > 0)
        log_info("published the timeout policies of %s agent(s)", PQgetvalue(res, 0, 0));
}

void tw_policy_publish(TwPg *pg, const TwConfig *cfg, bool served_only, const char *who)
{
    json_t *doc = tw_policy_doc(cfg, served_only);
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    const char *params[] = {text, who};

    json_decref(doc);
    if (!text) {
        log_error("out of memory building the timeout policies");
        return;
    }
    if (strcmp(text, "[]") != 0)
        tw_pg_query(pg, "SELECT tw.publish_policies($1::jsonb, $2)", 2, params, published_cb, NULL);
    free(text);
}

json_t *tw_flow_limits_doc(const TwConfig *cfg)
{
    json_t *doc = json_array();

    for (size_t i = 0; doc && i < cfg->n_flow_limits; i++) {
        const TwFlowLimitConf *l = &cfg->flow_limits[i];
        json_t *one = json_pack("{s:s,s:i,s:b,s:i}", "name", l->name, "max_concurrent", l->max_concurrent,
                                "per_key", l->per_key, "max_wait_seconds", l->max_wait_sec);
        if (one && l->rate_n) {
            json_object_set_new(one, "rate_n", json_integer(l->rate_n));
            json_object_set_new(one, "rate_seconds", json_real(l->rate_sec));
            if (l->burst)
                json_object_set_new(one, "burst", json_integer(l->burst));
        }
        if (!one || json_array_append_new(doc, one) != 0) {
            json_decref(doc);
            return NULL;
        }
    }
    for (size_t i = 0; doc && i < cfg->n_tools; i++) {
        const TwToolConf *t = &cfg->tools[i];
        char name[80];
        if (!t->max_concurrent)
            continue;
        snprintf(name, sizeof name, TW_TOOL_LIMIT_PREFIX "%s", t->name);
        json_t *one = json_pack("{s:s,s:i}", "name", name, "max_concurrent", t->max_concurrent);
        if (!one || json_array_append_new(doc, one) != 0) {
            json_decref(doc);
            return NULL;
        }
    }
    return doc;
}

static void limits_synced_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    static TwLogLimit lim;

    if (err)
        tw_pg_log_failure(&lim, res, "publish the limits", err);
}

json_t *tw_flow_profile_limits_doc(const TwConfig *cfg)
{
    json_t *doc = json_object();

    for (size_t i = 0; doc && i < cfg->n_agents; i++) {
        const char *p = cfg->agents[i].flow_limits, *item;
        size_t len;
        json_t *list = *p ? json_array() : json_null();
        while (list && *cfg->agents[i].flow_limits && (p = tw_list_next(p, &item, &len)))
            json_array_append_new(list, json_stringn(item, len));
        if (!list || json_object_set_new(doc, cfg->agents[i].name, list) != 0) {
            json_decref(doc);
            return NULL;
        }
    }
    return doc;
}

void tw_flow_limits_publish(TwPg *pg, const TwConfig *cfg)
{
    json_t *doc = tw_flow_limits_doc(cfg), *prof = tw_flow_profile_limits_doc(cfg);
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    char *ptext = prof ? json_dumps(prof, JSON_COMPACT) : NULL;
    const char *params[] = {text, ptext};

    json_decref(doc);
    json_decref(prof);
    if (!text || !ptext) {
        free(text);
        free(ptext);
        log_error("out of memory building the limits");
        return;
    }
    /* The grants that follow a change are rung by the PMO (NOTIFY tw_ring). The profiles' limits
     * ([agent.P] limits) go with them. */
    tw_pg_query(pg, "SELECT tw.api_publish(tw.sync_limits($1::jsonb) || tw.sync_profile_limits($2::jsonb))",
                2, params, limits_synced_cb, NULL);
    free(text);
    free(ptext);
}

json_t *tw_flow_tool_limits(const TwToolConf *t)
{
    json_t *out;
    const char *p = t->flow_limits, *item;
    size_t len;
    char name[80];

    if (!*t->flow_limits && !t->max_concurrent)
        return NULL;
    out = json_array();
    while (out && (p = tw_list_next(p, &item, &len)))
        json_array_append_new(out, json_stringn(item, len));
    if (out && t->max_concurrent) {
        snprintf(name, sizeof name, TW_TOOL_LIMIT_PREFIX "%s", t->name);
        json_array_append_new(out, json_string(name));
    }
    return out;
}
