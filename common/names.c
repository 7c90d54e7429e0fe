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
