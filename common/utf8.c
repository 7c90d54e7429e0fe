/* Cleaning text from outside into valid UTF-8 (jansson refuses anything else: json_pack returns NULL). */
#include "utf8.h"

#include <stdio.h>
#include <stdlib.h>
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

/* The escape of the character at s (len > 0 bytes) into out; *used: how many bytes of s it stands for. */
static size_t escape_one(const char *s, size_t len, char out[9], size_t *used)
{
    unsigned char c = (unsigned char)s[0];
    int n = tw_utf8_char_len(s, len);
    const char *named = c == '\t' ? "\\t" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : NULL;

    *used = 1;
    if (named) {
        memcpy(out, named, 2);
        return 2;
    }
    if (c < 0x20 || c == 0x7f || n <= 0) {
        snprintf(out, 9, "\\x%02x", c);
        return 4;
    }
    if (c == 0xc2 && (unsigned char)s[1] < 0xa0) { /* C1 */
        *used = 2;
        snprintf(out, 9, "\\xc2\\x%02x", (unsigned char)s[1]);
        return 8;
    }
    *used = (size_t)n;
    memcpy(out, s, (size_t)n);
    return (size_t)n;
}

size_t tw_text_escape(char *buf, size_t size, const char *s, size_t len)
{
    size_t k = 0, i = 0;

    if (size == 0)
        return 0;
    while (i < len) {
        char piece[9];
        size_t used, n = escape_one(s + i, len - i, piece, &used);
        if (k + n >= size)
            break;
        memcpy(buf + k, piece, n);
        k += n;
        i += used;
    }
    buf[k] = '\0';
    return k;
}

char *tw_text_escaped(const char *s, size_t len)
{
    size_t size = 4 * len + 1;
    char *buf = len < ((size_t)-1) / 4 ? malloc(size) : NULL;

    if (buf)
        tw_text_escape(buf, size, s, len);
    return buf;
}
