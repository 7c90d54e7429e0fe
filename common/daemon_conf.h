/* The configuration a daemon runs by (daemon_conf.c): loaded at start-up, read again at a reload with the
 * same checks, its [log] settings and its open-files limit. Below the shell (daemon.h) and its main. */
#ifndef TW_DAEMON_CONF_H
#define TW_DAEMON_CONF_H

#include <stdbool.h>

#include "config.h"

typedef struct TwDaemonArgs {
    const char *config_path;
    bool check_config;
    bool verbose;
    bool check_programs; /* set by the worker: tw_daemon_config also runs tw_config_check_programs */
} TwDaemonArgs;

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
/** Open files. At start-up (raise): the soft limit goes up to the hard one (systemd starts services at 1024
 *  unless LimitNOFILE= says more; the worker's programs inherit the raised limit). Then, and after a reload:
 * a warning when the limit is below what cfg may use at once (connections, the metrics endpoint's limit, and
 * for the worker (runs_programs) the pipes of a program and a serve process per slot of concurrency). */
void tw_daemon_fd_limit(const TwConfig *cfg, bool runs_programs, bool raise);

#endif
