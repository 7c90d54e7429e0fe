/* Schema migrations, applied one transaction each and recorded in state.schema_migrations (with the md5 of
 * their text, which decides whether a repeatable one is applied again). */
#include "migrate.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Any fixed number shared by every turnwatch migrate run. */
#define TW_MIGRATE_LOCK "7243001"

static int exec_ok(PGconn *conn, const char *sql, int n, const char *const *params, char *err, size_t errsize,
                   PGresult **out)
{
    PGresult *res = n ? PQexecParams(conn, sql, n, NULL, params, NULL, NULL, 0) : PQexec(conn, sql);
    ExecStatusType st = PQresultStatus(res);

    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        snprintf(err, errsize, "%s", PQresultErrorMessage(res));
        PQclear(res);
        return -1;
    }
    if (out)
        *out = res;
    else
        PQclear(res);
    return 0;
}

int tw_migrate(PGconn *conn, int *applied, char *err, size_t errsize)
{
    *applied = 0;
    /* Schema migrations first, then the repeatable ones (the functions), each pass in number order: a
     * function may use a column that a later schema migration adds. */
    for (int k = 0; k < 2 * tw_migrations_count; k++) {
        const TwMigration *m = &tw_migrations[k % tw_migrations_count];
        if (m->repeatable != (k >= tw_migrations_count))
            continue;
        char version[16];
        const char *params[] = {version, m->name, m->sql};
        PGresult *res = NULL;
        bool done;

        snprintf(version, sizeof version, "%d", m->version);
        if (exec_ok(conn, "BEGIN", 0, NULL, err, errsize, NULL) ||
            exec_ok(conn, "SELECT pg_advisory_xact_lock(" TW_MIGRATE_LOCK ")", 0, NULL, err, errsize, NULL) ||
            exec_ok(conn,
                    "CREATE SCHEMA IF NOT EXISTS state; "
                    "CREATE TABLE IF NOT EXISTS state.schema_migrations ("
                    " version integer PRIMARY KEY, name text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now()); "
                    "ALTER TABLE state.schema_migrations ADD COLUMN IF NOT EXISTS checksum text",
                    0, NULL, err, errsize, NULL) ||
            /* Applied already: a schema migration once and for all, a repeatable one if its text is the same.
             */
            exec_ok(conn,
                    "SELECT 1 FROM state.schema_migrations WHERE version = $1::integer"
                    " AND ($2::boolean IS FALSE OR checksum IS NOT DISTINCT FROM md5($3))",
                    3, (const char *[]){version, m->repeatable ? "true" : "false", m->sql}, err, errsize,
                    &res))
            goto fail;
        done = PQntuples(res) > 0;
        PQclear(res);
        if (!done) {
            char prefix[64];
            if (exec_ok(conn, m->sql, 0, NULL, err, errsize, NULL)) {
                snprintf(prefix, sizeof prefix, "%s: ", m->name);
                size_t pl = strlen(prefix);
                if (pl + strlen(err) < errsize) {
                    memmove(err + pl, err, strlen(err) + 1);
                    memcpy(err, prefix, pl);
                }
                goto fail;
            }
            if (exec_ok(conn,
                        "INSERT INTO state.schema_migrations (version, name, checksum)"
                        " VALUES ($1::integer, $2, md5($3)) ON CONFLICT (version) DO UPDATE"
                        " SET name = EXCLUDED.name, checksum = EXCLUDED.checksum, applied_at = now()",
                        3, params, err, errsize, NULL))
                goto fail;
            (*applied)++;
        }
        if (exec_ok(conn, "COMMIT", 0, NULL, err, errsize, NULL))
            goto fail;
    }
    return 0;
fail:
    PQclear(PQexec(conn, "ROLLBACK"));
    for (char *p = err + strlen(err); p > err && (p[-1] == '\n' || p[-1] == ' ');)
        *--p = '\0';
    return -1;
}

int tw_schema_version(PGconn *conn)
{
    PGresult *res = PQexec(conn, "SELECT coalesce(max(version), 0) FROM state.schema_migrations");
    int v = -1;

    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
        v = atoi(PQgetvalue(res, 0, 0));
    PQclear(res);
    return v;
}
