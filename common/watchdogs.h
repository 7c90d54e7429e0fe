/* The watchdog rules, one row each (docs/watchdogs.md and docs/timeouts.md): which daemon runs it, its SQL
 * action and due term (both in sql/rules/<file>.sql), the parameters they take (keys of the configuration
 * table or fixed values) and how it is run. A daemon builds its TwRules from its rows (tw_watchdogs_fill);
 * TwDue asks every due term of them in one statement. Adding a rule: README "Adding a rule".
 * tests/test_watchdogs.c keeps the table and sql/rules/ in step. */
#ifndef TW_WATCHDOGS_H
#define TW_WATCHDOGS_H

#include <stdbool.h>
#include <stddef.h>

#include "config.h"
#include "rule.h"

/* Who runs a rule. TW_RULES_LIVENESS: the liveness poll of every daemon (liveness.c), not due-timed. */
typedef enum TwRuleDaemon { TW_RULES_PMO, TW_RULES_WORKER, TW_RULES_LIVENESS } TwRuleDaemon;

/* A daemon not seen (tw.daemon_seen, every 10 s, liveness.c) for this long is not counted as a live worker of
 * its profiles by 2.4 and 2.5 (tw.profile_clock): a frozen process keeps its lock but serves nobody. */
#define TW_LIVE_STALE_SEC 30

/* The most rules one daemon runs (the size of its TwRule array). */
#define TW_WATCHDOGS_MAX 12

/* One parameter of a rule: a global integer key of the configuration table ([section] key), a fixed value, or
 * the daemon id (text; the liveness rule's). */
typedef struct TwRuleParam {
    TwSection section;
    const char *key; /* NULL: value, or self */
    int value;
    bool self;
} TwRuleParam;

/* The changes that start a rule's clock, for the wake-ups (tw_watchdogs_wake_pays). */
enum {
    TW_CLOCK_DISPATCH = 1,  /* a turn dispatched (an inbox item pending, an agent dispatched) */
    TW_CLOCK_CLAIM = 2,     /* a step claimed (a running turn, an inbox or resume lease) */
    TW_CLOCK_TOOL_CALL = 4, /* a tool call waiting */
    TW_CLOCK_ANY = 7
};

typedef struct TwRuleDef {
    const char *file; /* sql/rules/<file>.sql holds its action and its due term */
    const char *key;  /* short name ("2.5", "deadline") */
    const char *name; /* in log lines, the counters line and the metrics ("2.5 reap_dispatched") */
    TwRuleDaemon daemon;
    const char *action; /* tw.*: takes the parameters, then the batch size when batch > 0 */
    const char *due;    /* tw.due_*: takes the parameters, returns when it is next due; NULL: not due-timed */
    int n_params;
    TwRuleParam params[TW_RULE_MAX_PARAMS - 1];
    int batch; /* at most this many items a run (its action's last parameter); 0: none */
    /* Runs at once, each on a connection of its own (0 or 1: one), for a rule whose action shares the items
     * due between concurrent runs (SKIP LOCKED): many items due at one instant are acted on by as many
     * backends. */
    int parallel;
    /* The key that bounds from below how far from a change the deadlines it starts for this rule are, and
     * the changes that start them (TW_CLOCK_*); none when no key bounds them. */
    TwRuleParam clock;
    unsigned starts;
    bool heartbeat_judged; /* TwRule.heartbeat_judged */
    int info_lines_per_10s;
} TwRuleDef;

/** Every row, the rules of one daemon in the order it runs and logs them. */
const TwRuleDef *tw_watchdogs(size_t *n);
/** Fill rules (room for TW_WATCHDOGS_MAX) with daemon's rules, their parameters from cfg (self: the daemon
 *  id, for a rule that takes it). Returns how many, or -1 when a row names a key that is not a global integer
 *  key of the configuration table (tests/test_watchdogs.c makes sure none does). Called again after a
 *  reload: tw_rules_update_params takes the new parameters over. */
int tw_watchdogs_fill(TwRule *rules, TwRuleDaemon daemon, const TwConfig *cfg, const char *self);
/** The integer a parameter takes under cfg; -1 when it names no global integer key (or is self). */
int tw_watchdogs_param(const TwRuleParam *p, const TwConfig *cfg);
/** Whether a change that starts the clocks in starts (TW_CLOCK_*) may create a deadline of daemon's rules
 *  that falls before that daemon's safety sweep ([pmo]/[worker] watchdog_interval_seconds): only then does a
 *  wake-up (cmd.<kind>.wakeup) pay off. */
bool tw_watchdogs_wake_pays(TwRuleDaemon daemon, unsigned starts, const TwConfig *cfg);

#endif
