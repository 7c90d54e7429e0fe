/* Running watchdog rules: log, count, publish. */
#include "rule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "outbox.h"

typedef struct RuleRun {
    TwRule *rule;
    TwBus *bus;
} RuleRun;

static void rule_done(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    RuleRun *run = arg;
    TwRule *rule = run->rule;
    json_t *out = NULL, *action;
    size_t i;

    rule->busy = false;
    rule->runs++;
    if (err || !(out = tw_result_json(res, &err))) {
        rule->errors++;
        char what[96];
        snprintf(what, sizeof what, "watchdog rule=%s", rule->name);
        tw_pg_log_failure(&rule->failed_log, res, what, err);
        free(run);
        return;
    }
    json_array_foreach(json_object_get(out, "actions"), i, action)
    {
        char *line = json_dumps(action, JSON_COMPACT | JSON_SORT_KEYS);
        log_info("watchdog rule=\"%s\" %s", rule->name, line ? line : "");
        free(line);
        rule->actions++;
    }
    tw_outbox_publish(pg, run->bus, json_object_get(out, "publish"));
    json_decref(out);
    free(run);
}

void tw_rule_run(TwRule *rule, TwPg *pg, TwBus *bus, int nparams, const char *const *params)
{
    RuleRun *run;

    if (rule->busy || !tw_pg_is_up(pg))
        return;
    if (!(run = calloc(1, sizeof *run)))
        return;
    run->rule = rule;
    run->bus = bus;
    rule->busy = true;
    tw_pg_query(pg, rule->sql, nparams, params, rule_done, run);
}

void tw_rules_log_counters(const char *who, TwRule *rules, int n)
{
    char line[1024];
    size_t off = 0;

    for (int i = 0; i < n && off < sizeof line; i++)
        off += (size_t)snprintf(line + off, sizeof line - off, "%s\"%s\"=%ld", i ? " " : "", rules[i].name,
                                rules[i].actions);
    log_info("%s watchdog counters (actions since start): %s", who, line);
}
