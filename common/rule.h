/* A periodic watchdog rule: one SQL function returning {"actions":[...],"publish":[...]}. The runner
 * logs one line per action, counts them, publishes what the rule returned, and never runs a rule again
 * while its previous run is still in flight. */
#ifndef TW_RULE_H
#define TW_RULE_H

#include <stdbool.h>

#include "bus.h"
#include "pgconn.h"

typedef struct TwRule {
    const char *name; /* e.g. "2.5 reap_dispatched" */
    const char *sql;  /* SELECT tw.some_function($1, ...) */
    long runs;
    long actions;
    long errors;
    TwLogLimit failed_log; /* its server errors, at most one line per interval */
    bool busy;
} TwRule;

void tw_rule_run(TwRule *rule, TwPg *pg, TwBus *bus, int nparams, const char *const *params);
/** One log line with every rule's counters. */
void tw_rules_log_counters(const char *who, TwRule *rules, int n);

#endif
