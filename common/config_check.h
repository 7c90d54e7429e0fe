/* The checks of a configuration beyond each value's own (its type and bounds are the table's): the rules
 * across keys and sections, and the programs and limits a worker checks at start-up. */
#ifndef TW_CONFIG_CHECK_H
#define TW_CONFIG_CHECK_H

#include <sys/types.h>

#include "config_table.h"

/** The rules across keys and sections of a file read without errors (retry below timeout, the [nats]
 *  credentials, every agent's exec, the tools' kinds, [worker] agents naming sections, ...): appends each
 *  problem to cfg->errors. tw_config_load runs it. */
void tw_config_check_rules(TwConfig *cfg);
/** Check the programs of the agents and tools this worker serves: each exec must name an existing regular
 *  file that is executable. Appends each problem to cfg->errors ("file:line: [section] exec: why") and
 *  returns -1, or returns 0. The worker runs it at start-up and with --check-config; the PMO and the CLI
 *  run no programs and do not. */
int tw_config_check_programs(TwConfig *cfg) __attribute__((warn_unused_result));
/* The fewest open files a limit may allow (max_open_files, 0 being no limit): a dynamically linked program
 * needs its three standard descriptors and one for each library its loader opens (4 for /bin/true, 5 for
 * python3), and dash moves a descriptor it redirects to 10 or above (`sh -c 'ls >/dev/null'` needs 12). */
#define TW_MIN_OPEN_FILES 16

/** The limits part of tw_config_check_programs, for a worker running with effective uid euid: run_as_user
 *  names an existing user, the worker runs as root, and that user may run the program (search on each
 *  directory of its path, execute on it, read on a script: by the mode bits, for the user and its primary
 *  group, the only one a program of it has); max_processes does not apply to a program running as root
 *  (RLIMIT_NPROC), so it needs run_as_user then; max_open_files is 0 or at least TW_MIN_OPEN_FILES. Appends
 *  each problem; returns -1 or 0. */
int tw_config_check_limits(TwConfig *cfg, uid_t euid) __attribute__((warn_unused_result));

#endif
