/* turnwatch submit: validate a turn's names and input document, then tw.submit_turn. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "profiles.h"
#include "jsondoc.h"
#include "names.h"

/* Reads at most limit + 1 bytes of path ("-": stdin), so that an oversized file is seen as such without
 * reading all of it. */
static char *read_file_limited(const char *path, size_t limit, size_t *len, int *code)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    char *buf;
    size_t n;

    if (!f) {
        *code = cli_die(CLI_EXIT_USAGE, "--input-file %s: %s", path, strerror(errno));
        return NULL;
    }
    buf = malloc(limit + 2);
    n = buf ? fread(buf, 1, limit + 1, f) : 0;
    if (f != stdin)
        fclose(f);
    if (!buf) {
        *code = cli_die(CLI_EXIT_RUNTIME, "out of memory");
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* --in DURATION: a whole number of seconds, minutes or hours ("90s", "15m", "2h"), or several of them in that
 * order ("1h30m"); at most one year in all. */
static bool parse_duration(const char *s, long *out)
{
    static const char units[] = "hms";
    static const long mult[] = {3600, 60, 1};
    long total = 0;
    int next = 0;

    if (!*s)
        return false;
    while (*s) {
        long n = 0;
        int digits = 0;
        const char *u;

        for (; *s >= '0' && *s <= '9'; s++, digits++) {
            if (digits >= 9)
                return false;
            n = n * 10 + (*s - '0');
        }
        if (digits == 0 || !*s || !(u = strchr(units + next, *s)))
            return false;
        next = (int)(u - units) + 1;
        total += n * mult[u - units];
        s++;
    }
    if (total > TW_TURN_TIMEOUT_MAX_SEC)
        return false;
    *out = total;
    return true;
}

/* --at TIME: ISO 8601 with its offset, "2026-12-01T09:00:00+01:00" or "...Z" (seconds and a fraction
 * optional); the database reads it. */
static bool at_valid(const char *s)
{
    static const char shape[] = "dddd-dd-ddTdd:dd";
    size_t i;

    for (i = 0; shape[i]; i++) {
        if (shape[i] == 'd' ? !(s[i] >= '0' && s[i] <= '9') : s[i] != shape[i])
            return false;
    }
    s += i;
    if (s[0] == ':' && s[1] >= '0' && s[1] <= '9' && s[2] >= '0' && s[2] <= '9') {
        s += 3;
        if (*s == '.' && s[1] >= '0' && s[1] <= '9')
            for (s++; *s >= '0' && *s <= '9'; s++)
                ;
    }
    if (strcmp(s, "Z") == 0)
        return true;
    if (*s != '+' && *s != '-')
        return false;
    s++;
    return (strlen(s) == 5 && s[0] >= '0' && s[0] <= '9' && s[1] >= '0' && s[1] <= '9' && s[2] == ':' &&
            s[3] >= '0' && s[3] <= '9' && s[4] >= '0' && s[4] <= '9') ||
           (strlen(s) == 2 && s[0] >= '0' && s[0] <= '9' && s[1] >= '0' && s[1] <= '9');
}

int cli_submit(Cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        {"agent", required_argument, NULL, 'a'},
        {"channel", required_argument, NULL, 'C'},
        {"box", required_argument, NULL, 'b'},
        {"input", required_argument, NULL, 'i'},
        {"input-file", required_argument, NULL, 'f'},
        {"timeout", required_argument, NULL, 't'},
        {"idempotency-key", required_argument, NULL, 'k'},
        {"profile", required_argument, NULL, 'p'},
        {"limit-key", required_argument, NULL, 'L'},
        {"priority", required_argument, NULL, 'P'},
        {"at", required_argument, NULL, 'A'},
        {"in", required_argument, NULL, 'I'},
        {NULL, 0, NULL, 0},
    };
    const char *agent = NULL, *channel = NULL, *box = NULL, *input = NULL, *input_file = NULL,
               *timeout = NULL, *key = NULL, *profile = NULL, *limit_key = NULL, *priority = "0", *at = NULL,
               *in = NULL;
    char in_buf[24];
    char *file_buf = NULL, *canon = NULL;
    size_t input_len;
    json_t *doc;
    long timeout_sec;
    int c, rc = CLI_EXIT_OK;

    optind = 1;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case 'a':
            agent = optarg;
            break;
        case 'C':
            channel = optarg;
            break;
        case 'b':
            box = optarg;
            break;
        case 'i':
            input = optarg;
            break;
        case 'f':
            input_file = optarg;
            break;
        case 't':
            timeout = optarg;
            break;
        case 'k':
            key = optarg;
            break;
        case 'p':
            profile = optarg;
            break;
        case 'L':
            limit_key = optarg;
            break;
        case 'P':
            priority = optarg;
            break;
        case 'A':
            at = optarg;
            break;
        case 'I':
            in = optarg;
            break;
        default:
            return cli_bad_option(cli, c, argv);
        }
    }
    if (optind < argc)
        return cli_die(CLI_EXIT_USAGE, "submit: unexpected argument '%.80s'", argv[optind]);
    if (!agent || !channel)
        return cli_die(CLI_EXIT_USAGE, "submit: --agent and --channel are required");
    if (!tw_name_valid(agent))
        return cli_die(CLI_EXIT_USAGE,
                       "submit: invalid agent name '%.80s' (allowed: [A-Za-z0-9_-], 1 to 64 characters)",
                       agent);
    /* Agents are a roster (docs/roster.md): whether an agent exists, or may be added with --profile, the
     * database says. The profile must be one the configuration knows, or one some daemon published. */
    if (profile && !tw_name_valid(profile))
        return cli_die(CLI_EXIT_USAGE,
                       "submit: invalid profile name '%.80s' (allowed: [A-Za-z0-9_-], 1 to 64 characters)",
                       profile);
    /* tw_ident_valid counts bytes, not characters: a UTF-8 channel of 100 characters may be too long. */
    if (!tw_ident_valid(channel))
        return cli_die(CLI_EXIT_USAGE, "submit: invalid --channel (1 to 256 bytes, no control characters)");
    if (box && !tw_ident_valid(box))
        return cli_die(CLI_EXIT_USAGE, "submit: invalid --box (1 to 256 bytes, no control characters)");
    if (key && !tw_ident_valid(key))
        return cli_die(CLI_EXIT_USAGE,
                       "submit: invalid --idempotency-key (1 to 256 bytes, no control characters)");
    if (limit_key && !tw_ident_valid(limit_key))
        return cli_die(CLI_EXIT_USAGE, "submit: invalid --limit-key (1 to 256 bytes, no control characters)");
    long prio;
    if (!cli_parse_long(priority, 0, 9, &prio))
        return cli_die(CLI_EXIT_USAGE, "submit: --priority must be a whole number from 0 to 9");
    if (input && input_file)
        return cli_die(CLI_EXIT_USAGE, "submit: give --input or --input-file, not both");
    /* A turn that runs later (docs/schedules.md): its time on the database's clock. */
    if (at && in)
        return cli_die(CLI_EXIT_USAGE, "submit: give --at or --in, not both");
    if (at && !at_valid(at))
        return cli_die(CLI_EXIT_USAGE,
                       "submit: --at must be an ISO 8601 time with its offset, e.g. 2026-12-01T09:00:00Z or "
                       "2026-12-01T09:00:00+01:00, not '%.80s'",
                       at);
    long in_sec;
    if (in && !parse_duration(in, &in_sec))
        return cli_die(CLI_EXIT_USAGE,
                       "submit: --in must be a duration such as 90s, 15m, 2h or 1h30m (at most one year), "
                       "not '%.80s'",
                       in);
    if (in)
        snprintf(in_buf, sizeof in_buf, "%ld", in_sec);
    /* Run again after a lost connection, a submit makes one turn only when its key says it is the same. */
    cli->idempotent = key != NULL;
    if (timeout && !cli_parse_long(timeout, 1, TW_TURN_TIMEOUT_MAX_SEC, &timeout_sec))
        return cli_die(
            CLI_EXIT_USAGE,
            "submit: --timeout must be a whole number of seconds from 1 to " TW_STR(TW_TURN_TIMEOUT_MAX_SEC));
    if (input_file) {
        if (!(file_buf = read_file_limited(input_file, TW_DOC_MAX, &input_len, &rc)))
            return rc;
        input = file_buf;
    } else if (!input) {
        input = "{}";
    }
    if (!input_file)
        input_len = strlen(input);
    /* The same gate the fuzzer drives (tools/fuzz cli-input): size, NUL bytes (jansson would stop there and
     * cut a file short in silence), JSON. */
    char why[300];
    if (!(doc = tw_jsondoc_parse(input, input_len, 0, why, sizeof why))) {
        free(file_buf);
        return cli_die(CLI_EXIT_USAGE, "submit: the input document %s", why);
    }
    canon = tw_json_dumps(doc, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(doc);
    free(file_buf);
    if (!canon)
        return cli_die(CLI_EXIT_RUNTIME, "out of memory");
    char *known = tw_profiles_array(&cli->cfg);
    const char *params[] = {agent,   channel, canon,     timeout,  key, box,
                            profile, known,   limit_key, priority, at,  in ? in_buf : NULL};
    PGresult *res =
        known ? cli_query(cli,
                          "SELECT turn_id, created FROM tw.submit_turn_ex($1, $2, $3::jsonb, "
                          "$4::integer, $5, $6, $7, $8::text[], $9, $10::integer, "
                          "coalesce($11::timestamptz, now() + make_interval(secs => $12::integer)))",
                          12, params, &rc)
              : NULL;
    if (!known)
        rc = cli_die(CLI_EXIT_RUNTIME, "out of memory");
    free(known);
    free(canon);
    if (!res)
        return rc;
    if (PQntuples(res) != 1) {
        rc = cli_die(CLI_EXIT_RUNTIME, "unexpected answer from the database");
    } else if (cli->json) {
        rc = cli_print_json(json_pack("{s:s,s:b}", "turn_id", PQgetvalue(res, 0, 0), "created",
                                      PQgetvalue(res, 0, 1)[0] == 't'));
    } else {
        printf("%s\n", PQgetvalue(res, 0, 0));
    }
    PQclear(res);
    return rc;
}
