/* turnwatch-bench-relay: how the PMO's outbox relay copes with a flood (tools/bench relay). It loads a
 * backlog of unpublished events as one old transaction would leave them (a cancelled tree whose writer never
 * published them: created long enough ago for the relay, no NOTIFY), then has a SQL API client cancel one
 * fresh turn (its final event reaches the relay through NOTIFY tw_outbox), and prints how long that final
 * event waited (marked published in the outbox, and received from NATS) and how fast the backlog drained
 * (events/s received, distinct event ids, duplicates). Needs a running turnwatch-pmo on the same
 * configuration and an agent that no worker serves: the fresh turn stays dispatched until it is cancelled. */
#include <jansson.h>
#include <libpq-fe.h>
#include <nats/nats.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"

#define FLOOD_PREFIX "evt.agent.flood"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char (*ids)[37]; /* open addressing: the flood's event ids received */
static size_t ids_size;
static long received, distinct, before_fresh;
static double last_at, fresh_at;
static char fresh_subject[128], fresh_turn[37];

static double now_sec(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Counts id once; lock held. */
static void id_add(const char *id)
{
    size_t h = 1469598103934665603u;

    for (const char *c = id; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211u;
    for (size_t k = 0; k < ids_size; k++) {
        char *slot = ids[(h + k) & (ids_size - 1)];
        if (!slot[0]) {
            snprintf(slot, 37, "%s", id);
            distinct++;
            return;
        }
        if (strcmp(slot, id) == 0)
            return;
    }
}

static void on_event(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    double t = now_sec();
    const char *subject = natsMsg_GetSubject(msg);

    pthread_mutex_lock(&lock);
    if (strncmp(subject, FLOOD_PREFIX, strlen(FLOOD_PREFIX)) == 0) {
        json_t *j = json_loadb(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), 0, NULL);
        const char *id = json_string_value(json_object_get(j, "event_id"));
        if (id && strlen(id) == 36)
            id_add(id);
        received++;
        last_at = t;
        json_decref(j);
    } else if (fresh_at == 0 && fresh_turn[0] && strcmp(subject, fresh_subject) == 0 &&
               memmem(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), fresh_turn, 36)) {
        fresh_at = t;
        before_fresh = received;
    }
    pthread_mutex_unlock(&lock);
    natsMsg_Destroy(msg);
}

static PGresult *sql(PGconn *conn, const char *q, int n, const char *const *params)
{
    PGresult *res = PQexecParams(conn, q, n, NULL, params, NULL, NULL, 0);

    if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK) {
        fprintf(stderr, "turnwatch-bench-relay: %s: %s", q, PQerrorMessage(conn));
        PQclear(res);
        return NULL;
    }
    return res;
}

/* The first column of the first row as a number; -1 on error. */
static long long sql_ll(PGconn *conn, const char *q, int n, const char *const *params)
{
    PGresult *res = sql(conn, q, n, params);
    long long v = res && PQntuples(res) > 0 ? atoll(PQgetvalue(res, 0, 0)) : -1;

    PQclear(res);
    return v;
}

static void usage(void)
{
    fputs("usage: turnwatch-bench-relay -c FILE [--backlog N] [--agent A] [--timeout S]\n"
          "  loads N unpublished events (default 150000) as one old transaction, cancels a fresh turn of\n"
          "  agent A (default fresh; no worker may serve it) through tw.cancel_turn, and waits at most\n"
          "  S seconds (default 600) for the fresh final event and the backlog\n",
          stderr);
}

int main(int argc, char **argv)
{
    const char *config = NULL, *agent = "fresh";
    long backlog = 150000;
    int timeout_sec = 600;
    TwConfig cfg;
    PGconn *conn;
    natsConnection *nc = NULL;
    natsSubscription *sub = NULL;
    PGresult *res;
    char n_text[24], *event_id = NULL;
    double t_load, t0, fresh_db_at = 0, drained_db_at = 0;

    for (int i = 1; i < argc; i++) {
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "-c") == 0 && next)
            config = argv[++i];
        else if (strcmp(argv[i], "--backlog") == 0 && next)
            backlog = atol(argv[++i]);
        else if (strcmp(argv[i], "--agent") == 0 && next)
            agent = argv[++i];
        else if (strcmp(argv[i], "--timeout") == 0 && next)
            timeout_sec = atoi(argv[++i]);
        else {
            usage();
            return 2;
        }
    }
    if (!config || backlog < 1 || timeout_sec < 1) {
        usage();
        return 2;
    }
    if (tw_config_load(&cfg, config) != 0) {
        fputs(cfg.errors, stderr);
        return 2;
    }
    for (ids_size = 1024; ids_size < 2 * (size_t)backlog;)
        ids_size *= 2;
    ids = calloc(ids_size, sizeof *ids);
    conn = PQconnectdb(cfg.pg_dsn);
    if (!ids || PQstatus(conn) != CONNECTION_OK) {
        fprintf(stderr, "turnwatch-bench-relay: %s", PQerrorMessage(conn));
        return 1;
    }
    if (natsConnection_ConnectTo(&nc, cfg.nats_url) != NATS_OK ||
        natsConnection_Subscribe(&sub, nc, "evt.>", on_event, NULL) != NATS_OK ||
        natsConnection_Flush(nc) != NATS_OK) {
        fprintf(stderr, "turnwatch-bench-relay: cannot subscribe at %s\n", cfg.nats_url);
        return 1;
    }
    natsSubscription_SetPendingLimits(sub, -1, -1);

    /* The fresh turn first, dispatched to an agent that nobody serves. */
    const char *p_agent[] = {agent};
    if (!(res = sql(conn, "SELECT tw.submit_turn($1, 'bench', '{\"bench\":\"relay\"}'::jsonb)", 1, p_agent)))
        return 1;
    snprintf(fresh_turn, sizeof fresh_turn, "%s", PQgetvalue(res, 0, 0));
    snprintf(fresh_subject, sizeof fresh_subject, "evt.agent.%s.task", agent);
    PQclear(res);
    const char *p_turn[] = {fresh_turn};
    for (int i = 0;
         sql_ll(conn, "SELECT count(*) FROM state.turns WHERE turn_id = $1 AND status = 'dispatched'", 1,
                p_turn) != 1;
         i++) {
        if (i > 3000) {
            fprintf(stderr,
                    "turnwatch-bench-relay: the fresh turn was never dispatched (is the PMO running?)\n");
            return 1;
        }
        usleep(10000);
    }

    /* The flood: one transaction, as a cancelled tree's, created a minute ago and never published. */
    snprintf(n_text, sizeof n_text, "%ld", backlog);
    const char *p_n[] = {n_text};
    t_load = now_sec();
    /* Half of them with a deliverable, as a tree's final events have; all on .state subjects, so that a
     * client that follows final events (turnwatch-bench, with --lone) only sees those of its own turns. */
    if (!(res = sql(
              conn,
              "INSERT INTO state.outbox (event_id, kind, subject, payload, turn_id, turn_epoch, created_at) "
              "SELECT e, 'state', '" FLOOD_PREFIX "' || (i % 100) || '.state', "
              "       jsonb_build_object('agent', 'flood' || (i % 100), 'profile', 'echo', 'status', "
              "                          'cancelled', 'turn_id', t, 'turn_epoch', 1, 'event_id', e, "
              "                          'at', now(), 'error', 'cancelled by request', 'deliverable', "
              "                          CASE WHEN i % 2 = 0 THEN jsonb_build_object('summary', "
              "                          'cancelled', 'output', 'The turn was cancelled before it "
              "                          finished.') END), "
              "       t, 1, now() - interval '1 minute' "
              "  FROM (SELECT i, gen_random_uuid() e, gen_random_uuid() t "
              "          FROM generate_series(1, $1::integer) i) s",
              1, p_n)))
        return 1;
    PQclear(res);
    printf("backlog: %ld events loaded in %.1f s (one transaction, created a minute ago, no NOTIFY)\n",
           backlog, now_sec() - t_load);

    /* A SQL API client cancels the fresh turn: its final event goes to the relay through NOTIFY tw_outbox. */
    t0 = now_sec();
    if (!(res = sql(conn, "SELECT tw.cancel_turn($1::uuid)", 1, p_turn)))
        return 1;
    PQclear(res);
    res = sql(conn, "SELECT event_id::text FROM state.outbox WHERE turn_id = $1::uuid AND kind = 'task'", 1,
              p_turn);
    if (!res || PQntuples(res) != 1) {
        fprintf(stderr, "turnwatch-bench-relay: the cancel wrote no final event\n");
        return 1;
    }
    event_id = strdup(PQgetvalue(res, 0, 0));
    PQclear(res);
    const char *p_event[] = {event_id};

    /* Poll the outbox every 20 ms for the fresh event's mark (one row by its key) while the subscriber counts
     * what NATS delivers; the backlog's marks (a scan of the table, which would cost PostgreSQL as much as
     * the relay) only once NATS delivered all of it. */
    while (now_sec() - t0 < timeout_sec && (fresh_db_at == 0 || drained_db_at == 0)) {
        pthread_mutex_lock(&lock);
        bool all = distinct >= backlog;
        pthread_mutex_unlock(&lock);
        if (fresh_db_at == 0 &&
            sql_ll(conn,
                   "SELECT count(*) FROM state.outbox WHERE event_id = $1::uuid AND published_at IS NOT NULL",
                   1, p_event) == 1)
            fresh_db_at = now_sec();
        if (all && drained_db_at == 0 &&
            sql_ll(
                conn,
                "SELECT count(*) FROM state.outbox WHERE published_at IS NULL AND subject LIKE '" FLOOD_PREFIX
                "%'",
                0, NULL) == 0)
            drained_db_at = now_sec();
        usleep(20000);
    }

    pthread_mutex_lock(&lock);
    printf("fresh final event (SQL API cancel, NOTIFY tw_outbox): ");
    if (fresh_db_at > 0)
        printf("marked published after %.3f s, ", fresh_db_at - t0);
    else
        printf("not marked published after %d s, ", timeout_sec);
    if (fresh_at > 0)
        printf("received from NATS after %.3f s, %ld backlog events received before it\n", fresh_at - t0,
               before_fresh);
    else
        printf("not received from NATS\n");
    printf("backlog: %ld of %ld distinct events received (%ld messages, %ld duplicates)", distinct, backlog,
           received, received - distinct);
    if (received > 0) {
        double span = (distinct >= backlog ? last_at : now_sec()) - t0;
        printf(" in %.2f s after the cancel: %.0f events/s", span, (double)distinct / span);
    }
    if (drained_db_at > 0)
        printf("; all marked published %.2f s after the cancel\n", drained_db_at - t0);
    else
        printf("; not all marked published after %d s\n", timeout_sec);
    pthread_mutex_unlock(&lock);

    natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(nc);
    PQfinish(conn);
    tw_config_free(&cfg);
    free(event_id);
    free(ids);
    return 0;
}
