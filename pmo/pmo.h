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
#include "httpd.h"
#include "liveness.h"
#include "notify.h"
#include "pgpool.h"
#include "rule.h"
#include "watchdogs.h"

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
    struct event_base *base;
    TwConfig *cfg; /* ours (one reference); a SIGHUP reload swaps it (pmo_apply_config) */
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
    struct event *sigterm, *sigint, *sighup;
    struct event *drain;
    TwHttpd *httpd;                 /* /metrics and /healthz when [pmo] metrics_listen is set */
    TwNotify *notify;               /* systemd */
    TwRule rules[TW_WATCHDOGS_MAX]; /* its rows of the rule table (common/watchdogs.c) */
    int n_rules;
    bool wake_on_dispatch; /* a dispatch creates deadlines (2.4, 2.7) shorter than the sweep */
    bool dispatch_scan_busy;
    bool dispatch_scan_again; /* notifications were left to the scan while it ran */
    PmoRelay relay;
    bool stopping;
    bool reloading;   /* a reload's profiles are being checked against the database */
    bool profiles_ok; /* the database has taken our profiles once (a refusal after that does not stop us) */
    int exit_code;    /* 1 when the database refused the configuration at start */
    int drain_ticks;
} TwPmo;

/** Start the PMO on base; it takes cfg (one reference, see tw_config_ref) and unrefs it in pmo_teardown. */
int pmo_setup(TwPmo *pmo, struct event_base *base, TwConfig *cfg) __attribute__((warn_unused_result));
/** A reload: run by cfg from now on (takes the reference; the old configuration is dropped). Watchdog
 *  parameters and timers, the sweep, metrics_listen and the metrics' names follow it; the connections stay
 *  (a changed dsn or url is logged as taking a restart). Returns -1, keeping the old one and dropping cfg,
 *  when cfg cannot be applied (metrics_listen cannot be opened). */
int pmo_apply_config(TwPmo *pmo, TwConfig *cfg) __attribute__((warn_unused_result));
/** Its connections now (for /healthz, the metrics and systemd). */
void pmo_health(void *pmo, TwHealth *h);
/** Frees everything, after pmo_setup whether it succeeded or not. */
void pmo_teardown(TwPmo *pmo);

/* dispatch.c */
void pmo_dispatch_on_notify(TwPmo *pmo, const char *agent);
void pmo_dispatch_scan(TwPmo *pmo);

/* relay.c */
void pmo_relay_tick(TwPmo *pmo);
void pmo_relay_now(TwPmo *pmo);

/* ring.c: NOTIFY tw_ring, the doorbells of SQL API calls (untrusted: only doorbells are rung) */
void pmo_ring(TwPmo *pmo, const char *payload);

#endif
