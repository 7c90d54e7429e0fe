/* turnwatch limits set|remove|list|show: flow control's limits (docs/flow-control.md), as the database holds
 * them (state.limits), with what each has in use and waiting, its tokens and its pause. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "names.h"

static const char *num(json_t *o, const char *key, char *buf, size_t size)
{
    json_t *v = json_object_get(o, key);
    if (json_is_integer(v))
        snprintf(buf, size, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        snprintf(buf, size, "%g", json_real_value(v));
    else if (json_is_string(v))
        snprintf(buf, size, "%s", json_string_value(v));
    else
        snprintf(buf, size, "-");
    return buf;
}

/* One line of `limits list`, or the header. */
static void print_row(json_t *l)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], rate[64];
    if (!l) {
        printf("%-24s %-8s %-12s %-6s %-7s %-8s %-8s %-8s %s\n", "LIMIT", "CAP", "RATE", "BURST", "PER_KEY",
               "IN_USE", "WAITING", "TOKENS", "SOURCE");
        return;
    }
    if (json_is_null(json_object_get(l, "rate_n")) || !json_object_get(l, "rate_n"))
        snprintf(rate, sizeof rate, "-");
    else
        snprintf(rate, sizeof rate, "%s/%s", num(l, "rate_n", a, sizeof a),
                 num(l, "rate_seconds", b, sizeof b));
    printf("%-24s %-8s %-12s %-6s %-7s %-8s %-8s %-8s %s\n", json_string_value(json_object_get(l, "name")),
           num(l, "max_concurrent", c, sizeof c), rate, num(l, "burst", d, sizeof d),
           json_is_true(json_object_get(l, "per_key")) ? "yes" : "no", num(l, "in_use", e, sizeof e),
           num(l, "waiting", f, sizeof f), num(l, "tokens", a, sizeof a),
           json_string_value(json_object_get(l, "source")));
}

static int print_one(Cli *cli, json_t *l)
{
    char a[32], b[32];
    if (cli->json)
        return cli_print_json(l);
    print_row(NULL);
    print_row(l);
    json_t *paused = json_object_get(l, "paused_until");
    if (json_is_string(paused))
        printf("paused until %s\n", json_string_value(paused));
    if (json_is_number(json_object_get(l, "oldest_wait_seconds")))
        printf("oldest waiter: %s s\n", num(l, "oldest_wait_seconds", a, sizeof a));
    if (json_is_number(json_object_get(l, "max_wait_seconds")) &&
        json_number_value(json_object_get(l, "max_wait_seconds")) > 0)
        printf("max wait: %s s\n", num(l, "max_wait_seconds", b, sizeof b));
    json_t *keys = json_object_get(l, "keys"), *k;
    size_t i;
    json_array_foreach(keys, i, k)
        printf("  key %-32s in use %-6s waiting %s\n", json_string_value(json_object_get(k, "key")),
               num(k, "in_use", a, sizeof a), num(k, "waiting", b, sizeof b));
    json_decref(l);
    return CLI_EXIT_OK;
}

int cli_limits_show(Cli *cli, int argc, char **argv)
{
    int rc;
    json_t *l = cli_named_doc(cli, argc, argv, "limits", "limit", "SELECT tw.limit_show($1)", &rc);
    return l ? print_one(cli, l) : rc;
}

int cli_limits_list(Cli *cli, int argc, char **argv)
{
    (void)argv;
    return cli_list_rows(cli, argc, "limits", "SELECT tw.limits_list()", print_row);
}

/* "N/S": N 1 to 1000000, S a number of seconds above 0. */
static bool parse_rate(const char *s, char *n_out, size_t n_size, char *s_out, size_t s_size)
{
    char *end;
    errno = 0;
    long n = strtol(s, &end, 10);
    if (errno || end == s || *end != '/' || n < 1 || n > 1000000)
        return false;
    const char *sec = end + 1;
    double v = strtod(sec, &end);
    if (errno || end == sec || *end || !(v > 0) || v > 86400)
        return false;
    snprintf(n_out, n_size, "%ld", n);
    snprintf(s_out, s_size, "%s", sec);
    return true;
}

int cli_limits_set(Cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        {"max-concurrent", required_argument, NULL, 'm'}, {"rate", required_argument, NULL, 'r'},
        {"burst", required_argument, NULL, 'b'},          {"per-key", no_argument, NULL, 'k'},
        {"max-wait", required_argument, NULL, 'w'},       {NULL, 0, NULL, 0}};
    const char *max = "0", *burst = NULL, *wait = "0", *rate = NULL;
    char rn[32], rs[64];
    bool per_key = false;
    int c, rc;

    optind = 0;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        if (c == 'm')
            max = optarg;
        else if (c == 'r')
            rate = optarg;
        else if (c == 'b')
            burst = optarg;
        else if (c == 'k')
            per_key = true;
        else if (c == 'w')
            wait = optarg;
        else
            return cli_bad_option(cli, c, argv);
    }
    if ((rc = cli_need_name("limits", "limit", "set", argc, argv, optind)) != CLI_EXIT_OK)
        return rc;
    if (rate && !parse_rate(rate, rn, sizeof rn, rs, sizeof rs))
        return cli_die(CLI_EXIT_USAGE,
                       "limits set: --rate '%.80s' is not N/S (e.g. 60/60: 60 starts a minute)", rate);
    /* The numbers are checked by tw.set_limit (SQLSTATE 22: exit 2). */
    const char *params[] = {
        argv[optind], max, rate ? rn : NULL, rate ? rs : NULL, burst, per_key ? "true" : "false", wait};
    json_t *l = cli_query_json(cli,
                               "SELECT tw.set_limit($1, $2::integer, $3::integer, $4::numeric, $5::integer, "
                               "$6::boolean, $7::numeric)",
                               7, params, &rc);
    if (!l)
        return rc;
    return print_one(cli, l);
}

int cli_limits_remove(Cli *cli, int argc, char **argv)
{
    return cli_named_remove(cli, argc, argv, "limits", "limit", "SELECT to_jsonb(tw.remove_limit($1))");
}
