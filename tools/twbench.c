/* turnwatch-bench: end-to-end numbers for tools/bench. Submits turns through tw.submit_turn on one
 * connection and times each turn's final event (evt.agent.<agent>.task) as it arrives from NATS.
 *   throughput: N turns over K agents, all submitted at once (B per statement); turns/s from the first submit
 *               to the last final event, and submit to final event per turn, queueing included (median, p99)
 *   latency:    M lone turns one after another; median and p99 from submit to the final event
 *   inflight:   N turns that wait on an external tool nobody answers; once they wait, the watched processes'
 *               CPU over --idle-seconds and their memory
 *   rss:        peak and current memory of the watched processes
 * With --watch name=pid,... each run also prints per turn: SQL statements and transactions (PostgreSQL's own
 * counters), CPU by process (/proc), and the host's CPU with the hypervisor's steal (benchstat.c). */
#include <jansson.h>
#include <libpq-fe.h>
#include <nats/nats.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "benchstat.h"
#include "config.h"

/* A turn seen by this client: submitted by it (registered) and/or ended (its final event). The final event
 * may come before submit has returned (a fast turn on a busy machine), so both sides meet in one table. */
typedef struct Turn {
    char turn_id[37];
    bool registered;
    double submitted, finished;
    bool ok;
} Turn;

typedef struct Opts {
    const char *config, *mode, *prefix, *tool;
    int count, agents, batch, settle_sec, idle_sec;
    BsWatch watch[BS_MAX_WATCH];
    int n_watch;
} Opts;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static Turn *table; /* open addressing on the turn id */
static size_t table_size;
static int n_turns, n_done, n_bad;
/* The schema has the agent roster (docs/roster.md: tw.add_agent, and tw.submit_turn(agent, channel,
 * input, timeout_seconds, idempotency_key, box, profile) returning the id); before it, tw.submit_turn(agent,
 * channel, box, input, timeout, idempotency_key) returned a table. */
static bool roster;
/* The schema has tw.submit_turns (many turns in one call, issue 24): batches use it. */
static bool bulk;

/* The entry for id, made if new; NULL when the table is full. Call with lock held. */
static Turn *turn_slot(const char *id)
{
    size_t h = 1469598103934665603u;

    for (const char *c = id; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211u;
    for (size_t k = 0; k < table_size; k++) {
        Turn *t = &table[(h + k) & (table_size - 1)];
        if (!t->turn_id[0])
            snprintf(t->turn_id, sizeof t->turn_id, "%s", id);
        if (strcmp(t->turn_id, id) == 0)
            return t;
    }
    return NULL;
}

/* One of ours has both been submitted and ended. */
static void turn_count(Turn *t)
{
    n_done++;
    if (!t->ok)
        n_bad++;
    pthread_cond_broadcast(&cond);
}

static double now_sec(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void on_event(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    double t = now_sec();
    json_t *j = json_loadb(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), 0, NULL);
    const char *id = json_string_value(json_object_get(j, "turn_id"));
    const char *status = json_string_value(json_object_get(j, "status"));
    Turn *turn;

    pthread_mutex_lock(&lock);
    if (id && strlen(id) == 36 && (turn = turn_slot(id)) && turn->finished == 0) {
        turn->finished = t;
        turn->ok = status && strcmp(status, "done") == 0;
        if (turn->registered)
            turn_count(turn);
    }
    pthread_mutex_unlock(&lock);
    json_decref(j);
    natsMsg_Destroy(msg);
}

/* A turn this client submitted at `at`. */
static void turn_register(const char *id, double at)
{
    Turn *turn;

    pthread_mutex_lock(&lock);
    if ((turn = turn_slot(id)) && !turn->registered) {
        turn->registered = true;
        turn->submitted = at;
        n_turns++;
        if (turn->finished > 0)
            turn_count(turn);
    }
    pthread_mutex_unlock(&lock);
}

/* Every turn's input (--input): a no-op agent's, or one that makes the tool calls a run measures. */
static const char *bench_input = "{\"bench\":true}";

/* One turn, one statement (a client that submits as it goes). */
static int submit_one(PGconn *conn, const char *agent)
{
    const char *params[] = {agent, "bench", NULL, bench_input, NULL, NULL};
    double at = now_sec();
    PGresult *res = PQexecPrepared(conn, "submit", 6, params, NULL, NULL, 0);

    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        fprintf(stderr, "turnwatch-bench: submit failed: %s", PQerrorMessage(conn));
        PQclear(res);
        return -1;
    }
    turn_register(PQgetvalue(res, 0, 0), at);
    PQclear(res);
    return 0;
}

/* n turns in one statement (one transaction), round robin over the agents from number `first` on. */
static int submit_batch(PGconn *conn, const Opts *o, int first, int n)
{
    char f[16], c[16], k[16];
    const char *params[] = {o->prefix, f, c, k, bench_input};
    double at = now_sec();
    PGresult *res;

    snprintf(f, sizeof f, "%d", first);
    snprintf(c, sizeof c, "%d", n);
    snprintf(k, sizeof k, "%d", o->agents);
    static const char *q_roster = "SELECT tw.submit_turn($1 || (i % $4::integer), 'bench', $5::jsonb) "
                                  "FROM generate_series($2::integer, $2::integer + $3::integer - 1) i";
    static const char *q_bulk =
        "SELECT turn_id FROM tw.submit_turns(ARRAY(SELECT $1 || (i % $4::integer) FROM "
        "generate_series($2::integer,"
        " $2::integer + $3::integer - 1) i), array_fill('bench'::text, ARRAY[$3::integer]),"
        " array_fill($5::jsonb, ARRAY[$3::integer]))";
    static const char *q_before =
        "SELECT s.turn_id FROM generate_series($2::integer, $2::integer + $3::integer - 1) i, "
        "LATERAL tw.submit_turn($1 || (i % $4::integer), 'bench', NULL, $5, NULL, NULL) s";
    res = PQexecParams(conn, bulk ? q_bulk : roster ? q_roster : q_before, 5, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        fprintf(stderr, "turnwatch-bench: submit failed: %s", PQerrorMessage(conn));
        PQclear(res);
        return -1;
    }
    for (int i = 0; i < PQntuples(res); i++)
        turn_register(PQgetvalue(res, i, 0), at);
    PQclear(res);
    return 0;
}

/* Wait until `want` turns have ended or the timeout passes; returns how many ended. */
static int wait_done(int want, double timeout_sec)
{
    struct timespec deadline;
    int done;

    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += (time_t)timeout_sec;
    pthread_mutex_lock(&lock);
    while (n_done < want && pthread_cond_timedwait(&cond, &lock, &deadline) == 0)
        ;
    done = n_done;
    pthread_mutex_unlock(&lock);
    return done;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Submit to final event in ms of our turns that ended, sorted; returns how many. */
static int latencies(double *lat, int max)
{
    int got = 0;

    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < table_size && got < max; i++)
        if (table[i].registered && table[i].finished > 0)
            lat[got++] = (table[i].finished - table[i].submitted) * 1000;
    pthread_mutex_unlock(&lock);
    qsort(lat, (size_t)got, sizeof *lat, cmp_double);
    return got;
}

static double pct(const double *v, int n, double p)
{
    int k = (int)(n * p);
    return v[k < n ? k : n - 1];
}

/* The measurement around a run: a snapshot before, one after; with settle seconds, PostgreSQL's delayed
 * statistics are read after waiting that long on both sides (a backend reports them within about 10 s). */
static void measure_begin(PGconn *conn, const Opts *o, BsSnap *a)
{
    if (o->settle_sec > 0)
        sleep((unsigned)o->settle_sec);
    bs_snap(conn, o->watch, o->n_watch, o->settle_sec > 0, a);
}

static void measure_end(PGconn *conn, const Opts *o, const BsSnap *a, int turns_measured)
{
    BsSnap b, late;

    bs_snap(conn, o->watch, o->n_watch, false, &b);
    if (o->settle_sec > 0) {
        sleep((unsigned)o->settle_sec);
        bs_snap(conn, o->watch, o->n_watch, true, &late);
        b.xact_commit = late.xact_commit;
        b.wal_sync = late.wal_sync;
        b.wal_sync_ms = late.wal_sync_ms;
    }
    if (o->n_watch > 0)
        bs_report(o->watch, o->n_watch, a, &b, turns_measured);
    bs_report_host(a, &b);
}

/* All turns at once: in batches of o->batch per statement (a platform that enqueues in bulk, as the job
 * queues compared with do before they time the workers), or one statement each (o->batch 1). */
static int run_throughput(PGconn *conn, const Opts *o)
{
    char agent[80];
    double end = 0, *lat = calloc((size_t)o->count, sizeof *lat);
    BsSnap a;

    if (!lat)
        return 1;
    measure_begin(conn, o, &a);
    double start = now_sec();
    for (int i = 0; i < o->count;) {
        int n = o->count - i < o->batch ? o->count - i : o->batch;
        snprintf(agent, sizeof agent, "%s%d", o->prefix, i % o->agents);
        if ((n == 1 ? submit_one(conn, agent) : submit_batch(conn, o, i, n)) != 0)
            return 1;
        i += n;
    }
    double submitted = now_sec();
    int done = wait_done(o->count, 600);
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < table_size; i++)
        if (table[i].registered && table[i].finished > end)
            end = table[i].finished;
    pthread_mutex_unlock(&lock);
    int got = latencies(lat, o->count);
    printf(
        "throughput: %d turns over %d agents, submitted %d per statement in %.3f s; all final events after "
        "%.3f s: %.0f turns/s (%d ended, %d not done); submit to final event, queueing included: median %.1f "
        "ms, p99 %.1f ms\n",
        o->count, o->agents, o->batch, submitted - start, end - start, done / (end - start), done,
        n_bad + (o->count - done), got ? pct(lat, got, 0.5) : 0, got ? pct(lat, got, 0.99) : 0);
    fflush(stdout);
    measure_end(conn, o, &a, done);
    free(lat);
    return 0;
}

static int run_latency(PGconn *conn, const Opts *o)
{
    double *lat = calloc((size_t)o->count, sizeof *lat);
    char agent[80];
    BsSnap a;

    if (!lat)
        return 1;
    measure_begin(conn, o, &a);
    snprintf(agent, sizeof agent, "%s0", o->prefix);
    for (int i = 0; i < o->count; i++) {
        if (submit_one(conn, agent) != 0)
            return 1;
        if (wait_done(i + 1, 10) < i + 1) {
            fprintf(stderr, "turnwatch-bench: a lone turn did not end within 10 s\n");
            break;
        }
    }
    int got = latencies(lat, o->count);
    if (got)
        printf("latency: %d lone turns, submit to final event: median %.2f ms, p99 %.2f ms, max %.2f ms\n",
               got, pct(lat, got, 0.5), pct(lat, got, 0.99), lat[got - 1]);
    fflush(stdout);
    measure_end(conn, o, &a, got);
    free(lat);
    return 0;
}

static void report_rss(const Opts *o)
{
    printf("memory (MiB, peak VmHWM / now VmRSS):");
    for (int i = 0; i < o->n_watch; i++) {
        double hwm, rss, kids = 0;
        int n = 0;
        if (!o->watch[i].children_apart)
            continue; /* postgres: shared memory counted once per process says nothing */
        bs_rss(o->watch[i].pid, &hwm, &rss, &n, o->watch[i].children_apart ? &kids : NULL);
        printf(" %s %.1f / %.1f", o->watch[i].name, hwm, rss);
        if (n > 0)
            printf(" (+ %d programs %.1f)", n, kids);
    }
    printf("\n");
}

static long long sql_ll(PGconn *conn, const char *sql)
{
    PGresult *res = PQexec(conn, sql);
    long long v = -1;

    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
        v = atoll(PQgetvalue(res, 0, 0));
    else
        fprintf(stderr, "turnwatch-bench: %s: %s", sql, PQerrorMessage(conn));
    PQclear(res);
    return v;
}

/* The in-flight run's turns, in one scan: suspended, ended, and still queued (pending, dispatched or
 * running). False on an error, said on stderr. */
static bool inflight_counts(PGconn *conn, long long *suspended, long long *ended, long long *queued)
{
    PGresult *res =
        PQexec(conn, "SELECT count(*) FILTER (WHERE status = 'suspended'), "
                     "count(*) FILTER (WHERE status IN ('done', 'failed', 'timeout', 'cancelled')), "
                     "count(*) FILTER (WHERE status IN ('pending', 'dispatched', 'running')) "
                     "FROM state.turns WHERE channel_id = 'bench-inflight'");
    bool ok = PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1;

    if (ok) {
        *suspended = atoll(PQgetvalue(res, 0, 0));
        *ended = atoll(PQgetvalue(res, 0, 1));
        *queued = atoll(PQgetvalue(res, 0, 2));
    } else {
        fprintf(stderr, "turnwatch-bench: counting the turns in flight: %s", PQerrorMessage(conn));
    }
    PQclear(res);
    return ok;
}

/* N turns waiting on an external tool that nobody answers. With the agent roster (tw.add_agent), N agents of
 * profile <prefix>0 each hold one suspended turn; without it an agent runs one turn at a time, so the K
 * configured agents each hold one suspended turn and the other N - K turns queue behind them. */
static int run_inflight(PGconn *conn, const Opts *o)
{
    char count[32], agents[32], input[256], *q;
    long long want_suspended = roster ? o->count : (o->count < o->agents ? o->count : o->agents);
    PGresult *res;
    BsSnap a, b;

    snprintf(count, sizeof count, "%d", o->count);
    snprintf(agents, sizeof agents, "%d", o->agents);
    snprintf(input, sizeof input,
             "{\"mode\":\"tools\",\"calls\":[{\"id\":\"wait\",\"tool\":\"%s\",\"args\":{}}]}", o->tool);
    double t0 = now_sec();
    if (roster) {
        const char *add[] = {o->prefix, count};
        res = PQexecParams(conn,
                           "SELECT count(tw.add_agent($1 || '0-r' || i, $1 || '0')) "
                           "FROM generate_series(1, $2::integer) i",
                           2, NULL, add, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_TUPLES_OK) {
            fprintf(stderr, "turnwatch-bench: adding %d agents: %s", o->count, PQerrorMessage(conn));
            PQclear(res);
            return 1;
        }
        PQclear(res);
        q = "SELECT count(tw.submit_turn($1 || '0-r' || i, 'bench-inflight', $3::jsonb)) "
            "FROM generate_series(1, $2::integer) i";
    } else {
        q = "SELECT count(*) FROM generate_series(0, $2::integer - 1) i, "
            "LATERAL tw.submit_turn($1 || (i % $4::integer), 'bench-inflight', NULL, $3::jsonb, NULL, NULL)";
    }
    const char *params[] = {o->prefix, count, input, agents};
    res = PQexecParams(conn, q, roster ? 3 : 4, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        fprintf(stderr, "turnwatch-bench: submitting %d turns: %s", o->count, PQerrorMessage(conn));
        PQclear(res);
        return 1;
    }
    PQclear(res);
    double t1 = now_sec();
    long long suspended = 0, ended = 0, queued = 0;
    while (now_sec() - t1 < 3600 && inflight_counts(conn, &suspended, &ended, &queued)) {
        /* A turn that ended instead (a watchdog gave up on it) will never wait: stop waiting for it. */
        if (suspended >= want_suspended || suspended + ended >= o->count)
            break;
        sleep(1);
    }
    printf(
        "in flight: %d turns (%s): %lld suspended on external tool %s, %lld queued; submitted in %.1f s, all "
        "waiting after %.1f s\n",
        o->count,
        roster ? "roster: one agent each" : "no roster here: one turn at a time per agent, so the rest queue",
        suspended, o->tool, queued, t1 - t0, now_sec() - t0);
    if (suspended < want_suspended) {
        fprintf(stderr,
                "turnwatch-bench: only %lld of %lld turns got to wait on the tool; %lld ended instead\n",
                suspended, want_suspended, ended);
        return 1;
    }
    fflush(stdout);
    measure_begin(conn, o, &a);
    sleep((unsigned)o->idle_sec);
    bs_snap(conn, o->watch, o->n_watch, true, &b);
    printf("  over %d s with them waiting, CPU in %% of one core:", o->idle_sec);
    for (int i = 0; i < o->n_watch; i++)
        printf(" %s %.2f", o->watch[i].name,
               100 * ((b.own_ms[i] - a.own_ms[i]) + (b.children_ms[i] - a.children_ms[i])) / 1000 /
                   (b.at - a.at));
    if (a.top_calls >= 0 && b.top_calls >= 0)
        printf("; %.1f SQL statements/s", (double)(b.top_calls - a.top_calls) / (b.at - a.at));
    printf("\n  ");
    report_rss(o);
    bs_report_host(&a, &b);
    return 0;
}

static void usage(void)
{
    fputs("usage: turnwatch-bench -c FILE [--mode throughput|latency|inflight|rss] [--turns N] [--agents K]\n"
          "                       [--batch B] [--prefix P] [--watch name=pid,...] [--settle S] [--tool T]\n"
          "                       [--idle-seconds S] [--input JSON]\n"
          "  agents are named P0..P(K-1) and must have [agent.*] sections; throughput submits B turns per\n"
          "  statement (default 100); --watch: processes to measure (name+=pid counts its children as its\n"
          "  own); --settle: seconds to wait for PostgreSQL's delayed statistics around a run; inflight:\n"
          "  turns wait on external tool T; --input: every throughput and latency turn's input\n",
          stderr);
}

int main(int argc, char **argv)
{
    Opts o = {.mode = "throughput",
              .prefix = "bench",
              .tool = "hold",
              .count = 1000,
              .agents = 10,
              .batch = 100,
              .idle_sec = 30};
    TwConfig cfg;
    PGconn *conn;
    natsConnection *nc = NULL;
    natsSubscription *sub = NULL;
    int rc;

    for (int i = 1; i < argc; i++) {
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "-c") == 0 && next)
            o.config = argv[++i];
        else if (strcmp(argv[i], "--mode") == 0 && next)
            o.mode = argv[++i];
        else if (strcmp(argv[i], "--turns") == 0 && next)
            o.count = atoi(argv[++i]);
        else if (strcmp(argv[i], "--agents") == 0 && next)
            o.agents = atoi(argv[++i]);
        else if (strcmp(argv[i], "--prefix") == 0 && next)
            o.prefix = argv[++i];
        else if (strcmp(argv[i], "--batch") == 0 && next)
            o.batch = atoi(argv[++i]);
        else if (strcmp(argv[i], "--tool") == 0 && next)
            o.tool = argv[++i];
        else if (strcmp(argv[i], "--input") == 0 && next)
            bench_input = argv[++i];
        else if (strcmp(argv[i], "--settle") == 0 && next)
            o.settle_sec = atoi(argv[++i]);
        else if (strcmp(argv[i], "--idle-seconds") == 0 && next)
            o.idle_sec = atoi(argv[++i]);
        else if (strcmp(argv[i], "--watch") == 0 && next) {
            if ((o.n_watch = bs_watch_parse(argv[++i], o.watch, BS_MAX_WATCH)) < 0)
                return 2;
        } else {
            usage();
            return 2;
        }
    }
    if (!o.config || o.count < 1 || o.agents < 1 || o.batch < 1 || o.idle_sec < 1) {
        usage();
        return 2;
    }
    if (strcmp(o.mode, "rss") == 0) {
        report_rss(&o);
        return 0;
    }
    if (tw_config_load(&cfg, o.config) != 0) {
        fputs(cfg.errors, stderr);
        return 2;
    }
    for (table_size = 1024; table_size < 2 * (size_t)o.count + 1024;)
        table_size *= 2;
    table = calloc(table_size, sizeof *table);
    conn = PQconnectdb(cfg.pg_dsn);
    if (!table || PQstatus(conn) != CONNECTION_OK) {
        fprintf(stderr, "turnwatch-bench: %s", PQerrorMessage(conn));
        return 1;
    }
    roster = sql_ll(conn, "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                          "WHERE n.nspname = 'tw' AND p.proname = 'add_agent'") > 0;
    bulk = sql_ll(conn, "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                        "WHERE n.nspname = 'tw' AND p.proname = 'submit_turns'") > 0;
    /* A platform submits over a long-lived connection, as here: the statement is prepared once. */
    PGresult *prep =
        PQprepare(conn, "submit", "SELECT tw.submit_turn($1, $2, $4::jsonb, $5::integer, $6, $3)", 6, NULL);
    if (PQresultStatus(prep) != PGRES_COMMAND_OK) {
        fprintf(stderr, "turnwatch-bench: %s", PQerrorMessage(conn));
        return 1;
    }
    PQclear(prep);
    if (natsConnection_ConnectTo(&nc, cfg.nats_url) != NATS_OK ||
        natsConnection_Subscribe(&sub, nc, "evt.agent.*.task", on_event, NULL) != NATS_OK ||
        natsConnection_Flush(nc) != NATS_OK) {
        fprintf(stderr, "turnwatch-bench: cannot subscribe at %s\n", cfg.nats_url);
        return 1;
    }
    natsSubscription_SetPendingLimits(sub, -1, -1);

    if (strcmp(o.mode, "throughput") == 0)
        rc = run_throughput(conn, &o);
    else if (strcmp(o.mode, "latency") == 0)
        rc = run_latency(conn, &o);
    else if (strcmp(o.mode, "inflight") == 0)
        rc = run_inflight(conn, &o);
    else {
        usage();
        rc = 2;
    }
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(nc);
    PQfinish(conn);
    tw_config_free(&cfg);
    free(table);
    return rc ? rc : n_bad ? 1 : 0;
}
