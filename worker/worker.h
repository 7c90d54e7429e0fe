/* turnwatch-worker: claims inbox items and resume ledger entries, runs agent and tool programs, applies
 * their results, heartbeats what it holds, and runs the worker watchdogs (2.1-2.3) at their due times.
 *
 * Files depend downward only: worker.c (this loop, wiring) -> claim.c, heartbeat.c, applier.c -> job.c ->
 * serve.c (serve-mode processes), runner.c (exec runs) -> child.c (a program's pipes, timers and end) ->
 * launch.c (starting one, with its limits), stderr_budget.c; steps.c (replies) -> common/. A lower file
 * reports upward through callbacks that worker.c sets (a freed slot, a claim that resumed a turn, what an
 * apply published). */
#ifndef WRK_WORKER_H
#define WRK_WORKER_H

#include <event2/event.h>
#include <stdbool.h>

#include "capacity.h"
#include "claim.h"
#include "daemon.h"
#include "heartbeat.h"
#include "job.h"

/* Connections per worker for the work (besides the watchdogs' and the liveness one): claims, applies and
 * heartbeats are independent transactions, and more than one lets the database use more than one core for a
 * busy worker. One per two slots: with fsync on, a connection waits for the disk at every commit, and only
 * commits in flight at once share a WAL flush (2 connections for 16 slots gave one flush per turn, 8 gave
 * 0.4). */
#define WRK_PG_CONNS_MIN 2
#define WRK_PG_CONNS_MAX TW_PGPOOL_MAX

typedef struct TwWorker {
    /* The shell (common/daemon.h): its configuration (a SIGHUP reload swaps it; a running job keeps the one
     * it started with), connections (the work's: claims, applies, heartbeats; the watchdogs', which also
     * hears NOTIFY tw_work), bus, rules 2.1-2.3, liveness, signals and reloads. */
    TwDaemon d;
    char *agents_arr; /* served agents as a text[] literal (from cfg) */
    char *tools_arr;  /* served (non-external) tools as a text[] literal (from cfg) */
    WrkJobs jobs;
    WrkClaim claim;
    WrkBeat beat;
    WrkCapacity capacity; /* free_since in state.daemons, for 2.4/2.5 */
    /* Deadlines a worker's changes start that are shorter than the responsible daemons' sweeps: after such a
     * change it wakes them (cmd.pmo.wakeup, cmd.worker.wakeup), coalesced to one message per loop pass. */
    bool wake_pmo, wake_workers;
    bool wake_pmo_due, wake_workers_due;
    struct event *wake;
    struct event *poll, *heartbeat, *sigchld;
} TwWorker;

/** The worker in the daemon shell: tw_daemon_main(argc, argv, &wrk_ops, &w, &w.d). Its setup takes cfg (one
 *  reference); a reload changes what it serves and claims (agents and tools added, removed, changed),
 *  concurrency, leases, the doorbells, the poll and heartbeat (the shell does the rest), and is refused when
 * out of memory. */
extern const TwDaemonOps wrk_ops;

#endif
