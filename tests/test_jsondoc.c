/* Unit tests for common/jsondoc.c: the gate for JSON documents users give the CLI (contract section 8). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "jsondoc.h"
#include "names.h"
#include "suite.h"

static char why[256];

static json_t *parse(const char *s, size_t len, unsigned flags)
{
    why[0] = '\0';
    return tw_jsondoc_parse(s, len, flags, why, sizeof why);
}

static void assert_refused(const char *s, size_t len, unsigned flags, const char *in_why)
{
    json_t *j = parse(s, len, flags);
    ck_assert_msg(j == NULL, "'%s' was accepted", s);
    ck_assert_msg(strstr(why, in_why), "reason '%s' lacks '%s'", why, in_why);
}

#define REFUSED(lit, flags, in_why) assert_refused(lit, sizeof lit - 1, flags, in_why)

START_TEST(documents_are_parsed)
{
    json_t *j = parse("{\"a\":[1,\"\\u00e9\"]}", 18, TW_JSONDOC_OBJECT);
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(json_string_value(json_array_get(json_object_get(j, "a"), 1)), "\xc3\xa9");
    json_decref(j);
    /* Any value unless an object is asked for. */
    j = parse("42", 2, 0);
    ck_assert_int_eq(json_integer_value(j), 42);
    json_decref(j);
    REFUSED("42", TW_JSONDOC_OBJECT, "is JSON but not an object");
    REFUSED("\"text\"", TW_JSONDOC_OBJECT, "is JSON but not an object");
}
END_TEST

START_TEST(bad_documents_say_why)
{
    REFUSED("", 0, "is not valid JSON: ");
    REFUSED("{\"a\":", 0, "is not valid JSON: ");
    REFUSED("{'a': 1}", 0, "(line 1, column 2)");
    REFUSED("{\"a\":\"\xff\"}", 0, "unable to decode byte 0xff");
    REFUSED("{\"a\":\"\\ud800\"}", 0, "is not valid JSON");
    REFUSED("{\"a\":\"\\u0000\"}", 0, "is not valid JSON");
    /* A NUL byte is refused wherever it is; jansson alone takes "4\0" as 4. */
    REFUSED("4\0", 0, "contains a NUL byte (at byte 1)");
    REFUSED("{}\0{\"hidden\":1}", 0, "contains a NUL byte (at byte 2)");
}
END_TEST

START_TEST(size_limit)
{
    char *doc = malloc(TW_DOC_MAX + 1);

    /* {"p":"xxx…"} of exactly TW_DOC_MAX bytes is accepted; one byte more is not. */
    memset(doc, 'x', TW_DOC_MAX + 1);
    memcpy(doc, "{\"p\":\"", 6);
    memcpy(doc + TW_DOC_MAX - 2, "\"}", 2);
    json_t *j = parse(doc, TW_DOC_MAX, TW_JSONDOC_OBJECT);
    ck_assert_ptr_nonnull(j);
    ck_assert_uint_eq(strlen(json_string_value(json_object_get(j, "p"))), TW_DOC_MAX - 8);
    json_decref(j);
    memcpy(doc + TW_DOC_MAX - 2, "x\"}", 3);
    assert_refused(doc, TW_DOC_MAX + 1, 0, "is over the 1048576 byte limit");
    free(doc);
}
END_TEST

START_TEST(short_reason_buffer_is_cut_cleanly)
{
    char small[24];

    /* "is not valid JSON: unable to decode byte 0xff…" cut to 23 bytes: still a C string, still ASCII. */
    ck_assert_ptr_null(tw_jsondoc_parse("\"\xff\"", 3, 0, small, sizeof small));
    ck_assert_str_eq(small, "is not valid JSON: unab");
}
END_TEST

Suite *jsondoc_suite(void)
{
    const TwCase cases[] = {
        {"parse", documents_are_parsed, 10},
        {"parse", bad_documents_say_why, 10},
        {"parse", size_limit, 10},
        {"parse", short_reason_buffer_is_cut_cleanly, 10},
    };
    return TW_SUITE("jsondoc", cases);
}
