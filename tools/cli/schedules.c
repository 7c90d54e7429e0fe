/* turnwatch schedules add|remove|list|show: recurring schedules (docs/schedules.md), as the database holds
 * them (state.schedules), with their next fire times, the turns their last ticks fired and the ticks they
 * skipped. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "names.h"

static const char *str(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "-";
}

/* One line of `schedules list`, or the header. */
static void print_row(json_t *s)
{
    if (!s) {
        printf("%-24s %-20s %-16s %-10s %-16s %-8s %-32s %s\n", "SCHEDULE", "AGENT", "CRON", "TIMEZONE",
               "OVERLAP", "CATCHUP", "NEXT", "OWNER");
        return;
    }
    printf("%-24s %-20s %-16s %-10s %-16s %-8s %-32s %s\n", str(s, "name"), str(s, "agent"), str(s, "cron"),
           str(s, "timezone"), str(s, "overlap"), str(s, "catchup"), str(s, "next_fire_at"), str(s, "owner"));
}

static int print_one(Cli *cli, json_t *s)
{
    json_t *v;
    size_t i;

    if (cli->json)
        return cli_print_json(s);
    print_row(NULL);
    print_row(s);
    printf("next fires (UTC):");
    json_array_foreach(json_object_get(s, "next_fires"), i, v) printf(" %s", json_string_value(v));
    printf("\n");
    json_array_foreach(json_object_get(s, "last_turns"), i, v)
        printf("  tick %-32s turn %s %s\n", str(v, "tick_at"), str(v, "turn_id"), str(v, "status"));
    json_array_foreach(json_object_get(s, "skipped"), i, v)
        printf("  tick %-32s skipped %s%s%s\n", str(v, "tick_at"), str(v, "skipped"),
               json_object_get(v, "error") ? ": " : "", json_object_get(v, "error") ? str(v, "error") : "");
    json_decref(s);
    return CLI_EXIT_OK;
}

int cli_schedules_show(Cli *cli, int argc, char **argv)
{
    int rc;
    json_t *s = cli_named_doc(cli, argc, argv, "schedules", "schedule", "SELECT tw.schedule_show($1)", &rc);
    return s ? print_one(cli, s) : rc;
}

int cli_schedules_list(Cli *cli, int argc, char **argv)
{
    (void)argv;
    return cli_list_rows(cli, argc, "schedules", "SELECT tw.schedules_list()", print_row);
}

int cli_schedules_add(Cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {{"agent", required_argument, NULL, 'a'},
                                         {"cron", required_argument, NULL, 'c'},
                                         {"timezone", required_argument, NULL, 'z'},
                                         {"channel", required_argument, NULL, 'h'},
                                         {"input", required_argument, NULL, 'i'},
                                         {"timeout", required_argument, NULL, 't'},
                                         {"limit-key", required_argument, NULL, 'k'},
                                         {"overlap", required_argument, NULL, 'o'},
                                         {"catchup", required_argument, NULL, 'u'},
                                         {"catchup-window", required_argument, NULL, 'w'},
                                         {NULL, 0, NULL, 0}};
    const char *agent = NULL, *cron = NULL, *tz = "UTC", *channel = NULL, *input = "{}", *timeout = NULL,
               *key = NULL, *overlap = "skip", *catchup = "last", *window = "3600";
    int c, rc;

    optind = 0;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case 'a':
            agent = optarg;
            break;
        case 'c':
            cron = optarg;
            break;
        case 'z':
            tz = optarg;
            break;
        case 'h':
            channel = optarg;
            break;
        case 'i':
            input = optarg;
            break;
        case 't':
            timeout = optarg;
            break;
        case 'k':
            key = optarg;
            break;
        case 'o':
            overlap = optarg;
            break;
        case 'u':
            catchup = optarg;
            break;
        case 'w':
            window = optarg;
            break;
        default:
            return cli_bad_option(cli, c, argv);
        }
    }
    if ((rc = cli_need_name("schedules", "schedule", "add", argc, argv, optind)) != CLI_EXIT_OK)
        return rc;
    if (!agent || !cron)
        return cli_die(CLI_EXIT_USAGE, "schedules add: --agent and --cron are required");
    if (!tw_name_valid(agent))
        return cli_die(CLI_EXIT_USAGE, "schedules add: invalid agent '%.80s' (allowed: [A-Za-z0-9_-]{1,64})",
                       agent);
    /* The rest is checked by tw.add_schedule (SQLSTATE 22: exit 2), the cron and time zone by the cron
     * engine. */
    const char *params[] = {argv[optind], agent, cron,    tz,      channel, input,
                            timeout,      key,   overlap, catchup, window};
    json_t *s =
        cli_query_json(cli,
                       "SELECT tw.add_schedule($1, $2, $3, $4, $5, $6::jsonb, $7::integer, $8, $9, $10, "
                       "$11::integer)",
                       11, params, &rc);
    if (!s)
        return rc;
    return print_one(cli, s);
}

int cli_schedules_remove(Cli *cli, int argc, char **argv)
{
    return cli_named_remove(cli, argc, argv, "schedules", "schedule",
                            "SELECT to_jsonb(tw.remove_schedule($1))");
}
