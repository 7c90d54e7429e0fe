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

/** Text from outside made safe for a terminal and for one line of a text log: every control character
 *  becomes a visible escape, C0 (U+0000 to U+001F: "\t", "\n", "\r", the others and ESC as "\xNN"), DEL
 *  ("\x7f") and C1 (U+0080 to U+009F, written C2 80 to C2 9F: "\xc2\xNN"), and so does each byte that does
 *  not start a well-formed UTF-8 character ("\xNN": a lone 9B is CSI to a terminal of 8-bit controls). The
 *  rest, backslashes too, is copied as is: the result holds no byte that starts a terminal sequence or ends
 *  a line. Writes at most size - 1 bytes and a NUL into buf (size > 0), never half an escape or half a
 *  character; returns the length written. Four bytes out per byte in are always enough. */
size_t tw_text_escape(char *buf, size_t size, const char *s, size_t len);

/** tw_text_escape of the len bytes at s into a malloc'd string (NULL when out of memory). */
char *tw_text_escaped(const char *s, size_t len);

#endif
