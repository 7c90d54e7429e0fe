/* turnwatch-worker: claims inbox items and resume ledger entries, runs agent and tool programs, applies
 * their results, heartbeats what it holds, and runs the worker watchdogs (2.1-2.3) at their due times.
 *
 * Files depend downward only: worker.c (this loop, wiring) -> claim.c, heartbeat.c, watchdog.c -> job.c ->
 * serve.c (serve-mode processes) -> runner.c (processes), steps.c (replies) -> common/. A lower file reports
 * upward through callbacks that worker.c sets (a freed slot, a claim that resumed a turn, what an apply
 * published). */
#ifndef WRK_WORKER_H
#define WRK_WORKER_H

#include <event2/event.h>
#include <stdbool.h>

#include "bus.h"
#include "claim.h"
#include "config.h"
#include "due.h"
#include "heartbeat.h"
#include "job.h"
#include "liveness.h"
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
    const TwConfig *cfg;
    TwPgPool pool;    /* claims, applies, heartbeats */
    TwPgPool wd_pool; /* the watchdog rules, so that they never wait in line behind the work */
    TwBus *bus;
    TwDue *due;
    TwLive *live;
    char id[128];     /* host:pid, recorded as claimed_by */
    char *agents_arr; /* served agents as a text[] literal */
    char *tools_arr;  /* served (non-external) tools as a text[] literal */
    WrkJobs jobs;
    WrkClaim claim;
    WrkBeat beat;
    TwRule rules[WRK_RULE_COUNT];
    /* Deadlines a worker's changes start that are shorter than the responsible daemons' sweeps: after such a
     * change it wakes them (cmd.pmo.wakeup, cmd.worker.wakeup), coalesced to one message per loop pass. */
    bool wake_pmo, wake_workers;
    bool wake_pmo_due, wake_workers_due;
    struct event *wake;
    bool stopping;
    struct event *poll, *heartbeat, *counters, *sigterm, *sigint, *sigchld, *exit_check;
} TwWorker;

int wrk_setup(TwWorker *w, struct event_base *base, const TwConfig *cfg) __attribute__((warn_unused_result));
/** Log every rule's counters (at exit and every minute). */
void wrk_log_counters(TwWorker *w);
void wrk_teardown(TwWorker *w);

#endif
