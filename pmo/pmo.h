/* turnwatch-pmo: dispatches pending turns, runs the PMO watchdogs (2.4-2.7, turn deadlines, and the timeout
 * policies' retries, queue budgets and warnings) at their due times and relays outbox events that their
 * writers did not publish. */
#ifndef PMO_PMO_H
#define PMO_PMO_H

#include <event2/event.h>
#include <stdbool.h>

#include "bus.h"
#include "config.h"
#include "due.h"
#include "liveness.h"
#include "pgpool.h"
#include "rule.h"

enum {
    PMO_RULE_RERING_DISPATCHED,
    PMO_RULE_REAP_DISPATCHED,
    PMO_RULE_REAP_RUNNING,
    PMO_RULE_RERING_PENDING,
    PMO_RULE_TURN_DEADLINE,
    PMO_RULE_RETRY,
    PMO_RULE_QUEUE,
    PMO_RULE_WARN,
    PMO_RULE_COUNT
};

typedef struct TwPmo {
    struct event_base *base;
    const TwConfig *cfg;
    TwPgPool pool; /* one connection: LISTEN tw_turn / tw_due, dispatch, relay */
    TwPg *pg;
    /* The watchdog rules and their due-time questions have a connection of their own, so that they never
     * wait in line behind a burst of dispatches. */
    TwPgPool wd_pool;
    TwBus *bus;
    TwDue *due;
    TwLive *live;
    char id[128];
    struct event *tick; /* dispatch scan and relay, every watchdog_interval_seconds */
    struct event *counters;
    struct event *sigterm, *sigint;
    struct event *drain;
    TwRule rules[PMO_RULE_COUNT];
    bool wake_on_dispatch; /* a dispatch creates deadlines (2.4, 2.7) shorter than the sweep */
    bool dispatch_scan_busy;
    bool relay_busy;
    bool stopping;
    int drain_ticks;
} TwPmo;

int pmo_setup(TwPmo *pmo, struct event_base *base, const TwConfig *cfg) __attribute__((warn_unused_result));
void pmo_teardown(TwPmo *pmo);

/* dispatch.c */
void pmo_dispatch_on_notify(TwPmo *pmo, const char *agent);
void pmo_dispatch_scan(TwPmo *pmo);

/* rering.c: 2.4 and 2.7 */
void pmo_rering_setup(TwPmo *pmo);

/* reaper.c: 2.5, 2.6 and turn deadlines */
void pmo_reaper_setup(TwPmo *pmo);

/* policy.c: retries at retry_at, queue budgets, warnings before deadlines (contract 11) */
void pmo_policy_setup(TwPmo *pmo);

/* relay.c */
void pmo_relay_tick(TwPmo *pmo);

#endif
