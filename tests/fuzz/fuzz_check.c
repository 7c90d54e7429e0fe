/* Checks shared by the fuzz targets (see fuzz_check.h). */
#include "fuzz_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fz_check(bool ok, const char *what)
{
    if (ok)
        return;
    fprintf(stderr, "fuzz check failed: %s\n", what);
    abort();
}

bool fz_utf8_valid(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;

    for (size_t i = 0; i < len;) {
        unsigned cp, min;
        size_t n;

        if (u[i] == 0)
            return false;
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        if ((u[i] & 0xe0) == 0xc0) {
            n = 2, cp = u[i] & 0x1f, min = 0x80;
        } else if ((u[i] & 0xf0) == 0xe0) {
            n = 3, cp = u[i] & 0x0f, min = 0x800;
        } else if ((u[i] & 0xf8) == 0xf0) {
            n = 4, cp = u[i] & 0x07, min = 0x10000;
        } else {
            return false;
        }
        if (len - i < n)
            return false;
        for (size_t k = 1; k < n; k++) {
            if ((u[i + k] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (u[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += n;
    }
    return true;
}

static void check_strings(const json_t *j)
{
    const char *key;
    json_t *v;
    size_t i;

    if (json_is_string(j)) {
        fz_check(fz_utf8_valid(json_string_value(j), json_string_length(j)), "a string is not valid UTF-8");
    } else if (json_is_object(j)) {
        json_object_foreach((json_t *)j, key, v)
        {
            fz_check(fz_utf8_valid(key, strlen(key)), "a key is not valid UTF-8");
            check_strings(v);
        }
    } else if (json_is_array(j)) {
        json_array_foreach(j, i, v)
        {
            check_strings(v);
        }
    }
}

void fz_check_json(const json_t *j)
{
    char *dump;
    json_t *back;

    fz_check(j != NULL, "NULL JSON value");
    check_strings(j);
    dump = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    fz_check(dump != NULL, "json_dumps failed");
    back = json_loads(dump, JSON_DECODE_ANY, NULL);
    fz_check(back != NULL, "json_dumps wrote something json_loads cannot read");
    fz_check(json_equal(j, back), "JSON changed on a dump and load");
    json_decref(back);
    free(dump);
}

const char *fz_check_string(const json_t *j, const char *key)
{
    const char *s = json_string_value(json_object_get(j, key));

    fz_check(s != NULL, key);
    fz_check(*s != '\0', "an empty string");
    return s;
}
