/* One gate for JSON documents from users: the size limit, the JSON grammar, and the type asked for. */
#include "jsondoc.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "names.h"
#include "utf8.h"

json_t *tw_jsondoc_parse(const char *buf, size_t len, unsigned flags, char *why, size_t why_size)
{
    json_error_t err;
    json_t *doc;
    const char *nul;
    char msg[JSON_ERROR_TEXT_LENGTH + 64];

    if (len > TW_DOC_MAX) {
        snprintf(msg, sizeof msg, "is over the %d byte limit", TW_DOC_MAX);
        goto fail;
    }
    /* jansson reads a NUL byte as the end of the input, even in json_loadb ("4\0" parses as 4), and
     * would hide whatever follows it; JSON text never contains one. */
    if ((nul = memchr(buf, '\0', len))) {
        snprintf(msg, sizeof msg, "is not valid JSON: it contains a NUL byte (at byte %zu)",
                 (size_t)(nul - buf));
        goto fail;
    }
    if (!(doc = json_loadb(buf, len, JSON_DECODE_ANY, &err))) {
        snprintf(msg, sizeof msg, "is not valid JSON: %s (line %d, column %d)", err.text, err.line,
                 err.column);
        goto fail;
    }
    if ((flags & TW_JSONDOC_OBJECT) && !json_is_object(doc)) {
        json_decref(doc);
        snprintf(msg, sizeof msg, "is JSON but not an object");
        goto fail;
    }
    return doc;
fail:
    /* why may be short; cut it on a character boundary so callers can put it in JSON or a log line. */
    tw_utf8_clean(why, why_size, msg, strlen(msg));
    return NULL;
}

/* The shortest of %.15g..%.17g that strtod reads back as d (17 digits always do). */
static int shortest_real(char *out, size_t size, double d)
{
    int n = 0;

    for (int prec = 15; prec <= 17; prec++) {
        n = snprintf(out, size, "%.*g", prec, d);
        if (n > 0 && (size_t)n < size && strtod(out, NULL) == d)
            break;
    }
    /* Still a real to whoever reads it (2.0, not 2), as jansson writes it. */
    if (n > 0 && (size_t)n + 2 < size && !strpbrk(out, ".eE"))
        n += snprintf(out + n, size - (size_t)n, ".0");
    return n;
}

char *tw_json_dumps(const json_t *j, size_t flags)
{
    char *text = json_dumps(j, flags), *out, *w;
    const char *r;
    bool in_string = false;

    if (!text)
        return NULL;
    /* Every real is rewritten no longer than jansson's 17 digits plus the sign and exponent it used. */
    if (!(out = malloc(strlen(text) + 1))) {
        free(text);
        return NULL;
    }
    /* jansson's own output: strings are quoted with backslash escapes, and a number outside a string starts
     * with '-' or a digit; a real is one that has '.', 'e' or 'E'. */
    for (r = text, w = out; *r;) {
        if (in_string) {
            if (*r == '\\' && r[1]) {
                *w++ = *r++;
            } else if (*r == '"') {
                in_string = false;
            }
            *w++ = *r++;
            continue;
        }
        if (*r == '"') {
            in_string = true;
            *w++ = *r++;
            continue;
        }
        if (*r == '-' || (*r >= '0' && *r <= '9')) {
            size_t len = strspn(r, "+-0123456789.eE");
            char tok[64], best[64];
            if (len < sizeof tok && strcspn(r, ".eE") < len) {
                memcpy(tok, r, len);
                tok[len] = '\0';
                int n = shortest_real(best, sizeof best, strtod(tok, NULL));
                if (n > 0 && (size_t)n <= len) {
                    memcpy(w, best, (size_t)n);
                    w += n;
                    r += len;
                    continue;
                }
            }
            memcpy(w, r, len);
            w += len;
            r += len;
            continue;
        }
        *w++ = *r++;
    }
    *w = '\0';
    free(text);
    return out;
}
