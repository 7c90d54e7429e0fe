/* JSON documents that users hand the CLI (submit --input / --input-file, tool-result --output), checked
 * the same way wherever they come in (docs/limits.md). */
#ifndef TW_JSONDOC_H
#define TW_JSONDOC_H

#include <jansson.h>
#include <stddef.h>

/** Require a JSON object (otherwise any JSON value is accepted). */
#define TW_JSONDOC_OBJECT 0x1

/** Parse len bytes (need not be NUL-terminated; a NUL byte anywhere is an error) as one JSON
 *  document of at most TW_DOC_MAX bytes. Returns a new reference, or NULL with why (a sentence
 *  fragment such as "is over the 1048576 byte limit" or "is not valid JSON: … (line 1, column 3)",
 *  valid UTF-8, to follow the document's name) filled in. */
json_t *tw_jsondoc_parse(const char *buf, size_t len, unsigned flags, char *why, size_t why_size);

/** json_dumps(j, flags), with every real number written in the fewest digits that read back as the same
 *  double: jansson writes 17 significant digits, so a program's 0.1 would be stored as 0.10000000000000001.
 *  Caller frees; NULL when out of memory or jansson cannot encode j. */
char *tw_json_dumps(const json_t *j, size_t flags);

#endif
