/* Measurements for turnwatch-bench: CPU time by process from /proc (a process and its children), the host's
 * CPU and the hypervisor's steal from /proc/stat, peak and current RSS, and PostgreSQL's counters (statements
 * from pg_stat_statements, write transactions from the transaction id counter, commits from
 * pg_stat_database, WAL syncs from pg_stat_wal). A snapshot before and one after a run give the per-turn
 * figures. */
#ifndef TW_BENCHSTAT_H
#define TW_BENCHSTAT_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <sys/types.h>

#define BS_MAX_WATCH 8

/* A process watched: its name in the report, its pid, and whether its children are reported apart ("worker":
 * the agent programs) or counted as its own ("postgres": its backends). */
typedef struct BsWatch {
    char name[32];
    pid_t pid;
    bool children_apart;
} BsWatch;

typedef struct BsSnap {
    double at;                 /* CLOCK_MONOTONIC seconds */
    unsigned long long cpu[8]; /* /proc/stat "cpu": user nice system idle iowait irq softirq steal */
    double own_ms[BS_MAX_WATCH], children_ms[BS_MAX_WATCH];
    double self_ms; /* this process (the bench client) */
    /* PostgreSQL, immediate: -1 when not available */
    long long top_calls, nested_calls, next_xid;
    /* PostgreSQL, through the cumulative statistics (a backend reports within about 10 s): -1 when not read
     */
    long long xact_commit, wal_sync;
    double wal_sync_ms;
} BsSnap;

/** Parse "name=pid,name=pid,..."; a name ending in '+' counts its children as its own. Returns the count,
 *  or -1 with a message on stderr. */
int bs_watch_parse(const char *spec, BsWatch *w, int max);
/** Take a snapshot; with cumulative, also the delayed counters (call after a settle time). */
void bs_snap(PGconn *conn, const BsWatch *w, int n, bool cumulative, BsSnap *s);
/** Print what happened between a and b, per turn (turns > 0) */
void bs_report(const BsWatch *w, int n, const BsSnap *a, const BsSnap *b, int turns);
/** Print the host's CPU between a and b: busy, idle, stolen. */
void bs_report_host(const BsSnap *a, const BsSnap *b);
/** VmHWM and VmRSS of pid in MiB (-1 when unknown); with children, the sum over its live children too. */
void bs_rss(pid_t pid, double *hwm_mb, double *rss_mb, int *n_children, double *children_rss_mb);

#endif
