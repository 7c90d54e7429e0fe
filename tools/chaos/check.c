/* The soak's verdict: every invariant of docs/soak.md (and a few more that the tables let us check),
 * each one SQL query over the database at rest plus what the soak knows (its plan, what the CLI answered,
 * every event NATS delivered, loaded into temporary tables), returning one row per violation: the turn and
 * what is wrong. Then the table: turns by kind and outcome, faults, events, invariants with their violation
 * counts. */
#include "chaos.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What fault kind k did in this run: chaos_fault_name, or with --ha its formation's counterpart. */
#define SHOW_PER_INVARIANT 12

static const char *fault_label(const ChaosRun *run, ChaosFaultKind k)
{
    if (run->opt.ha_dir && k == CHAOS_FAULT_NATS_RESTART)
        return "nats-server killed (one of 3)";
    if (run->opt.ha_dir && k == CHAOS_FAULT_PG_RESTART)
        return "postgres switchover";
    if (run->opt.ha_dir && k == CHAOS_FAULT_PG_CRASH)
        return "postgres primary killed (failover)";
    return chaos_fault_name(k);
}

/* ---- loading what the soak knows into temporary tables
 * -------------------------------------------------------- */

static bool exec_ok(PGconn *db, const char *sql, const char *param)
{
    const char *params[] = {param};
    /* Without a parameter, PQexec: the text may hold several statements. */
    PGresult *res = param ? PQexecParams(db, sql, 1, NULL, params, NULL, NULL, 0) : PQexec(db, sql);
    bool ok = PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK;
    if (!ok)
        fprintf(stderr, "turnwatch-soak: check: %s\n", PQerrorMessage(db));
    PQclear(res);
    return ok;
}

static bool exec_json(PGconn *db, const char *sql, json_t *doc)
{
    char *text = json_dumps(doc, JSON_COMPACT);
    bool ok = text && exec_ok(db, sql, text);
    free(text);
    return ok;
}

static bool load_plan(ChaosRun *run, PGconn *db)
{
    json_t *plan = json_array(), *ext = json_array();
    bool ok;

    for (int i = 0; i < run->plan->n_turns; i++) {
        const ChaosTurnPlan *p = &run->plan->turns[i];
        const ChaosTurn *t = &run->turns[i];
        const ChaosKindInfo *k = chaos_kind_info(p->kind);
        json_array_append_new(
            plan, json_pack("{s:i,s:s?,s:s,s:s,s:s?,s:b,s:b,s:s?}", "idx", i, "answered_id",
                            t->id[0] ? t->id : NULL, "kind", k->name, "nat_status", k->status, "nat_error",
                            k->error, "deadline", p->timeout_sec > 0, "cancel_sent", t->cancel_tries > 0,
                            "cancel_result", t->cancel_result[0] ? t->cancel_result : NULL));
        for (int e = 0; e < p->n_ext; e++)
            if (t->id[0] && t->ext_result[e][0])
                json_array_append_new(
                    ext, json_pack("{s:s,s:s+,s:s,s:s}", "turn_id", t->id, "call", "ext", e ? "1" : "0",
                                   "status", p->ext[e].error ? "error" : "ok", "result", t->ext_result[e]));
    }
    ok = exec_json(
             db,
             "INSERT INTO soak_plan (idx, answered_id, kind, nat_status, nat_error, deadline, cancel_sent,"
             " cancel_result) SELECT * FROM jsonb_to_recordset($1::jsonb) AS x(idx integer,"
             " answered_id uuid, kind text, nat_status text, nat_error text, deadline boolean,"
             " cancel_sent boolean, cancel_result text)",
             plan) &&
         /* A submit whose answer was lost (the CLI killed, the connection dropped after the commit) still
          * made its turn: the idempotency key says which. */
         exec_ok(db,
                 "UPDATE soak_plan p SET turn_id = t.turn_id FROM state.turns t"
                 " WHERE t.idempotency_key = 'soak-' || p.idx",
                 NULL) &&
         exec_json(
             db,
             "INSERT INTO soak_ext SELECT * FROM jsonb_to_recordset($1::jsonb) AS x(turn_id uuid, call text,"
             " status text, result text)",
             ext);
    json_decref(plan);
    json_decref(ext);
    return ok;
}

static bool load_events(ChaosRun *run, PGconn *db)
{
    json_t *seen = chaos_events_json(run->events), *gaps = chaos_events_gaps(run->events);
    size_t n = json_array_size(seen);
    bool ok = true;

    for (size_t from = 0; ok && from < n; from += 5000) {
        json_t *chunk = json_array();
        for (size_t i = from; i < n && i < from + 5000; i++)
            json_array_append(chunk, json_array_get(seen, i));
        ok = exec_json(db,
                       "INSERT INTO soak_seen (subject, payload, source) SELECT e->>'subject', "
                       "(e->>'payload')::jsonb, e->>'source'"
                       " FROM jsonb_array_elements($1::jsonb) e",
                       chunk);
        json_decref(chunk);
    }
    ok = ok && exec_json(db,
                         "INSERT INTO soak_gaps SELECT to_timestamp((g->>0)::bigint / 1000.0),"
                         " to_timestamp((g->>1)::bigint / 1000.0) FROM jsonb_array_elements($1::jsonb) g",
                         gaps);
    json_decref(seen);
    json_decref(gaps);
    return ok && exec_ok(db, "CREATE INDEX ON soak_seen ((payload->>'event_id')); ANALYZE soak_seen", NULL);
}

static const char setup_sql[] =
    "CREATE TEMP TABLE soak_plan (idx integer, turn_id uuid, answered_id uuid, kind text, nat_status text,"
    " nat_error text,"
    " deadline boolean, cancel_sent boolean, cancel_result text);"
    "CREATE TEMP TABLE soak_ext (turn_id uuid, call text, status text, result text);"
    "CREATE TEMP TABLE soak_seen (n bigserial, subject text, payload jsonb, source text);"
    "CREATE TEMP TABLE soak_gaps (from_at timestamptz, to_at timestamptz);"
    /* An event published while the soak's own subscriber was reconnecting never reached it live, through no
     * fault of turnwatch (the stream has it): published_at comes after the server took the event (the
     * publisher's flush), so the window reaches a few seconds past the reconnect. For the statistics only. */
    "CREATE FUNCTION pg_temp.soak_away(p_at timestamptz) RETURNS boolean LANGUAGE sql STABLE AS"
    " $$ SELECT EXISTS (SELECT 1 FROM soak_gaps g WHERE p_at BETWEEN g.from_at - interval '1 second'"
    " AND g.to_at + interval '3 seconds') $$;";

/* ---- the table
 * ------------------------------------------------------------------------------------------------- */

static PGresult *query(PGconn *db, const char *sql)
{
    PGresult *res = PQexec(db, sql);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        fprintf(stderr, "turnwatch-soak: check: %s\n", PQerrorMessage(db));
        PQclear(res);
        return NULL;
    }
    return res;
}

static void print_outcomes(PGconn *db, FILE *out)
{
    static const char *statuses[] = {"done", "failed", "timeout", "cancelled"};
    long counts[CHAOS_KIND_N + 1][5] = {{0}};
    PGresult *res =
        query(db, "SELECT p.kind, coalesce(t.status, 'never submitted'), count(*) FROM soak_plan p "
                  "LEFT JOIN state.turns t ON t.turn_id = p.turn_id GROUP BY 1, 2");

    if (!res)
        return;
    for (int r = 0; r < PQntuples(res); r++) {
        int k = 0, s = 4;
        while (k < CHAOS_KIND_N && strcmp(chaos_kind_info((ChaosKind)k)->name, PQgetvalue(res, r, 0)) != 0)
            k++;
        for (int i = 0; i < 4; i++)
            if (strcmp(statuses[i], PQgetvalue(res, r, 1)) == 0)
                s = i;
        long n = atol(PQgetvalue(res, r, 2));
        counts[k][s] += n;
        counts[CHAOS_KIND_N][s] += n;
    }
    PQclear(res);
    fprintf(out, "turns by kind and outcome\n  %-10s %7s %7s %7s %7s %9s %7s\n", "kind", "total", "done",
            "failed", "timeout", "cancelled", "open");
    for (int k = 0; k <= CHAOS_KIND_N; k++) {
        long total = 0;
        for (int s = 0; s < 5; s++)
            total += counts[k][s];
        fprintf(out, "  %-10s %7ld %7ld %7ld %7ld %9ld %7ld\n",
                k < CHAOS_KIND_N ? chaos_kind_info((ChaosKind)k)->name : "all", total, counts[k][0],
                counts[k][1], counts[k][2], counts[k][3], counts[k][4]);
    }
    if ((res = query(db, "SELECT status || '/' || coalesce(error, '-'), count(*) FROM state.turns "
                         "WHERE status <> 'done' OR error IS NOT NULL GROUP BY 1 ORDER BY 2 DESC, 1"))) {
        fprintf(out, "outcomes other than done, by error\n");
        for (int r = 0; r < PQntuples(res); r++)
            fprintf(out, "  %-40s %7s\n", PQgetvalue(res, r, 0), PQgetvalue(res, r, 1));
        PQclear(res);
    }
}

static void print_faults(const ChaosRun *run, FILE *out)
{
    fprintf(out, "faults injected%*s%7s %7s\n", 26, "", "done", "skipped");
    for (int k = 0; k < CHAOS_FAULT_N; k++)
        fprintf(out, "  %-38s %7d %7d\n", fault_label(run, (ChaosFaultKind)k), run->faults_done[k],
                run->faults_skipped[k]);
}

static void print_events(PGconn *db, FILE *out)
{
    PGresult *res = query(
        db, "SELECT (SELECT count(*) FROM state.outbox),"
            " (SELECT count(*) FROM soak_seen WHERE source = 'live'),"
            " (SELECT count(DISTINCT payload->>'event_id') FROM soak_seen WHERE source = 'live'),"
            " (SELECT count(*) FROM soak_seen WHERE source = 'stream'),"
            " (SELECT count(DISTINCT payload->>'event_id') FROM soak_seen WHERE source = 'stream'),"
            " (SELECT count(*) FROM soak_gaps),"
            " (SELECT coalesce(sum(extract(epoch FROM to_at - from_at)), 0)::numeric(10,1) FROM soak_gaps),"
            " (SELECT count(*) FROM state.outbox o WHERE NOT EXISTS (SELECT 1 FROM soak_seen s"
            "  WHERE s.source = 'live' AND s.payload->>'event_id' = o.event_id::text)),"
            " (SELECT count(*) FROM state.outbox o WHERE pg_temp.soak_away(o.published_at) AND NOT EXISTS"
            "  (SELECT 1 FROM soak_seen s WHERE s.source = 'live' AND s.payload->>'event_id' = "
            "o.event_id::text))");
    if (!res)
        return;
    fprintf(out,
            "events: %s in the outbox; %s delivered live (%s distinct), %s kept in the stream (%s distinct)\n"
            "  the soak's subscriber was away %s times (%s s); %s events not delivered to it live, %s of them"
            " published while it was away\n",
            PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 1), PQgetvalue(res, 0, 2), PQgetvalue(res, 0, 3),
            PQgetvalue(res, 0, 4), PQgetvalue(res, 0, 5), PQgetvalue(res, 0, 6), PQgetvalue(res, 0, 7),
            PQgetvalue(res, 0, 8));
    PQclear(res);
}

/* ---- the checker's self-test
 * ---------------------------------------------------------------------------------- */

/* Each invariant must see a violation planted in this very database (in a transaction rolled back
 * afterwards): a check that cannot fail proves nothing. Returns how many did not see theirs; prints the
 * result. */
static int self_test(PGconn *db, FILE *out)
{
    int caught = 0, missed = 0, nothing = 0;
    size_t i;

    for (i = 0; chaos_invariant(i); i++) {
        PGresult *res;
        bool planted;

        if (!exec_ok(db, "BEGIN", NULL))
            return 1;
        res = PQexec(db, chaos_invariant(i)->plant);
        planted = PQresultStatus(res) == PGRES_COMMAND_OK && atoi(PQcmdTuples(res)) > 0;
        if (PQresultStatus(res) != PGRES_COMMAND_OK)
            fprintf(stderr, "turnwatch-soak: self-test of \"%s\": %s", chaos_invariant(i)->name,
                    PQerrorMessage(db));
        PQclear(res);
        if (planted) {
            res = PQexec(db, chaos_invariant(i)->sql);
            if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) > 0) {
                caught++;
            } else {
                missed++;
                fprintf(out, "checker self-test: \"%s\" did not see the violation planted for it\n",
                        chaos_invariant(i)->name);
            }
            PQclear(res);
        } else {
            nothing++;
        }
        exec_ok(db, "ROLLBACK", NULL);
    }
    fprintf(out, "checker self-test: %d of %zu invariants saw the violation planted for them", caught, i);
    if (nothing)
        fprintf(out, " (%d had nothing to plant it on in this run)", nothing);
    fprintf(out, "\n");
    return missed;
}

/* ---- the verdict
 * ----------------------------------------------------------------------------------------------- */

typedef struct Verdict {
    const char *name;
    int n;
    json_t *rows; /* [[turn, what]] */
} Verdict;

static void add_turn(json_t *ids, const char *id)
{
    if (strcmp(id, "-") != 0)
        json_object_set_new(ids, id, json_true());
}

int chaos_check(ChaosRun *run, FILE *out)
{
    const char *keys[] = {"dbname", "application_name", NULL};
    const char *vals[] = {run->opt.dsn, "turnwatch-soak check", NULL};
    PGconn *db = PQconnectdbParams(keys, vals, 1);
    Verdict v[CHAOS_MAX_INVARIANTS + 1];
    size_t n_inv = 0;
    json_t *ids = json_object();
    int total = 0, failed_queries = 0;
    char path[PATH_MAX];
    FILE *all;

    if (PQstatus(db) != CONNECTION_OK) {
        fprintf(stderr, "turnwatch-soak: check: cannot connect: %s", PQerrorMessage(db));
        PQfinish(db);
        json_decref(ids);
        return -1;
    }
    if (!exec_ok(db, setup_sql, NULL) || !load_plan(run, db) || !load_events(run, db)) {
        PQfinish(db);
        json_decref(ids);
        return -1;
    }
    for (; chaos_invariant(n_inv); n_inv++) {
        size_t i = n_inv;
        PGresult *res = query(db, chaos_invariant(i)->sql);
        v[i].name = chaos_invariant(i)->name;
        v[i].rows = json_array();
        if (!res) {
            json_array_append_new(v[i].rows, json_pack("[s,s]", "-", "the check query failed (see above)"));
            failed_queries++;
        }
        for (int r = 0; res && r < PQntuples(res); r++) {
            json_array_append_new(v[i].rows,
                                  json_pack("[s,s]", PQgetvalue(res, r, 0), PQgetvalue(res, r, 1)));
            add_turn(ids, PQgetvalue(res, r, 0));
        }
        PQclear(res);
        v[i].n = (int)json_array_size(v[i].rows);
    }
    /* What happened outside the database: a daemon that died on its own or did not stop cleanly. */
    v[n_inv].name = "no crash, unclean stop or unreadable stream";
    v[n_inv].rows = json_array();
    for (size_t i = 0; i < json_array_size(run->incidents); i++) {
        json_t *inc = json_array_get(run->incidents, i);
        json_array_append_new(v[n_inv].rows,
                              json_pack("[s,s++]", "-", json_string_value(json_object_get(inc, "what")), ": ",
                                        json_string_value(json_object_get(inc, "detail"))));
    }
    v[n_inv].n = (int)json_array_size(v[n_inv].rows);

    print_outcomes(db, out);
    print_faults(run, out);
    print_events(db, out);
    fprintf(out, "invariants%*s%s\n", 44, "", "violations");
    for (size_t i = 0; i <= n_inv; i++) {
        fprintf(out, "  %-50s %10d\n", v[i].name, v[i].n);
        total += v[i].n;
    }
    total += self_test(db, out);
    snprintf(path, sizeof path, "%s/violations.txt", run->opt.dir);
    all = fopen(path, "w");
    for (size_t i = 0; i <= n_inv; i++) {
        if (!v[i].n)
            continue;
        fprintf(out, "violations of \"%s\" (%d)%s:\n", v[i].name, v[i].n,
                v[i].n > SHOW_PER_INVARIANT ? ", the first few" : "");
        for (size_t r = 0; r < json_array_size(v[i].rows); r++) {
            json_t *row = json_array_get(v[i].rows, r);
            const char *turn = json_string_value(json_array_get(row, 0));
            const char *what = json_string_value(json_array_get(row, 1));
            if (r < SHOW_PER_INVARIANT)
                fprintf(out, "  %s  %s\n", turn, what);
            if (all)
                fprintf(all, "%s\t%s\t%s\n", v[i].name, turn, what);
        }
        json_decref(v[i].rows);
        v[i].rows = NULL;
    }
    for (size_t i = 0; i <= n_inv; i++)
        json_decref(v[i].rows);
    if (all)
        fclose(all);
    if (json_object_size(ids)) {
        const char *id;
        json_t *val;
        fprintf(out, "violating turns (%zu):", json_object_size(ids));
        json_object_foreach(ids, id, val) fprintf(out, " %s", id);
        fprintf(out, "\n");
    }
    if (total)
        fprintf(out, "every violation: %s\n", path);
    json_decref(ids);
    PQfinish(db);
    return failed_queries && !total ? -1 : total;
}
