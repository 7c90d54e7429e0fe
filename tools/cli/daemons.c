/* turnwatch daemons: the daemons alive now and those gone in the last day, with what each holds: counts, and
 * the turn ids of the first 100 steps and tool calls of each (tw.daemons, docs/watchdogs.md). Alive means
 * its liveness lock is held at this moment. */
#include <stdio.h>

#include "cli.h"

static const char *str(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? cli_text(s) : "-";
}

/* Under a daemon's row, one line per turn id it holds (what), and how many more it holds than are listed. */
static void print_held(json_t *holds, const char *count_key, const char *ids_key, const char *what,
                       const char *whats)
{
    json_t *ids = json_object_get(holds, ids_key), *id;
    long long n = json_integer_value(json_object_get(holds, count_key));
    size_t i;

    json_array_foreach(ids, i, id) printf("    %s of turn %s\n", what, cli_text(json_string_value(id)));
    if (n > (long long)json_array_size(ids))
        printf("    and %lld more %s\n", n - (long long)json_array_size(ids), whats);
}

int cli_daemons(Cli *cli, int argc, char **argv)
{
    json_t *list, *d;
    size_t i;
    int rc = CLI_EXIT_OK;

    if (argc != 1)
        return cli_die(CLI_EXIT_USAGE, "usage: turnwatch daemons [--json]");
    if (!(list = cli_query_json(cli, "SELECT tw.daemons()", 0, NULL, &rc)))
        return rc;
    if (cli->json)
        return cli_print_json(list);
    printf("%-28s %-7s %-6s %-8s %-7s %-26s %s\n", "DAEMON", "KIND", "STATE", "STEPS", "TOOLS", "STARTED",
           "LAST SEEN / GONE");
    json_array_foreach(list, i, d)
    {
        json_t *holds = json_object_get(d, "holds");
        bool alive = json_is_true(json_object_get(d, "alive"));
        /* Gone with no gone_at: its session ended and no other daemon has looked since (none is running). */
        bool marked = json_is_string(json_object_get(d, "gone_at"));
        printf("%-28s %-7s %-6s %-8lld %-7lld %-26s %s%s%s\n", str(d, "daemon_id"), str(d, "kind"),
               alive ? "alive" : "gone", json_integer_value(json_object_get(holds, "steps")),
               json_integer_value(json_object_get(holds, "tool_calls")), str(d, "started_at"),
               alive || !marked ? str(d, "last_seen_at") : str(d, "gone_at"), alive ? "" : " ",
               alive    ? ""
               : marked ? str(d, "gone_reason")
                        : "(session ended; last seen then)");
        print_held(holds, "steps", "step_turn_ids", "step", "steps");
        print_held(holds, "tool_calls", "tool_call_turn_ids", "tool call", "tool calls");
    }
    json_decref(list);
    return rc;
}
