/* The turnwatch CLI's shared context: configuration, the database connection, errors and JSON output. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <nats/nats.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bus.h"
#include "log.h"
#include "names.h"
#include "natsopts.h"
#include "outbox.h"
#include "stream.h"

int cli_die(int code, const char *fmt, ...)
{
    va_list ap;

    fputs("turnwatch: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return code;
}

int cli_bad_option(Cli *cli, int c, char **argv)
{
    /* getopt_long leaves optind past the word of a long option; for a short one (none of ours takes any)
     * optopt names the letter. */
    char shortopt[3] = {'-', (char)optopt, '\0'};
    const char *what = strncmp(argv[optind - 1], "--", 2) == 0 ? argv[optind - 1] : shortopt;
    int len = (int)strcspn(what, "=");

    if (c == ':')
        return cli_die(CLI_EXIT_USAGE, "%s: option '%.*s' needs a value; try turnwatch %s --help",
                       cli->cmd_name, len < 80 ? len : 80, what, cli->cmd_name);
    return cli_die(CLI_EXIT_USAGE, "%s: unknown option '%.*s'; try turnwatch %s --help", cli->cmd_name,
                   len < 80 ? len : 80, what, cli->cmd_name);
}

bool cli_parse_long(const char *s, long min, long max, long *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < min || v > max)
        return false;
    *out = v;
    return true;
}

/* --- configuration ----------------------------------------------------------------------------- */

int cli_config_load(Cli *cli)
{
    if (tw_config_load(&cli->cfg, cli->config_path) != 0) {
        char *nl = cli->cfg.errors ? strchr(cli->cfg.errors, '\n') : NULL;
        if (nl)
            *nl = '\0';
        int rc = cli_die(CLI_EXIT_USAGE, "configuration: %s%s", cli->cfg.errors ? cli->cfg.errors : "invalid",
                         cli->cfg.n_errors > 1 ? " (and more; see turnwatch --check-config)" : "");
        tw_config_free(&cli->cfg);
        return rc;
    }
    return CLI_EXIT_OK;
}

int cli_check_config(Cli *cli)
{
    int rc = CLI_EXIT_OK;

    /* The [nats] files too (turnwatch events and the CLI's own publishing read them). */
    if (tw_config_load(&cli->cfg, cli->config_path) != 0 || tw_nats_check(&cli->cfg) != 0) {
        fputs(cli->cfg.errors ? cli->cfg.errors : "configuration error\n", stderr);
        fprintf(stderr, "turnwatch: %s: %d error%s\n", cli->config_path, cli->cfg.n_errors,
                cli->cfg.n_errors == 1 ? "" : "s");
        rc = CLI_EXIT_RUNTIME;
    } else {
        printf("turnwatch: %s is valid: %zu agent%s, %zu tool%s\n", cli->config_path, cli->cfg.n_agents,
               cli->cfg.n_agents == 1 ? "" : "s", cli->cfg.n_tools, cli->cfg.n_tools == 1 ? "" : "s");
    }
    tw_config_free(&cli->cfg);
    return rc;
}

/* --- database ---------------------------------------------------------------------------------- */

static void quiet_notices(void *arg, const char *message)
{
    Cli *cli = arg;

    /* NOTICEs ("already exists, skipping") are noise to a CLI user; -v shows them. */
    if (cli->verbose)
        fprintf(stderr, "turnwatch: %s", message);
}

PGconn *cli_db(Cli *cli, int *code)
{
    char dsn[512];

    if (cli->conn)
        return cli->conn;
    cli->conn = PQconnectdb(cli->cfg.pg_dsn);
    if (PQstatus(cli->conn) != CONNECTION_OK) {
        /* libpq's message may span lines; the CLI's failures are one line. */
        char *msg = PQerrorMessage(cli->conn), *nl;
        while ((nl = strchr(msg, '\n')) && nl[1])
            *nl = ' ';
        if ((nl = strchr(msg, '\n')))
            *nl = '\0';
        *code = cli_die(CLI_EXIT_RUNTIME, "cannot connect to PostgreSQL (%s): %s",
                        tw_redact_dsn(cli->cfg.pg_dsn, dsn, sizeof dsn), msg);
        PQfinish(cli->conn);
        cli->conn = NULL;
        return NULL;
    }
    PQsetNoticeProcessor(cli->conn, quiet_notices, cli);
    /* What the turn history records as the actor of the changes this command makes. */
    PQclear(PQexec(cli->conn, "SELECT set_config('tw.actor', 'cli', false)"));
    return cli->conn;
}

PGresult *cli_query(Cli *cli, const char *sql, int n, const char *const *params, int *code)
{
    PGconn *conn = cli_db(cli, code);
    PGresult *res;
    ExecStatusType st;

    if (!conn)
        return NULL;
    res = PQexecParams(conn, sql, n, NULL, params, NULL, NULL, 0);
    st = PQresultStatus(res);
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)
        return res;
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
    /* 22xxx/23xxx: the input was refused (bad value, constraint); anything else is a runtime failure. */
    bool input = state && (strncmp(state, "22", 2) == 0 || strncmp(state, "23", 2) == 0);
    *code = cli_die(input ? CLI_EXIT_USAGE : CLI_EXIT_RUNTIME, "%s", msg ? msg : PQerrorMessage(conn));
    PQclear(res);
    return NULL;
}

json_t *cli_query_json(Cli *cli, const char *sql, int n, const char *const *params, int *code)
{
    PGresult *res = cli_query(cli, sql, n, params, code);
    json_t *j = NULL;

    if (!res)
        return NULL;
    if (PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
        j = json_loads(PQgetvalue(res, 0, 0), JSON_DECODE_ANY, NULL);
    PQclear(res);
    if (!j)
        *code = cli_die(CLI_EXIT_RUNTIME, "unexpected answer from the database");
    return j;
}

/* --- output ------------------------------------------------------------------------------------ */

int cli_print_json(json_t *doc)
{
    char *text = doc ? json_dumps(doc, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    int rc = CLI_EXIT_OK;

    json_decref(doc);
    if (!text)
        return cli_die(CLI_EXIT_RUNTIME, "cannot encode the JSON output");
    if (puts(text) == EOF || fflush(stdout) == EOF)
        rc = cli_die(CLI_EXIT_RUNTIME, "cannot write to stdout: %s", strerror(errno));
    free(text);
    return rc;
}

/* --- events ------------------------------------------------------------------------------------ */

void cli_publish(Cli *cli, json_t *items)
{
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    natsOptions *opts = NULL;
    natsStatus s;
    json_t *it, *ids = NULL;
    size_t i;

    if (!json_is_array(items) || json_array_size(items) == 0)
        return;
    char why[1024];
    if (tw_nats_options_create(&opts, &cli->cfg, why, sizeof why) != NATS_OK) {
        /* A configuration problem, not an outage: said whether -v or not. */
        fprintf(stderr, "turnwatch: %s; the PMO's relay will publish the events\n", why);
        goto out;
    }
    s = natsOptions_SetTimeout(opts, 2000);
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, opts);
    if (s != NATS_OK) {
        if (cli->verbose || tw_nats_refused(s))
            fprintf(stderr, "turnwatch: NATS %s (%s%s%s); the PMO's relay will publish the events\n",
                    tw_nats_refused(s) ? "refused the credentials" : "not reachable", natsStatus_GetText(s),
                    tw_nats_refused(s) ? "; check " : "",
                    tw_nats_refused(s) ? tw_nats_auth_keys(&cli->cfg) : "");
        goto out;
    }
    /* With an events stream, an event counts as published once the stream kept it (as in the daemons). */
    if (cli->cfg.nats_events_stream[0] && natsConnection_JetStream(&js, nc, NULL) != NATS_OK)
        js = NULL;
    ids = json_array();
    json_array_foreach(items, i, it)
    {
        const char *subject = json_string_value(json_object_get(it, "subject"));
        json_t *event_id = json_object_get(it, "event_id");
        char *owned = NULL;
        const char *data = tw_item_payload(it, &owned);
        /* Doorbells have no event_id: there is nothing to mark for them. A subject that is no subject is
         * never written into a PUB line (the PMO's relay refuses it too). */
        if (!subject || !data || !tw_subject_valid(subject))
            ;
        else if (json_is_string(event_id) && cli->cfg.nats_events_stream[0]) {
            if (js && tw_stream_publish(js, subject, data, strlen(data), json_string_value(event_id), 2000) ==
                          NATS_OK)
                json_array_append(ids, event_id);
        } else if (natsConnection_PublishString(nc, subject, data) == NATS_OK && json_is_string(event_id)) {
            json_array_append(ids, event_id);
        }
        free(owned);
    }
    if (json_array_size(ids) > 0 && natsConnection_FlushTimeout(nc, 2000) == NATS_OK) {
        char *text = json_dumps(ids, JSON_COMPACT);
        const char *params[] = {text};
        int code;
        if (text) {
            PGresult *res = cli_query(
                cli,
                "SELECT tw.outbox_mark_published(ARRAY(SELECT jsonb_array_elements_text($1::jsonb)::uuid))",
                1, params, &code);
            PQclear(res);
        }
        free(text);
    }
out:
    json_decref(ids);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    natsOptions_Destroy(opts);
}
