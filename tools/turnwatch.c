/* turnwatch: the operator and user CLI (contract section 2). Exit codes: 0 ok, 1 runtime failure,
 * 2 usage or validation error; every failure is one line on stderr. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <nats/nats.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bus.h"
#include "config.h"
#include "log.h"
#include "migrate.h"
#include "names.h"
#include "tw_build.h"

enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

typedef struct Cli {
    const char *config_path;
    bool json;
    bool verbose;
    TwConfig cfg;
    bool cfg_loaded;
    bool check_config;
    PGconn *conn;
} Cli;

static int die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int die(int code, const char *fmt, ...)
{
    va_list ap;

    fputs("turnwatch: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return code;
}

static const char usage_text[] =
    "Usage: turnwatch [-c FILE] [--json] [-v] COMMAND [ARGS]\n"
    "\n"
    "Commands:\n"
    "  migrate                              create or upgrade the schema (idempotent)\n"
    "  submit --agent A --channel C [--box B] [--input JSON | --input-file F]\n"
    "         [--timeout SECONDS] [--idempotency-key K]\n"
    "                                       submit a turn; prints its id\n"
    "  turn show ID                         status, epoch, timestamps, error, deliverable, tool calls\n"
    "  turns list [--agent A] [--status S] [--limit N]\n"
    "  tool-result --turn ID --call CALL_ID [--status ok|error] --output JSON\n"
    "                                       post the result of an external tool call\n"
    "  cancel ID                            cancel a turn that has not ended\n"
    "  events [--agent A]                   print events from NATS as JSON lines until interrupted\n"
    "\n"
    "Options:\n"
    "  -c, --config FILE   INI configuration (default " TW_DEFAULT_CONFIG ")\n"
    "      --json          machine-readable output on stdout\n"
    "  -v, --verbose       more detail on stderr\n"
    "      --check-config  validate the configuration, print what is wrong, exit 0 or 1\n"
    "      --version       print the version and exit\n"
    "  -h, --help          print this help and exit\n"
    "\n"
    "Exit status: 0 ok, 1 runtime failure, 2 usage or validation error.\n";

static int load_config(Cli *cli)
{
    if (tw_config_load(&cli->cfg, cli->config_path) != 0) {
        char *nl = cli->cfg.errors ? strchr(cli->cfg.errors, '\n') : NULL;
        if (nl)
            *nl = '\0';
        int rc = die(EXIT_USAGE, "configuration: %s%s", cli->cfg.errors ? cli->cfg.errors : "invalid",
                     cli->cfg.n_errors > 1 ? " (and more; see turnwatch --check-config)" : "");
        tw_config_free(&cli->cfg);
        return rc;
    }
    cli->cfg_loaded = true;
    return EXIT_OK;
}

/* --check-config (contract section 2, common flags): every problem, one line each, exit 1; or one line saying
 * the file is valid, exit 0. */
static int check_config(Cli *cli)
{
    int rc = EXIT_OK;

    if (tw_config_load(&cli->cfg, cli->config_path) != 0) {
        fputs(cli->cfg.errors ? cli->cfg.errors : "configuration error\n", stderr);
        fprintf(stderr, "turnwatch: %s: %d error%s\n", cli->config_path, cli->cfg.n_errors,
                cli->cfg.n_errors == 1 ? "" : "s");
        rc = EXIT_RUNTIME;
    } else {
        printf("turnwatch: %s is valid: %zu agent%s, %zu tool%s\n", cli->config_path, cli->cfg.n_agents,
               cli->cfg.n_agents == 1 ? "" : "s", cli->cfg.n_tools, cli->cfg.n_tools == 1 ? "" : "s");
    }
    tw_config_free(&cli->cfg);
    return rc;
}

static void quiet_notices(void *arg, const char *message)
{
    Cli *cli = arg;

    /* NOTICEs ("already exists, skipping") are noise to a CLI user; -v shows them. */
    if (cli->verbose)
        fprintf(stderr, "turnwatch: %s", message);
}

static int connect_db(Cli *cli)
{
    char dsn[512];

    cli->conn = PQconnectdb(cli->cfg.pg_dsn);
    if (PQstatus(cli->conn) != CONNECTION_OK) {
        char *msg = PQerrorMessage(cli->conn), *nl;
        while ((nl = strchr(msg, '\n')) && nl[1])
            *nl = ' ';
        if ((nl = strchr(msg, '\n')))
            *nl = '\0';
        return die(EXIT_RUNTIME, "cannot connect to PostgreSQL (%s): %s",
                   tw_redact_dsn(cli->cfg.pg_dsn, dsn, sizeof dsn), msg);
    }
    PQsetNoticeProcessor(cli->conn, quiet_notices, cli);
    return EXIT_OK;
}

/* Run a parameterised query; on error print it and return NULL. */
static PGresult *query(Cli *cli, const char *sql, int n, const char *const *params, int *code)
{
    PGresult *res = PQexecParams(cli->conn, sql, n, NULL, params, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(res);

    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)
        return res;
    {
        const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
        /* 22xxx/23xxx: the input was refused (bad value, constraint); anything else is a runtime failure. */
        bool input = state && (strncmp(state, "22", 2) == 0 || strncmp(state, "23", 2) == 0);
        *code = die(input ? EXIT_USAGE : EXIT_RUNTIME, "%s", msg ? msg : PQerrorMessage(cli->conn));
    }
    PQclear(res);
    return NULL;
}

static json_t *query_json(Cli *cli, const char *sql, int n, const char *const *params, int *code)
{
    PGresult *res = query(cli, sql, n, params, code);
    json_t *j = NULL;

    if (!res)
        return NULL;
    if (PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
        j = json_loads(PQgetvalue(res, 0, 0), JSON_DECODE_ANY, NULL);
    PQclear(res);
    if (!j)
        *code = die(EXIT_RUNTIME, "unexpected answer from the database");
    return j;
}

/* Publish what a state change returned, confirm with a flush, mark the events published. If NATS is not
 * reachable the outbox relay of a running turnwatch-pmo publishes them. */
static void publish(Cli *cli, json_t *items)
{
    natsConnection *nc = NULL;
    natsOptions *opts = NULL;
    natsStatus s;
    json_t *it;
    size_t i;
    char ids[8192] = "{";
    size_t off = 1;
    int n = 0;

    if (!json_is_array(items) || json_array_size(items) == 0)
        return;
    s = tw_nats_options_create(&opts, cli->cfg.nats_url);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(opts, 2000);
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, opts);
    if (s != NATS_OK) {
        if (cli->verbose)
            fprintf(stderr, "turnwatch: NATS not reachable (%s); the PMO's relay will publish the events\n",
                    natsStatus_GetText(s));
        goto out;
    }
    json_array_foreach(items, i, it)
    {
        const char *subject = json_string_value(json_object_get(it, "subject"));
        const char *event_id = json_string_value(json_object_get(it, "event_id"));
        char *data = json_dumps(json_object_get(it, "data"), JSON_COMPACT);
        if (subject && data && natsConnection_PublishString(nc, subject, data) == NATS_OK && event_id &&
            off + 40 < sizeof ids) {
            off += (size_t)snprintf(ids + off, sizeof ids - off, "%s%s", n ? "," : "", event_id);
            n++;
        }
        free(data);
    }
    if (n && natsConnection_FlushTimeout(nc, 2000) == NATS_OK) {
        const char *params[] = {ids};
        int code;
        snprintf(ids + off, sizeof ids - off, "}");
        PGresult *res = query(cli, "SELECT tw.outbox_mark_published($1::uuid[])", 1, params, &code);
        PQclear(res);
    }
out:
    natsConnection_Destroy(nc);
    natsOptions_Destroy(opts);
}

/* --- migrate ----------------------------------------------------------------------------------- */

static int cmd_migrate(Cli *cli, int argc, char **argv)
{
    char err[1024];
    int applied, rc;

    if (argc > 1)
        return die(EXIT_USAGE, "migrate takes no arguments");
    if ((rc = connect_db(cli)))
        return rc;
    if (tw_migrate(cli->conn, &applied, err, sizeof err) != 0)
        return die(EXIT_RUNTIME, "migrate failed: %s", err);
    int version = tw_schema_version(cli->conn);
    if (cli->json)
        printf("{\"applied\":%d,\"version\":%d}\n", applied, version);
    else
        printf("applied %d migration%s; schema at version %d\n", applied, applied == 1 ? "" : "s", version);
    return EXIT_OK;
}

/* --- submit ------------------------------------------------------------------------------------ */

static char *read_file_limited(const char *path, size_t limit, size_t *len, int *code)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    char *buf;
    size_t n;

    if (!f) {
        *code = die(EXIT_USAGE, "--input-file %s: %s", path, strerror(errno));
        return NULL;
    }
    buf = malloc(limit + 2);
    n = buf ? fread(buf, 1, limit + 1, f) : 0;
    if (f != stdin)
        fclose(f);
    if (!buf) {
        *code = die(EXIT_RUNTIME, "out of memory");
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int cmd_submit(Cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        {"agent", required_argument, NULL, 'a'},
        {"channel", required_argument, NULL, 'C'},
        {"box", required_argument, NULL, 'b'},
        {"input", required_argument, NULL, 'i'},
        {"input-file", required_argument, NULL, 'f'},
        {"timeout", required_argument, NULL, 't'},
        {"idempotency-key", required_argument, NULL, 'k'},
        {NULL, 0, NULL, 0},
    };
    const char *agent = NULL, *channel = NULL, *box = NULL, *input = NULL, *input_file = NULL,
               *timeout = NULL, *key = NULL;
    char *file_buf = NULL, *canon = NULL;
    size_t input_len;
    json_error_t jerr;
    json_t *doc;
    int c, rc = EXIT_OK;

    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
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
        default:
            return die(EXIT_USAGE, "submit: try turnwatch --help");
        }
    }
    if (optind < argc)
        return die(EXIT_USAGE, "submit: unexpected argument '%s'", argv[optind]);
    if (!agent || !channel)
        return die(EXIT_USAGE, "submit: --agent and --channel are required");
    if (!tw_name_valid(agent))
        return die(EXIT_USAGE,
                   "submit: invalid agent name '%.80s' (allowed: [A-Za-z0-9_-], 1 to 64 characters)", agent);
    if (!tw_config_agent(&cli->cfg, agent))
        return die(EXIT_USAGE, "submit: unknown agent '%s' (no [agent.%s] section in %s)", agent, agent,
                   cli->config_path);
    if (!tw_ident_valid(channel))
        return die(EXIT_USAGE, "submit: invalid --channel (1 to 256 printable characters)");
    if (box && !tw_ident_valid(box))
        return die(EXIT_USAGE, "submit: invalid --box (1 to 256 printable characters)");
    if (key && !tw_ident_valid(key))
        return die(EXIT_USAGE, "submit: invalid --idempotency-key (1 to 256 printable characters)");
    if (input && input_file)
        return die(EXIT_USAGE, "submit: give --input or --input-file, not both");
    if (timeout) {
        char *end;
        long t = strtol(timeout, &end, 10);
        if (*end || end == timeout || t < 1 || t > 31536000)
            return die(EXIT_USAGE, "submit: --timeout must be a whole number of seconds from 1 to 31536000");
    }
    if (input_file) {
        if (!(file_buf = read_file_limited(input_file, TW_DOC_MAX, &input_len, &rc)))
            return rc;
        input = file_buf;
    } else if (!input) {
        input = "{}";
    }
    input_len = strlen(input);
    if (input_len > TW_DOC_MAX) {
        free(file_buf);
        return die(EXIT_USAGE, "submit: the input document is over the %d byte limit", TW_DOC_MAX);
    }
    if (!(doc = json_loadb(input, input_len, JSON_DECODE_ANY, &jerr))) {
        free(file_buf);
        return die(EXIT_USAGE, "submit: the input is not valid JSON: %s (line %d, column %d)", jerr.text,
                   jerr.line, jerr.column);
    }
    canon = json_dumps(doc, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(doc);
    free(file_buf);
    if (!canon)
        return die(EXIT_RUNTIME, "out of memory");
    if ((rc = connect_db(cli)) == EXIT_OK) {
        const char *params[] = {agent, channel, box, canon, timeout, key};
        PGresult *res =
            query(cli, "SELECT turn_id, created FROM tw.submit_turn($1, $2, $3, $4::jsonb, $5::integer, $6)",
                  6, params, &rc);
        if (res) {
            if (cli->json)
                printf("{\"turn_id\":\"%s\",\"created\":%s}\n", PQgetvalue(res, 0, 0),
                       PQgetvalue(res, 0, 1)[0] == 't' ? "true" : "false");
            else
                printf("%s\n", PQgetvalue(res, 0, 0));
            PQclear(res);
        }
    }
    free(canon);
    return rc;
}

/* --- turn show / turns list --------------------------------------------------------------------- */

static const char turn_show_sql[] =
    "SELECT jsonb_build_object("
    " 'turn_id', t.turn_id, 'agent', t.agent, 'channel_id', t.channel_id, 'output_box_id', t.output_box_id,"
    " 'status', t.status, 'turn_epoch', t.turn_epoch, 'step', t.step, 'error', t.error,"
    " 'error_message', t.error_message, 'deliverable_card_id', t.deliverable_card_id,"
    " 'idempotency_key', t.idempotency_key, 'timeout_seconds', t.timeout_seconds, 'deadline_at', "
    "t.deadline_at,"
    " 'resume_deadline', t.resume_deadline, 'wait', CASE t.wait_mode WHEN 'n' THEN to_jsonb(t.wait_count)"
    "   ELSE to_jsonb(t.wait_mode) END,"
    " 'created_at', t.created_at, 'dispatched_at', t.dispatched_at, 'started_at', t.started_at,"
    " 'suspended_at', t.suspended_at, 'ended_at', t.ended_at, 'updated_at', t.updated_at,"
    " 'tool_calls', (SELECT coalesce(jsonb_agg(jsonb_build_object("
    "     'tool_call_id', w.tool_call_id, 'tool', w.tool, 'step', w.step, 'status', w.wait_status,"
    "     'result_status', w.result_status, 'error', w.error, 'external', w.external,"
    "     'timeout_seconds', w.timeout_seconds, 'created_at', w.created_at, 'started_at', w.started_at,"
    "     'deadline_at', w.deadline_at, 'settled_at', w.settled_at) ORDER BY w.step, w.call_index), '[]')"
    "   FROM state.turn_waiting_tools w WHERE w.turn_id = t.turn_id),"
    " 'force_terminations', (SELECT coalesce(jsonb_agg(jsonb_build_object('reason', f.reason, 'turn_epoch',"
    "     f.turn_epoch, 'at', f.created_at) ORDER BY f.id), '[]')"
    "   FROM state.force_terminations f WHERE f.turn_id = t.turn_id))"
    " FROM state.turns t WHERE t.turn_id = $1::uuid";

static void print_field(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);

    if (!v || json_is_null(v))
        return;
    if (json_is_string(v))
        printf("%-20s %s\n", key, json_string_value(v));
    else {
        char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        printf("%-20s %s\n", key, s ? s : "");
        free(s);
    }
}

static int cmd_turn(Cli *cli, int argc, char **argv)
{
    static const char *fields[] = {
        "turn_id",         "agent",           "status",      "turn_epoch",      "step",
        "channel_id",      "output_box_id",   "error",       "error_message",   "deliverable_card_id",
        "idempotency_key", "timeout_seconds", "deadline_at", "resume_deadline", "wait",
        "created_at",      "dispatched_at",   "started_at",  "suspended_at",    "ended_at",
        "updated_at"};
    json_t *t, *call;
    size_t i;
    int rc;

    if (argc != 3 || strcmp(argv[1], "show") != 0)
        return die(EXIT_USAGE, "usage: turnwatch turn show ID");
    if (!tw_uuid_valid(argv[2]))
        return die(EXIT_USAGE, "turn show: '%.80s' is not a turn id (a UUID)", argv[2]);
    if ((rc = connect_db(cli)))
        return rc;
    const char *params[] = {argv[2]};
    PGresult *res = query(cli, turn_show_sql, 1, params, &rc);
    if (!res)
        return rc;
    if (PQntuples(res) == 0) {
        PQclear(res);
        return die(EXIT_USAGE, "turn show: no turn %s", argv[2]);
    }
    if (cli->json) {
        printf("%s\n", PQgetvalue(res, 0, 0));
        PQclear(res);
        return EXIT_OK;
    }
    t = json_loads(PQgetvalue(res, 0, 0), 0, NULL);
    PQclear(res);
    if (!t)
        return die(EXIT_RUNTIME, "unexpected answer from the database");
    for (i = 0; i < sizeof fields / sizeof fields[0]; i++)
        print_field(t, fields[i]);
    json_array_foreach(json_object_get(t, "tool_calls"), i, call)
    {
        json_t *err = json_object_get(call, "error");
        const char *emsg = json_string_value(json_object_get(err, "message"));
        /* When it was asked for, when a program took it (none for external tools), when it settled, and
         * why it failed in words: the stderr tail, the time limit, what the reply began with. */
        printf("tool call            step=%lld id=%s tool=%s status=%s%s%s issued=%s started=%s "
               "settled=%s%s%s%s%s%s\n",
               json_integer_value(json_object_get(call, "step")),
               json_string_value(json_object_get(call, "tool_call_id")),
               json_string_value(json_object_get(call, "tool")),
               json_string_value(json_object_get(call, "status")),
               json_object_get(call, "result_status") && !json_is_null(json_object_get(call, "result_status"))
                   ? " result="
                   : "",
               json_string_value(json_object_get(call, "result_status"))
                   ? json_string_value(json_object_get(call, "result_status"))
                   : "",
               json_string_value(json_object_get(call, "created_at"))
                   ? json_string_value(json_object_get(call, "created_at"))
                   : "-",
               json_string_value(json_object_get(call, "started_at"))
                   ? json_string_value(json_object_get(call, "started_at"))
                   : "-",
               json_string_value(json_object_get(call, "settled_at"))
                   ? json_string_value(json_object_get(call, "settled_at"))
                   : "-",
               json_is_object(err) ? " error=" : "",
               json_is_object(err) && json_string_value(json_object_get(err, "code"))
                   ? json_string_value(json_object_get(err, "code"))
                   : "",
               emsg ? " (" : "", emsg ? emsg : "", emsg ? ")" : "");
    }
    json_array_foreach(json_object_get(t, "force_terminations"), i, call)
        printf("force termination    reason=%s epoch=%lld at=%s\n",
               json_string_value(json_object_get(call, "reason")),
               json_integer_value(json_object_get(call, "turn_epoch")),
               json_string_value(json_object_get(call, "at")));
    json_decref(t);
    return EXIT_OK;
}

static int cmd_turns(Cli *cli, int argc, char **argv)
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
    int c, rc;

    if (argc < 2 || strcmp(argv[1], "list") != 0)
        return die(EXIT_USAGE, "usage: turnwatch turns list [--agent A] [--status S] [--limit N]");
    optind = 2;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
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
            return die(EXIT_USAGE, "turns list: try turnwatch --help");
        }
    }
    if (optind < argc)
        return die(EXIT_USAGE, "turns list: unexpected argument '%s'", argv[optind]);
    if (agent && !tw_name_valid(agent))
        return die(EXIT_USAGE, "turns list: invalid agent name '%.80s'", agent);
    if (status) {
        bool ok = false;
        for (i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
            ok |= strcmp(status, statuses[i]) == 0;
        if (!ok)
            return die(EXIT_USAGE,
                       "turns list: --status must be one of pending, dispatched, running, suspended, "
                       "done, failed, timeout, cancelled");
    }
    {
        char *end;
        long l = strtol(limit, &end, 10);
        if (*end || end == limit || l < 1 || l > 100000)
            return die(EXIT_USAGE, "turns list: --limit must be a whole number from 1 to 100000");
    }
    if ((rc = connect_db(cli)))
        return rc;
    const char *params[] = {agent, status, limit};
    rows =
        query_json(cli,
                   "SELECT coalesce(jsonb_agg(x ORDER BY x.seq DESC), '[]') FROM ("
                   " SELECT seq, turn_id, agent, channel_id, status, turn_epoch, error, deliverable_card_id,"
                   "        created_at, ended_at FROM state.turns"
                   "  WHERE ($1::text IS NULL OR agent = $1) AND ($2::text IS NULL OR status = $2)"
                   "  ORDER BY seq DESC LIMIT $3::integer) x",
                   3, params, &rc);
    if (!rows)
        return rc;
    if (cli->json) {
        json_array_foreach(rows, i, r) json_object_del(r, "seq");
        char *s = json_dumps(rows, JSON_COMPACT);
        printf("%s\n", s ? s : "[]");
        free(s);
    } else {
        printf("%-36s  %-16s  %-10s  %5s  %-24s  %s\n", "TURN", "AGENT", "STATUS", "EPOCH", "ERROR",
               "CREATED");
        json_array_foreach(rows, i, r) printf(
            "%-36s  %-16.16s  %-10s  %5lld  %-24.24s  %s\n", json_string_value(json_object_get(r, "turn_id")),
            json_string_value(json_object_get(r, "agent")), json_string_value(json_object_get(r, "status")),
            json_integer_value(json_object_get(r, "turn_epoch")),
            json_string_value(json_object_get(r, "error")) ? json_string_value(json_object_get(r, "error"))
                                                           : "-",
            json_string_value(json_object_get(r, "created_at")));
    }
    json_decref(rows);
    return EXIT_OK;
}

/* --- tool-result and cancel --------------------------------------------------------------------- */

static int cmd_tool_result(Cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        {"turn", required_argument, NULL, 't'},
        {"call", required_argument, NULL, 'c'},
        {"status", required_argument, NULL, 's'},
        {"output", required_argument, NULL, 'o'},
        {NULL, 0, NULL, 0},
    };
    const char *turn = NULL, *call = NULL, *status = "ok", *output = NULL, *result;
    char *out_s = NULL, *err_s = NULL;
    json_t *doc, *res;
    json_error_t jerr;
    int c, rc;

    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
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
            return die(EXIT_USAGE, "tool-result: try turnwatch --help");
        }
    }
    if (optind < argc)
        return die(EXIT_USAGE, "tool-result: unexpected argument '%s'", argv[optind]);
    if (!turn || !call || !output)
        return die(EXIT_USAGE, "tool-result: --turn, --call and --output are required");
    if (!tw_uuid_valid(turn))
        return die(EXIT_USAGE, "tool-result: '%.80s' is not a turn id (a UUID)", turn);
    if (!tw_ident_valid(call))
        return die(EXIT_USAGE, "tool-result: invalid --call (1 to 256 printable characters)");
    if (strcmp(status, "ok") != 0 && strcmp(status, "error") != 0)
        return die(EXIT_USAGE, "tool-result: --status must be ok or error");
    if (strlen(output) > TW_DOC_MAX)
        return die(EXIT_USAGE, "tool-result: --output is over the %d byte limit", TW_DOC_MAX);
    if (!(doc = json_loads(output, JSON_DECODE_ANY, &jerr)))
        return die(EXIT_USAGE, "tool-result: --output is not valid JSON: %s (line %d, column %d)", jerr.text,
                   jerr.line, jerr.column);
    if (strcmp(status, "ok") == 0) {
        out_s = json_dumps(doc, JSON_COMPACT | JSON_ENCODE_ANY);
    } else {
        /* An error result: {"code","message"} as given, or the output wrapped as the message. */
        json_t *e;
        if (json_is_object(doc) && json_is_string(json_object_get(doc, "code")))
            e = json_incref(doc);
        else if (json_is_string(doc))
            e = json_pack("{s:s,s:O}", "code", "tool_error", "message", doc);
        else
            e = json_pack("{s:s,s:O}", "code", "tool_error", "detail", doc);
        err_s = json_dumps(e, JSON_COMPACT);
        json_decref(e);
    }
    json_decref(doc);
    if ((rc = connect_db(cli)) == EXIT_OK) {
        const char *params[] = {turn, call, status, out_s, err_s};
        res = query_json(
            cli, "SELECT tw.deliver_result($1::uuid, $2, $3, $4::jsonb, $5::jsonb, NULL, 'tool.result')", 5,
            params, &rc);
        if (res) {
            result = json_string_value(json_object_get(res, "result"));
            if (result && strcmp(result, "accepted") == 0) {
                publish(cli, json_object_get(res, "publish"));
                if (cli->json)
                    printf("{\"result\":\"accepted\",\"card_id\":\"%s\"}\n",
                           json_string_value(json_object_get(res, "card_id")));
                else
                    printf("accepted: tool.result card %s\n",
                           json_string_value(json_object_get(res, "card_id")));
            } else if (result && strcmp(result, "unknown_turn") == 0) {
                rc = die(EXIT_USAGE, "tool-result: no turn %s; nothing changed", turn);
            } else if (result && strcmp(result, "unknown_call") == 0) {
                rc = die(EXIT_USAGE, "tool-result: turn %s has no tool call '%s'; nothing changed", turn,
                         call);
            } else if (result && strcmp(result, "ended") == 0) {
                rc = die(EXIT_RUNTIME, "tool-result: turn %s has already ended; nothing changed", turn);
            } else if (result && strcmp(result, "duplicate") == 0) {
                rc = die(EXIT_RUNTIME,
                         "tool-result: call '%s' already has a result (the first one stands); "
                         "nothing changed",
                         call);
            } else if (result && strcmp(result, "timed_out") == 0) {
                rc = die(EXIT_RUNTIME,
                         "tool-result: call '%s' already timed out (a timeout report stands); "
                         "nothing changed",
                         call);
            } else if (result && strcmp(result, "cancelled") == 0) {
                rc = die(EXIT_RUNTIME,
                         "tool-result: call '%s' was cancelled (the turn went on without it); "
                         "nothing changed",
                         call);
            } else {
                rc = die(EXIT_RUNTIME, "tool-result: refused (%s); nothing changed", result ? result : "?");
            }
            json_decref(res);
        }
    }
    free(out_s);
    free(err_s);
    return rc;
}

static int cmd_cancel(Cli *cli, int argc, char **argv)
{
    json_t *res;
    const char *result;
    int rc;

    if (argc != 2)
        return die(EXIT_USAGE, "usage: turnwatch cancel ID");
    if (!tw_uuid_valid(argv[1]))
        return die(EXIT_USAGE, "cancel: '%.80s' is not a turn id (a UUID)", argv[1]);
    if ((rc = connect_db(cli)))
        return rc;
    const char *params[] = {argv[1]};
    if (!(res = query_json(cli, "SELECT tw.cancel_turn($1::uuid)", 1, params, &rc)))
        return rc;
    result = json_string_value(json_object_get(res, "result"));
    if (result && strcmp(result, "cancelled") == 0) {
        publish(cli, json_object_get(res, "publish"));
        if (cli->json)
            printf("{\"turn_id\":\"%s\",\"result\":\"cancelled\",\"status\":\"cancelled\"}\n", argv[1]);
        else
            printf("cancelled %s\n", argv[1]);
    } else if (result && strcmp(result, "already_ended") == 0) {
        const char *status = json_string_value(json_object_get(res, "status"));
        if (cli->json)
            printf("{\"turn_id\":\"%s\",\"result\":\"already_ended\",\"status\":\"%s\"}\n", argv[1], status);
        rc = die(EXIT_RUNTIME, "cancel: turn %s has already ended (%s); nothing changed", argv[1], status);
    } else {
        rc = die(EXIT_USAGE, "cancel: no turn %s", argv[1]);
    }
    json_decref(res);
    return rc;
}

/* --- events ------------------------------------------------------------------------------------ */

static volatile sig_atomic_t events_stop;

static void events_signal(int sig)
{
    events_stop = 1;
}

static void events_disconnected(natsConnection *nc, void *closure)
{
    if (events_stop)
        return; /* our own close on Ctrl-C */
    fprintf(stderr, "turnwatch: events: NATS connection lost; reconnecting\n");
}

static void events_reconnected(natsConnection *nc, void *closure)
{
    fprintf(stderr, "turnwatch: events: NATS connection back\n");
}

static int cmd_events(Cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {{"agent", required_argument, NULL, 'a'}, {NULL, 0, NULL, 0}};
    const char *agent = NULL;
    char subject[128];
    natsConnection *nc = NULL;
    natsOptions *no = NULL;
    natsSubscription *sub = NULL;
    natsStatus s;
    int c;

    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c != 'a')
            return die(EXIT_USAGE, "events: try turnwatch --help");
        agent = optarg;
    }
    if (optind < argc)
        return die(EXIT_USAGE, "events: unexpected argument '%s'", argv[optind]);
    if (agent && !tw_name_valid(agent))
        return die(EXIT_USAGE, "events: invalid agent name '%.80s'", agent);
    snprintf(subject, sizeof subject, "evt.agent.%s.>", agent ? agent : "*");
    if (!agent)
        snprintf(subject, sizeof subject, "evt.agent.>");
    signal(SIGINT, events_signal);
    signal(SIGTERM, events_signal);
    signal(SIGPIPE, SIG_IGN);

    s = tw_nats_options_create(&no, cli->cfg.nats_url);
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(no, -1);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(no, 250);
    if (s == NATS_OK)
        s = natsOptions_SetDisconnectedCB(no, events_disconnected, NULL);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(no, events_reconnected, NULL);
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, no);
    if (s == NATS_OK)
        s = natsConnection_SubscribeSync(&sub, nc, subject);
    if (s == NATS_OK)
        s = natsConnection_Flush(nc);
    if (s != NATS_OK) {
        natsOptions_Destroy(no);
        natsConnection_Destroy(nc);
        return die(EXIT_RUNTIME, "events: cannot subscribe at %s: %s", cli->cfg.nats_url,
                   natsStatus_GetText(s));
    }
    natsSubscription_SetPendingLimits(sub, -1, -1);
    if (cli->verbose)
        fprintf(stderr, "turnwatch: events: listening on %s\n", subject);
    while (!events_stop) {
        natsMsg *msg = NULL;
        s = natsSubscription_NextMsg(&msg, sub, 200);
        if (s == NATS_TIMEOUT)
            continue;
        if (s != NATS_OK)
            break;
        json_t *payload = json_loadb(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), 0, NULL);
        if (json_is_object(payload)) {
            json_t *line = json_pack("{s:s}", "subject", natsMsg_GetSubject(msg));
            json_object_update(line, payload);
            char *text = json_dumps(line, JSON_COMPACT);
            if (text)
                printf("%s\n", text);
            free(text);
            json_decref(line);
        }
        json_decref(payload);
        fflush(stdout);
        natsMsg_Destroy(msg);
    }
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(nc);
    natsOptions_Destroy(no);
    return EXIT_OK;
}

/* --- main -------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"json", no_argument, NULL, 'j'},
        {"verbose", no_argument, NULL, 'v'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {"check-config", no_argument, NULL, 'C'},
        {NULL, 0, NULL, 0},
    };
    Cli cli = {.config_path = TW_DEFAULT_CONFIG};
    const char *cmd;
    int c, rc;

    /* Global options come before the command; the command parses the rest. */
    while ((c = getopt_long(argc, argv, "+c:vh", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            cli.config_path = optarg;
            break;
        case 'j':
            cli.json = true;
            break;
        case 'v':
            cli.verbose = true;
            break;
        case 'V':
            printf("turnwatch %s\n", TW_VERSION);
            return EXIT_OK;
        case 'C':
            cli.check_config = true;
            break;
        case 'h':
            fputs(usage_text, stdout);
            return EXIT_OK;
        default:
            fputs(usage_text, stderr);
            return EXIT_USAGE;
        }
    }
    if (cli.check_config)
        return optind < argc ? die(EXIT_USAGE, "--check-config takes no command") : check_config(&cli);
    if (optind >= argc) {
        fputs(usage_text, stderr);
        return EXIT_USAGE;
    }
    argc -= optind;
    argv += optind;
    cmd = argv[0];
    /* Also accept the global options after the command (turnwatch submit ... --json -c FILE). */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0 || strcmp(argv[i], "-v") == 0 ||
            strcmp(argv[i], "--verbose") == 0) {
            if (argv[i][2] == 'j')
                cli.json = true;
            else
                cli.verbose = true;
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i) * sizeof *argv);
            argc--;
            i--;
        } else if ((strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--config") == 0) && i + 1 < argc) {
            cli.config_path = argv[i + 1];
            memmove(&argv[i], &argv[i + 2], (size_t)(argc - i - 1) * sizeof *argv);
            argc -= 2;
            i--;
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            cli.config_path = argv[i] + 9;
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i) * sizeof *argv);
            argc--;
            i--;
        }
    }
    if (strcmp(cmd, "help") == 0) {
        fputs(usage_text, stdout);
        return EXIT_OK;
    }
    tw_log_init("turnwatch", cli.verbose ? TW_LOG_DEBUG : TW_LOG_WARN);
    if ((rc = load_config(&cli)))
        return rc;
    if (strcmp(cmd, "migrate") == 0)
        rc = cmd_migrate(&cli, argc, argv);
    else if (strcmp(cmd, "submit") == 0)
        rc = cmd_submit(&cli, argc, argv);
    else if (strcmp(cmd, "turn") == 0)
        rc = cmd_turn(&cli, argc, argv);
    else if (strcmp(cmd, "turns") == 0)
        rc = cmd_turns(&cli, argc, argv);
    else if (strcmp(cmd, "tool-result") == 0)
        rc = cmd_tool_result(&cli, argc, argv);
    else if (strcmp(cmd, "cancel") == 0)
        rc = cmd_cancel(&cli, argc, argv);
    else if (strcmp(cmd, "events") == 0)
        rc = cmd_events(&cli, argc, argv);
    else
        rc = die(EXIT_USAGE, "unknown command '%.40s'; try turnwatch --help", cmd);
    if (cli.conn)
        PQfinish(cli.conn);
    tw_config_free(&cli.cfg);
    nats_Close();
    return rc;
}
