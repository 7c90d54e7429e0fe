/* Due-time firing of a daemon's watchdog rules (docs/watchdogs.md). The daemon asks the database, on its
 * clock, when each rule is next due (one statement selecting every rule's due term, TwRule.due, with the
 * rule's parameters: each term an index-backed min()), arms one libevent timer for
 * the earliest, runs the rules that are due when it fires, and asks again after every batch. It asks again
 * early when told that something may now be due sooner (tw_due_wake: a wake-up from another daemon, or a
 * deadline this daemon created itself). A safety sweep every interval runs every rule whatever the answer, so
 * a lost wake-up costs at most one interval. Rules that judge other daemons by heartbeats or leases are held
 * back for a grace period after the database comes back (a reconnect, not the first connect), so that the
 * others can reconnect and write what they finished meanwhile before anyone is judged dead. */
#ifndef TW_DUE_H
#define TW_DUE_H

#include <event2/event.h>
#include <stdbool.h>

#include "bus.h"
#include "config.h"
#include "pgpool.h"
#include "rule.h"

typedef struct TwDue TwDue;

typedef struct TwDueConf {
    const char *who; /* "pmo" or "worker", for log lines */
    TwRule *rules;   /* the daemon's rules (owned by the caller, outlive TwDue); their due terms are asked */
    int n_rules;
    int sweep_sec; /* the safety sweep, watchdog_interval_seconds */
    int grace_ms;  /* hold heartbeat-judged rules this long after the database comes back */
    /* Called after a run whose rule acted: its actions may have started clocks other daemons watch. */
    void (*on_acted)(void *arg);
    void *arg;
} TwDueConf;

TwDue *tw_due_new(struct event_base *base, TwPgPool *pool, TwBus *bus, const TwDueConf *conf)
    __attribute__((warn_unused_result));
/** Arm the sweep and ask for the first due times. */
void tw_due_start(TwDue *d);
/** Something may now be due sooner than the timer is armed for: ask the database again (coalesced, at most
 *  one question in flight, spaced by a few milliseconds). */
void tw_due_wake(TwDue *d);
/** A change started the clock of the rule `key` ("2.4"), of in_ms from now: that rule is due no later than
 * then. Armed here without a question to the database (the rule checks its own condition when it runs, and
 * the question after its run finds what is due next); a key that is not one of this daemon's rules asks. */
void tw_due_expect(TwDue *d, const char *key, int64_t in_ms);
/** Run every rule now (the safety sweep's work), then ask again. */
void tw_due_sweep(TwDue *d);
/** Call when one of the pool's connections (pg) came up: after its reconnect this starts the grace period;
 *  asks again. */
void tw_due_pg_up(TwDue *d, const TwPg *pg);
/** A reload: a new sweep interval and grace (conf->rules, n_rules and the callbacks must be the same; the
 *  rules' new parameters, tw_rules_update_params, are what the next question sends). Asks again at once. */
void tw_due_reconfigure(TwDue *d, const TwDueConf *conf);
/** No more runs: shutdown. */
void tw_due_stop(TwDue *d);
/** The timer's next firing in ms from now (-1 when none is armed), for tests and logs. */
long tw_due_armed_in_ms(const TwDue *d);
void tw_due_free(TwDue *d);

/** How long rules that judge other daemons by heartbeats (and the liveness check) wait after the database
 *  comes back: one heartbeat interval plus the longest reconnect backoff, so every daemon has reconnected and
 *  written once before anyone is judged. */
int tw_due_grace_ms(const TwConfig *cfg);
/** Tell the daemons of one kind ("pmo", "worker") that something may be due sooner than they sleep for:
 *  cmd.<kind>.wakeup on NATS, a hint like every doorbell. */
void tw_due_wake_peers(TwBus *bus, const char *kind);

#endif
