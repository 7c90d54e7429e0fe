/* Splitting text into words: an exec line into an argv, a comma list into its items. */
#ifndef TW_WORDS_H
#define TW_WORDS_H

#include <stddef.h>

/** Split an exec line into a NULL-terminated argv, with '…', "…" and backslash escapes; no expansion. NULL
 *  with *err saying why ("unterminated quote", "is empty", "out of memory"). */
char **tw_argv_split(const char *line, const char **err);
/** Accepts NULL. */
void tw_argv_free(char **argv);
/** Walks a comma-separated list ("a, b,c"): sets *item and *len to the next item without its blanks and
 * returns where the walk goes on, or NULL when no item is left. */
const char *tw_list_next(const char *p, const char **item, size_t *len);

#endif
