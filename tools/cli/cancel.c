/* turnwatch cancel ID: end a turn that has not ended with status cancelled (tw.cancel_turn_ex, as
 * tw.cancel_turn for SQL clients). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "names.h"

int cli_cancel(Cli *cli, int argc, char **argv)
{
    const char *turn, *result, *status;
    json_t *res;
    int rc = CLI_EXIT_OK;

    if (argc != 2)
        return cli_die(CLI_EXIT_USAGE, "usage: turnwatch cancel ID");
    turn = argv[1];
    if (!tw_uuid_valid(turn))
        return cli_die(CLI_EXIT_USAGE, "cancel: '%.80s' is not a turn id (a UUID)", turn);
    const char *params[] = {turn};
    if (!(res = cli_query_json(cli, "SELECT tw.cancel_turn_ex($1::uuid)", 1, params, &rc)))
        return rc;
    result = json_string_value(json_object_get(res, "result"));
    status = json_string_value(json_object_get(res, "status"));
    if (result && strcmp(result, "cancelled") == 0) {
        cli_publish(cli, json_object_get(res, "publish"));
        if (cli->json)
            rc = cli_print_json(
                json_pack("{s:s,s:s,s:s}", "turn_id", turn, "result", "cancelled", "status", "cancelled"));
        else
            printf("cancelled %s\n", turn);
    } else if (result && strcmp(result, "already_ended") == 0) {
        /* The answer on stdout for scripts, and still a failure: nothing was cancelled. */
        if (cli->json)
            cli_print_json(
                json_pack("{s:s,s:s,s:s?}", "turn_id", turn, "result", "already_ended", "status", status));
        rc = cli_die(CLI_EXIT_RUNTIME, "cancel: turn %s has already ended (%s); nothing changed", turn,
                     status ? status : "?");
    } else {
        rc = cli_die(CLI_EXIT_USAGE, "cancel: no turn %s", turn);
    }
    json_decref(res);
    return rc;
}
