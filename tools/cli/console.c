/* turnwatch console: a read-only web console (docs/python.md) served by the CLI with libevent's evhttp.
 * The page (tools/cli/console/, built into the binary) reads JSON from /api/, which this file answers from
 * the tw.* read functions on a few database sessions of its own (common/pgpool.c), read only and with a
 * statement timeout. Queries are asynchronous on the event loop: a slow one (a statement that runs up to its
 * timeout) holds one session and its own request, while the other requests go on over the other sessions.
 * Everything but GET and HEAD is refused with 405, methods evhttp does not know included; every input is
 * validated first (console_query.c); each response says what the page may load (Content-Security-Policy:
 * this origin only), the pages evhttp writes itself (400, 413) too. */
#include <dirent.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "console_assets.h"
#include "console_query.h"
#include "log.h"
#include "names.h"
#include "pgpool.h"

/* A client that stalls is dropped after this long without progress (evhttp's timeout). */
#define CONSOLE_TIMEOUT_SEC 10
/* Connections open at once; past it the listener pauses until some close. */
#define CONSOLE_MAX_CONNECTIONS 64
#define CONSOLE_MAX_HEADERS 8192
/* Bodies are never read for anything; a small one is taken so that a POST gets its 405. */
#define CONSOLE_MAX_BODY 1024
/* Every statement of the console's sessions ends after this long (statement_timeout). */
#define CONSOLE_STATEMENT_TIMEOUT "5s"
/* Database sessions: as many requests run their queries at once; more wait for a session. */
#define CONSOLE_DB_SESSIONS 4
/* A delegation tree is drawn with at most this many turns (the first, depth first); the page says when some
 * are left out. */
#define CONSOLE_TREE_MAX "500"
/* libevent 2.1 gives a method it does not know (PROPFIND, ...) this type (http-internal.h's
 * EVHTTP_REQ_UNKNOWN_); allowed, it reaches request_cb and its 405 instead of evhttp's own 501. */
#define CONSOLE_REQ_UNKNOWN (1 << 15)

static const char csp[] = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
                          "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
                          "form-action 'self'; frame-ancestors 'none'";

typedef struct Console {
    struct event_base *base;
    struct evhttp *http;
    struct evconnlistener *listener;
    struct event *sigint, *sigterm, *recheck;
    const char *dsn;
    TwPgPool db;
    bool replying; /* in reply(): a response head written now is ours, with its headers */
    char host[256];
    int port;
    bool any_host; /* listening on every address: any Host header is the operator's choice */
    TwLogLimit db_log;
} Console;

/* --- the database sessions -------------------------------------------------------------------- */

/* Each session of the pool: read only (default_transaction_read_only), every statement bounded, timestamps in
 * UTC. A standby serves as well as the primary. */
static const char console_session_sql[] =
    "SET default_transaction_read_only = on; SET statement_timeout = '" CONSOLE_STATEMENT_TIMEOUT
    "'; SET lock_timeout = '1s'; SET TimeZone = 'UTC'";

/* Whether PostgreSQL can be reached now (at start, to say so once): false with why in buf. */
static bool console_db_probe(const Console *c, char *why, size_t why_size)
{
    static const char *const keys[] = {"dbname", "connect_timeout", "application_name", NULL};
    const char *const values[] = {c->dsn, "5", "turnwatch-console", NULL};
    PGconn *db = PQconnectdbParams(keys, values, 1);
    bool ok = PQstatus(db) == CONNECTION_OK;

    if (!ok) {
        snprintf(why, why_size, "%s", PQerrorMessage(db));
        why[strcspn(why, "\n")] = '\0';
    }
    PQfinish(db);
    return ok;
}

/* --- replies ----------------------------------------------------------------------------------- */

static void common_headers(struct evhttp_request *req, const char *type)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);

    evhttp_add_header(h, "Content-Type", type);
    evhttp_add_header(h, "Content-Security-Policy", csp);
    evhttp_add_header(h, "X-Content-Type-Options", "nosniff");
    evhttp_add_header(h, "X-Frame-Options", "DENY");
    evhttp_add_header(h, "Referrer-Policy", "no-referrer");
    evhttp_add_header(h, "Cross-Origin-Resource-Policy", "same-origin");
    evhttp_add_header(h, "Cache-Control", "no-store");
}

static void reply(Console *c, struct evhttp_request *req, int code, const char *reason, const char *type,
                  const void *body, size_t size)
{
    struct evbuffer *buf = evbuffer_new();

    common_headers(req, type);
    if (buf && body && size)
        evbuffer_add(buf, body, size);
    c->replying = true;
    evhttp_send_reply(req, code, reason, buf);
    c->replying = false;
    if (buf)
        evbuffer_free(buf);
}

/* {"error": message} with the status code. */
static void reply_error(Console *c, struct evhttp_request *req, int code, const char *reason,
                        const char *message)
{
    json_t *doc = json_pack("{s:s}", "error", message);
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;

    reply(c, req, code, reason, "application/json", text ? text : "{}", text ? strlen(text) : 2);
    free(text);
    json_decref(doc);
}

/* The pages evhttp answers itself, before any callback of ours (400 for a request it cannot parse, 413 for a
 * body over the limit), carry only its own headers. Every connection's output buffer calls this after each
 * write to it: evhttp writes a response's status line in one piece, then each header line, so a status line
 * written while reply() is not running is one of evhttp's pages, and the security headers go in right after
 * it (a 1xx head, written whole, is left alone). No body the console sends begins with "HTTP/". */
static void security_headers_cb(struct evbuffer *out, const struct evbuffer_cb_info *info, void *arg)
{
    Console *c = arg;
    struct evbuffer_ptr at;
    char head[16];
    int code;

    if (c->replying || info->n_added < 13 || info->n_deleted ||
        info->orig_size + info->n_added > evbuffer_get_length(out))
        return;
    if (evbuffer_ptr_set(out, &at, info->orig_size, EVBUFFER_PTR_SET) < 0 ||
        evbuffer_copyout_from(out, &at, head, sizeof head - 1) < 13)
        return;
    head[sizeof head - 1] = '\0';
    if (strncmp(head, "HTTP/1.", 7) != 0 || sscanf(head + 9, "%3d", &code) != 1 || code < 200)
        return;
    evbuffer_add_printf(out,
                        "Content-Security-Policy: %s\r\nX-Content-Type-Options: nosniff\r\n"
                        "X-Frame-Options: DENY\r\nReferrer-Policy: no-referrer\r\n"
                        "Cross-Origin-Resource-Policy: same-origin\r\nCache-Control: no-store\r\n",
                        csp);
}

/* --- the API ----------------------------------------------------------------------------------- */

/* A request waiting for its query. */
typedef struct ConsoleQuery {
    Console *c;
    struct evhttp_request *req;
    const char *sql; /* a literal */
} ConsoleQuery;

/* The answer to reply_query's statement: 200 with its value, 404 when it is NULL, 400 when PostgreSQL refused
 * the input (SQLSTATE class 22), 503 when the database cannot answer now. */
static void query_done(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    ConsoleQuery *q = arg;
    Console *c = q->c;
    struct evhttp_request *req = q->req;
    char why[512];

    if (!err && res && PQresultStatus(res) == PGRES_TUPLES_OK) {
        if (PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
            reply(c, req, 200, "OK", "application/json", PQgetvalue(res, 0, 0),
                  (size_t)PQgetlength(res, 0, 0));
        else
            reply_error(c, req, 404, "Not Found", "no such turn");
        free(q);
        return;
    }
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    snprintf(why, sizeof why, "%s", msg ? msg : err ? err : "no result");
    why[strcspn(why, "\n")] = '\0';
    if (!state) {
        /* No session (PostgreSQL down, or the console stopping): the pool connects again by itself. */
        tw_log_warn_limited(&c->db_log, "console: cannot reach PostgreSQL: %s", why);
        reply_error(c, req, 503, "Service Unavailable", "the database cannot be reached now; try again");
    } else if (strncmp(state, "22", 2) == 0) {
        reply_error(c, req, 400, "Bad Request", why);
    } else if (strcmp(state, "42501") == 0) {
        /* The console reads through the functions turnwatch_observer may execute (docs/security.md). */
        char need[768];
        snprintf(
            need, sizeof need,
            "permission denied: the console needs the role turnwatch_observer (GRANT turnwatch_observer TO "
            "%s); PostgreSQL said: %s",
            tw_pg_user(pg), why);
        tw_log_warn_limited(&c->db_log, "console: %s", need);
        reply_error(c, req, 503, "Service Unavailable", need);
    } else if (strcmp(state, "57014") == 0) {
        log_warn("console: a query took longer than " CONSOLE_STATEMENT_TIMEOUT ": %s", q->sql);
        reply_error(c, req, 503, "Service Unavailable",
                    "the query took longer than " CONSOLE_STATEMENT_TIMEOUT);
    } else {
        tw_log_warn_limited(&c->db_log, "console: query failed (SQLSTATE %s): %s", state, why);
        reply_error(c, req, 503, "Service Unavailable", why);
    }
    free(q);
}

/* Runs sql (one jsonb value) on a session of the pool, the one with the least work queued, and answers with
 * it when it is done (query_done); the loop serves other requests meanwhile. */
static void reply_query(Console *c, struct evhttp_request *req, const char *sql, int n,
                        const char *const *params)
{
    ConsoleQuery *q = malloc(sizeof *q);

    if (!q) {
        reply_error(c, req, 503, "Service Unavailable", "out of memory");
        return;
    }
    *q = (ConsoleQuery){.c = c, .req = req, .sql = sql};
    tw_pg_query(tw_pgpool_pick(&c->db), sql, n, params, query_done, q);
}

/* NULL for "", so that a filter not given is SQL NULL. */
static const char *or_null(const char *s)
{
    return *s ? s : NULL;
}

static void api(Console *c, struct evhttp_request *req, ConsoleRoute route, const char *id, const char *query)
{
    char why[200];

    switch (route) {
    case CONSOLE_TURNS: {
        ConsoleTurnsQuery q;
        if (!console_turns_query_parse(query, &q, why, sizeof why)) {
            reply_error(c, req, 400, "Bad Request", why);
            return;
        }
        const char *params[] = {or_null(q.agent), or_null(q.profile), or_null(q.status),
                                or_null(q.since), or_null(q.before),  or_null(q.cursor),
                                q.limit};
        reply_query(c, req,
                    "SELECT tw.console_turns($1, $2, $3, $4::timestamptz, $5::timestamptz, $6::bigint, "
                    "$7::integer)",
                    7, params);
        return;
    }
    case CONSOLE_TURN:
        reply_query(c, req, "SELECT tw.console_turn($1::uuid)", 1, (const char *[]){id});
        return;
    case CONSOLE_TURN_HISTORY:
        /* turn_history is [] for a turn that does not exist: that is a 404 here. */
        reply_query(
            c, req,
            "SELECT CASE WHEN tw.turn_outcome($1::uuid) IS NOT NULL THEN tw.turn_history($1::uuid) END", 1,
            (const char *[]){id});
        return;
    case CONSOLE_TURN_TREE:
        /* At most CONSOLE_TREE_MAX turns; the root says how many the tree has when some are left out. */
        reply_query(c, req, "SELECT tw.turn_tree($1::uuid, $2::integer)", 2,
                    (const char *[]){id, CONSOLE_TREE_MAX});
        return;
    case CONSOLE_DAEMONS:
        if (query && *query) {
            reply_error(c, req, 400, "Bad Request", "/api/daemons takes no parameters");
            return;
        }
        reply_query(c, req, "SELECT tw.daemons()", 0, NULL);
        return;
    case CONSOLE_DEAD_LETTERS: {
        ConsoleDeadLettersQuery q;
        if (!console_dead_letters_query_parse(query, &q, why, sizeof why)) {
            reply_error(c, req, 400, "Bad Request", why);
            return;
        }
        const char *params[] = {or_null(q.agent), q.limit};
        reply_query(c, req, "SELECT tw.dead_letters($1, $2::integer)", 2, params);
        return;
    }
    case CONSOLE_BAD_ID:
        reply_error(c, req, 400, "Bad Request", "not a turn id (a UUID)");
        return;
    default:
        reply_error(c, req, 404, "Not Found", "no such API; see /api/turns, /api/daemons, /api/dead-letters");
        return;
    }
}

/* --- requests ---------------------------------------------------------------------------------- */

/* The Host header names this console (a page of another site that a DNS name rebinds to 127.0.0.1 sends its
 * own name, and reads nothing). */
static bool host_ok(const Console *c, struct evhttp_request *req)
{
    const char *host = evhttp_find_header(evhttp_request_get_input_headers(req), "Host");
    char want[300];

    if (c->any_host)
        return true;
    if (!host)
        return false;
    snprintf(want, sizeof want, strchr(c->host, ':') ? "[%s]:%d" : "%s:%d", c->host, c->port);
    if (strcasecmp(host, want) == 0)
        return true;
    /* A loopback listener answers to each loopback name. */
    if (strcmp(c->host, "127.0.0.1") == 0 || strcmp(c->host, "localhost") == 0 ||
        strcmp(c->host, "::1") == 0) {
        static const char *const names[] = {"127.0.0.1:%d", "localhost:%d", "[::1]:%d"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            snprintf(want, sizeof want, names[i], c->port);
            if (strcasecmp(host, want) == 0)
                return true;
        }
    }
    return false;
}

static const char *method_name(enum evhttp_cmd_type m)
{
    switch (m) {
    case EVHTTP_REQ_GET:
        return "GET";
    case EVHTTP_REQ_HEAD:
        return "HEAD";
    case EVHTTP_REQ_POST:
        return "POST";
    case EVHTTP_REQ_PUT:
        return "PUT";
    case EVHTTP_REQ_DELETE:
        return "DELETE";
    case EVHTTP_REQ_PATCH:
        return "PATCH";
    case EVHTTP_REQ_OPTIONS:
        return "OPTIONS";
    default:
        return "other";
    }
}

static void request_cb(struct evhttp_request *req, void *arg)
{
    Console *c = arg;
    enum evhttp_cmd_type method = evhttp_request_get_command(req);
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *raw = uri ? evhttp_uri_get_path(uri) : NULL;
    char *path = NULL, id[37];
    size_t len = 0;

    log_info("console: %s %.200s", method_name(method), evhttp_request_get_uri(req));
    if (method != EVHTTP_REQ_GET && method != EVHTTP_REQ_HEAD) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
        reply_error(c, req, 405, "Method Not Allowed", "the console is read-only: GET and HEAD only");
        return;
    }
    if (!host_ok(c, req)) {
        reply_error(c, req, 403, "Forbidden", "this console answers to its own address only");
        return;
    }
    if (!raw || !(path = evhttp_uridecode(raw, 0, &len)) || strlen(path) != len) {
        reply_error(c, req, 400, "Bad Request", "the path cannot be read");
        free(path);
        return;
    }
    ConsoleRoute route = console_route(path, id);
    if (route == CONSOLE_ASSET) {
        const char *want = strcmp(path, "/") == 0 ? "/index.html" : path;
        for (size_t i = 0; i < console_assets_count; i++)
            if (strcmp(console_assets[i].path, want) == 0) {
                reply(c, req, 200, "OK", console_assets[i].type, console_assets[i].data,
                      console_assets[i].size);
                free(path);
                return;
            }
        route = CONSOLE_NOT_FOUND;
    }
    if (route == CONSOLE_NOT_FOUND && strncmp(path, "/api", 4) != 0)
        reply_error(c, req, 404, "Not Found", "not found");
    else
        api(c, req, route, id, evhttp_uri_get_query(uri));
    free(path);
}

/* --- the connection cap ------------------------------------------------------------------------ */

/* Sockets this process holds: the listener, the database sessions and the clients' connections. evhttp 2.1
 * tells of no connection's end, so the count is read from /proc; -1 when it cannot be. */
static int open_sockets(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char link[PATH_MAX], target[64];
    int n = 0;

    if (!d)
        return -1;
    while ((e = readdir(d))) {
        ssize_t k;
        if (e->d_name[0] == '.')
            continue;
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        if ((k = readlink(link, target, sizeof target - 1)) > 0) {
            target[k] = '\0';
            n += strncmp(target, "socket:", 7) == 0;
        }
    }
    closedir(d);
    return n;
}

static bool over_cap(void)
{
    int n = open_sockets();

    /* Sockets besides the clients': the listener and the database sessions (fewer while PostgreSQL is down,
     * when a few more clients may come in). */
    return n >= 0 && n - 1 - CONSOLE_DB_SESSIONS >= CONSOLE_MAX_CONNECTIONS;
}

static void recheck_cb(evutil_socket_t fd, short what, void *arg)
{
    Console *c = arg;
    struct timeval tv = {0, 100 * 1000};

    if (over_cap()) {
        evtimer_add(c->recheck, &tv);
        return;
    }
    log_info("console: below %d connections again, accepting", CONSOLE_MAX_CONNECTIONS);
    evconnlistener_enable(c->listener);
}

/* Called by evhttp for each connection it accepted: at the cap, stop accepting (the kernel queues the next
 * ones) and look again every 100 ms. */
static struct bufferevent *conn_cb(struct event_base *base, void *arg)
{
    Console *c = arg;
    struct timeval tv = {0, 100 * 1000};
    struct bufferevent *bev;

    if (c->listener && !evtimer_pending(c->recheck, NULL) && over_cap()) {
        log_warn("console: %d connections open, the limit: not accepting more for now",
                 CONSOLE_MAX_CONNECTIONS);
        evconnlistener_disable(c->listener);
        evtimer_add(c->recheck, &tv);
    }
    if ((bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE)))
        evbuffer_add_cb(bufferevent_get_output(bev), security_headers_cb, c);
    return bev;
}

/* --- the command ------------------------------------------------------------------------------- */

static void stop_cb(evutil_socket_t sig, short what, void *arg)
{
    Console *c = arg;

    log_info("console: signal %d, stopping", (int)sig);
    event_base_loopexit(c->base, NULL);
}

static void console_free(Console *c)
{
    /* First the sessions: the requests still waiting for a query are answered (503) while evhttp is there. */
    tw_pgpool_free(&c->db);
    if (c->http)
        evhttp_free(c->http);
    if (c->sigint)
        event_free(c->sigint);
    if (c->sigterm)
        event_free(c->sigterm);
    if (c->recheck)
        event_free(c->recheck);
    if (c->base)
        event_base_free(c->base);
}

int cli_console(Cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {{"listen", required_argument, NULL, 'l'}, {NULL, 0, NULL, 0}};
    const char *listen = "127.0.0.1:8080";
    struct evhttp_bound_socket *bound;
    Console c = {.dsn = cli->cfg.pg_dsn};
    char why[512];
    int opt, rc = CLI_EXIT_OK;

    optind = 1;
    while ((opt = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        if (opt == 'l')
            listen = optarg;
        else
            return cli_bad_option(cli, opt, argv);
    }
    if (optind < argc)
        return cli_die(CLI_EXIT_USAGE, "console: unexpected argument '%.80s'", argv[optind]);
    if (!tw_listen_parse(listen, c.host, sizeof c.host, &c.port))
        return cli_die(CLI_EXIT_USAGE, "console: --listen '%.80s' is not HOST:PORT (e.g. 127.0.0.1:8080)",
                       listen);
    c.any_host = strcmp(c.host, "0.0.0.0") == 0 || strcmp(c.host, "::") == 0;

    if (!(c.base = event_base_new()) || !(c.http = evhttp_new(c.base)) ||
        !(c.recheck = evtimer_new(c.base, recheck_cb, &c)) ||
        !(c.sigint = evsignal_new(c.base, SIGINT, stop_cb, &c)) ||
        !(c.sigterm = evsignal_new(c.base, SIGTERM, stop_cb, &c))) {
        console_free(&c);
        return cli_die(CLI_EXIT_RUNTIME, "console: out of memory");
    }
    /* Every method reaches request_cb, which refuses all but GET and HEAD with 405 (evhttp would say 501),
     * those evhttp does not know too. */
    evhttp_set_allowed_methods(c.http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                           EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
                                           EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH | CONSOLE_REQ_UNKNOWN);
    evhttp_set_timeout(c.http, CONSOLE_TIMEOUT_SEC);
    evhttp_set_max_headers_size(c.http, CONSOLE_MAX_HEADERS);
    evhttp_set_max_body_size(c.http, CONSOLE_MAX_BODY);
    evhttp_set_gencb(c.http, request_cb, &c);
    evhttp_set_bevcb(c.http, conn_cb, &c);
    errno = 0;
    if (!(bound = evhttp_bind_socket_with_handle(c.http, c.host, (ev_uint16_t)c.port))) {
        rc = cli_die(CLI_EXIT_RUNTIME, "console: cannot listen on %s: %s", listen,
                     errno ? strerror(errno) : "bind failed");
        console_free(&c);
        return rc;
    }
    c.listener = evhttp_bound_socket_get_listener(bound);
    event_add(c.sigint, NULL);
    event_add(c.sigterm, NULL);
    if (tw_pgpool_init(&c.db, c.base, c.dsn, 0, "console", CONSOLE_DB_SESSIONS, NULL, NULL) != 0) {
        console_free(&c);
        return cli_die(CLI_EXIT_RUNTIME, "console: out of memory");
    }
    for (int i = 0; i < c.db.n; i++)
        if (tw_pg_set_reader(c.db.conns[i], console_session_sql) != 0) {
            console_free(&c);
            return cli_die(CLI_EXIT_RUNTIME, "console: out of memory");
        }
    tw_pgpool_start(&c.db);
    /* Not reaching PostgreSQL now is said once; the sessions connect again by themselves (within a second of
     * the server's return) and each request meanwhile is answered 503. */
    if (!console_db_probe(&c, why, sizeof why))
        fprintf(stderr, "turnwatch: console: cannot reach PostgreSQL yet (%s); trying again all the time\n",
                why);
    printf("turnwatch console: http://%s%s%s:%d/ (read-only; Ctrl-C to stop)\n",
           strchr(c.host, ':') ? "[" : "", c.host, strchr(c.host, ':') ? "]" : "", c.port);
    fflush(stdout);
    if (event_base_dispatch(c.base) < 0)
        rc = cli_die(CLI_EXIT_RUNTIME, "console: the event loop failed");
    console_free(&c);
    return rc;
}
