/* turnwatch-worker: claims inbox items and resume ledger entries, runs agent and tool programs, applies
 * their results, heartbeats what it holds, and runs the worker watchdogs (2.1-2.3) at their due times.
 *
 * Files depend downward only: worker.c (this loop, wiring) -> claim.c, heartbeat.c, watchdog.c, applier.c ->
 * job.c -> serve.c (serve-mode processes), runner.c (exec runs) -> child.c (a program's pipes, timers and
 * end) -> launch.c (starting one, with its limits), stderr_budget.c; steps.c (replies) -> common/. A lower
 * file reports upward through callbacks that worker.c sets (a freed slot, a claim that resumed a turn, what
 * an apply published). */
#ifndef WRK_WORKER_H
#define WRK_WORKER_H

#include <event2/event.h>
#include <stdbool.h>

#include "bus.h"
#include "capacity.h"
#include "claim.h"
#include "config.h"
#include "due.h"
#include "heartbeat.h"
#include "httpd.h"
#include "job.h"
#include "liveness.h"
#include "notify.h"
#include "pgpool.h"
#include "watchdog.h"

/* Connections per worker for the work (besides the watchdogs' and the liveness one): claims, applies and
 * heartbeats are independent transactions, and more than one lets the database use more than one core for a
 * busy worker. One per two slots: with fsync on, a connection waits for the disk at every commit, and only
 * commits in flight at once share a WAL flush (2 connections for 16 slots gave one flush per turn, 8 gave
 * 0.4). */
#define WRK_PG_CONNS_MIN 2
#define WRK_PG_CONNS_MAX TW_PGPOOL_MAX

typedef struct TwWorker {
    struct event_base *base;
    TwConfig *cfg;    /* ours (one reference); a SIGHUP reload swaps it (wrk_apply_config) */
    TwPgPool pool;    /* claims, applies, heartbeats */
    TwPgPool wd_pool; /* the watchdog rules, so that they never wait in line behind the work */
    TwBus *bus;
    TwDue *due;
    TwLive *live;
    char id[128];     /* host:pid, recorded as claimed_by */
    char *agents_arr; /* served agents as a text[] literal (from cfg) */
    char *tools_arr;  /* served (non-external) tools as a text[] literal (from cfg) */
    WrkJobs jobs;
    WrkClaim claim;
    WrkBeat beat;
    WrkCapacity capacity; /* free_since in state.daemons, for 2.4/2.5 */
    TwRule rules[WRK_RULE_COUNT];
    /* Deadlines a worker's changes start that are shorter than the responsible daemons' sweeps: after such a
     * change it wakes them (cmd.pmo.wakeup, cmd.worker.wakeup), coalesced to one message per loop pass. */
    bool wake_pmo, wake_workers;
    bool wake_pmo_due, wake_workers_due;
    struct event *wake;
    bool stopping;
    bool reloading;   /* a reload's profiles are being checked against the database */
    bool profiles_ok; /* the database has taken our profiles once (a refusal after that does not stop us) */
    int exit_code;    /* 1 when the database refused the configuration at start */
    struct event *poll, *heartbeat, *counters, *sigterm, *sigint, *sighup, *sigchld, *exit_check;
    TwHttpd *httpd;   /* /metrics and /healthz when [worker] metrics_listen is set */
    TwNotify *notify; /* systemd */
} TwWorker;

/** Start the worker on base; it takes cfg (one reference, see tw_config_ref), dropped in wrk_teardown. */
int wrk_setup(TwWorker *w, struct event_base *base, TwConfig *cfg) __attribute__((warn_unused_result));
/** A reload: run by cfg from now on (takes the reference; the old configuration is dropped once the last job
 *  started under it has ended, for a running job keeps the one it started with). What it serves and claims
 *  (agents and tools added, removed, changed), concurrency, leases, watchdog parameters and timers,
 *  metrics_listen and the metrics' names follow it; the connections stay (a changed dsn or url is logged as
 *  taking a restart). Returns -1, keeping the old one and dropping cfg, when cfg cannot be applied
 *  (metrics_listen cannot be opened, out of memory). */
int wrk_apply_config(TwWorker *w, TwConfig *cfg) __attribute__((warn_unused_result));
/** Its connections now (for /healthz, the metrics and systemd). */
void wrk_health(void *w, TwHealth *h);
/** Log every rule's counters (at exit and every minute). */
void wrk_log_counters(TwWorker *w);
/** Frees everything, after wrk_setup whether it succeeded or not. */
void wrk_teardown(TwWorker *w);

#endif
