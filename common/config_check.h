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
/** The limits part of tw_config_check_programs, for a worker running with effective uid euid: run_as_user
 *  names an existing user and the worker runs as root; max_processes does not apply to a program running as
 *  root (RLIMIT_NPROC), so it needs run_as_user then. Appends each problem; returns -1 or 0. */
int tw_config_check_limits(TwConfig *cfg, uid_t euid) __attribute__((warn_unused_result));

#endif
