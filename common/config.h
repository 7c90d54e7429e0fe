/* The INI configuration (docs/configuration.md): the engine that loads a file through inih into a TwConfig by
 * the parameter table (config_table.h), has it checked (config_check.h), frees it and shares it. The
 * agents' policies as the turns see them are policy.h's; exec lines and comma lists are split by words.h. */
#ifndef TW_CONFIG_H
#define TW_CONFIG_H

#include "config_check.h"
#include "config_table.h"

/* Longest INI line in bytes, not counting its line end ("\n" or "\r\n"). A longer line is an error: read in
 * pieces, its tail would be parsed as a line of its own (a section or key nobody wrote). */
#define TW_CONFIG_MAX_LINE 65536

/** Load and validate path. Returns 0, or -1 with cfg->errors listing every problem found. */
int tw_config_load(TwConfig *cfg, const char *path) __attribute__((warn_unused_result));
/** Load from a string (tests); name is used in messages. */
int tw_config_load_string(TwConfig *cfg, const char *name, const char *text)
    __attribute__((warn_unused_result));
void tw_config_free(TwConfig *cfg);
/** A configuration on the heap (calloc'd, then loaded) shared by a daemon and the work it started: a reload
 *  swaps the daemon's, and a running step keeps the one it started with. A fresh one has a single user;
 *  tw_config_ref adds one, tw_config_unref drops one and frees it (tw_config_free + free) after the last.
 *  Both accept NULL. */
TwConfig *tw_config_ref(TwConfig *cfg);
void tw_config_unref(TwConfig *cfg);

#endif
