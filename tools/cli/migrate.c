/* turnwatch migrate: create or upgrade the schema from the embedded sql/ files (idempotent). */
#include <stdio.h>

#include "cli.h"
#include "migrate.h"
#include "profiles.h"

int cli_migrate(Cli *cli, int argc, char **argv)
{
    char err[1024];
    PGconn *conn;
    int applied, version, rc;

    if (argc > 1)
        return cli_die(CLI_EXIT_USAGE, "migrate takes no arguments");
    if (!(conn = cli_db(cli, &rc)))
        return rc;
    if (tw_migrate(conn, &applied, err, sizeof err) != 0) {
        /* Migrations are the owner's (docs/security.md): a role that is not says whose they are. */
        PGresult *own =
            PQexec(conn, "SELECT pg_catalog.pg_get_userbyid(n.nspowner) FROM pg_catalog.pg_namespace n"
                         " WHERE n.nspname = 'state' AND n.nspowner <> (SELECT r.oid FROM"
                         " pg_catalog.pg_roles r WHERE r.rolname = current_user)");
        if (PQresultStatus(own) == PGRES_TUPLES_OK && PQntuples(own) == 1)
            rc = cli_die(
                CLI_EXIT_RUNTIME,
                "migrate failed: %s; schemas state and tw belong to the role %s: run turnwatch migrate "
                "as %s, not as %s",
                err, PQgetvalue(own, 0, 0), PQgetvalue(own, 0, 0), PQuser(conn));
        else
            rc = cli_die(CLI_EXIT_RUNTIME, "migrate failed: %s", err);
        PQclear(own);
        return rc;
    }
    version = tw_schema_version(conn);
    /* The profiles of this configuration (docs/roster.md), as the daemons publish theirs when they
     * start: agents can be added to them before any daemon ran. */
    char *known = tw_profiles_array(&cli->cfg);
    if (!known)
        return cli_die(CLI_EXIT_RUNTIME, "out of memory");
    const char *params[] = {known};
    PGresult *res = cli_query(cli, "SELECT tw.publish_profiles($1::text[])", 1, params, &rc);
    free(known);
    if (!res)
        return rc;
    PQclear(res);
    if (cli->json)
        return cli_print_json(json_pack("{s:i,s:i}", "applied", applied, "version", version));
    printf("applied %d migration%s; schema at version %d\n", applied, applied == 1 ? "" : "s", version);
    return CLI_EXIT_OK;
}
