/* turnwatch turn show ID, turn history ID and turns list: a turn with its attempts, tool calls (with their
 * effective timeouts and where each came from), warnings and forced ends; its transitions in order
 * (tw.turn_history); a listing. Each reads through a function of tw (tw.turn_show, tw.turn_history,
 * tw.turns_list), which turnwatch_observer may execute (docs/security.md). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "names.h"

/* A string member, or dflt when it is missing or not a string. */
static const char *str_or(json_t *o, const char *key, const char *dflt)
{
    const char *s = json_string_value(json_object_get(o, key));

    return s ? cli_text(s) : dflt;
}

static void print_field(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);

    if (!v || json_is_null(v))
        return;
    if (json_is_string(v)) {
        printf("%-20s %s\n", key, cli_text(json_string_value(v)));
    } else {
        char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        printf("%-20s %s\n", key, s ? s : "");
        free(s);
    }
}

/* An MCP call's last progress (docs/mcp.md), as --json has it: progress[/total], its message, when. */
static void print_progress(json_t *call)
{
    json_t *p = json_object_get(call, "progress");
    char *done, *total;

    if (!json_is_object(p))
        return;
    done = json_dumps(json_object_get(p, "progress"), JSON_ENCODE_ANY);
    total = json_dumps(json_object_get(p, "total"), JSON_ENCODE_ANY);
    const char *msg = cli_text(json_string_value(json_object_get(p, "message")));
    printf("tool call progress   id=%s progress=%s%s%s at=%s%s%s%s\n", str_or(call, "tool_call_id", "-"),
           done ? done : "-", total ? "/" : "", total ? total : "", str_or(p, "at", "-"), msg ? " (" : "",
           msg ? msg : "", msg ? ")" : "");
    free(done);
    free(total);
}

static void print_turn(json_t *t)
{
    static const char *fields[] = {"turn_id",
                                   "agent",
                                   "profile",
                                   "status",
                                   "pending_reason",
                                   "not_before",
                                   "attempt",
                                   "max_attempts",
                                   "replay_of",
                                   "turn_epoch",
                                   "step",
                                   "channel_id",
                                   "output_box_id",
                                   "depth",
                                   "parent_turn_id",
                                   "parent_tool_call_id",
                                   "error",
                                   "error_message",
                                   "timeout",
                                   "deliverable_card_id",
                                   "idempotency_key",
                                   "limit_key",
                                   "timeout_seconds",
                                   "deadline_at",
                                   "resume_deadline",
                                   "wait",
                                   "retry_at",
                                   "created_at",
                                   "dispatched_at",
                                   "started_at",
                                   "suspended_at",
                                   "ended_at",
                                   "updated_at"};
    json_t *call, *f, *wn;
    size_t i;

    for (i = 0; i < sizeof fields / sizeof fields[0]; i++)
        print_field(t, fields[i]);
    json_array_foreach(json_object_get(t, "tool_calls"), i, call)
    {
        json_t *err = json_object_get(call, "error");
        const char *result = cli_text(json_string_value(json_object_get(call, "result_status")));
        const char *emsg = cli_text(json_string_value(json_object_get(err, "message")));
        /* When it was asked for, when a program took it (none for external tools), when it settled, and
         * why it failed in words: the stderr tail, the time limit, what the reply began with. */
        printf("tool call            step=%lld id=%s tool=%s status=%s%s%s issued=%s started=%s "
               "settled=%s timeout=%llds(%s)%s%s%s%s%s\n",
               json_integer_value(json_object_get(call, "step")), str_or(call, "tool_call_id", "-"),
               str_or(call, "tool", "-"), str_or(call, "status", "-"), result ? " result=" : "",
               result ? result : "", str_or(call, "created_at", "-"), str_or(call, "started_at", "-"),
               str_or(call, "settled_at", "-"), json_integer_value(json_object_get(call, "timeout_seconds")),
               str_or(call, "timeout_source", "-"), json_is_object(err) ? " error=" : "",
               json_is_object(err) ? str_or(err, "code", "") : "", emsg ? " (" : "", emsg ? emsg : "",
               emsg ? ")" : "");
        print_progress(call);
    }
    json_array_foreach(json_object_get(t, "children"), i, f)
    {
        const char *err = str_or(f, "error", NULL);
        printf("child turn           %s agent=%s call=%s status=%s%s%s\n", str_or(f, "turn_id", "-"),
               str_or(f, "agent", "-"), str_or(f, "tool_call_id", "-"), str_or(f, "status", "-"),
               err ? "/" : "", err ? err : "");
    }
    /* tw.turn_show lists the first children only; `turn tree` has them all. */
    if (json_is_true(json_object_get(t, "children_truncated")))
        printf("children             %zu of %lld shown (turnwatch turn tree %s lists them all)\n",
               json_array_size(json_object_get(t, "children")),
               json_integer_value(json_object_get(t, "children_total")), str_or(t, "turn_id", "ID"));
    json_array_foreach(json_object_get(t, "force_terminations"), i, f)
    {
        /* A turn ended before it was dispatched has no epoch. */
        json_t *e = json_object_get(f, "turn_epoch");
        char epoch[24] = "-";
        if (json_is_integer(e))
            snprintf(epoch, sizeof epoch, "%lld", json_integer_value(e));
        printf("force termination    reason=%s epoch=%s at=%s\n", str_or(f, "reason", "-"), epoch,
               str_or(f, "at", "-"));
    }
    json_array_foreach(json_object_get(t, "warnings"), i, wn)
    {
        char *lim = json_dumps(json_object_get(wn, "limit_seconds"), JSON_ENCODE_ANY);
        char *el = json_dumps(json_object_get(wn, "elapsed_seconds"), JSON_ENCODE_ANY);
        printf("warning              kind=%s attempt=%lld%s%s limit=%ss elapsed=%ss due=%s at=%s\n",
               str_or(wn, "kind", "-"), json_integer_value(json_object_get(wn, "attempt")),
               json_object_get(wn, "tool_call_id") ? " call=" : "", str_or(wn, "tool_call_id", ""),
               lim ? lim : "-", el ? el : "-", str_or(wn, "due_at", "-"), str_or(wn, "at", "-"));
        free(lim);
        free(el);
    }
}

int cli_turn_show(Cli *cli, int argc, char **argv)
{
    json_t *t;
    int rc;

    if (!(t = cli_turn_doc(cli, argc, argv, "turn show", "SELECT tw.turn_show($1::uuid)", &rc)))
        return rc;
    if (cli->json)
        return cli_print_json(t);
    print_turn(t);
    json_decref(t);
    return CLI_EXIT_OK;
}

int cli_turn_history(Cli *cli, int argc, char **argv)
{
    json_t *rows, *r;
    size_t i;
    int rc;

    if (!(rows = cli_turn_doc(cli, argc, argv, "turn history", "SELECT tw.turn_history($1::uuid)", &rc)))
        return rc;
    if (cli->json)
        return cli_print_json(rows);
    printf("%-32s  %-23s  %5s  %7s  %-24s  %s\n", "AT", "FROM -> TO", "EPOCH", "ATTEMPT", "ACTOR", "REASON");
    json_array_foreach(rows, i, r)
    {
        char move[64], epoch[24] = "-";
        json_t *e = json_object_get(r, "turn_epoch");
        snprintf(move, sizeof move, "%s -> %s", str_or(r, "from", "(new)"), str_or(r, "to", "-"));
        if (json_is_integer(e))
            snprintf(epoch, sizeof epoch, "%lld", json_integer_value(e));
        printf("%-32s  %-23s  %5s  %7lld  %-24s  %s\n", str_or(r, "at", "-"), move, epoch,
               json_integer_value(json_object_get(r, "attempt")), str_or(r, "actor", "-"),
               str_or(r, "reason", "-"));
    }
    json_decref(rows);
    return CLI_EXIT_OK;
}

int cli_turns_list(Cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        {"agent", required_argument, NULL, 'a'},
        {"status", required_argument, NULL, 's'},
        {"limit", required_argument, NULL, 'l'},
        {NULL, 0, NULL, 0},
    };
    static const char *statuses[] = {"pending", "dispatched", "running", "suspended",
                                     "done",    "failed",     "timeout", "cancelled"};
    const char *agent = NULL, *status = NULL, *limit = "100";
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
        case 's':
            status = optarg;
            break;
        case 'l':
            limit = optarg;
            break;
        default:
            return cli_bad_option(cli, c, argv);
        }
    }
    if (optind < argc)
        return cli_die(CLI_EXIT_USAGE, "turns list: unexpected argument '%.80s'", argv[optind]);
    if (agent && !tw_name_valid(agent))
        return cli_die(CLI_EXIT_USAGE, "turns list: invalid agent name '%.80s'", agent);
    if (status) {
        bool ok = false;
        for (i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
            ok |= strcmp(status, statuses[i]) == 0;
        if (!ok)
            return cli_die(CLI_EXIT_USAGE,
                           "turns list: --status must be one of pending, dispatched, running, "
                           "suspended, done, failed, timeout, cancelled");
    }
    if (!cli_parse_long(limit, 1, 100000, &n))
        return cli_die(CLI_EXIT_USAGE, "turns list: --limit must be a whole number from 1 to 100000");
    const char *params[] = {agent, status, limit};
    rows = cli_query_json(cli, "SELECT tw.turns_list($1, $2, $3::integer)", 3, params, &rc);
    if (!rows)
        return rc;
    if (cli->json)
        return cli_print_json(rows);
    printf("%-36s  %-16s  %-10s  %5s  %-24s  %s\n", "TURN", "AGENT", "STATUS", "EPOCH", "ERROR", "CREATED");
    json_array_foreach(rows, i, r) printf(
        "%-36s  %-16.16s  %-10s  %5lld  %-24.24s  %s\n", str_or(r, "turn_id", "-"), str_or(r, "agent", "-"),
        str_or(r, "status", "-"), json_integer_value(json_object_get(r, "turn_epoch")),
        str_or(r, "error", "-"), str_or(r, "created_at", "-"));
    json_decref(rows);
    return CLI_EXIT_OK;
}
