/* What both daemons share at start-up: the common flags and loading the configuration. */
#ifndef TW_DAEMON_H
#define TW_DAEMON_H

#include <stdbool.h>

#include "config.h"

typedef struct TwDaemonArgs {
    const char *config_path;
    bool check_config;
    bool verbose;
    bool check_programs; /* set by the worker: tw_daemon_config also runs tw_config_check_programs */
} TwDaemonArgs;

/** Parse -c FILE, --check-config, --version, --help, -v. Returns -1 to go on, else the exit code. */
int tw_daemon_args(int argc, char **argv, const char *prog, const char *summary, TwDaemonArgs *args);
/** Load the configuration (and, with args->check_programs, check the programs it serves), printing every
 *  error to stderr. With --check-config, also print a summary and return the exit code (0 valid, 1 not).
 *  Otherwise returns 0 to go on, 1 to exit. */
int tw_daemon_config(const TwDaemonArgs *args, const char *prog, TwConfig *cfg);

#endif
