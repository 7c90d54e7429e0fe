/* Running watchdog rules: log, count, measure lateness, publish. */
#include "rule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "outbox.h"

const int tw_late_bounds_ms[TW_LATE_BUCKETS - 1] = {1,   2,   5,    10,   25,   50,   100,
                                                    250, 500, 1000, 2500, 5000, 10000};

void tw_lateness_add(TwLateness *l, long long ms)
{
    int b = 0;

    if (ms < 0)
        ms = 0;
    while (b < TW_LATE_BUCKETS - 1 && ms > tw_late_bounds_ms[b])
        b++;
    l->bucket[b]++;
    l->count++;
    l->sum_ms += ms;
    if (ms > l->max_ms)
        l->max_ms = ms;
}

long long tw_lateness_quantile(const TwLateness *l, double q)
{
    long need, seen = 0;

    if (l->count == 0)
        return -1;
    need = (long)(q * (double)l->count + 0.999999);
    if (need < 1)
        need = 1;
    for (int b = 0; b < TW_LATE_BUCKETS; b++) {
        seen += l->bucket[b];
        if (seen >= need) {
            long long bound = b < TW_LATE_BUCKETS - 1 ? tw_late_bounds_ms[b] : l->max_ms;
            return bound < l->max_ms ? bound : l->max_ms;
        }
    }
    return l->max_ms;
}

#define RULE_LOG_WINDOW_MS 10000

static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A rule with a line budget: the actions past it in this window went to debug; say how many, once. */
static void window_close(TwRule *rule, int64_t now)
{
    if (rule->window_quiet > 0)
        log_info("watchdog rule=\"%s\": %ld more actions in the last %lld s, logged at level debug only "
                 "(lateness_ms max=%lld)",
                 rule->name, rule->window_quiet, (long long)((now - rule->window_start_ms + 999) / 1000),
                 rule->window_quiet_max_ms);
    rule->window_start_ms = now;
    rule->window_lines = rule->window_quiet = 0;
    rule->window_quiet_max_ms = 0;
}

static void log_action(TwRule *rule, const json_t *action, const char *line, long long late_ms)
{
    const char *what = json_string_value(json_object_get(action, "action"));

    /* Only re-rings share the budget: an action that changes state (2.7's skip) is always said. */
    if (rule->info_lines_per_10s <= 0 || (what && strcmp(what, "rering") != 0)) {
        log_info("watchdog rule=\"%s\" %s", rule->name, line);
        return;
    }
    int64_t now = mono_ms();
    if (now - rule->window_start_ms >= RULE_LOG_WINDOW_MS)
        window_close(rule, now);
    if (rule->window_lines < rule->info_lines_per_10s) {
        rule->window_lines++;
        log_info("watchdog rule=\"%s\" %s", rule->name, line);
        return;
    }
    rule->window_quiet++;
    if (late_ms > rule->window_quiet_max_ms)
        rule->window_quiet_max_ms = late_ms;
    log_debug("watchdog rule=\"%s\" %s", rule->name, line);
}

typedef struct RuleRun {
    TwRule *rule;
    TwBus *bus;
    TwRuleDoneCb done;
    void *arg;
} RuleRun;

static void rule_done(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    RuleRun *run = arg;
    TwRule *rule = run->rule;
    json_t *out = NULL, *action;
    size_t i;
    int n = 0;

    rule->running--;
    rule->runs++;
    if (err || !(out = tw_result_json(res, &err))) {
        rule->errors++;
        char what[96];
        snprintf(what, sizeof what, "watchdog rule=%s", rule->name);
        tw_pg_log_failure(&rule->failed_log, res, what, err);
        n = -1;
        goto out;
    }
    json_array_foreach(json_object_get(out, "actions"), i, action)
    {
        json_t *late = json_object_get(action, "lateness_ms");
        char *line = json_dumps(action, JSON_COMPACT | JSON_SORT_KEYS);
        if (json_is_integer(late))
            tw_lateness_add(&rule->lateness, json_integer_value(late));
        log_action(rule, action, line ? line : "", json_is_integer(late) ? json_integer_value(late) : 0);
        free(line);
        rule->actions++;
        n++;
    }
    tw_outbox_publish(pg, run->bus, json_object_get(out, "publish"));
    json_decref(out);
out:
    if (run->done)
        run->done(rule, n, run->arg);
    free(run);
}

void tw_rules_update_params(TwRule *rules, const TwRule *fresh, int n)
{
    for (int i = 0; i < n; i++) {
        rules[i].nparams = fresh[i].nparams;
        memcpy(rules[i].params, fresh[i].params, sizeof rules[i].params);
    }
}

bool tw_rule_run(TwRule *rule, TwPg *pg, TwBus *bus, TwRuleDoneCb done, void *arg)
{
    const char *params[TW_RULE_MAX_PARAMS];
    RuleRun *run;

    if (rule->running >= (rule->parallel > 1 ? rule->parallel : 1) || !tw_pg_is_up(pg))
        return false;
    if (!(run = calloc(1, sizeof *run)))
        return false;
    run->rule = rule;
    run->bus = bus;
    run->done = done;
    run->arg = arg;
    for (int i = 0; i < rule->nparams; i++)
        params[i] = rule->params[i];
    rule->running++;
    tw_pg_query(pg, rule->sql, rule->nparams, params, rule_done, run);
    return true;
}

void tw_rules_log_counters(const char *who, TwRule *rules, int n)
{
    char line[2048];
    size_t off = 0;
    int64_t now = mono_ms();

    /* Actions left unsaid since a quiet window started are said now, at the latest. */
    for (int i = 0; i < n; i++)
        if (rules[i].window_quiet > 0)
            window_close(&rules[i], now);
    for (int i = 0; i < n && off < sizeof line; i++) {
        const TwLateness *l = &rules[i].lateness;
        off += (size_t)snprintf(line + off, sizeof line - off, "%s\"%s\"=%ld", i ? " " : "", rules[i].name,
                                rules[i].actions);
        if (l->count && off < sizeof line)
            off +=
                (size_t)snprintf(line + off, sizeof line - off, " (lateness_ms p50<=%lld p99<=%lld max=%lld)",
                                 tw_lateness_quantile(l, 0.5), tw_lateness_quantile(l, 0.99), l->max_ms);
    }
    log_info("%s watchdog counters (actions since start): %s", who, line);
}
