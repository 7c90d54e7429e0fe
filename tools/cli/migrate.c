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
    if (tw_migrate(conn, &applied, err, sizeof err) != 0)
        return cli_die(CLI_EXIT_RUNTIME, "migrate failed: %s", err);
    version = tw_schema_version(conn);
    /* The profiles of this configuration (contract section 14), as the daemons publish theirs when they
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
