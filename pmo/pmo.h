/* turnwatch-pmo: dispatches pending turns, runs the PMO watchdogs (2.4-2.7, turn deadlines, and the timeout
 * policies' retries, queue budgets and warnings) at their due times and relays outbox events that their
 * writers did not publish. */
#ifndef PMO_PMO_H
#define PMO_PMO_H

#include <event2/event.h>
#include <stdbool.h>

#include "daemon.h"

/* relay.c: the outbox relay. A tick or a NOTIFY tw_outbox asks for a claim; a claim that says "more" is
 * followed by the next at once, with at most PMO_RELAY_IN_FLIGHT claimed batches not yet confirmed and
 * marked. */
typedef struct PmoRelay {
    bool claiming;      /* a claim is in flight */
    bool claiming_now;  /* ... one asked for by a NOTIFY */
    int batches;        /* claimed batches not yet marked published (or given up) */
    bool due;           /* a tick or a NOTIFY asked for a claim: it looks at the newest events first */
    bool now;           /* ... a NOTIFY: events of any age */
    bool more;          /* the last claim said there is more: claim again at once */
    bool failed;        /* a batch was not confirmed or not marked: no claims until the next tick */
    char after_xid[24]; /* where the drain goes on; "" at the cursor */
    long long after_seq;
} PmoRelay;

typedef struct TwPmo {
    /* The shell (common/daemon.h): its configuration, connections (the work's one: LISTEN tw_turn, tw_due,
     * tw_outbox, tw_ring; dispatch; relay), bus, rules, liveness, signals and reloads. */
    TwDaemon d;
    TwPg *pg;              /* the work's connection */
    struct event *tick;    /* dispatch scan and relay, every watchdog_interval_seconds */
    bool wake_on_dispatch; /* a dispatch creates deadlines (2.4, 2.7) shorter than the sweep */
    bool dispatch_scan_busy;
    bool dispatch_scan_again; /* notifications were left to the scan while it ran */
    PmoRelay relay;
} TwPmo;

/** The PMO in the daemon shell: tw_daemon_main(argc, argv, &pmo_ops, &pmo, &pmo.d). Its setup takes cfg (one
 *  reference); a reload re-arms the tick (the shell does the rest). */
extern const TwDaemonOps pmo_ops;

/* dispatch.c */
void pmo_dispatch_on_notify(TwPmo *pmo, const char *agent);
void pmo_dispatch_scan(TwPmo *pmo);

/* relay.c */
void pmo_relay_tick(TwPmo *pmo);
void pmo_relay_now(TwPmo *pmo);

/* ring.c: NOTIFY tw_ring, the doorbells of SQL API calls (untrusted: only doorbells are rung) */
void pmo_ring(TwPmo *pmo, const char *payload);

#endif
