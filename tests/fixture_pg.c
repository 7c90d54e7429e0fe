/* fixture_pg.c — the fixture's PostgreSQL server (initdb, start, stop), SQL helpers and a TLS test PKI.
 * See fixture.h. */
#include "fixture_int.h"

#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <glob.h>
#include <libpq-fe.h>
#include <math.h>
#include <nats/nats.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- PostgreSQL
 * ------------------------------------------------------------------------------------------------- */

/* Where initdb and pg_ctl live: $TW_PG_BINDIR, the newest /usr/lib/postgresql/<v>/bin (Debian keeps them off
 * PATH), or PATH. */
static const char *fx_pg_bindir(void)
{
    static char *dir;
    if (dir)
        return dir;
    const char *env = getenv("TW_PG_BINDIR");
    if (env && *env)
        return dir = fx_xstrdup(env);
    glob_t g;
    int best = -1;
    if (glob("/usr/lib/postgresql/*/bin/initdb", 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) {
            int v = atoi(g.gl_pathv[i] + strlen("/usr/lib/postgresql/"));
            if (v > best) {
                best = v;
                free(dir);
                dir = fx_xstrdup(g.gl_pathv[i]);
                *strrchr(dir, '/') = '\0';
            }
        }
        globfree(&g);
    }
    if (!dir) {
        char *initdb = fx_which("initdb");
        if (initdb)
            *strrchr(initdb, '/') = '\0';
        dir = initdb ? initdb : fx_xstrdup("/usr/lib/postgresql/15/bin");
    }
    return dir;
}

/* Runs a PostgreSQL program as the `postgres` user when we are root (initdb and postgres refuse root), in the
 * cluster's directory so that no inaccessible cwd gets in the way. */
static int fx_pg_run(TwFx *fx, const char *const args[], char **out)
{
    const char *argv[32];
    size_t n = 0;
    char *runuser = NULL;
    char *prog = fx_asprintf("%s/%s", fx_pg_bindir(), args[0]);
    if (geteuid() == 0) {
        runuser = fx_which("runuser");
        if (!runuser) {
            free(prog);
            if (out)
                *out = fx_xstrdup("runuser not found");
            return -1;
        }
        argv[n++] = runuser;
        argv[n++] = "-u";
        argv[n++] = "postgres";
        argv[n++] = "--";
    }
    argv[n++] = prog;
    for (size_t i = 1; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    char *o = NULL, *e = NULL;
    int rc = fx_run(argv, NULL, &o, &e, FX_PG_TIMEOUT_MS, fx->pg_dir);
    if (out)
        *out = fx_asprintf("%s%s", o, e);
    free(o);
    free(e);
    free(prog);
    free(runuser);
    return rc;
}

bool fx_pg_has_pidfile(const TwFx *fx)
{
    char *pidfile = fx_asprintf("%s/postmaster.pid", fx->pg_data);
    bool has = access(pidfile, F_OK) == 0;
    free(pidfile);
    return has;
}

int fx_pg_ctl(TwFx *fx, const char *action, const char *mode, char **out)
{
    const char *args[12] = {"pg_ctl", "-D", fx->pg_data, "-l", fx->pg_log, "-w", "-t", "60"};
    size_t n = 8;
    if (mode) {
        args[n++] = "-m";
        args[n++] = mode;
    }
    args[n++] = action;
    args[n] = NULL;
    return fx_pg_run(fx, args, out);
}

/* Runs pg_ctl and fails the test, with the server log, unless it worked. */
static void fx_pg_ctl_or_fail(TwFx *fx, const char *action, const char *mode)
{
    if (!fx->pg_inited)
        fx_fail("pg %s: call tw_fx_pg_init first", action);
    char *out = NULL;
    int rc = fx_pg_ctl(fx, action, mode, &out);
    if (rc != 0) {
        char *tail = fx_file_tail(fx->pg_log, 3000);
        fprintf(stderr, "fixture: pg_ctl %s exited %d:\n%s\n--- %s (tail) ---\n%s\n", action, rc, out,
                fx->pg_log, tail);
        free(tail);
        free(out);
        fx_fail("pg_ctl %s failed (exit %d), see stderr", action, rc);
    }
    free(out);
}

static void fx_pg_drop_conn(TwFx *fx)
{
    PQfinish(fx->conn);
    fx->conn = NULL;
}

void tw_fx_pg_init(TwFx *fx)
{
    if (fx->pg_inited)
        fx_fail("tw_fx_pg_init called twice");
    fx->pg_dir = fx_asprintf("%s/pg", fx->dir);
    fx->pg_data = fx_asprintf("%s/data", fx->pg_dir);
    fx->pg_log = fx_asprintf("%s/postgres.log", fx->pg_dir);
    if (mkdir(fx->pg_dir, 0700) != 0)
        fx_fail("mkdir %s: %s", fx->pg_dir, strerror(errno));
    if (geteuid() == 0) {
        struct passwd *pw = getpwnam("postgres");
        if (!pw)
            fx_fail("running as root but there is no `postgres` user to run PostgreSQL as");
        if (chown(fx->pg_dir, pw->pw_uid, pw->pw_gid) != 0)
            fx_fail("chown %s: %s", fx->pg_dir, strerror(errno));
    }
    char *out = NULL;
    const char *initdb[] = {"initdb",   "-D",        fx->pg_data,   "-A", "trust", "-U",
                            "postgres", "--no-sync", "--no-locale", "-E", "UTF8",  NULL};
    int rc = fx_pg_run(fx, initdb, &out);
    if (rc != 0) {
        fprintf(stderr, "fixture: initdb exited %d:\n%s\n", rc, out);
        free(out);
        fx_fail("initdb failed (exit %d), see stderr", rc);
    }
    free(out);

    fx->pg_port = fx_free_port();
    char *conf_path = fx_asprintf("%s/postgresql.conf", fx->pg_data);
    FILE *conf = fopen(conf_path, "a");
    if (!conf)
        fx_fail("open %s: %s", conf_path, strerror(errno));
    /* fsync and full-page writes only matter for an OS crash; synchronous_commit stays on so that a process
     * crash (tw_fx_pg_crash) never loses a committed transaction, which is what the daemons' tests rely on.
     */
    fprintf(conf,
            "\n# turnwatch test fixture\n"
            "port = %d\n"
            "listen_addresses = '127.0.0.1'\n"
            "unix_socket_directories = '%s'\n"
            "fsync = off\n"
            "full_page_writes = off\n"
            "max_connections = 200\n"
            "log_line_prefix = '%%m [%%p] %%q%%a '\n",
            fx->pg_port, fx->pg_dir);
    fclose(conf);
    fx->pg_inited = true;
    /* The port was free when chosen, but another process (a test running beside this one, another cluster)
     * may bind it before the postmaster does: then another port, a few times, as long as no one knows this
     * one. */
    for (int attempt = 1;; attempt++) {
        char *ctl_out = NULL;
        if (fx_pg_ctl(fx, "start", NULL, &ctl_out) == 0) {
            free(ctl_out);
            break;
        }
        free(ctl_out);
        char *log = fx_read_file(fx->pg_log);
        bool taken = strstr(log, "could not create any TCP/IP sockets") != NULL;
        free(log);
        if (!taken || attempt == 5) {
            fx_pg_ctl_or_fail(fx, "start", NULL); /* fails the test with the server's log */
            break;
        }
        fprintf(stderr, "fixture: port %d was taken before PostgreSQL bound it; another\n", fx->pg_port);
        fx->pg_port = fx_free_port();
        conf = fopen(conf_path, "a");
        if (!conf)
            fx_fail("open %s: %s", conf_path, strerror(errno));
        fprintf(conf, "port = %d\n", fx->pg_port); /* the last setting of a key wins */
        fclose(conf);
    }
    fx->pg_running = true;
    free(conf_path);
    fx->pg_dsn = fx_asprintf("postgresql://postgres@127.0.0.1:%d/turnwatch", fx->pg_port);
    fx->pg_conninfo = fx_asprintf("%s?connect_timeout=10&application_name=tw_fixture", fx->pg_dsn);

    char *admin = fx_asprintf("postgresql://postgres@127.0.0.1:%d/postgres?connect_timeout=10", fx->pg_port);
    PGconn *c = PQconnectdb(admin);
    free(admin);
    PGresult *res = PQstatus(c) == CONNECTION_OK ? PQexec(c, "CREATE DATABASE turnwatch") : NULL;
    bool ok = res && PQresultStatus(res) == PGRES_COMMAND_OK;
    char *msg = fx_xstrdup(PQerrorMessage(c));
    PQclear(res);
    PQfinish(c);
    if (!ok) {
        fx_fail("CREATE DATABASE turnwatch: %s", msg);
    }
    free(msg);
}

void tw_fx_pg_start(TwFx *fx)
{
    fx_pg_ctl_or_fail(fx, "start", NULL);
    fx->pg_running = true;
}

void tw_fx_pg_stop(TwFx *fx)
{
    fx_pg_drop_conn(fx);
    fx_pg_ctl_or_fail(fx, "stop", "fast");
    fx->pg_running = false;
}

void tw_fx_pg_crash(TwFx *fx)
{
    fx_pg_drop_conn(fx);
    fx_pg_ctl_or_fail(fx, "stop", "immediate");
    fx->pg_running = false;
}

void tw_fx_pg_restart(TwFx *fx)
{
    fx_pg_drop_conn(fx);
    fx_pg_ctl_or_fail(fx, "restart", "fast");
    fx->pg_running = true;
}

bool tw_fx_pg_running(const TwFx *fx)
{
    return fx->pg_running;
}

void tw_fx_use_servers(TwFx *fx, const char *dsn, const char *nats_url)
{
    if (dsn) {
        fx_pg_drop_conn(fx);
        free(fx->pg_dsn);
        free(fx->pg_conninfo);
        fx->pg_dsn = fx_xstrdup(dsn);
        fx->pg_conninfo = fx_asprintf("%s%sconnect_timeout=10&application_name=tw_fixture", dsn,
                                      strchr(dsn, '?') ? "&" : "?");
    }
    if (nats_url) {
        free(fx->nats_url);
        fx->nats_url = fx_xstrdup(nats_url);
    }
}

const char *tw_fx_pg_dsn(const TwFx *fx)
{
    return fx->pg_dsn;
}

int tw_fx_pg_port(const TwFx *fx)
{
    return fx->pg_port;
}

/* ---- SQL
 * -------------------------------------------------------------------------------------------------------- */

/* Runs one query on the fixture's connection, reconnecting once when the server went away underneath it (a
 * restart between two calls). Returns the result, or NULL with a malloc'd message in *err. */
static PGresult *fx_sql_query(TwFx *fx, const char *sql, int nparams, const char *const *params, char **err)
{
    if (!fx->pg_dsn) {
        *err = fx_xstrdup("PostgreSQL is not initialised (tw_fx_pg_init)");
        return NULL;
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!fx->conn || PQstatus(fx->conn) != CONNECTION_OK) {
            fx_pg_drop_conn(fx);
            fx->conn = PQconnectdb(fx->pg_conninfo);
            if (PQstatus(fx->conn) != CONNECTION_OK) {
                *err = fx_xstrdup(PQerrorMessage(fx->conn));
                fx_pg_drop_conn(fx);
                return NULL;
            }
        }
        PGresult *res = nparams == 0 ? PQexec(fx->conn, sql)
                                     : PQexecParams(fx->conn, sql, nparams, NULL, params, NULL, NULL, 0);
        ExecStatusType st = PQresultStatus(res);
        if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
            return res;
        PQclear(res);
        if (PQstatus(fx->conn) == CONNECTION_OK || attempt == 1) {
            *err = fx_xstrdup(PQerrorMessage(fx->conn));
            return NULL;
        }
    }
    *err = fx_xstrdup("unreachable");
    return NULL;
}

/* Collects `nparams` const char * varargs into `out`. */
static void fx_sql_params(int nparams, va_list ap, const char *out[FX_SQL_MAX_PARAMS])
{
    if (nparams < 0 || nparams > FX_SQL_MAX_PARAMS)
        fx_fail("SQL helpers take 0..%d parameters, got %d", FX_SQL_MAX_PARAMS, nparams);
    for (int i = 0; i < nparams; i++)
        out[i] = va_arg(ap, const char *);
}

/* Declares `params` holding the `nparams` const char * varargs of the calling SQL helper. */
#define FX_SQL_VARARGS(params, nparams)                                                                      \
    const char *params[FX_SQL_MAX_PARAMS];                                                                   \
    do {                                                                                                     \
        va_list ap_;                                                                                         \
        va_start(ap_, nparams);                                                                              \
        fx_sql_params(nparams, ap_, params);                                                                 \
        va_end(ap_);                                                                                         \
    } while (0)

static PGresult *fx_sql_must(TwFx *fx, const char *sql, int nparams, const char *const *params)
{
    char *err = NULL;
    PGresult *res = fx_sql_query(fx, sql, nparams, params, &err);
    if (!res) {
        fprintf(stderr, "fixture: SQL failed: %s\n  query: %s\n", err, sql);
        fx_fail("SQL failed: %s", err);
    }
    return res;
}

void tw_fx_sql_exec(TwFx *fx, const char *sql, int nparams, ...)
{
    FX_SQL_VARARGS(params, nparams);
    PQclear(fx_sql_must(fx, sql, nparams, params));
}

bool tw_fx_sql_try(TwFx *fx, char **err, const char *sql, int nparams, ...)
{
    FX_SQL_VARARGS(params, nparams);
    char *msg = NULL;
    PGresult *res = fx_sql_query(fx, sql, nparams, params, &msg);
    PQclear(res);
    if (err)
        *err = msg;
    else
        free(msg);
    return res != NULL;
}

static char *fx_first_value(PGresult *res)
{
    char *v = NULL;
    if (PQntuples(res) > 0 && PQnfields(res) > 0 && !PQgetisnull(res, 0, 0))
        v = fx_xstrdup(PQgetvalue(res, 0, 0));
    PQclear(res);
    return v;
}

char *tw_fx_sql_str(TwFx *fx, const char *sql, int nparams, ...)
{
    FX_SQL_VARARGS(params, nparams);
    return fx_first_value(fx_sql_must(fx, sql, nparams, params));
}

bool tw_fx_sql_wait_count(TwFx *fx, const char *sql, int64_t want, int timeout_ms)
{
    int64_t deadline = tw_fx_now_ms() + timeout_ms;
    /* The SQL helpers fail the test on an SQL error; during an outage "not yet" is the right answer. */
    while (!tw_fx_sql_try(fx, NULL, "SELECT 1", 0) || tw_fx_sql_int(fx, sql, 0) < want)
        if (!tw_fx_poll(deadline))
            return false;
    return true;
}

int64_t tw_fx_sql_int(TwFx *fx, const char *sql, int nparams, ...)
{
    FX_SQL_VARARGS(params, nparams);
    char *v = fx_first_value(fx_sql_must(fx, sql, nparams, params));
    if (!v)
        fx_fail("SQL returned no row or NULL where an integer was expected: %s", sql);
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    bool ok = errno == 0 && end != v && *end == '\0';
    if (!ok) {
        fprintf(stderr, "fixture: not an integer: '%s' from %s\n", v, sql);
        free(v);
        fx_fail("SQL returned a value that is not an integer");
    }
    free(v);
    return n;
}

bool tw_fx_sql_wait(TwFx *fx, int timeout_ms, const char *expect, const char *sql, int nparams, ...)
{
    FX_SQL_VARARGS(params, nparams);
    int64_t deadline = tw_fx_now_ms() + timeout_ms;
    char *last = NULL, *last_err = NULL;
    for (;;) {
        char *err = NULL;
        PGresult *res = fx_sql_query(fx, sql, nparams, params, &err);
        if (res) {
            free(last);
            last = fx_first_value(res);
            if (expect ? last && strcmp(last, expect) == 0 : last == NULL) {
                free(last);
                free(last_err);
                return true;
            }
        } else {
            free(last_err);
            last_err = err;
        }
        if (tw_fx_now_ms() >= deadline)
            break;
        tw_fx_sleep_ms(FX_POLL_MS);
    }
    fprintf(stderr, "fixture: waited %d ms for '%s' but got '%s'%s%s\n  query: %s\n", timeout_ms,
            expect ? expect : "(null)", last ? last : "(null)", last_err ? "; last error: " : "",
            last_err ? last_err : "", sql);
    free(last);
    free(last_err);
    return false;
}

/* ---- TLS: a test PKI (openssl), PostgreSQL with ssl
 * ----------------------------------------------------------------------------------- */

static void fx_openssl(const char *const argv[])
{
    char *out = NULL, *err = NULL;
    int rc = tw_fx_run_full(argv, NULL, &out, &err, 30000);
    if (rc != 0) {
        fprintf(stderr, "fixture: %s %s exited %d:\n%s%s\n", argv[0], argv[1], rc, out ? out : "",
                err ? err : "");
        free(out);
        free(err);
        fx_fail("openssl %s failed (exit %d), see stderr", argv[1], rc);
    }
    free(out);
    free(err);
}

const char *tw_fx_tls_cert(TwFx *fx, const char *ca, const char *name, const char *san)
{
    char *dir = fx_asprintf("%s/tls", fx->dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        fx_fail("mkdir %s: %s", dir, strerror(errno));
    char *ca_pem = fx_asprintf("%s/%s.pem", dir, ca), *ca_key = fx_asprintf("%s/%s.key", dir, ca);
    char *ca_subj = fx_asprintf("/CN=%s", ca);
    if (access(ca_pem, F_OK) != 0) {
        const char *argv[] = {
            "openssl", "req",     "-x509", "-newkey", "ec",   "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes",  "-keyout", ca_key,  "-out",    ca_pem, "-days",    "2",
            "-subj",   ca_subj,   NULL};
        fx_openssl(argv);
    }
    if (name) {
        char *pem = fx_asprintf("%s/%s.pem", dir, name), *key = fx_asprintf("%s/%s.key", dir, name);
        char *csr = fx_asprintf("%s/%s.csr", dir, name), *ext = fx_asprintf("%s/%s.ext", dir, name);
        char *subj = fx_asprintf("/CN=%s", name), *srl = fx_asprintf("%s/%s.srl", dir, ca);
        FILE *f = fopen(ext, "w");
        if (!f || fprintf(f, "subjectAltName=%s\n", san) < 0 || fclose(f) != 0)
            fx_fail("cannot write %s", ext);
        const char *req[] = {
            "openssl", "req",     "-newkey", "ec",   "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes",  "-keyout", key,       "-out", csr,        "-subj",
            subj,      NULL};
        fx_openssl(req);
        const char *sign[] = {"openssl", "x509",   "-req",  "-in",       csr,        "-CA",
                              ca_pem,    "-CAkey", ca_key,  "-CAserial", srl,        "-CAcreateserial",
                              "-out",    pem,      "-days", "2",         "-extfile", ext,
                              NULL};
        fx_openssl(sign);
        free(pem);
        free(key);
        free(csr);
        free(ext);
        free(subj);
        free(srl);
    }
    free(ca_pem);
    free(ca_key);
    free(ca_subj);
    return tw_fx_keep(fx, dir);
}

/* A copy of src in the cluster's data directory, owned by the server's user, mode 0600. */
static char *fx_pg_copy(TwFx *fx, const char *src, const char *name)
{
    char *dst = fx_asprintf("%s/%s", fx->pg_data, name);
    char *text = fx_read_file(src);
    int fd = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text) || close(fd) != 0)
        fx_fail("cannot write %s: %s", dst, strerror(errno));
    free(text);
    if (geteuid() == 0) {
        struct passwd *pw = getpwnam("postgres");
        if (!pw || chown(dst, pw->pw_uid, pw->pw_gid) != 0)
            fx_fail("chown %s to postgres: %s", dst, strerror(errno));
    }
    return dst;
}

void tw_fx_pg_ssl(TwFx *fx, const char *cert, const char *key, const char *hba_first)
{
    if (!fx->pg_inited)
        fx_fail("tw_fx_pg_ssl: call tw_fx_pg_init first");
    char *crt = fx_pg_copy(fx, cert, "server.crt"), *k = fx_pg_copy(fx, key, "server.key");
    char *conf_path = fx_asprintf("%s/postgresql.conf", fx->pg_data);
    FILE *conf = fopen(conf_path, "a");
    if (!conf || fprintf(conf, "ssl = on\nssl_cert_file = '%s'\nssl_key_file = '%s'\n", crt, k) < 0 ||
        fclose(conf) != 0)
        fx_fail("cannot append to %s", conf_path);
    /* TCP without TLS is refused, first rule wins: a connection that works is a TLS one. */
    char *hba_path = fx_asprintf("%s/pg_hba.conf", fx->pg_data);
    char *hba = fx_read_file(hba_path);
    FILE *f = fopen(hba_path, "w");
    if (!f ||
        fprintf(f, "hostnossl all all 0.0.0.0/0 reject\nhostnossl all all ::/0 reject\n%s%s",
                hba_first ? hba_first : "", hba) < 0 ||
        fclose(f) != 0)
        fx_fail("cannot write %s", hba_path);
    free(hba);
    free(hba_path);
    free(conf_path);
    free(crt);
    free(k);
    tw_fx_pg_restart(fx);
}
