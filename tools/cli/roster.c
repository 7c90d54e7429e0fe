/* turnwatch agent add|retire|show, agents list, profiles, turn tree: the roster of agents bound to profiles
 * and delegation trees (docs/roster.md), through the tw.* functions any SQL client can call. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "jsondoc.h"
#include "names.h"
#include "profiles.h"

static const char *str_or(json_t *o, const char *key, const char *dflt)
{
    const char *s = json_string_value(json_object_get(o, key));

    return s ? cli_text(s) : dflt;
}

static int need_id(const char *what, int argc, char **argv, int optind_)
{
    if (optind_ != argc - 1)
        return cli_die(CLI_EXIT_USAGE, "usage: turnwatch %s ID", what);
    if (!tw_name_valid(argv[optind_]))
        return cli_die(CLI_EXIT_USAGE,
                       "%s: invalid agent id '%.80s' (allowed: [A-Za-z0-9_-], 1 to 64 characters)", what,
                       argv[optind_]);
    return CLI_EXIT_OK;
}

int cli_agent_add(Cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {{"profile", required_argument, NULL, 'p'},
                                         {"metadata", required_argument, NULL, 'm'},
                                         {NULL, 0, NULL, 0}};
    const char *profile = NULL, *metadata = "{}";
    char why[300], *canon, *known;
    json_t *doc;
    int c, rc;

    /* 0, not 1: glibc then starts a fresh scan, permuting so that ID may come before or after the options
     * (the global options were parsed in "+" mode, which a reset to 1 would keep). */
    optind = 0;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        if (c == 'p')
            profile = optarg;
        else if (c == 'm')
            metadata = optarg;
        else
            return cli_bad_option(cli, c, argv);
    }
    if ((rc = need_id("agent add", argc, argv, optind)) != CLI_EXIT_OK)
        return rc;
    if (!profile)
        return cli_die(CLI_EXIT_USAGE, "agent add: --profile is required");
    if (!tw_name_valid(profile))
        return cli_die(CLI_EXIT_USAGE, "agent add: invalid profile name '%.80s'", profile);
    if (!(doc = tw_jsondoc_parse(metadata, strlen(metadata), 0, why, sizeof why)))
        return cli_die(CLI_EXIT_USAGE, "agent add: --metadata %s", why);
    if (!json_is_object(doc)) {
        json_decref(doc);
        return cli_die(CLI_EXIT_USAGE, "agent add: --metadata must be a JSON object");
    }
    canon = tw_json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    if (canon && strlen(canon) > TW_METADATA_MAX) {
        size_t n = strlen(canon);
        free(canon);
        return cli_die(CLI_EXIT_USAGE, "agent add: --metadata is %zu bytes of compact JSON; at most %d", n,
                       TW_METADATA_MAX);
    }
    known = tw_profiles_array(&cli->cfg);
    if (!canon || !known) {
        free(canon);
        free(known);
        return cli_die(CLI_EXIT_RUNTIME, "out of memory");
    }
    /* This configuration's profiles first, as a daemon would at start: a profile it defines is known. */
    const char *pp[] = {known};
    PGresult *res = cli_query(cli, "SELECT tw.publish_profiles($1::text[])", 1, pp, &rc);
    free(known);
    if (!res) {
        free(canon);
        return rc;
    }
    PQclear(res);
    const char *params[] = {argv[optind], profile, canon};
    json_t *created = cli_query_json(cli, "SELECT to_jsonb(tw.add_agent($1, $2, $3::jsonb))", 3, params, &rc);
    free(canon);
    if (!created)
        return rc;
    bool made = json_is_true(created);
    json_decref(created);
    if (cli->json)
        return cli_print_json(
            json_pack("{s:s,s:s,s:b}", "agent", argv[optind], "profile", profile, "created", made));
    printf("agent %s %s (profile %s)\n", argv[optind], made ? "added" : "already exists", profile);
    return CLI_EXIT_OK;
}

int cli_agent_retire(Cli *cli, int argc, char **argv)
{
    int rc;

    if ((rc = need_id("agent retire", argc, argv, 1)) != CLI_EXIT_OK)
        return rc;
    const char *params[] = {argv[1]};
    json_t *done = cli_query_json(cli, "SELECT to_jsonb(tw.retire_agent($1))", 1, params, &rc);
    if (!done)
        return rc;
    bool now = json_is_true(done);
    json_decref(done);
    if (cli->json)
        return cli_print_json(json_pack("{s:s,s:b}", "agent", argv[1], "retired_now", now));
    printf("agent %s %s\n", argv[1], now ? "retired" : "was retired already");
    return CLI_EXIT_OK;
}

static void print_kv(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    char *s;

    if (!v || json_is_null(v))
        return;
    s = json_is_string(v) ? NULL : json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    printf("%-16s %s\n", key, s ? s : cli_text(json_string_value(v)));
    free(s);
}

/* An agent whose metadata jansson cannot read (nested deeper than its limit of 2048 levels; PostgreSQL takes
 * more): everything else as usual, the metadata as the database's text. */
static int show_raw_metadata(Cli *cli, const char *id, const char *const *fields, size_t n_fields)
{
    const char *params[] = {id};
    int rc;
    PGresult *res =
        cli_query(cli, "SELECT tw.agent_info($1) - 'metadata', (tw.agent_info($1) -> 'metadata')::text", 1,
                  params, &rc);
    json_t *a;

    if (!res)
        return rc;
    if (!(a = json_loads(PQgetvalue(res, 0, 0), 0, NULL))) {
        PQclear(res);
        return cli_die(CLI_EXIT_RUNTIME, "unexpected answer from the database");
    }
    for (size_t i = 0; i < n_fields; i++)
        if (strcmp(fields[i], "metadata") == 0)
            printf("%-16s %s\n", "metadata", cli_text(PQgetvalue(res, 0, 1)));
        else
            print_kv(a, fields[i]);
    json_decref(a);
    PQclear(res);
    return CLI_EXIT_OK;
}

int cli_agent_show(Cli *cli, int argc, char **argv)
{
    static const char *fields[] = {"agent",      "profile",    "status",     "retired",
                                   "created_at", "retired_at", "turn_epoch", "active_turn_id",
                                   "updated_at", "metadata",   "turns"};
    int rc;

    if ((rc = need_id("agent show", argc, argv, 1)) != CLI_EXIT_OK)
        return rc;
    const char *params[] = {argv[1]};
    PGresult *res = cli_query(cli, "SELECT tw.agent_info($1)", 1, params, &rc);
    if (!res)
        return rc;
    if (PQgetisnull(res, 0, 0)) {
        PQclear(res);
        return cli_die(CLI_EXIT_USAGE, "agent show: no agent %s", argv[1]);
    }
    json_t *a = json_loads(PQgetvalue(res, 0, 0), 0, NULL);
    if (!a && cli->json) {
        /* The database's own JSON text, unparsed: valid JSON whatever its depth. */
        rc = puts(PQgetvalue(res, 0, 0)) == EOF || fflush(stdout) == EOF
                 ? cli_die(CLI_EXIT_RUNTIME, "cannot write to stdout: %s", strerror(errno))
                 : CLI_EXIT_OK;
        PQclear(res);
        return rc;
    }
    PQclear(res);
    if (!a)
        return show_raw_metadata(cli, argv[1], fields, sizeof fields / sizeof fields[0]);
    if (cli->json)
        return cli_print_json(a);
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        print_kv(a, fields[i]);
    json_decref(a);
    return CLI_EXIT_OK;
}

int cli_agents_list(Cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {{"profile", required_argument, NULL, 'p'},
                                         {"retired", no_argument, NULL, 'r'},
                                         {"after", required_argument, NULL, 'a'},
                                         {"limit", required_argument, NULL, 'l'},
                                         {NULL, 0, NULL, 0}};
    const char *profile = NULL, *after = NULL, *limit = "100";
    bool retired = false;
    long n;
    int c, rc;

    optind = 1;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case 'p':
            profile = optarg;
            break;
        case 'r':
            retired = true;
            break;
        case 'a':
            after = optarg;
            break;
        case 'l':
            limit = optarg;
            break;
        default:
            return cli_bad_option(cli, c, argv);
        }
    }
    if (optind < argc)
        return cli_die(CLI_EXIT_USAGE, "agents list: unexpected argument '%.80s'", argv[optind]);
    if (profile && !tw_name_valid(profile))
        return cli_die(CLI_EXIT_USAGE, "agents list: invalid profile name '%.80s'", profile);
    if (after && !tw_name_valid(after))
        return cli_die(CLI_EXIT_USAGE, "agents list: invalid --after id '%.80s'", after);
    if (!cli_parse_long(limit, 1, 100000, &n))
        return cli_die(CLI_EXIT_USAGE, "agents list: --limit must be a whole number from 1 to 100000");
    /* Without --retired, the agents that take turns; with it, the retired ones. */
    const char *params[] = {profile, retired ? "true" : "false", after, limit};
    json_t *list =
        cli_query_json(cli, "SELECT tw.agents_list($1, $2::boolean, $3, $4::integer)", 4, params, &rc);
    size_t i;
    json_t *a;

    if (!list)
        return rc;
    if (cli->json)
        return cli_print_json(list);
    printf("%-40s  %-24s  %-10s  %s\n", "AGENT", "PROFILE", "STATUS", "CREATED");
    json_array_foreach(list, i, a)
        printf("%-40s  %-24s  %-10s  %s\n", str_or(a, "agent", "-"), str_or(a, "profile", "-"),
               json_is_true(json_object_get(a, "retired")) ? "retired" : str_or(a, "status", "-"),
               str_or(a, "created_at", "-"));
    json_decref(list);
    return CLI_EXIT_OK;
}

int cli_profiles(Cli *cli, int argc, char **argv)
{
    json_t *list, *p, *w;
    size_t i, k;
    int rc;

    if (argc > 1)
        return cli_die(CLI_EXIT_USAGE, "profiles takes no arguments");
    if (!(list = cli_query_json(cli, "SELECT tw.profiles()", 0, NULL, &rc)))
        return rc;
    if (cli->json)
        return cli_print_json(list);
    printf("%-24s  %-26s  %s\n", "PROFILE", "PUBLISHED", "WORKERS");
    json_array_foreach(list, i, p)
    {
        printf("%-24s  %-26.26s  ", str_or(p, "profile", "-"), str_or(p, "updated_at", "-"));
        if (json_array_size(json_object_get(p, "workers")) == 0)
            fputs("(no live worker)", stdout);
        json_array_foreach(json_object_get(p, "workers"), k, w)
            printf("%s%s", k ? ", " : "", cli_text(json_string_value(w)));
        putchar('\n');
    }
    json_decref(list);
    return CLI_EXIT_OK;
}

static void print_tree(json_t *node, int indent)
{
    json_t *kid;
    size_t i;
    const char *err = str_or(node, "error", NULL), *call = str_or(node, "parent_tool_call_id", NULL);

    printf("%*s%s  %s  %s%s%s%s%s\n", indent * 2, "", str_or(node, "turn_id", "-"),
           str_or(node, "agent", "-"), str_or(node, "status", "-"), err ? "/" : "", err ? err : "",
           call ? "  call=" : "", call ? call : "");
    json_array_foreach(json_object_get(node, "children"), i, kid) print_tree(kid, indent + 1);
}

int cli_turn_tree(Cli *cli, int argc, char **argv)
{
    json_t *tree;
    int rc;

    if (!(tree = cli_turn_doc(cli, argc, argv, "turn tree", "SELECT tw.turn_tree($1::uuid)", &rc)))
        return rc;
    if (cli->json)
        return cli_print_json(tree);
    print_tree(tree, 0);
    json_decref(tree);
    return CLI_EXIT_OK;
}
