/* turnwatch dead-letters list and replay (docs/timeouts.md): the turns whose last attempt ended failed or
 * timeout (tw.dead_letters), and a new turn from one of them (tw.replay_turn). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "names.h"

static const char *str_or(json_t *o, const char *key, const char *dflt)
{
    const char *s = json_string_value(json_object_get(o, key));

    return s ? cli_text(s) : dflt;
}

int cli_dead_letters_list(Cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        {"agent", required_argument, NULL, 'a'},
        {"limit", required_argument, NULL, 'l'},
        {NULL, 0, NULL, 0},
    };
    const char *agent = NULL, *limit = "100";
    json_t *rows, *r;
    size_t i;
    long n;
    int c, rc;

    optind = 1;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case 'a':
            agent = optarg;
            break;
        case 'l':
            limit = optarg;
            break;
        default:
            return cli_bad_option(cli, c, argv);
        }
    }
    if (optind < argc)
        return cli_die(CLI_EXIT_USAGE, "dead-letters list: unexpected argument '%.80s'", argv[optind]);
    if (agent && !tw_name_valid(agent))
        return cli_die(CLI_EXIT_USAGE, "dead-letters list: invalid agent name '%.80s'", agent);
    if (!cli_parse_long(limit, 1, 100000, &n))
        return cli_die(CLI_EXIT_USAGE, "dead-letters list: --limit must be a whole number from 1 to 100000");
    const char *params[] = {agent, limit};
    if (!(rows = cli_query_json(cli, "SELECT tw.dead_letters($1, $2::integer)", 2, params, &rc)))
        return rc;
    if (cli->json)
        return cli_print_json(rows);
    printf("%-36s  %-16s  %-8s  %-26s  %7s  %7s  %s\n", "TURN", "AGENT", "STATUS", "ERROR", "ATTEMPT",
           "REPLAYS", "ENDED");
    json_array_foreach(rows, i, r)
    {
        char attempts[32];
        snprintf(attempts, sizeof attempts, "%lld/%lld", json_integer_value(json_object_get(r, "attempt")),
                 json_integer_value(json_object_get(r, "max_attempts")));
        printf("%-36s  %-16.16s  %-8s  %-26.26s  %7s  %7lld  %s\n", str_or(r, "turn_id", "-"),
               str_or(r, "agent", "-"), str_or(r, "status", "-"), str_or(r, "error", "-"), attempts,
               json_integer_value(json_object_get(r, "replays")), str_or(r, "ended_at", "-"));
    }
    json_decref(rows);
    return CLI_EXIT_OK;
}

int cli_dead_letters_replay(Cli *cli, int argc, char **argv)
{
    const char *turn = NULL;
    bool again = false;
    PGresult *res;
    int rc = CLI_EXIT_OK;

    /* One id and one flag, in either order (getopt would stop at the id: main parses in order). */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--again") == 0)
            again = true;
        else if (argv[i][0] == '-')
            return cli_die(CLI_EXIT_USAGE,
                           "dead-letters replay: unknown option '%.80s'; try turnwatch "
                           "dead-letters replay --help",
                           argv[i]);
        else if (turn)
            return cli_die(CLI_EXIT_USAGE, "usage: turnwatch dead-letters replay ID [--again]");
        else
            turn = argv[i];
    }
    if (!turn)
        return cli_die(CLI_EXIT_USAGE, "usage: turnwatch dead-letters replay ID [--again]");
    if (!tw_uuid_valid(turn))
        return cli_die(CLI_EXIT_USAGE, "dead-letters replay: '%.80s' is not a turn id (a UUID)", turn);
    const char *params[] = {turn, again ? "true" : "false"};
    cli->idempotent = !again; /* without --again a repeat gives the first replay back */
    if (!(res = cli_query(cli, "SELECT turn_id, created FROM tw.replay_turn($1::uuid, $2::boolean)", 2,
                          params, &rc)))
        return rc;
    if (PQntuples(res) != 1) {
        PQclear(res);
        return cli_die(CLI_EXIT_RUNTIME, "unexpected answer from the database");
    }
    bool created = PQgetvalue(res, 0, 1)[0] == 't';
    if (cli->json)
        rc = cli_print_json(json_pack("{s:s,s:b,s:s}", "turn_id", PQgetvalue(res, 0, 0), "created", created,
                                      "replay_of", turn));
    else
        printf("%s\n", PQgetvalue(res, 0, 0));
    if (!created)
        fprintf(stderr,
                "turnwatch: dead-letters replay: %s was replayed before as %s; nothing submitted "
                "(--again replays it once more)\n",
                turn, PQgetvalue(res, 0, 0));
    PQclear(res);
    return rc;
}
