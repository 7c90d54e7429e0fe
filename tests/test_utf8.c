/* Unit tests for common/utf8.c: bytes from programs become valid UTF-8, cut on character boundaries; text for
 * a terminal or a log line has its control characters escaped. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"
#include "suite.h"

static const char *clean(const char *s, size_t len, size_t size)
{
    static char buf[256];

    ck_assert_uint_le(size, sizeof buf);
    size_t n = tw_utf8_clean(buf, size, s, len);
    ck_assert_uint_eq(n, strlen(buf));
    ck_assert_uint_lt(n, size);
    return buf;
}

#define CLEAN(lit) clean(lit, sizeof lit - 1, 256)
#define FFFD "\xef\xbf\xbd"

START_TEST(valid_text_is_unchanged)
{
    ck_assert_str_eq(CLEAN("plain ascii\n"), "plain ascii\n");
    ck_assert_str_eq(CLEAN("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf"),
                     "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf");
    ck_assert_str_eq(CLEAN(""), "");
}
END_TEST

START_TEST(invalid_bytes_become_replacement_characters)
{
    ck_assert_str_eq(CLEAN("\xff\xfe"), FFFD FFFD);
    ck_assert_str_eq(CLEAN("a\x80z"), "a" FFFD "z");                  /* stray continuation */
    ck_assert_str_eq(CLEAN("\xc0\xaf"), FFFD FFFD);                   /* overlong '/' */
    ck_assert_str_eq(CLEAN("\xe0\x80\xaf"), FFFD FFFD FFFD);          /* overlong, three bytes */
    ck_assert_str_eq(CLEAN("\xed\xa0\x80"), FFFD FFFD FFFD);          /* surrogate U+D800 */
    ck_assert_str_eq(CLEAN("\xf4\x90\x80\x80"), FFFD FFFD FFFD FFFD); /* above U+10FFFF */
    ck_assert_str_eq(CLEAN("\xc3(x"), FFFD "(x");                     /* lead byte, then ASCII */
    ck_assert_str_eq(CLEAN("\xe2\x82"
                           "x\xe2\x82\xac"),
                     FFFD FFFD "x\xe2\x82\xac");           /* broken, then whole */
    ck_assert_str_eq(clean("a\0b", 3, 256), "a" FFFD "b"); /* NUL would end the string */
}
END_TEST

START_TEST(cuts_fall_on_character_boundaries)
{
    /* Input cut inside a character: the partial character is dropped, not replaced. */
    ck_assert_str_eq(CLEAN("ab\xe2\x82"), "ab");
    ck_assert_str_eq(CLEAN("ab\xf0\x9f\x98"), "ab");
    /* Output full: stop before a character that does not fit, whole or replaced. */
    ck_assert_str_eq(clean("\xe2\x82\xac\xe2\x82\xac", 6, 6), "\xe2\x82\xac");
    ck_assert_str_eq(clean("\xe2\x82\xac\xe2\x82\xac", 6, 7), "\xe2\x82\xac\xe2\x82\xac");
    ck_assert_str_eq(clean("ab\xff", 3, 5), "ab");
    ck_assert_str_eq(clean("abc", 3, 1), "");
}
END_TEST

START_TEST(char_len)
{
    ck_assert_int_eq(tw_utf8_char_len("a", 1), 1);
    ck_assert_int_eq(tw_utf8_char_len("\xc3\xa9", 2), 2);
    ck_assert_int_eq(tw_utf8_char_len("\xe2\x82\xac", 3), 3);
    ck_assert_int_eq(tw_utf8_char_len("\xf0\x9f\x98\x80", 4), 4);
    ck_assert_int_eq(tw_utf8_char_len("\xe2\x82", 2), -1);
    ck_assert_int_eq(tw_utf8_char_len("\xe2\x28\xac", 3), 0);
    ck_assert_int_eq(tw_utf8_char_len("\xf5\x80\x80\x80", 4), 0);
    ck_assert_int_eq(tw_utf8_char_len("", 0), 0);
}
END_TEST

static const char *escape(const char *s, size_t len, size_t size)
{
    static char buf[512];

    ck_assert_uint_le(size, sizeof buf);
    size_t n = tw_text_escape(buf, size, s, len);
    ck_assert_uint_eq(n, strlen(buf));
    ck_assert_uint_lt(n, size);
    return buf;
}

#define ESCAPE(lit) escape(lit, sizeof lit - 1, 512)

/* Printable text, UTF-8 included, is unchanged; backslashes too. */
START_TEST(escape_keeps_printable_text)
{
    ck_assert_str_eq(ESCAPE(""), "");
    ck_assert_str_eq(ESCAPE("plain text, 100% ~ {\"json\": [1]}"), "plain text, 100% ~ {\"json\": [1]}");
    ck_assert_str_eq(ESCAPE("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xc2\xa0\xc2\xbf"),
                     "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xc2\xa0\xc2\xbf");
    ck_assert_str_eq(ESCAPE("a\\x1b\\n"), "a\\x1b\\n");
}
END_TEST

/* Every C0 character, DEL and every C1 character (U+0080..U+009F) is escaped; so is a byte that starts no
 * well-formed character, a lone 9B (CSI) among them, and a character cut by the end. */
START_TEST(escape_control_characters)
{
    ck_assert_str_eq(ESCAPE("\r\x1b]0;x\x07"
                            "ERROR: forged line"),
                     "\\r\\x1b]0;x\\x07ERROR: forged line");
    ck_assert_str_eq(ESCAPE("a\tb\nc\rd"), "a\\tb\\nc\\rd");
    ck_assert_str_eq(escape("a\0b", 3, 512), "a\\x00b");
    ck_assert_str_eq(ESCAPE("\x1b[31mred\x1b[0m"), "\\x1b[31mred\\x1b[0m");
    ck_assert_str_eq(ESCAPE("del\x7f"), "del\\x7f");
    ck_assert_str_eq(ESCAPE("csi\xc2\x9b"
                            "31m nel\xc2\x85 pad\xc2\x80"),
                     "csi\\xc2\\x9b31m nel\\xc2\\x85 pad\\xc2\\x80");
    ck_assert_str_eq(ESCAPE("lone\x9b"
                            "31m \xff\xc0\xaf"),
                     "lone\\x9b31m \\xff\\xc0\\xaf");
    ck_assert_str_eq(ESCAPE("cut\xe2\x82"), "cut\\xe2\\x82");
    /* All 32 C0 characters: none is left as it was. */
    for (int c = 0; c < 0x20; c++) {
        char in[1] = {(char)c};
        const char *out = escape(in, 1, 512);
        ck_assert_msg(out[0] == '\\' && strlen(out) >= 2, "0x%02x became '%s'", c, out);
        for (const char *p = out; *p; p++)
            ck_assert_msg((unsigned char)*p >= 0x20 && *p != 0x7f, "0x%02x became '%s'", c, out);
    }
}
END_TEST

/* When the output fills up, the copy stops before an escape or a character that does not fit whole. */
START_TEST(escape_cuts_whole_escapes)
{
    ck_assert_str_eq(escape("ab\x1b", 3, 6), "ab");
    ck_assert_str_eq(escape("ab\x1b", 3, 7), "ab\\x1b");
    ck_assert_str_eq(escape("a\xc2\x9b", 3, 9), "a");
    ck_assert_str_eq(escape("a\xc2\x9b", 3, 10), "a\\xc2\\x9b");
    ck_assert_str_eq(escape("\xe2\x82\xac\xe2\x82\xac", 6, 6), "\xe2\x82\xac");
    ck_assert_str_eq(escape("abc", 3, 1), "");
    /* Four bytes out per byte in are enough, whatever the input. */
    char worst[64];
    memset(worst, 0x1b, sizeof worst);
    char *all = tw_text_escaped(worst, sizeof worst);
    ck_assert_ptr_nonnull(all);
    ck_assert_uint_eq(strlen(all), 4 * sizeof worst);
    free(all);
    all = tw_text_escaped("\xc2\x85\xc2\x85", 4);
    ck_assert_str_eq(all, "\\xc2\\x85\\xc2\\x85");
    free(all);
}
END_TEST

TW_SUITE_DEFINE(utf8, {
                          {"clean", valid_text_is_unchanged, 10},
                          {"clean", invalid_bytes_become_replacement_characters, 10},
                          {"clean", cuts_fall_on_character_boundaries, 10},
                          {"clean", char_len, 10},
                          {"escape", escape_keeps_printable_text, 10},
                          {"escape", escape_control_characters, 10},
                          {"escape", escape_cuts_whole_escapes, 10},
                      })
