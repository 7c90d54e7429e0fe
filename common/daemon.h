/* What both daemons share at start-up: the common flags and loading the configuration. */
#ifndef TW_DAEMON_H
#define TW_DAEMON_H

#include <stdbool.h>

#include "config.h"
#include "notify.h"
#include "pgconn.h"

typedef struct TwDaemonArgs {
    const char *config_path;
    bool check_config;
    bool verbose;
    bool check_programs; /* set by the worker: tw_daemon_config also runs tw_config_check_programs */
} TwDaemonArgs;

/** Hold SIGTERM, SIGINT and SIGHUP from the first line of main until the event loop handles them
 *  (tw_daemon_signals_ready, once the daemon's setup has added its signal events): one that arrives during
 *  start-up is then a graceful stop or a reload as at any other time, not the default action that kills the
 *  process before it has said anything. Threads started meanwhile (nats.c's) keep them blocked, so they go to
 *  the main thread. */
void tw_daemon_hold_signals(void);
void tw_daemon_signals_ready(void);

/** Parse -c FILE, --check-config, --version, --help, -v. Returns -1 to go on, else the exit code. */
int tw_daemon_args(int argc, char **argv, const char *prog, const char *summary, TwDaemonArgs *args);
/** Load the configuration (and, with args->check_programs, check the programs it serves), printing every
 *  error to stderr. With --check-config, also print a summary and return the exit code (0 valid, 1 not).
 *  Otherwise returns 0 to go on, 1 to exit. */
int tw_daemon_config(const TwDaemonArgs *args, const char *prog, TwConfig *cfg);

/** SIGHUP: read path again, with the same checks as at start-up (the programs too when check_programs).
 *  A valid file is returned (on the heap, one user, see tw_config_ref); the caller applies it, its [log]
 *  settings last (tw_daemon_apply_log). An invalid one: every error is logged and NULL returned; the caller
 *  keeps its configuration. */
TwConfig *tw_daemon_reload(const char *path, bool check_programs) __attribute__((warn_unused_result));
/** [log] level (unless -v was given: debug) and format. */
void tw_daemon_apply_log(const TwConfig *cfg);
/** A daemon's way of taking a new configuration (pmo_apply_config, wrk_apply_config): it takes cfg's
 * reference and returns 0, or -1 when it cannot apply it (keeping its own). */
typedef int (*TwApplyConfigFn)(void *daemon, TwConfig *cfg);
/** The SIGHUP sequence of both daemons: RELOADING=1 to systemd and tw_daemon_reload of path; then the new
 *  file's profiles are published through pg, and unless the database refuses them (a profile whose name the
 *  roster binds, as an agent, to another profile: the reload is refused and logged, the running configuration
 *  kept) the file is applied; then READY=1 and the result for the metrics' reload gauge. The database answers
 *  on the loop: *busy is true until then (a SIGHUP meanwhile is logged and ignored), and a file whose answer
 *  comes when *stopping is true is dropped. When the database cannot answer, the file is applied (its
 * profiles are published when it can). */
void tw_daemon_sighup(const char *path, bool check_programs, TwApplyConfigFn apply, void *daemon,
                      TwNotify *notify, TwPg *pg, bool *busy, const bool *stopping);
/** Open files. At start-up (raise): the soft limit goes up to the hard one (systemd starts services at 1024
 *  unless LimitNOFILE= says more; the worker's programs inherit the raised limit). Then, and after a reload:
 * a warning when the limit is below what cfg may use at once (connections, the metrics endpoint's limit, and
 * for the worker (runs_programs) the pipes of a program and a serve process per slot of concurrency). */
void tw_daemon_fd_limit(const TwConfig *cfg, bool runs_programs, bool raise);
/** Log what a reload changes: keys, agents and tools added, removed or changed; the keys that only a restart
 *  applies (the connections) are named as such. */
void tw_daemon_log_changes(const TwConfig *old, const TwConfig *cfg);

#endif
