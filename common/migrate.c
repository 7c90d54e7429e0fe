/* Migrations: schema files applied once each and recorded in state.schema_migrations; the code set (functions
 * and rules) re-made in one transaction when its checksum differs from the one in state.code_version; the
 * grants applied every time, at the end of that transaction. */
#include "migrate.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Any fixed number shared by every turnwatch migrate run. */
#define TW_MIGRATE_LOCK "7243001"

/* Versions that were repeatable function files before sql/ was re-laid (release 2 and early release 3): their
 * rows in state.schema_migrations say nothing any more once the code set is in place. */
#define TW_LEGACY_CODE_VERSIONS "{2,5,7,9,12,13}"

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

/* "name: why" in err. */
static void name_error(const char *name, char *err, size_t errsize)
{
    char prefix[96];
    size_t pl;

    snprintf(prefix, sizeof prefix, "%s: ", name);
    pl = strlen(prefix);
    if (pl + strlen(err) < errsize) {
        memmove(err + pl, err, strlen(err) + 1);
        memcpy(err, prefix, pl);
    }
}

static int begin_locked(PGconn *conn, char *err, size_t errsize)
{
    return exec_ok(conn, "BEGIN", 0, NULL, err, errsize, NULL) ||
           exec_ok(conn, "SELECT pg_advisory_xact_lock(" TW_MIGRATE_LOCK ")", 0, NULL, err, errsize, NULL) ||
           exec_ok(conn,
                   "CREATE SCHEMA IF NOT EXISTS state; "
                   "CREATE TABLE IF NOT EXISTS state.schema_migrations ("
                   " version integer PRIMARY KEY, name text NOT NULL,"
                   " applied_at timestamptz NOT NULL DEFAULT now()); "
                   "ALTER TABLE state.schema_migrations ADD COLUMN IF NOT EXISTS checksum text; "
                   "CREATE TABLE IF NOT EXISTS state.code_version ("
                   " one boolean PRIMARY KEY DEFAULT true CHECK (one), checksum text NOT NULL,"
                   " applied_at timestamptz NOT NULL DEFAULT now())",
                   0, NULL, err, errsize, NULL);
}

static int apply_schema(PGconn *conn, const TwMigration *m, int *applied, char *err, size_t errsize)
{
    char version[16];
    PGresult *res = NULL;
    bool done;

    snprintf(version, sizeof version, "%d", m->version);
    if (begin_locked(conn, err, errsize) ||
        exec_ok(conn, "SELECT 1 FROM state.schema_migrations WHERE version = $1::integer", 1,
                (const char *[]){version}, err, errsize, &res))
        return -1;
    done = PQntuples(res) > 0;
    PQclear(res);
    if (!done) {
        if (exec_ok(conn, m->sql, 0, NULL, err, errsize, NULL)) {
            name_error(m->name, err, errsize);
            return -1;
        }
        if (exec_ok(conn,
                    "INSERT INTO state.schema_migrations (version, name, checksum)"
                    " VALUES ($1::integer, $2, md5($3)) ON CONFLICT (version) DO UPDATE"
                    " SET name = EXCLUDED.name, checksum = EXCLUDED.checksum, applied_at = now()",
                    3, (const char *[]){version, m->name, m->sql}, err, errsize, NULL))
            return -1;
        (*applied)++;
    }
    return exec_ok(conn, "COMMIT", 0, NULL, err, errsize, NULL);
}

/* Every code file, in order, as one text: what the checksum is taken of. */
static char *code_text(void)
{
    size_t len = 1, off = 0;
    char *all;

    for (int i = 0; i < tw_migrations_count; i++)
        if (tw_migrations[i].code == TW_MIGRATION_CODE)
            len += strlen(tw_migrations[i].name) + strlen(tw_migrations[i].sql) + 2;
    if (!(all = malloc(len)))
        return NULL;
    all[0] = '\0';
    for (int i = 0; i < tw_migrations_count; i++)
        if (tw_migrations[i].code == TW_MIGRATION_CODE)
            off += (size_t)snprintf(all + off, len - off, "%s\n%s\n", tw_migrations[i].name,
                                    tw_migrations[i].sql);
    return all;
}

/* Schema tw made anew from the code set, unless the database has this very set already. Function bodies are
 * not checked as they are created, so that the files may refer to each other in any order. Then, whether the
 * set changed or not, the grants: a new set's functions start closed (DROP SCHEMA took their grants along)
 * and are opened in this same transaction, so no client ever finds them closed; and a grant taken away by
 * hand, or a table a schema migration added, is put right on every migrate. */
static int apply_code(PGconn *conn, int *applied, char *err, size_t errsize)
{
    char *all = code_text();
    PGresult *res = NULL;
    bool same;
    int rc = -1;

    if (!all) {
        snprintf(err, errsize, "out of memory");
        return -1;
    }
    const char *params[] = {all};
    if (begin_locked(conn, err, errsize) ||
        exec_ok(conn, "SELECT 1 FROM state.code_version WHERE checksum = md5($1)", 1, params, err, errsize,
                &res))
        goto out;
    same = PQntuples(res) > 0;
    PQclear(res);
    if (!same) {
        if (exec_ok(
                conn,
                "SET LOCAL check_function_bodies = off; DROP SCHEMA IF EXISTS tw CASCADE; CREATE SCHEMA tw",
                0, NULL, err, errsize, NULL))
            goto out;
        for (int i = 0; i < tw_migrations_count; i++) {
            const TwMigration *m = &tw_migrations[i];
            if (m->code == TW_MIGRATION_CODE && exec_ok(conn, m->sql, 0, NULL, err, errsize, NULL)) {
                name_error(m->name, err, errsize);
                goto out;
            }
        }
        if (exec_ok(conn,
                    "INSERT INTO state.code_version (checksum) VALUES (md5($1))"
                    " ON CONFLICT (one) DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now()",
                    1, params, err, errsize, NULL) ||
            exec_ok(conn,
                    "DELETE FROM state.schema_migrations WHERE version = ANY ('" TW_LEGACY_CODE_VERSIONS "')",
                    0, NULL, err, errsize, NULL))
            goto out;
        (*applied)++;
    }
    for (int i = 0; i < tw_migrations_count; i++) {
        const TwMigration *m = &tw_migrations[i];
        if (m->code == TW_MIGRATION_GRANTS && exec_ok(conn, m->sql, 0, NULL, err, errsize, NULL)) {
            name_error(m->name, err, errsize);
            goto out;
        }
    }
    rc = exec_ok(conn, "COMMIT", 0, NULL, err, errsize, NULL);
out:
    free(all);
    return rc;
}

int tw_migrate(PGconn *conn, int *applied, char *err, size_t errsize)
{
    *applied = 0;
    /* Schema first, in number order (a function may use a column that a schema migration adds). */
    for (int i = 0; i < tw_migrations_count; i++)
        if (tw_migrations[i].code == TW_MIGRATION_SCHEMA &&
            apply_schema(conn, &tw_migrations[i], applied, err, errsize) != 0)
            goto fail;
    if (apply_code(conn, applied, err, errsize) != 0)
        goto fail;
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

int tw_schema_version_built(void)
{
    int v = 0;

    for (int i = 0; i < tw_migrations_count; i++)
        if (tw_migrations[i].code == TW_MIGRATION_SCHEMA && tw_migrations[i].version > v)
            v = tw_migrations[i].version;
    return v;
}
