/* A watchdog rule: one SQL function returning {"actions":[...],"publish":[...]}, each action with its
 * "lateness_ms" (database clock at the action minus the time it was due). Running one logs a line per action,
 * counts the actions and their lateness, publishes what the rule returned, and never runs the rule again
 * while its previous run is still in flight. When rules run is decided by TwDue (due.c); which rules there
 * are, and what they are built from, by the table in watchdogs.c. */
#ifndef TW_RULE_H
#define TW_RULE_H

#include <stdbool.h>
#include <stdint.h>

#include "bus.h"
#include "pgconn.h"

#define TW_RULE_MAX_PARAMS 6
#define TW_RULE_SQL_MAX 160

/* Lateness of a rule's actions: a histogram with fixed upper bounds in ms (the last bucket is everything
 * above), enough for the counters line and for metrics. */
#define TW_LATE_BUCKETS 14
extern const int tw_late_bounds_ms[TW_LATE_BUCKETS - 1];

typedef struct TwLateness {
    long count;
    long bucket[TW_LATE_BUCKETS];
    long long sum_ms;
    long long max_ms;
} TwLateness;

void tw_lateness_add(TwLateness *l, long long ms);
/** The upper bound of the bucket holding quantile q (0..1), exact max for the last bucket; -1 when empty. */
long long tw_lateness_quantile(const TwLateness *l, double q);

struct TwRule;
/** Called after every run with the number of actions (-1: the query failed). */
typedef void (*TwRuleDoneCb)(struct TwRule *rule, int actions, void *arg);

typedef struct TwRule {
    const char *key;           /* its short name ("2.1", ..., "deadline") */
    const char *name;          /* e.g. "2.5 reap_dispatched", in log lines */
    char sql[TW_RULE_SQL_MAX]; /* SELECT tw.some_function($1, ...) */
    int nparams;
    char params[TW_RULE_MAX_PARAMS][136]; /* text parameters (a daemon id is host:pid) */
    /* Its due term (tw.due_*, returning when it is next due), called with the first due_nparams parameters
     * (integers); NULL: not due-timed. TwDue asks the due terms of all its rules in one statement. */
    const char *due;
    int due_nparams;
    bool
        heartbeat_judged; /* judges others by heartbeats or leases: held back for a grace after a reconnect */
    int running;          /* runs in flight */
    int parallel;         /* the most runs in flight at once (TwRuleDef.parallel, at least 1) */
    /* > 0: at most this many re-ring lines (actions with no "action" or "action":"rering") per 10 s at level
     * info, the others at debug and counted in one summary line per 10 s (re-rings under a large backlog
     * would otherwise write a line per item each interval). 0: a line per action. */
    int info_lines_per_10s;
    int64_t window_start_ms;
    long window_lines, window_quiet;
    long long window_quiet_max_ms;
    long runs, actions, errors;
    TwLateness lateness;
    TwLogLimit failed_log; /* its server errors, at most one line per interval */
} TwRule;

/** A reload: take the parameters of fresh (the same rules, built from the new configuration) and keep
 *  everything else (counters, lateness, a run in flight). */
void tw_rules_update_params(TwRule *rules, const TwRule *fresh, int n);
/** Run it on pg unless it is busy or pg is down; done (may be NULL) is called once it finished. Returns true
 *  when it was started. */
bool tw_rule_run(TwRule *rule, TwPg *pg, TwBus *bus, TwRuleDoneCb done, void *arg);
/** One log line with every rule's counters and lateness (median, p99, max). */
void tw_rules_log_counters(const char *who, TwRule *rules, int n);

#endif
