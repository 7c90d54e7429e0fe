/* Checks shared by the fuzz targets. A failed check prints what broke and abort()s, which libFuzzer
 * reports as a crash and saves the input for. */
#ifndef FZ_CHECK_H
#define FZ_CHECK_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/** abort() with a message unless ok. */
void fz_check(bool ok, const char *what);
/** True when the len bytes at s are well-formed UTF-8 with no NUL (checked here independently of
 *  common/utf8.c, which is under test). */
bool fz_utf8_valid(const char *s, size_t len);
/** Every string and key in j is valid UTF-8, and j survives json_dumps and json_loads unchanged. */
void fz_check_json(const json_t *j);
/** j[key] is a string that is valid UTF-8 and not empty; returns it. */
const char *fz_check_string(const json_t *j, const char *key);

#endif
