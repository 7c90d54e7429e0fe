/* Measurements for turnwatch-bench, from /proc and PostgreSQL's statistics. */
#include "benchstat.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

int bs_watch_parse(const char *spec, BsWatch *w, int max)
{
    char *copy = strdup(spec), *save = NULL;
    int n = 0;

    if (!copy)
        return -1;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq || n == max || eq == tok || (size_t)(eq - tok) >= sizeof w[n].name || atoi(eq + 1) <= 0) {
            fprintf(stderr, "turnwatch-bench: --watch wants name=pid,... (at most %d), not '%s'\n", max, tok);
            free(copy);
            return -1;
        }
        *eq = '\0';
        w[n].children_apart = eq[-1] != '+';
        if (!w[n].children_apart)
            eq[-1] = '\0';
        snprintf(w[n].name, sizeof w[n].name, "%s", tok);
        w[n].pid = (pid_t)atoi(eq + 1);
        n++;
    }
    free(copy);
    return n;
}

/* utime+stime and cutime+cstime of pid, in clock ticks; false when it is gone. */
static bool proc_ticks(pid_t pid, unsigned long long *self, unsigned long long *reaped)
{
    char path[64], buf[1024];
    FILE *f;
    size_t n;

    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (!(f = fopen(path, "r")))
        return false;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name may hold spaces and parentheses: the fields start after the last ')'. */
    char *p = strrchr(buf, ')');
    unsigned long long ut, st, cut, cst;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %llu %llu", &ut, &st, &cut,
                     &cst) != 4)
        return false;
    *self = ut + st;
    *reaped = cut + cst;
    return true;
}

/* Calls fn for every live child of pid (any of its threads may have started it). */
static void for_children(pid_t pid, void (*fn)(pid_t child, void *arg), void *arg)
{
    char path[64];
    DIR *d;
    struct dirent *e;

    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    if (!(d = opendir(path)))
        return;
    while ((e = readdir(d))) {
        char cpath[400];
        FILE *f;
        int child;
        if (e->d_name[0] == '.')
            continue;
        snprintf(cpath, sizeof cpath, "/proc/%d/task/%s/children", (int)pid, e->d_name);
        if (!(f = fopen(cpath, "r")))
            continue;
        while (fscanf(f, "%d", &child) == 1)
            fn((pid_t)child, arg);
        fclose(f);
    }
    closedir(d);
}

static void add_child_ticks(pid_t child, void *arg)
{
    unsigned long long self, reaped;

    if (proc_ticks(child, &self, &reaped))
        *(unsigned long long *)arg += self + reaped;
}

static double now_sec(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long long pg_ll(const PGresult *res, int col)
{
    return PQgetisnull(res, 0, col) ? -1 : atoll(PQgetvalue(res, 0, col));
}

void bs_snap(PGconn *conn, const BsWatch *w, int n, bool cumulative, BsSnap *s)
{
    double ms_per_tick = 1000.0 / (double)sysconf(_SC_CLK_TCK);
    struct rusage ru;
    FILE *f;
    PGresult *res;

    memset(s, 0, sizeof *s);
    s->at = now_sec();
    if ((f = fopen("/proc/stat", "r"))) {
        if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &s->cpu[0], &s->cpu[1], &s->cpu[2],
                   &s->cpu[3], &s->cpu[4], &s->cpu[5], &s->cpu[6], &s->cpu[7]) != 8)
            memset(s->cpu, 0, sizeof s->cpu);
        fclose(f);
    }
    for (int i = 0; i < n; i++) {
        unsigned long long self = 0, reaped = 0, live = 0;
        (void)proc_ticks(w[i].pid, &self, &reaped);
        for_children(w[i].pid, add_child_ticks, &live);
        s->own_ms[i] = (double)self * ms_per_tick;
        s->children_ms[i] = (double)(reaped + live) * ms_per_tick;
        if (!w[i].children_apart) {
            s->own_ms[i] += s->children_ms[i];
            s->children_ms[i] = 0;
        }
    }
    getrusage(RUSAGE_SELF, &ru);
    s->self_ms = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000 +
                 (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000;

    s->top_calls = s->nested_calls = s->next_xid = s->xact_commit = s->wal_sync = -1;
    s->wal_sync_ms = -1;
    /* The next transaction id to be given out: how many transactions wrote (and so committed with a WAL
     * flush) in between, counted at once rather than through the delayed statistics. */
    res = PQexec(conn, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text");
    if (PQresultStatus(res) == PGRES_TUPLES_OK)
        s->next_xid = pg_ll(res, 0);
    PQclear(res);
    res = PQexec(conn, "SELECT sum(calls) FILTER (WHERE toplevel), sum(calls) FILTER (WHERE NOT toplevel) "
                       "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = "
                       "current_database())");
    if (PQresultStatus(res) == PGRES_TUPLES_OK) {
        s->top_calls = pg_ll(res, 0);
        s->nested_calls = pg_ll(res, 1);
    }
    PQclear(res);
    if (!cumulative)
        return;
    res =
        PQexec(conn, "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), "
                     "wal_sync, wal_sync_time FROM pg_stat_wal");
    if (PQresultStatus(res) == PGRES_TUPLES_OK) {
        s->xact_commit = pg_ll(res, 0);
        s->wal_sync = pg_ll(res, 1);
        s->wal_sync_ms = PQgetisnull(res, 0, 2) ? -1 : atof(PQgetvalue(res, 0, 2));
    }
    PQclear(res);
}

void bs_report_host(const BsSnap *a, const BsSnap *b)
{
    unsigned long long d[8], total = 0;

    for (int i = 0; i < 8; i++)
        total += d[i] = b->cpu[i] - a->cpu[i];
    if (total == 0)
        total = 1;
    printf(
        "  host CPU meanwhile (%ld cores): %.0f%% busy, %.0f%% idle or waiting for I/O, %.1f%% stolen by the "
        "hypervisor\n",
        sysconf(_SC_NPROCESSORS_ONLN), 100.0 * (double)(d[0] + d[1] + d[2] + d[5] + d[6]) / (double)total,
        100.0 * (double)(d[3] + d[4]) / (double)total, 100.0 * (double)d[7] / (double)total);
}

void bs_report(const BsWatch *w, int n, const BsSnap *a, const BsSnap *b, int turns)
{
    double per = turns > 0 ? 1.0 / turns : 0, total = 0;

    if (a->top_calls >= 0 && b->top_calls >= 0)
        printf(
            "  per turn: %.1f SQL statements sent (round trips, pg_stat_statements top level; %.1f more run "
            "inside their functions)",
            (double)(b->top_calls - a->top_calls) * per, (double)(b->nested_calls - a->nested_calls) * per);
    else
        printf("  per turn: statements n/a (pg_stat_statements is not loaded)");
    if (a->next_xid >= 0 && b->next_xid >= 0)
        printf(", %.2f write transactions (transaction ids)", (double)(b->next_xid - a->next_xid) * per);
    if (a->xact_commit >= 0 && b->xact_commit >= 0)
        printf(", %.2f commits (pg_stat_database, read-only ones too)",
               (double)(b->xact_commit - a->xact_commit) * per);
    if (a->wal_sync >= 0 && b->wal_sync >= 0) {
        long long syncs = b->wal_sync - a->wal_sync;
        printf(", %.2f WAL flushes (pg_stat_wal)", (double)syncs * per);
        if (syncs > 0 && a->wal_sync_ms >= 0)
            printf(" of %.2f ms each on average", (b->wal_sync_ms - a->wal_sync_ms) / (double)syncs);
    }
    printf("\n  CPU per turn (ms, from /proc):");
    for (int i = 0; i < n; i++) {
        double own = (b->own_ms[i] - a->own_ms[i]) * per,
               kids = (b->children_ms[i] - a->children_ms[i]) * per;
        printf(" %s %.3f", w[i].name, own);
        if (w[i].children_apart && kids > 0)
            printf(" + its programs %.3f", kids);
        total += own + kids;
    }
    printf(", bench client %.3f", (b->self_ms - a->self_ms) * per);
    total += (b->self_ms - a->self_ms) * per;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (total > 0 && b->at > a->at)
        printf("; total %.3f ms, so at most %.0f turns/s on %ld cores; these processes used %.2f of the %ld "
               "cores "
               "meanwhile\n",
               total, 1000.0 * (double)cores / total, cores, total * turns / 1000 / (b->at - a->at), cores);
    else
        printf("\n");
}

static void add_child_rss(pid_t child, void *arg)
{
    double *sum = arg, hwm, rss;
    int n;

    bs_rss(child, &hwm, &rss, &n, NULL);
    if (rss > 0) {
        sum[0] += rss;
        sum[1] += 1;
    }
}

void bs_rss(pid_t pid, double *hwm_mb, double *rss_mb, int *n_children, double *children_rss_mb)
{
    char path[64], line[256];
    FILE *f;

    *hwm_mb = *rss_mb = -1;
    *n_children = 0;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    if ((f = fopen(path, "r"))) {
        long kb;
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "VmHWM: %ld kB", &kb) == 1)
                *hwm_mb = (double)kb / 1024;
            else if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
                *rss_mb = (double)kb / 1024;
        }
        fclose(f);
    }
    if (children_rss_mb) {
        double sum[2] = {0, 0};
        for_children(pid, add_child_rss, sum);
        *children_rss_mb = sum[0];
        *n_children = (int)sum[1];
    }
}
