/* The turnwatch CLI's shared context: configuration, the database connection, errors and JSON output. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <nats/nats.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bus.h"
#include "log.h"
#include "names.h"
#include "natsopts.h"
#include "outbox.h"
#include "stream.h"
#include "utf8.h"

const char *cli_text(const char *s)
{
    static char *ring[64];
    static unsigned next;

    if (!s)
        return NULL;
    char **slot = &ring[next++ % 64];
    free(*slot);
    *slot = tw_text_escaped(s, strlen(s));
    return *slot ? *slot : "(out of memory)";
}

int cli_die(int code, const char *fmt, ...)
{
    va_list ap;
    char *msg = NULL;

    va_start(ap, fmt);
    int n = vasprintf(&msg, fmt, ap);
    if (n < 0)
        msg = NULL;
    va_end(ap);
    fprintf(stderr, "turnwatch: %s\n", n >= 0 ? cli_text(msg) : "out of memory");
    free(msg);
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

const char *cli_role_text(CliRole role)
{
    switch (role) {
    case CLI_ROLE_OBSERVER:
        return "turnwatch_observer (or turnwatch_client)";
    case CLI_ROLE_CLIENT:
        return "turnwatch_client";
    case CLI_ROLE_OWNER:
        return "the owner of schemas state and tw (the role that ran the first migrate)";
    case CLI_ROLE_NONE:
        break;
    }
    return "none (no database)";
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
        tw_nats_warn_modes(&cli->cfg);
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

/* One attempt; the message of a failure in msg. */
static PGconn *db_connect(Cli *cli, char *msg, size_t size)
{
    PGconn *conn = PQconnectdb(cli->cfg.pg_dsn);

    if (PQstatus(conn) != CONNECTION_OK) {
        /* libpq's message may span lines (one per host tried); the CLI's failures are one line. */
        snprintf(msg, size, "%s", PQerrorMessage(conn));
        for (char *p = msg; *p; p++)
            if (*p == '\n' || *p == '\t')
                *p = p[1] ? ' ' : '\0';
        PQfinish(conn);
        return NULL;
    }
    PQsetNoticeProcessor(conn, quiet_notices, cli);
    /* What the turn history records as the actor of the changes this command makes. */
    PQclear(PQexec(conn, "SELECT set_config('tw.actor', 'cli', false)"));
    return conn;
}

static bool db_reconnect(Cli *cli, char *msg, size_t size);

/* The DSN names several hosts (a formation with a standby): a failed connect may be a failover under way. */
static bool dsn_multi_host(const char *dsn)
{
    PQconninfoOption *opts = PQconninfoParse(dsn, NULL);
    bool multi = false;

    for (PQconninfoOption *o = opts; o && o->keyword; o++)
        if ((strcmp(o->keyword, "host") == 0 || strcmp(o->keyword, "hostaddr") == 0) && o->val &&
            strchr(o->val, ','))
            multi = true;
    PQconninfoFree(opts);
    return multi;
}

PGconn *cli_db(Cli *cli, int *code)
{
    char dsn[512], msg[1024];

    if (cli->conn)
        return cli->conn;
    /* With several hosts, no primary may be there for a few seconds (a failover promoting the standby): keep
     * trying for query_timeout_seconds, as after a lost connection. With one, fail at once. */
    if (!(cli->conn = db_connect(cli, msg, sizeof msg)) && dsn_multi_host(cli->cfg.pg_dsn))
        db_reconnect(cli, msg, sizeof msg);
    if (!cli->conn)
        *code = cli_die(CLI_EXIT_RUNTIME, "cannot connect to PostgreSQL (%s): %s",
                        tw_redact_dsn(cli->cfg.pg_dsn, dsn, sizeof dsn), msg);
    return cli->conn;
}

/* A new connection after the old one was lost or landed on a read-only node: tried every 250 ms (libpq goes
 * through the DSN's hosts each time) while a failover may still be promoting the standby, for at most
 * query_timeout_seconds. */
static bool db_reconnect(Cli *cli, char *msg, size_t size)
{
    struct timespec t0, now;

    PQfinish(cli->conn);
    cli->conn = NULL;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if ((cli->conn = db_connect(cli, msg, size)))
            return true;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec >= cli->cfg.pg_query_timeout_sec)
            return false;
        nanosleep(&(struct timespec){0, 250 * 1000000L}, NULL);
    }
}

int cli_permission_denied(Cli *cli, const char *why)
{
    const char *user = cli->conn ? PQuser(cli->conn) : NULL;
    CliRole role = cli->cmd ? cli->cmd->role : CLI_ROLE_CLIENT;
    char said[256];

    snprintf(said, sizeof said, "%s", why);
    said[strcspn(said, "\n")] = '\0';
    if (role == CLI_ROLE_OWNER)
        return cli_die(CLI_EXIT_RUNTIME,
                       "permission denied: `turnwatch %s` must run as %s, not as %s; PostgreSQL said: %s",
                       cli->cmd_name, cli_role_text(role), user ? user : "this role", said);
    /* The role that is enough: for a read, turnwatch_observer. */
    return cli_die(
        CLI_EXIT_RUNTIME,
        "permission denied: `turnwatch %s` needs the role %s (GRANT %s TO %s); PostgreSQL said: %s",
        cli->cmd_name, cli_role_text(role),
        role == CLI_ROLE_OBSERVER ? "turnwatch_observer" : "turnwatch_client", user ? user : "<user>", said);
}

PGresult *cli_query(Cli *cli, const char *sql, int n, const char *const *params, int *code)
{
    PGconn *conn = cli_db(cli, code);
    PGresult *res;
    ExecStatusType st;
    char why[1024];

    if (!conn)
        return NULL;
    for (int attempt = 0;; attempt++) {
        res = PQexecParams(cli->conn, sql, n, NULL, params, NULL, NULL, 0);
        st = PQresultStatus(res);
        if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)
            return res;
        const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        bool read_only = state && strcmp(state, "25006") == 0;
        bool lost = PQstatus(cli->conn) == CONNECTION_BAD;
        if (attempt > 0 || !(read_only || (lost && cli->idempotent))) {
            if (read_only) {
                *code =
                    cli_die(CLI_EXIT_RUNTIME,
                            "%s: PostgreSQL refused the write: the server is read-only (SQLSTATE 25006: a "
                            "standby, or a primary being demoted); nothing changed. List every node in "
                            "[postgres] dsn with target_session_attrs=read-write",
                            cli->cmd_name);
                PQclear(res);
                return NULL;
            }
            if (lost) {
                snprintf(why, sizeof why, "%s", PQerrorMessage(cli->conn));
                for (char *p = why; *p; p++)
                    if (*p == '\n' || *p == '\t')
                        *p = p[1] ? ' ' : '\0';
                *code = cli_die(
                    CLI_EXIT_RUNTIME,
                    "%s: the connection to PostgreSQL was lost while the command ran (%s); whether "
                    "it took effect is unknown%s",
                    cli->cmd_name, why,
                    cli->idempotent ? "" : " (a submit with --idempotency-key can be repeated safely)");
                PQclear(res);
                return NULL;
            }
            break;
        }
        PQclear(res);
        if (cli->verbose)
            fprintf(stderr, "turnwatch: %s; connecting again and running it once more\n",
                    read_only ? "the server is read-only" : "the connection was lost");
        if (!db_reconnect(cli, why, sizeof why)) {
            char dsn[512];
            *code = cli_die(
                CLI_EXIT_RUNTIME, "%s: %s, and no primary answered within %d s (%s): %s", cli->cmd_name,
                read_only ? "the server was read-only"
                          : "the connection to PostgreSQL was lost; whether the command took effect "
                            "is unknown",
                cli->cfg.pg_query_timeout_sec, tw_redact_dsn(cli->cfg.pg_dsn, dsn, sizeof dsn), why);
            return NULL;
        }
    }
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
    if (state && strcmp(state, "42501") == 0) {
        *code = cli_permission_denied(cli, msg ? msg : PQerrorMessage(cli->conn));
        PQclear(res);
        return NULL;
    }
    /* 22xxx/23xxx: the input was refused (bad value, constraint); anything else is a runtime failure. */
    bool input = state && (strncmp(state, "22", 2) == 0 || strncmp(state, "23", 2) == 0);
    *code = cli_die(input ? CLI_EXIT_USAGE : CLI_EXIT_RUNTIME, "%s", msg ? msg : PQerrorMessage(cli->conn));
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

json_t *cli_turn_doc(Cli *cli, int argc, char **argv, const char *cmd, const char *sql, int *code)
{
    PGresult *res;
    json_t *j = NULL;
    bool missing;

    if (argc != 2) {
        *code = cli_die(CLI_EXIT_USAGE, "usage: turnwatch %s ID", cmd);
        return NULL;
    }
    if (!tw_uuid_valid(argv[1])) {
        *code = cli_die(CLI_EXIT_USAGE, "%s: '%.80s' is not a turn id (a UUID)", cmd, argv[1]);
        return NULL;
    }
    const char *params[] = {argv[1]};
    if (!(res = cli_query(cli, sql, 1, params, code)))
        return NULL;
    missing = PQntuples(res) != 1 || PQgetisnull(res, 0, 0);
    if (!missing)
        j = json_loads(PQgetvalue(res, 0, 0), JSON_DECODE_ANY, NULL);
    PQclear(res);
    if (missing || (json_is_array(j) && json_array_size(j) == 0)) {
        json_decref(j);
        *code = cli_die(CLI_EXIT_USAGE, "%s: no turn %s", cmd, argv[1]);
        return NULL;
    }
    if (!j)
        *code = cli_die(CLI_EXIT_RUNTIME, "unexpected answer from the database");
    return j;
}

/* --- output ------------------------------------------------------------------------------------ */

int cli_need_name(const char *noun, const char *kind, const char *what, int argc, char **argv, int at)
{
    if (at != argc - 1)
        return cli_die(CLI_EXIT_USAGE, "usage: turnwatch %s %s NAME", noun, what);
    if (!tw_name_valid(argv[at]))
        return cli_die(CLI_EXIT_USAGE, "%s %s: invalid %s name '%.80s' (allowed: [A-Za-z0-9_-]{1,64})", noun,
                       what, kind, argv[at]);
    return CLI_EXIT_OK;
}

json_t *cli_named_doc(Cli *cli, int argc, char **argv, const char *noun, const char *kind, const char *sql,
                      int *code)
{
    json_t *doc;

    if ((*code = cli_need_name(noun, kind, "show", argc, argv, 1)) != CLI_EXIT_OK)
        return NULL;
    const char *params[] = {argv[1]};
    if (!(doc = cli_query_json(cli, sql, 1, params, code)))
        return NULL;
    if (json_is_null(doc)) {
        json_decref(doc);
        *code = cli_die(CLI_EXIT_USAGE, "%s show: no %s %s", noun, kind, argv[1]);
        return NULL;
    }
    return doc;
}

int cli_named_remove(Cli *cli, int argc, char **argv, const char *noun, const char *kind, const char *sql)
{
    int rc;
    json_t *r;

    if ((rc = cli_need_name(noun, kind, "remove", argc, argv, 1)) != CLI_EXIT_OK)
        return rc;
    const char *params[] = {argv[1]};
    if (!(r = cli_query_json(cli, sql, 1, params, &rc)))
        return rc;
    bool was = json_is_true(r);
    json_decref(r);
    if (cli->json)
        return cli_print_json(json_pack("{s:s,s:b}", "name", argv[1], "removed", was));
    if (!was)
        return cli_die(CLI_EXIT_USAGE, "%s remove: no %s %s", noun, kind, argv[1]);
    printf("%s %s removed\n", kind, argv[1]);
    return CLI_EXIT_OK;
}

int cli_list_rows(Cli *cli, int argc, const char *noun, const char *sql, void (*row)(json_t *))
{
    int rc = CLI_EXIT_OK;
    json_t *list, *e;
    size_t i;

    if (argc != 1)
        return cli_die(CLI_EXIT_USAGE, "usage: turnwatch %s list [--json]", noun);
    if (!(list = cli_query_json(cli, sql, 0, NULL, &rc)))
        return rc;
    if (cli->json)
        return cli_print_json(list);
    row(NULL);
    json_array_foreach(list, i, e) row(e);
    json_decref(list);
    return rc;
}

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

/* The CLI may mark events published only where the publisher may: under turnwatch_daemon or the owner, never
 * under turnwatch_client (a client that could mark events would hide any event it wrote). */
static bool cli_may_mark(Cli *cli)
{
    int code;
    PGresult *res = cli_query(cli,
                              "SELECT coalesce(has_function_privilege("
                              "to_regprocedure('tw.outbox_mark_published(uuid[])'), 'EXECUTE'), false)",
                              0, NULL, &code);
    bool may = res && PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't';

    PQclear(res);
    return may;
}

void cli_publish(Cli *cli, json_t *items)
{
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    natsOptions *opts = NULL;
    natsStatus s;
    json_t *it, *ids = NULL;
    size_t i, n_events = 0;
    bool mark;

    if (!json_is_array(items) || json_array_size(items) == 0)
        return;
    json_array_foreach(items, i, it) n_events += json_is_string(json_object_get(it, "event_id"));
    /* Events this command may not mark are left to the PMO's relay, as the SQL API's are: NOTIFY tw_outbox
     * has it relay them now (a PMO that does not hear it relays them within a second or two). Only the
     * doorbells go from here. */
    mark = n_events == 0 || cli_may_mark(cli);
    if (!mark) {
        int code;
        PQclear(cli_query(cli, "SELECT pg_notify('tw_outbox', '')", 0, NULL, &code));
        if (n_events == json_array_size(items))
            return;
    }
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
        if (!subject || !data || !tw_subject_valid(subject) || (!mark && json_is_string(event_id)))
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
