/* turnwatch timeouts suggest (docs/python.md): how long the steps of each profile and the calls of each tool
 * took in the last days (tw.timeouts_suggest), the timeout in force for each from this configuration, and a
 * suggested one, printed as INI lines to paste into it. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "names.h"
#include "policy.h"
#include "registry.h"

/* The suggestion: the p99 of the successful runs times this, rounded up to a whole second. */
#define TIMEOUTS_MARGIN 1.5

typedef struct Row {
    bool tool;          /* a [tool.NAME] row, else an [agent.NAME] (profile) row */
    const char *name;   /* the section's name */
    json_t *stats;      /* tw.timeouts_steps / tw.timeouts_calls, or NULL: no runs in the window */
    bool in_config;     /* the section is in this configuration */
    int in_force;       /* the timeout in force, seconds (0 when the section is not in the configuration) */
    const char *source; /* where it comes from: agent | tool | global, "-" when not in the configuration */
    long suggested;     /* 0: no suggestion */
    char note[256];     /* why there is none, or what bounded it */
} Row;

/* x rounded up to a whole number (x >= 0; without libm). */
static long round_up(double x)
{
    long v = (long)x;

    return (double)v < x ? v + 1 : v;
}

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);

    return json_is_number(v) ? json_number_value(v) : -1;
}

/* The timeout in force and the suggestion for one row. */
static void row_decide(const Cli *cli, const char *profile, Row *r)
{
    const char *what = r->tool ? "calls" : "steps";
    const TwAgentConf *agent = profile ? tw_config_agent(&cli->cfg, profile) : NULL;

    if (r->tool) {
        const TwToolConf *tc = tw_config_tool(&cli->cfg, r->name);
        r->in_config = tc != NULL;
        if (tc)
            r->in_force = tw_policy_tool_timeout(&cli->cfg, agent, tc, 0, &r->source);
    } else {
        const TwAgentConf *ac = tw_config_agent(&cli->cfg, r->name);
        r->in_config = ac != NULL;
        if (ac) {
            r->in_force = ac->step_timeout_sec;
            r->source = "agent";
        }
    }
    if (!r->in_config)
        r->source = "-";
    double ok = num(r->stats, "ok"), p99 = num(r->stats, "ok_p99_seconds");
    long timed_out = (long)json_integer_value(json_object_get(r->stats, "timed_out"));
    if (!r->stats) {
        snprintf(r->note, sizeof r->note, "no %s in the window", what);
        return;
    }
    if (!(ok > 0) || p99 < 0) {
        snprintf(r->note, sizeof r->note, "no successful %s in the window: nothing to suggest from", what);
        return;
    }
    r->suggested = round_up(p99 * TIMEOUTS_MARGIN);
    if (r->suggested < 1)
        r->suggested = 1;
    if ((double)r->suggested < p99) /* never below the p99 itself, whatever the rounding */
        r->suggested = round_up(p99);
    snprintf(r->note, sizeof r->note, "p99 %.3f s of %.0f successful %s x %.1f", p99, ok, what,
             TIMEOUTS_MARGIN);
    /* Runs that timed out were stopped at the limit in force: how long they would have taken is unknown, and
     * a limit below it would stop more of them. */
    if (timed_out > 0 && r->in_config && r->suggested < r->in_force) {
        r->suggested = r->in_force;
        snprintf(r->note, sizeof r->note,
                 "%ld of %ld %s timed out at the %d s in force, so not below it (the p99 of the successful "
                 "ones is %.3f s)",
                 timed_out, (long)json_integer_value(json_object_get(r->stats, "count")), what, r->in_force,
                 p99);
    }
    if (r->suggested > TW_TIMEOUT_MAX_SEC) {
        r->suggested = TW_TIMEOUT_MAX_SEC;
        snprintf(r->note, sizeof r->note, "p99 %.3f s x %.1f is past the largest value a configuration takes",
                 p99, TIMEOUTS_MARGIN);
    }
}

/* The INI lines: one section per row with a suggestion. A section this configuration does not have is written
 * as comments (pasted alone it would lack its exec line). */
static char *ini_text(const Cli *cli, const Row *rows, size_t n, long days)
{
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);

    if (!f)
        return NULL;
    fprintf(f,
            "; turnwatch timeouts suggest: the last %ld day%s; each value is the p99 of the successful runs "
            "x %.1f,\n"
            "; rounded up. Paste each key into its section of %s (replacing the key there).\n",
            days, days == 1 ? "" : "s", TIMEOUTS_MARGIN, cli->config_path);
    for (size_t i = 0; i < n; i++) {
        const Row *r = &rows[i];
        const char *kind = r->tool ? "tool" : "agent",
                   *key = r->tool ? "timeout_seconds" : "step_timeout_seconds";
        if (!r->suggested) {
            fprintf(f, "; [%s.%s]: %s\n", kind, r->name, r->note);
        } else if (!r->in_config) {
            fprintf(
                f,
                "; [%s.%s] is not in this configuration; for the one that runs it:\n; [%s.%s]\n; %s = %ld\n",
                kind, r->name, kind, r->name, key, r->suggested);
        } else {
            fprintf(f, "[%s.%s]\n; %s; in force: %d (%s)\n%s = %ld\n", kind, r->name, r->note, r->in_force,
                    r->source, key, r->suggested);
        }
    }
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void print_table(const Row *rows, size_t n, bool tools)
{
    bool any = false;

    for (size_t i = 0; i < n; i++) {
        const Row *r = &rows[i];
        char share[32] = "-", force[32] = "-", sugg[32] = "-";
        if (r->tool != tools)
            continue;
        if (!any)
            printf("%-24s %8s %9s %9s %9s %14s %9s %7s %9s\n", tools ? "TOOL" : "PROFILE",
                   tools ? "CALLS" : "STEPS", "P50 s", "P95 s", "P99 s", "TIMED OUT", "IN FORCE", "SOURCE",
                   "SUGGESTED");
        any = true;
        long count = (long)json_integer_value(json_object_get(r->stats, "count"));
        long timed_out = (long)json_integer_value(json_object_get(r->stats, "timed_out"));
        if (count > 0)
            snprintf(share, sizeof share, "%ld (%.1f%%)", timed_out,
                     100.0 * (double)timed_out / (double)count);
        if (r->in_config)
            snprintf(force, sizeof force, "%d", r->in_force);
        if (r->suggested)
            snprintf(sugg, sizeof sugg, "%ld", r->suggested);
        if (!r->stats) {
            printf("%-24.64s %8d %9s %9s %9s %14s %9s %7s %9s\n", r->name, 0, "-", "-", "-", "-", force,
                   r->source, sugg);
            continue;
        }
        printf("%-24.64s %7ld%s %9.3f %9.3f %9.3f %14s %9s %7s %9s\n", r->name, count,
               json_is_true(json_object_get(r->stats, "sampled")) ? "+" : " ", num(r->stats, "p50_seconds"),
               num(r->stats, "p95_seconds"), num(r->stats, "p99_seconds"), share, force, r->source, sugg);
    }
    if (any)
        printf("\n");
}

/* The rows: every name the database reported, and every section of the configuration that was asked for
 * (all of them when no filter was given) even without runs. */
static size_t rows_collect(const Cli *cli, json_t *doc, const char *profile, const char *tool, Row *rows,
                           size_t max)
{
    size_t n = 0;
    json_t *e;
    size_t i;

    for (int t = 0; t < 2; t++) {
        bool is_tool = t == 1;
        const char *only = is_tool ? tool : profile;
        bool wanted = is_tool ? (tool || !profile) : (profile || !tool);
        size_t first = n;
        if (!wanted)
            continue;
        json_array_foreach(json_object_get(doc, is_tool ? "tools" : "profiles"), i, e)
        {
            if (n < max)
                rows[n++] = (Row){.tool = is_tool,
                                  .name = json_string_value(json_object_get(e, is_tool ? "tool" : "profile")),
                                  .stats = e};
        }
        size_t nconf = is_tool ? cli->cfg.n_tools : cli->cfg.n_agents;
        for (size_t k = 0; k < nconf; k++) {
            const char *name = is_tool ? cli->cfg.tools[k].name : cli->cfg.agents[k].name;
            bool seen = false;
            if (only && strcmp(only, name) != 0)
                continue;
            for (size_t j = first; j < n; j++)
                seen = seen || strcmp(rows[j].name, name) == 0;
            if (!seen && n < max)
                rows[n++] = (Row){.tool = is_tool, .name = name};
        }
    }
    return n;
}

int cli_timeouts_suggest(Cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        {"profile", required_argument, NULL, 'p'},
        {"tool", required_argument, NULL, 't'},
        {"days", required_argument, NULL, 'd'},
        {NULL, 0, NULL, 0},
    };
    const char *profile = NULL, *tool = NULL, *days_s = "7";
    json_t *doc;
    long days;
    int c, rc;

    optind = 1;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case 'p':
            profile = optarg;
            break;
        case 't':
            tool = optarg;
            break;
        case 'd':
            days_s = optarg;
            break;
        default:
            return cli_bad_option(cli, c, argv);
        }
    }
    if (optind < argc)
        return cli_die(CLI_EXIT_USAGE, "timeouts suggest: unexpected argument '%.80s'", argv[optind]);
    if (profile && !tw_name_valid(profile))
        return cli_die(CLI_EXIT_USAGE,
                       "timeouts suggest: invalid profile name '%.80s' (allowed: [A-Za-z0-9_-]{1,64})",
                       profile);
    if (tool && !tw_name_valid(tool))
        return cli_die(CLI_EXIT_USAGE,
                       "timeouts suggest: invalid tool name '%.80s' (allowed: [A-Za-z0-9_-]{1,64})", tool);
    if (!cli_parse_long(days_s, 1, 3650, &days))
        return cli_die(CLI_EXIT_USAGE, "timeouts suggest: --days must be a whole number from 1 to 3650");
    cli->idempotent = true;
    const char *params[] = {profile, tool, days_s};
    if (!(doc = cli_query_json(cli, "SELECT tw.timeouts_suggest($1, $2, $3::integer)", 3, params, &rc)))
        return rc;

    size_t max = json_array_size(json_object_get(doc, "profiles")) +
                 json_array_size(json_object_get(doc, "tools")) + cli->cfg.n_agents + cli->cfg.n_tools + 1;
    Row *rows = calloc(max, sizeof *rows);
    if (!rows) {
        json_decref(doc);
        return cli_die(CLI_EXIT_RUNTIME, "timeouts suggest: out of memory");
    }
    size_t n = rows_collect(cli, doc, profile, tool, rows, max);
    /* A name asked for that neither this configuration nor the window knows is most likely a typo. */
    for (int t = 0; t < 2; t++) {
        const char *name = t ? tool : profile;
        if (!name ||
            (t ? (void *)tw_config_tool(&cli->cfg, name) : (void *)tw_config_agent(&cli->cfg, name)) ||
            json_array_size(json_object_get(doc, t ? "tools" : "profiles")) > 0)
            continue;
        free(rows);
        json_decref(doc);
        return cli_die(
            CLI_EXIT_USAGE,
            "timeouts suggest: unknown %s '%s': no [%s.%s] section in %s and no %s of it in the last "
            "%ld day%s",
            t ? "tool" : "profile", name, t ? "tool" : "agent", name, cli->config_path, t ? "calls" : "steps",
            days, days == 1 ? "" : "s");
    }
    for (size_t i = 0; i < n; i++)
        row_decide(cli, profile, &rows[i]);
    char *ini = ini_text(cli, rows, n, days);
    if (!ini) {
        free(rows);
        json_decref(doc);
        return cli_die(CLI_EXIT_RUNTIME, "timeouts suggest: out of memory");
    }
    if (cli->json) {
        json_t *profiles = json_array(), *tools = json_array();
        for (size_t i = 0; i < n; i++) {
            const Row *r = &rows[i];
            json_t *o = r->stats ? json_deep_copy(r->stats)
                                 : json_pack("{s:s,s:i}", r->tool ? "tool" : "profile", r->name, "count", 0);
            json_object_set_new(o, "in_config", json_boolean(r->in_config));
            json_object_set_new(o, "timeout_seconds", r->in_config ? json_integer(r->in_force) : json_null());
            json_object_set_new(o, "timeout_source", r->in_config ? json_string(r->source) : json_null());
            json_object_set_new(o, "suggested_seconds",
                                r->suggested ? json_integer(r->suggested) : json_null());
            json_object_set_new(o, "key", json_string(r->tool ? "timeout_seconds" : "step_timeout_seconds"));
            json_object_set_new(o, "note", json_string(r->note));
            json_array_append_new(r->tool ? tools : profiles, o);
        }
        rc = cli_print_json(json_pack("{s:O,s:O,s:I,s:I,s:f,s:o,s:o,s:s}", "now", json_object_get(doc, "now"),
                                      "since", json_object_get(doc, "since"), "days", (json_int_t)days,
                                      "sample", json_integer_value(json_object_get(doc, "sample")), "margin",
                                      TIMEOUTS_MARGIN, "profiles", profiles, "tools", tools, "ini", ini));
    } else {
        print_table(rows, n, false);
        print_table(rows, n, true);
        fputs(ini, stdout);
        rc = fflush(stdout) == 0 ? CLI_EXIT_OK : CLI_EXIT_RUNTIME;
    }
    free(ini);
    free(rows);
    json_decref(doc);
    return rc;
}
