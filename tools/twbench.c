/* turnwatch-bench: end-to-end numbers for tools/bench. Submits turns through tw.submit_turn on one
 * connection and times each turn's final event (evt.agent.<agent>.task) as it arrives from NATS.
 *   throughput: N turns over K agents, all submitted at once; turns/s from first submit to last event
 *   latency:    M lone turns one after another; median and p99 from submit to the final event */
#include <jansson.h>
#include <libpq-fe.h>
#include <nats/nats.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"

typedef struct Pending {
    char turn_id[37];
    double submitted;
    double finished;
    char status[16];
} Pending;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static Pending *turns;
static int n_turns, n_done, n_bad;

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

    pthread_mutex_lock(&lock);
    for (int i = n_turns - 1; id && i >= 0; i--) {
        if (strcmp(turns[i].turn_id, id) == 0 && turns[i].finished == 0) {
            turns[i].finished = t;
            snprintf(turns[i].status, sizeof turns[i].status, "%s", status ? status : "?");
            n_done++;
            if (!status || strcmp(status, "done") != 0)
                n_bad++;
            pthread_cond_broadcast(&cond);
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    json_decref(j);
    natsMsg_Destroy(msg);
}

static int submit(PGconn *conn, const char *agent, Pending *p)
{
    const char *params[] = {agent, "bench", NULL, "{\"bench\":true}", NULL, NULL};
    PGresult *res;

    p->submitted = now_sec();
    res = PQexecPrepared(conn, "submit", 6, params, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        fprintf(stderr, "turnwatch-bench: submit failed: %s", PQerrorMessage(conn));
        PQclear(res);
        return -1;
    }
    pthread_mutex_lock(&lock);
    snprintf(p->turn_id, sizeof p->turn_id, "%s", PQgetvalue(res, 0, 0));
    n_turns++;
    pthread_mutex_unlock(&lock);
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

int main(int argc, char **argv)
{
    const char *config = NULL, *mode = "throughput", *prefix = "bench";
    int count = 1000, agents = 10;
    TwConfig cfg;
    PGconn *conn;
    natsConnection *nc = NULL;
    natsSubscription *sub = NULL;
    char subject[128];

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-c") == 0 && i + 1 < argc)
            config = argv[++i];
        else if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc)
            mode = argv[++i];
        else if (strcmp(argv[i], "--turns") == 0 && i + 1 < argc)
            count = atoi(argv[++i]);
        else if (strcmp(argv[i], "--agents") == 0 && i + 1 < argc)
            agents = atoi(argv[++i]);
        else if (strcmp(argv[i], "--prefix") == 0 && i + 1 < argc)
            prefix = argv[++i];
        else {
            fprintf(stderr,
                    "usage: turnwatch-bench -c FILE [--mode throughput|latency] [--turns N] [--agents K] "
                    "[--prefix P]\n  agents are named P0..P(K-1) and must have [agent.*] sections\n");
            return 2;
        }
    }
    if (!config || count < 1 || agents < 1) {
        fprintf(stderr, "turnwatch-bench: -c FILE is required\n");
        return 2;
    }
    if (tw_config_load(&cfg, config) != 0) {
        fputs(cfg.errors, stderr);
        return 2;
    }
    turns = calloc((size_t)count, sizeof *turns);
    conn = PQconnectdb(cfg.pg_dsn);
    if (!turns || PQstatus(conn) != CONNECTION_OK) {
        fprintf(stderr, "turnwatch-bench: %s", PQerrorMessage(conn));
        return 1;
    }
    /* A platform submits over a long-lived connection, as here: the statement is prepared once. */
    PGresult *prep =
        PQprepare(conn, "submit", "SELECT tw.submit_turn($1, $2, $4::jsonb, $5::integer, $6, $3)", 6, NULL);
    if (PQresultStatus(prep) != PGRES_COMMAND_OK) {
        fprintf(stderr, "turnwatch-bench: %s", PQerrorMessage(conn));
        return 1;
    }
    PQclear(prep);
    snprintf(subject, sizeof subject, "evt.agent.*.task");
    if (natsConnection_ConnectTo(&nc, cfg.nats_url) != NATS_OK ||
        natsConnection_Subscribe(&sub, nc, subject, on_event, NULL) != NATS_OK ||
        natsConnection_Flush(nc) != NATS_OK) {
        fprintf(stderr, "turnwatch-bench: cannot subscribe at %s\n", cfg.nats_url);
        return 1;
    }
    natsSubscription_SetPendingLimits(sub, -1, -1);

    if (strcmp(mode, "throughput") == 0) {
        char agent[80];
        double start = now_sec(), end = 0;
        for (int i = 0; i < count; i++) {
            snprintf(agent, sizeof agent, "%s%d", prefix, i % agents);
            if (submit(conn, agent, &turns[i]) != 0)
                return 1;
        }
        double submitted = now_sec();
        int done = wait_done(count, 120);
        for (int i = 0; i < count; i++)
            if (turns[i].finished > end)
                end = turns[i].finished;
        printf("throughput: %d turns over %d agents: submitted in %.3f s, all final events after %.3f s: "
               "%.0f turns/s (%d ended, %d not done)\n",
               count, agents, submitted - start, end - start, done / (end - start), done,
               n_bad + (count - done));
    } else {
        double *lat = calloc((size_t)count, sizeof *lat);
        char agent[80];
        int got = 0;
        snprintf(agent, sizeof agent, "%s0", prefix);
        for (int i = 0; i < count; i++) {
            if (submit(conn, agent, &turns[i]) != 0)
                return 1;
            if (wait_done(i + 1, 10) < i + 1) {
                fprintf(stderr, "turnwatch-bench: turn %s did not end within 10 s\n", turns[i].turn_id);
                break;
            }
            lat[got++] = (turns[i].finished - turns[i].submitted) * 1000;
        }
        qsort(lat, (size_t)got, sizeof *lat, cmp_double);
        if (got)
            printf(
                "latency: %d lone turns, submit to final event: median %.2f ms, p99 %.2f ms, max %.2f ms\n",
                got, lat[got / 2], lat[(int)(got * 0.99) < got ? (int)(got * 0.99) : got - 1], lat[got - 1]);
        free(lat);
    }
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(nc);
    PQfinish(conn);
    tw_config_free(&cfg);
    return n_bad ? 1 : 0;
}
