/* fixture.h — integration test fixture: real PostgreSQL and nats-server on free ports in a temp dir,
 * processes, SQL, NATS event collection and daemon configs for Check tests. */
#ifndef TW_TESTS_FIXTURE_H
#define TW_TESTS_FIXTURE_H

/*
 * How it works
 * ------------
 * tw_fx_new() makes a private directory /tmp/twfx-XXXXXX (0755, so the `postgres` user can reach its pg/
 * subdir when we run as root). Everything a test starts lives there: the PostgreSQL cluster (pg/data, socket
 * and postgres.log in pg/), nats.log, one <name>.log per spawned process, and the INI files. tw_fx_free()
 * stops everything and removes the directory. Servers are real, never mocks.
 *
 * Failure handling: functions that set something up (start a server, run SQL that must succeed, write a
 * config) fail the current Check test with a message (ck_abort_msg) and print details (e.g. the tail of the
 * server log) to stderr, so tests need no error plumbing. Functions whose outcome a test may want to assert
 * on return a status instead (tw_fx_sql_try, tw_fx_run*, tw_fx_proc_wait, tw_fx_*_wait*).
 *
 * Use from Check: create the fixture inside the test (or in a *checked* fixture, which runs in the forked
 * child), never in an unchecked fixture: nats.c threads do not survive fork(). Leftovers are handled in three
 * layers:
 *  - tw_fx_free() for the normal path;
 *  - an atexit() handler frees every fixture still alive (a failed ck_assert exits the forked child), so its
 *    connections and memory are gone before LeakSanitizer looks;
 *  - Check kills the whole process group of a test child after it ends (this takes nats-server and every
 * spawned process with it), but pg_ctl puts the postmaster in its own session: tw_fx_sweep_stale() (called by
 *    tests/runner.c before and after the run) stops the cluster of any /tmp/twfx-* whose owning process is
 * gone (timeout, crash) and removes the directory. PostgreSQL also shuts itself down within a minute when its
 *    postmaster.pid disappears.
 *
 * Environment: TW_BUILD_DIR and TW_SOURCE_DIR (set by tests/meson.build) locate binaries and sources;
 * TW_PG_BINDIR overrides where initdb/pg_ctl are found (default: newest /usr/lib/postgresql/<v>/bin, then
 * PATH); TW_NATS_SERVER overrides the nats-server binary (default: PATH, then /usr/sbin, /usr/bin).
 * TW_FX_KEEP=1 keeps the temp directory (servers are still stopped) for post-mortem reading of the logs.
 */

#include <jansson.h>
#include <nats/nats.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define TW_FX_WARN_UNUSED __attribute__((warn_unused_result))

typedef struct TwFx TwFx;
typedef struct TwFxProc TwFxProc;
typedef struct TwFxEvents TwFxEvents;

/* ---- lifetime
 * ------------------------------------------------------------------------------------------------- */

/* A fixture with its temp dir and no servers yet. */
TwFx *tw_fx_new(void) TW_FX_WARN_UNUSED;
/* Stops the processes it spawned (SIGTERM, then SIGKILL after 5 s), nats-server and PostgreSQL (immediate:
 * the data is thrown away anyway), closes collectors and connections, removes the temp dir. Accepts NULL. */
void tw_fx_free(TwFx *fx);
/* tw_fx_new + tw_fx_pg_init + tw_fx_nats_start + tw_fx_write_config(fx, NULL, NULL): the usual start of a
 * test. */
TwFx *tw_fx_new_all(void) TW_FX_WARN_UNUSED;
/* tw_fx_new + tw_fx_pg_init + tw_fx_nats_start + tw_fx_write_config(fx, NULL, overrides) + tw_fx_migrate:
 * servers up and the schema in place, no daemon yet. */
TwFx *tw_fx_new_migrated(const char *overrides) TW_FX_WARN_UNUSED;
/* The temp dir, e.g. to place extra files. */
const char *tw_fx_dir(const TwFx *fx);
/* Hands `s` (malloc'd, or NULL) to the fixture, which frees it in tw_fx_free; returns `s`. */
char *tw_fx_keep(TwFx *fx, char *s);
/* Stops clusters and removes /tmp/twfx-* directories whose creating process is dead. Never fails a test. */
void tw_fx_sweep_stale(void);

/* ---- paths
 * ---------------------------------------------------------------------------------------------------- */

/* TW_BUILD_DIR (else the parent of the test executable's dir) and TW_SOURCE_DIR (else "."). */
const char *tw_fx_build_dir(void);
const char *tw_fx_source_dir(void);
/* <build>/<rel>, malloc'd, e.g. tw_fx_build_path("examples/agents/tw-echo-agent"). */
char *tw_fx_build_path(const char *rel) TW_FX_WARN_UNUSED;
/* <build>/pmo/turnwatch-pmo, <build>/worker/turnwatch-worker, <build>/tools/turnwatch (static strings). */
const char *tw_fx_pmo_path(void);
const char *tw_fx_worker_path(void);
const char *tw_fx_cli_path(void);
/* True when all three binaries above exist and are executable: lets a test say "not built yet" instead of
 * failing. */
bool tw_fx_daemons_built(void);
/* A copy (mode 0755) of the file at `path` in a directory of its own, /tmp/twfx-XXXXXX (0755), for what a
 * test runs as another user (nobody): the checkout and the build may lie under a directory that user cannot
 * enter (mktemp -d and home directories are 0700), and a test must not depend on where they lie. A copied
 * binary finds what it needs as before (the build links turnwatch's own libraries statically; the sanitizers'
 * are the system's). Returns the copy's path (malloc'd); tw_fx_remove_copy removes it with its directory, and
 * tw_fx_sweep_stale does when the test failed first. */
char *tw_fx_copy_for_user(const char *path) TW_FX_WARN_UNUSED;
/* Removes a copy made by tw_fx_copy_for_user and its directory, and frees `copy`. Accepts NULL. */
void tw_fx_remove_copy(char *copy);

/* ---- PostgreSQL
 * ----------------------------------------------------------------------------------------------- */

/* initdb (-A trust, superuser "postgres", --no-sync, no locale) into <dir>/pg/data, run as the `postgres`
 * user when we are root; port, listen_addresses=127.0.0.1, the socket dir and fsync=off/full_page_writes=off
 * go into postgresql.conf so every later start uses the same port and data. Then starts it and creates
 * database `turnwatch`. synchronous_commit stays on so a committed row survives tw_fx_pg_crash(). */
void tw_fx_pg_init(TwFx *fx);
/* pg_ctl -w start (after stop or crash; crash recovery runs first). */
void tw_fx_pg_start(TwFx *fx);
/* pg_ctl -m fast -w stop: sessions are disconnected, the cluster shuts down cleanly. */
void tw_fx_pg_stop(TwFx *fx);
/* pg_ctl -m immediate stop: every server process quits at once, as if the machine lost power (minus the
 * disk). */
void tw_fx_pg_crash(TwFx *fx);
/* pg_ctl -m fast -w restart. */
void tw_fx_pg_restart(TwFx *fx);
bool tw_fx_pg_running(const TwFx *fx);
/* "postgresql://postgres@127.0.0.1:PORT/turnwatch" (valid after tw_fx_pg_init). */
const char *tw_fx_pg_dsn(const TwFx *fx);
int tw_fx_pg_port(const TwFx *fx);

/* Servers the fixture did not start (an HA formation, tools/lib/ha-formation): `dsn` for SQL, configs and the
 * CLI (a multi-host DSN with target_session_attrs=read-write finds the primary), `nats_url` (a
 * comma-separated list) for configs and collectors. The fixture neither starts nor stops them. Either may be
 * NULL (keep the fixture's own). */
void tw_fx_use_servers(TwFx *fx, const char *dsn, const char *nats_url);

/* ---- SQL (a blocking connection of the fixture's own; reconnects after a restart)
 * ------------------------------- */
/* Parameters are text, passed as `nparams` const char * varargs; a NULL vararg is SQL NULL. With nparams == 0
 * the text may hold several statements. */

/* Runs a statement; fails the test if it errors. */
void tw_fx_sql_exec(TwFx *fx, const char *sql, int nparams, ...);
/* Runs a statement; returns false with a malloc'd message in *err (if err != NULL) instead of failing the
 * test. */
bool tw_fx_sql_try(TwFx *fx, char **err, const char *sql, int nparams, ...) TW_FX_WARN_UNUSED;
/* Polls until `sql` (a count, no parameters) is at least `want`, for at most timeout_ms; PostgreSQL not
 * answering means "not yet", so the wait may span an outage. */
bool tw_fx_sql_wait_count(TwFx *fx, const char *sql, int64_t want, int timeout_ms) TW_FX_WARN_UNUSED;
/* First column of the first row as a malloc'd string; NULL when there is no row or the value is NULL. Fails
 * the test on an SQL error. */
char *tw_fx_sql_str(TwFx *fx, const char *sql, int nparams, ...) TW_FX_WARN_UNUSED;
/* First column of the first row as an integer; fails the test when there is no row, it is NULL or not an
 * integer. */
int64_t tw_fx_sql_int(TwFx *fx, const char *sql, int nparams, ...);
/* Polls (every 20 ms) until the first column of the first row equals `expect` (NULL: no row or NULL value),
 * or timeout. SQL errors count as "not yet", so this can straddle a PostgreSQL restart. */
bool tw_fx_sql_wait(TwFx *fx, int timeout_ms, const char *expect, const char *sql, int nparams,
                    ...) TW_FX_WARN_UNUSED;

/* ---- nats-server
 * ---------------------------------------------------------------------------------------------- */

/* nats-server -a 127.0.0.1 -p PORT -js -sd <dir>/nats-js (JetStream on; free port chosen on first start, kept
 * afterwards), log in <dir>/nats.log; returns once it accepts TCP connections. */
void tw_fx_nats_start(TwFx *fx);
/* SIGINT + waitpid (SIGKILL after 10 s). */
void tw_fx_nats_stop(TwFx *fx);
void tw_fx_nats_restart(TwFx *fx);
bool tw_fx_nats_running(const TwFx *fx);
/* "nats://127.0.0.1:PORT"; pid is 0 when not running (e.g. to SIGSTOP the server). */
const char *tw_fx_nats_url(const TwFx *fx);
int tw_fx_nats_port(const TwFx *fx);
pid_t tw_fx_nats_pid(const TwFx *fx);
/* Publishes from a fixture-owned connection and flushes; false if the server did not take it (e.g. it is
 * down). */
bool tw_fx_nats_publish(TwFx *fx, const char *subject, const char *data) TW_FX_WARN_UNUSED;
/* Publishes `data` on `subject` on every poll until `ev` (a collector that takes that subject) has it, for at
 * most timeout_ms: after a restart of nats-server, the collector is back once this returns true. */
bool tw_fx_nats_wait_echo(TwFx *fx, TwFxEvents *ev, const char *subject, const char *data,
                          int timeout_ms) TW_FX_WARN_UNUSED;

/* nats-server with a configuration file (TLS, authorization) from the next tw_fx_nats_start on: `conf` is its
 * text, written to <dir>/nats.conf and given with -c (the fixture's own flags, address, port and JetStream,
 * still apply). NULL: none again. */
void tw_fx_nats_set_conf(TwFx *fx, const char *conf);
/* TLS and credentials for the fixture's own NATS connections (publisher, collectors) made from now on: fn
 * gets their options after the URL is set, and returns NATS_OK or why not. NULL: none again. */
typedef natsStatus (*TwFxNatsSetup)(natsOptions *opts, void *arg);
void tw_fx_nats_client(TwFx *fx, TwFxNatsSetup fn, void *arg);

/* ---- TLS
 * ----------------------------------------------------------------------------------------------------------
 */

/* A test PKI, made with the openssl command in <dir>/tls: the CA `ca` (tls/<ca>.pem and tls/<ca>.key, made on
 * first use) and, unless name is NULL, a certificate it signs, tls/<name>.pem and tls/<name>.key, valid for
 * `san` (an openssl subjectAltName value, e.g. "DNS:localhost,IP:127.0.0.1"), both valid for two days.
 * Returns "<dir>/tls" (owned by fx). Fails the test when openssl does. */
const char *tw_fx_tls_cert(TwFx *fx, const char *ca, const char *name, const char *san);
/* PostgreSQL with TLS: copies cert and key (PEM) into the cluster, turns ssl on with them, refuses TCP
 * connections without TLS (pg_hba), puts the pg_hba lines hba_first (NULL: none) before the fixture's own
 * ("trust"), and restarts the server. The fixture's own connection goes on with libpq's default
 * sslmode=prefer. */
void tw_fx_pg_ssl(TwFx *fx, const char *cert, const char *key, const char *hba_first);

/* ---- NATS event collector
 * ------------------------------------------------------------------------------------- */
/* A background nats.c connection subscribed to one subject pattern that keeps every message in order of
 * arrival, but for a message whose payload's event_id came before: delivery is at least once and observers
 * deduplicate by event_id (contract), so the collector keeps each event once. It reconnects forever, so it
 * survives tw_fx_nats_restart() (messages published while it is disconnected are lost, as with any NATS
 * subscriber). Matching arguments: `subject` is a NATS pattern
 * ("evt.agent.*.task", "evt.>") or NULL for any; `substr` must occur in the raw payload, or NULL for any. */

typedef bool (*TwFxEventPred)(const char *subject, const json_t *data, void *arg);

/* Subscribes and flushes, so messages published after it returns are seen. Owned by fx (freed by tw_fx_free).
 */
TwFxEvents *tw_fx_events_new(TwFx *fx, const char *pattern);
/* The same, keeping every message, a second delivery of an event too (for tests of re-publication). */
TwFxEvents *tw_fx_events_new_every(TwFx *fx, const char *pattern);
void tw_fx_events_free(TwFxEvents *ev);
size_t tw_fx_events_count(TwFxEvents *ev, const char *subject, const char *substr);
/* `data` is the parsed payload, NULL when it is not JSON. */
size_t tw_fx_events_count_if(TwFxEvents *ev, TwFxEventPred pred, void *arg);
/* Waits until at least n messages match; false on timeout. */
bool tw_fx_events_wait(TwFxEvents *ev, const char *subject, const char *substr, size_t n,
                       int timeout_ms) TW_FX_WARN_UNUSED;
bool tw_fx_events_wait_if(TwFxEvents *ev, TwFxEventPred pred, void *arg, size_t n,
                          int timeout_ms) TW_FX_WARN_UNUSED;
/* The k-th (0-based) matching message's payload as a new reference (caller json_decref's it), NULL if there
 * is none or it is not JSON. Optional outputs: its subject (valid until the collector is freed or cleared)
 * and its monotonic receive time (tw_fx_now_ms clock). */
json_t *tw_fx_events_get(TwFxEvents *ev, const char *subject, const char *substr, size_t k,
                         const char **subject_out, int64_t *recv_ms) TW_FX_WARN_UNUSED;
json_t *tw_fx_events_get_if(TwFxEvents *ev, TwFxEventPred pred, void *arg, size_t k, const char **subject_out,
                            int64_t *recv_ms) TW_FX_WARN_UNUSED;
/* Forgets every stored message. */
void tw_fx_events_clear(TwFxEvents *ev);
/* Writes all stored messages to stderr: call before failing an assertion about events. */
void tw_fx_events_dump(TwFxEvents *ev);

/* ---- processes
 * ------------------------------------------------------------------------------------------------ */

/* fork + execv(argv[0], argv) (argv NULL-terminated, argv[0] a path) with stdin from /dev/null and
 * stdout+stderr appended to <dir>/<name>.log; inherits the environment. Owned by fx. */
TwFxProc *tw_fx_spawn(TwFx *fx, const char *name, const char *const argv[]);
/* <build>/pmo/turnwatch-pmo -c CONFIG (NULL: the default config of tw_fx_write_config), log "pmo-N.log". */
TwFxProc *tw_fx_start_pmo(TwFx *fx, const char *config);
TwFxProc *tw_fx_start_worker(TwFx *fx, const char *config);
pid_t tw_fx_proc_pid(const TwFxProc *p);
const char *tw_fx_proc_log_path(const TwFxProc *p);
/* The whole log so far, malloc'd ("" if empty). */
char *tw_fx_proc_log(const TwFxProc *p) TW_FX_WARN_UNUSED;
/* kill(pid, sig); false if the process already ended. SIGSTOP/SIGCONT freeze and thaw it. */
bool tw_fx_proc_signal(TwFxProc *p, int sig);
bool tw_fx_proc_freeze(TwFxProc *p);
bool tw_fx_proc_thaw(TwFxProc *p);
/* True once the process has ended (reaped); *status gets the raw wait status. False on timeout. */
bool tw_fx_proc_wait(TwFxProc *p, int timeout_ms, int *status) TW_FX_WARN_UNUSED;
bool tw_fx_proc_alive(TwFxProc *p);
/* Field 3 of /proc/PID/stat for any pid: 'R', 'S', 'T' stopped, 'Z' zombie, ...; '?' when there is no such
 * process. */
char tw_fx_pid_state(pid_t pid);
/* The pid of a process whose environment holds TURNWATCH_TURN_ID=turn (the program a worker runs for the
 * turn's step), 0 when there is none. */
pid_t tw_fx_turn_pid(const char *turn);
/* kill -9 and reap. */
void tw_fx_proc_kill9(TwFxProc *p);
/* SIGTERM, wait up to timeout_ms, then SIGKILL. Returns the exit code (0..255), 128+signal if killed by a
 * signal, or -1 when it had to be SIGKILLed after the timeout. A frozen (SIGSTOPped) process is thawed first.
 */
int tw_fx_proc_terminate(TwFxProc *p, int timeout_ms);

/* Runs argv (argv[0] a path or a name looked up in PATH) to completion with stdin from `input` (NULL:
 * /dev/null) and captures stdout and stderr into malloc'd strings (out/err may be NULL to discard). Returns
 * the exit code (0..255), 128+signal if it died of a signal, -1 if it could not start or was killed after
 * timeout_ms. */
int tw_fx_run_full(const char *const argv[], const char *input, char **out, char **err, int timeout_ms);
/* tw_fx_run_full with no input and a 60 s limit. */
int tw_fx_run(const char *const argv[], char **out, char **err);
/* Runs the CLI: `<build>/tools/turnwatch -c <default config> ARGS...` (varargs are const char *,
 * NULL-terminated). */
int tw_fx_cli(TwFx *fx, char **out, char **err, ...) __attribute__((sentinel));
/* `turnwatch migrate`; fails the test unless it exits 0. */
void tw_fx_migrate(TwFx *fx);
/* The whole log of a process to stderr below a "---- <log path> ----" line: call before failing. */
void tw_fx_proc_dump(const TwFxProc *p);

/* What most end-to-end tests run against, all owned by fx. */
typedef struct TwFxStack {
    TwFx *fx;
    TwFxEvents *ev; /* every "evt.>" message, those of the pattern given, or NULL */
    TwFxProc *pmo, *worker;
} TwFxStack;
/* tw_fx_new_migrated(overrides), the collector, then one PMO and one worker on the default config. */
TwFxStack tw_fx_stack_start(const char *overrides);
/* The same with a collector of the events matching `pattern` only, or none when pattern is NULL. */
TwFxStack tw_fx_stack_start_events(const char *overrides, const char *pattern);
/* The collected events and the worker's and the PMO's logs to stderr: call before failing. */
void tw_fx_stack_dump(const TwFxStack *st);

/* ---- HTTP and Prometheus
 * ------------------------------------------------------------------------------------------ */

/* GET http://127.0.0.1:PORT/PATH (HTTP/1.0, at most 10 s): the status code, or -1 when nothing answered; the
 * body into *body (malloc'd; NULL when there was no answer). */
int tw_fx_http_get(int port, const char *path, char **body) TW_FX_WARN_UNUSED;
/* One HTTP/1.0 request to 127.0.0.1:port: METHOD path, a JSON body or NULL, the Host header given (NULL:
 * 127.0.0.1:port); 10 s for all of it. Returns the status (-1 when nothing answered) and the whole answer,
 * head and body, in *answer (malloc'd, NULL when nothing answered). */
int tw_fx_http_request(int port, const char *method, const char *path, const char *host, const char *body,
                       char **answer) TW_FX_WARN_UNUSED;
/* Parses the Prometheus text format strictly: every line is blank, a # HELP or # TYPE line, or a sample
 * `name{label="value",...} value` whose family has a # TYPE line before it (a histogram's _bucket, _sum and
 * _count series belong to their family), label values escaped as the format says, no sample twice. Returns an
 * object from each sample as written before its value (`name{a="x",le="+Inf"}`) to its value (a real), or
 * NULL with the first problem in *err (malloc'd, "line N: why: the line"). */
json_t *tw_fx_prom_parse(const char *text, char **err) TW_FX_WARN_UNUSED;
/* A sample's value from tw_fx_prom_parse's object; NAN when there is no such sample. */
double tw_fx_prom_value(json_t *samples, const char *key);

/* A TCP port on 127.0.0.1 that nothing listens on (e.g. for a daemon's metrics_listen), below the kernel's
 * ephemeral range and not handed out before by this process. */
int tw_fx_free_port(void);

/* ---- time and waiting
 * ----------------------------------------------------------------------------------------- */

int64_t tw_fx_now_ms(void);
void tw_fx_sleep_ms(int ms);
typedef bool (*TwFxCond)(void *arg);
/* Calls cond(arg) every ~20 ms until it returns true (then true) or timeout_ms passes (then false). */
bool tw_fx_wait_until(TwFxCond cond, void *arg, int timeout_ms) TW_FX_WARN_UNUSED;
/* One turn of a polling loop whose condition is written in place:
 *     int64_t deadline = tw_fx_now_ms() + timeout_ms;
 *     while (!condition)
 *         if (!tw_fx_poll(deadline))
 *             fail;
 * false once `deadline` (tw_fx_now_ms() time) has passed, else sleeps one poll interval and returns true. */
bool tw_fx_poll(int64_t deadline_ms) TW_FX_WARN_UNUSED;

/* ---- daemon configuration
 * ------------------------------------------------------------------------------------- */
/*
 * Writes an INI (contract §3) with every key: [postgres] dsn and [nats] url of this fixture, short watchdog
 * periods that keep the cross-key rules, and agents echo, failer, tester, fanout, racer plus tools sleep,
 * fail, garbage, echo (the example programs in <build>/examples) and ext (external = true). The exact base
 * values are in fixture_daemons.c (fx_base_config) and in the written file.
 *
 * `overrides` is INI text applied on top, line by line:
 *   [section]          following lines apply to this section (created at the end if new)
 *   key = value        sets the key (replacing the base value in place, or appended to the section)
 *   !key               removes the key from the current section
 *   ![section]         removes a whole section
 *   ; or # comments and blank lines are ignored.
 * Any line that is none of these is kept verbatim in the current section (so a test can also write
 * deliberately broken files, e.g. "this line is junk").
 *
 * name NULL writes "turnwatch.ini" and makes it the default config for tw_fx_cli/tw_fx_start_*; another name
 * writes a separate file. Returns the path (owned by fx).
 */
const char *tw_fx_write_config(TwFx *fx, const char *name, const char *overrides);
/* Path of the default config (NULL before the first tw_fx_write_config(fx, NULL, ...)). */
const char *tw_fx_config_path(const TwFx *fx);

#endif
