/* turnwatch tool-result: post the result of an external tool call, exactly as a tool program's result would
 * arrive (tw.post_tool_result_ex, which checks it as the SQL API does), and say in words why one was
 * refused. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "jsondoc.h"
#include "names.h"

/* What the CLI says for each refusal of tw.post_tool_result_ex (`res`, its answer): exit 2 when the caller
 * named something that is not there or takes no posted result, 1 when the state of the turn or call stands in
 * the way. */
static int refused(const char *result, json_t *res, const char *turn, const char *call)
{
    if (strcmp(result, "not_external") == 0) {
        const char *tool = json_string_value(json_object_get(res, "tool"));
        const char *child = json_string_value(json_object_get(res, "child_turn_id"));
        if (child)
            return cli_die(
                CLI_EXIT_USAGE,
                "tool-result: call '%s' is not a call of an external tool: tool %s delegates it to "
                "child turn %s, whose end is its result; nothing changed",
                call, tool ? tool : "?", child);
        return cli_die(
            CLI_EXIT_USAGE,
            "tool-result: call '%s' is not a call of an external tool: tool %s runs a program, whose "
            "result the worker delivers; nothing changed",
            call, tool ? tool : "?");
    }
    if (strcmp(result, "unknown_turn") == 0)
        return cli_die(CLI_EXIT_USAGE, "tool-result: no turn %s; nothing changed", turn);
    if (strcmp(result, "unknown_call") == 0)
        return cli_die(CLI_EXIT_USAGE, "tool-result: turn %s has no tool call '%s'; nothing changed", turn,
                       call);
    if (strcmp(result, "ended") == 0)
        return cli_die(CLI_EXIT_RUNTIME, "tool-result: turn %s has already ended; nothing changed", turn);
    if (strcmp(result, "duplicate") == 0)
        return cli_die(CLI_EXIT_RUNTIME,
                       "tool-result: call '%s' already has a result (the first one stands); nothing changed",
                       call);
    if (strcmp(result, "timed_out") == 0)
        return cli_die(CLI_EXIT_RUNTIME,
                       "tool-result: call '%s' already timed out (a timeout report stands); nothing changed",
                       call);
    if (strcmp(result, "cancelled") == 0)
        return cli_die(CLI_EXIT_RUNTIME,
                       "tool-result: call '%s' was cancelled (the turn went on without it); nothing changed",
                       call);
    return cli_die(CLI_EXIT_RUNTIME, "tool-result: refused (%s); nothing changed", result);
}

int cli_tool_result(Cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        {"turn", required_argument, NULL, 't'},
        {"call", required_argument, NULL, 'c'},
        {"status", required_argument, NULL, 's'},
        {"output", required_argument, NULL, 'o'},
        {NULL, 0, NULL, 0},
    };
    const char *turn = NULL, *call = NULL, *status = "ok", *output = NULL, *result;
    char *out_s = NULL;
    json_t *doc, *res;
    int c, rc = CLI_EXIT_OK;

    optind = 1;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            turn = optarg;
            break;
        case 'c':
            call = optarg;
            break;
        case 's':
            status = optarg;
            break;
        case 'o':
            output = optarg;
            break;
        default:
            return cli_bad_option(cli, c, argv);
        }
    }
    if (optind < argc)
        return cli_die(CLI_EXIT_USAGE, "tool-result: unexpected argument '%.80s'", argv[optind]);
    if (!turn || !call || !output)
        return cli_die(CLI_EXIT_USAGE, "tool-result: --turn, --call and --output are required");
    /* Posted again, the first result stands and the second is answered "duplicate": say the loss instead. */
    cli->idempotent = false;
    if (!tw_uuid_valid(turn))
        return cli_die(CLI_EXIT_USAGE, "tool-result: '%.80s' is not a turn id (a UUID)", turn);
    if (!tw_ident_valid(call))
        return cli_die(CLI_EXIT_USAGE, "tool-result: invalid --call (1 to 256 bytes, no control characters)");
    if (strcmp(status, "ok") != 0 && strcmp(status, "error") != 0)
        return cli_die(CLI_EXIT_USAGE, "tool-result: --status must be ok or error");
    char why[300];
    if (!(doc = tw_jsondoc_parse(output, strlen(output), 0, why, sizeof why)))
        return cli_die(CLI_EXIT_USAGE, "tool-result: --output %s", why);
    /* tw.post_tool_result_ex makes an error's {"code","message"} of the output as tw.post_tool_result does.
     */
    out_s = tw_json_dumps(doc, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(doc);
    if (!out_s)
        return cli_die(CLI_EXIT_RUNTIME, "out of memory");
    const char *params[] = {turn, call, status, out_s};
    res = cli_query_json(cli, "SELECT tw.post_tool_result_ex($1::uuid, $2, $3, $4::jsonb)", 4, params, &rc);
    free(out_s);
    if (!res)
        return rc;
    result = json_string_value(json_object_get(res, "result"));
    if (result && strcmp(result, "accepted") == 0) {
        const char *card = json_string_value(json_object_get(res, "card_id"));
        cli_publish(cli, json_object_get(res, "publish"));
        if (cli->json)
            rc = cli_print_json(json_pack("{s:s,s:s?}", "result", "accepted", "card_id", card));
        else
            printf("accepted: tool.result card %s\n", card ? card : "-");
    } else {
        rc = refused(result ? result : "?", res, turn, call);
    }
    json_decref(res);
    return rc;
}
