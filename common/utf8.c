/* Cleaning text from outside into valid UTF-8 (jansson refuses anything else: json_pack returns NULL). */
#include "utf8.h"

#include <string.h>

#define TW_UTF8_REPLACEMENT "\xef\xbf\xbd" /* U+FFFD */

int tw_utf8_char_len(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    unsigned char lo = 0x80, hi = 0xbf; /* allowed range of the second byte (Unicode table 3-7) */
    int n;

    if (len == 0)
        return 0;
    if (u[0] < 0x80)
        return 1;
    if (u[0] < 0xc2) /* continuation byte, or an overlong two-byte form */
        return 0;
    if (u[0] < 0xe0) {
        n = 2;
    } else if (u[0] < 0xf0) {
        n = 3;
        if (u[0] == 0xe0)
            lo = 0xa0; /* overlong */
        else if (u[0] == 0xed)
            hi = 0x9f; /* surrogates */
    } else if (u[0] < 0xf5) {
        n = 4;
        if (u[0] == 0xf0)
            lo = 0x90; /* overlong */
        else if (u[0] == 0xf4)
            hi = 0x8f; /* above U+10FFFF */
    } else {
        return 0;
    }
    for (int i = 1; i < n; i++) {
        if ((size_t)i >= len)
            return -1;
        if (u[i] < (i == 1 ? lo : 0x80) || u[i] > (i == 1 ? hi : 0xbf))
            return 0;
    }
    return n;
}

size_t tw_utf8_clean(char *buf, size_t size, const char *s, size_t len)
{
    size_t k = 0, i = 0;

    if (size == 0)
        return 0;
    while (i < len) {
        int n = tw_utf8_char_len(s + i, len - i);
        const char *piece = s + i;
        size_t plen = (size_t)n;

        if (n < 0) /* cut inside a character */
            break;
        if (n == 0 || s[i] == '\0') {
            piece = TW_UTF8_REPLACEMENT;
            plen = sizeof TW_UTF8_REPLACEMENT - 1;
            n = 1;
        }
        if (k + plen >= size)
            break;
        memcpy(buf + k, piece, plen);
        k += plen;
        i += (size_t)n;
    }
    buf[k] = '\0';
    return k;
}
