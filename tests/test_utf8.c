/* Unit tests for common/utf8.c: bytes from programs become valid UTF-8, cut on character boundaries. */
#include <check.h>
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

TW_SUITE_DEFINE(utf8, {
                          {"clean", valid_text_is_unchanged, 10},
                          {"clean", invalid_bytes_become_replacement_characters, 10},
                          {"clean", cuts_fall_on_character_boundaries, 10},
                          {"clean", char_len, 10},
                      })
