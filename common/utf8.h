/* Text that programs and users hand us is bytes; JSON (jansson, PostgreSQL jsonb) needs valid UTF-8. */
#ifndef TW_UTF8_H
#define TW_UTF8_H

#include <stddef.h>

/** Copy len bytes of s into buf (size > 0 bytes, always NUL-terminated) as valid UTF-8, for jansson:
 *  each byte that does not start a well-formed character (stray continuation bytes, overlong forms,
 *  surrogates, code points above U+10FFFF, bytes F5..FF) and each NUL becomes U+FFFD; a character left
 *  incomplete by the end of s is dropped, for s was cut there. When buf fills up the copy stops on a
 *  character boundary. Returns the length written (without the NUL). */
size_t tw_utf8_clean(char *buf, size_t size, const char *s, size_t len);

/** Length of the well-formed UTF-8 character at s (1 to 4 bytes, at most len), or 0 when s[0] does not
 *  start one, or -1 when s ends inside a character that could still be well-formed. */
int tw_utf8_char_len(const char *s, size_t len);

#endif
