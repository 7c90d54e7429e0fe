/* One gate for JSON documents from users: the size limit, the JSON grammar, and the type asked for. */
#include "jsondoc.h"

#include <stdio.h>
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
