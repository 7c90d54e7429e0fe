/* Validation of names and identifiers that come from outside. */
#include "names.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

bool tw_name_valid(const char *name)
{
    size_t n;

    if (!name)
        return false;
    n = strlen(name);
    if (n < 1 || n > TW_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!isalnum(c) && c != '_' && c != '-')
            return false;
    }
    return true;
}

bool tw_ident_valid(const char *s)
{
    size_t n;

    if (!s)
        return false;
    n = strlen(s);
    if (n < 1 || n > 256)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            return false;
    }
    return true;
}

bool tw_subject_valid(const char *subject)
{
    size_t n, token = 0;

    if (!subject)
        return false;
    n = strlen(subject);
    if (n < 1 || n > TW_SUBJECT_MAX)
        return false;
    for (size_t i = 0; i <= n; i++) {
        unsigned char c = (unsigned char)subject[i];
        if (c == '.' || c == '\0') {
            if (token == 0)
                return false; /* an empty token: leading, trailing or double dot */
            token = 0;
        } else if (c <= 0x20 || c >= 0x7f || c == '*' || c == '>') {
            return false;
        } else {
            token++;
        }
    }
    return true;
}

bool tw_doorbell_parse(const char *subject, const char **kind, char *name, const char **why)
{
    static const char *const kinds[] = {"agent", "tool"};
    static const char wakeup[] = ".wakeup";
    const char *k = NULL, *start, *end;
    const char *dummy;
    size_t n, len;

    if (!why)
        why = &dummy;
    if (!subject) {
        *why = "no subject";
        return false;
    }
    if (!tw_subject_valid(subject)) {
        *why = "not a valid subject (white space, control bytes, empty tokens, wildcards or too long)";
        return false;
    }
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0] && !k; i++) {
        len = strlen(kinds[i]);
        if (strncmp(subject, "cmd.", 4) == 0 && strncmp(subject + 4, kinds[i], len) == 0 &&
            subject[4 + len] == '.')
            k = kinds[i];
    }
    if (!k) {
        *why = "not cmd.agent.* or cmd.tool.*";
        return false;
    }
    start = subject + 4 + strlen(k) + 1;
    n = strlen(start);
    end = n >= sizeof wakeup - 1 ? start + n - (sizeof wakeup - 1) : NULL;
    if (!end || strcmp(end, wakeup) != 0 || end == start) {
        *why = "not a doorbell (cmd.<kind>.<name>.wakeup)";
        return false;
    }
    len = (size_t)(end - start);
    if (len > TW_NAME_MAX || memchr(start, '.', len)) {
        *why = "not a valid name";
        return false;
    }
    char buf[TW_NAME_MAX + 1];
    memcpy(buf, start, len);
    buf[len] = '\0';
    if (!tw_name_valid(buf)) {
        *why = "not a valid name";
        return false;
    }
    if (kind)
        *kind = k;
    if (name)
        memcpy(name, buf, len + 1);
    return true;
}

/* How a byte from outside is shown in a log line (tw_shown): into e, its length returned. */
static size_t shown_byte(unsigned char c, char e[4])
{
    static const char hex[] = "0123456789abcdef";

    if (c == '"' || c == '\\') {
        e[0] = '\\', e[1] = (char)c;
        return 2;
    }
    if (c >= 0x20 && c < 0x7f) {
        e[0] = (char)c;
        return 1;
    }
    if (c == '\r' || c == '\n' || c == '\t') {
        e[0] = '\\', e[1] = c == '\r' ? 'r' : c == '\n' ? 'n' : 't';
        return 2;
    }
    e[0] = '\\', e[1] = 'x', e[2] = hex[c >> 4], e[3] = hex[c & 15];
    return 4;
}

const char *tw_shown(const char *s, size_t len, char *buf, size_t size)
{
    size_t o = 0, all = 0, room;
    char e[4];

    if (size < 4) {
        if (size > 0)
            buf[0] = '\0';
        return buf;
    }
    for (size_t i = 0; i < len; i++)
        all += shown_byte((unsigned char)s[i], e);
    /* All of it when it fits, else as much as leaves room for the "..." of the cut. */
    room = all <= size - 1 ? size - 1 : size - 4;
    for (size_t i = 0; i < len; i++) {
        size_t w = shown_byte((unsigned char)s[i], e);
        if (o + w > room)
            break;
        memcpy(buf + o, e, w);
        o += w;
    }
    if (all > size - 1) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}

bool tw_uuid_valid(const char *s)
{
    static const int groups[] = {8, 4, 4, 4, 12};

    if (!s || strlen(s) != 36)
        return false;
    for (int g = 0, pos = 0; g < 5; g++) {
        for (int i = 0; i < groups[g]; i++, pos++)
            if (!isxdigit((unsigned char)s[pos]))
                return false;
        if (g < 4 && s[pos++] != '-')
            return false;
    }
    return true;
}

bool tw_listen_parse(const char *addr, char *host, size_t host_size, int *port)
{
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    const char *h, *he;
    char *end;
    long p;

    if (!colon || colon == addr || !colon[1])
        return false;
    h = addr;
    he = colon;
    if (*h == '[') {
        if (he[-1] != ']' || he - h < 3)
            return false;
        h++;
        he--;
        for (const char *c = h; c < he; c++)
            if (!isxdigit((unsigned char)*c) && *c != ':' && *c != '.')
                return false;
    } else {
        for (const char *c = h; c < he; c++)
            if (!isalnum((unsigned char)*c) && *c != '.' && *c != '-')
                return false;
    }
    if ((size_t)(he - h) >= host_size || he - h > 253)
        return false;
    for (const char *c = colon + 1; *c; c++)
        if (!isdigit((unsigned char)*c))
            return false;
    p = strtol(colon + 1, &end, 10);
    if (*end || p < 1 || p > 65535)
        return false;
    memcpy(host, h, (size_t)(he - h));
    host[he - h] = '\0';
    *port = (int)p;
    return true;
}
