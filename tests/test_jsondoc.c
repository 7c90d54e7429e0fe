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

/* Reals in the fewest digits that read back as the same double; nothing else changes. */
static void assert_dumps(const char *in, const char *want)
{
    json_t *j = json_loads(in, JSON_DECODE_ANY, NULL);
    ck_assert_msg(j != NULL, "test input %s", in);
    char *got = tw_json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    ck_assert_ptr_nonnull(got);
    ck_assert_str_eq(got, want);
    /* Whatever was shortened reads back as the same value. */
    json_t *back = json_loads(got, JSON_DECODE_ANY, NULL);
    ck_assert_msg(json_equal(j, back), "%s does not read back as %s", got, in);
    json_decref(back);
    free(got);
    json_decref(j);
}

START_TEST(reals_are_written_short)
{
    assert_dumps("{\"a\":0.1,\"b\":11.998,\"c\":-2.5e-7}", "{\"a\":0.1,\"b\":11.998,\"c\":-2.5e-07}");
    /* A double that needs 17 digits keeps them; an integral real stays a real; integers are untouched. */
    assert_dumps("[0.30000000000000004,2.0,1e300,-0.0,123456789012345678]",
                 "[0.30000000000000004,2.0,1e+300,-0.0,123456789012345678]");
    /* Numbers inside strings, escaped quotes and backslashes are left as they are. */
    assert_dumps("{\"s\":\"0.10000000000000001 \\\" 1.5\",\"t\":\"\\\\\",\"n\":1.5}",
                 "{\"s\":\"0.10000000000000001 \\\" 1.5\",\"t\":\"\\\\\",\"n\":1.5}");
    assert_dumps("0.1", "0.1");
}
END_TEST

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

TW_SUITE_DEFINE(jsondoc, {
                             {"parse", documents_are_parsed, 10},
                             {"parse", bad_documents_say_why, 10},
                             {"parse", size_limit, 10},
                             {"parse", short_reason_buffer_is_cut_cleanly, 10},
                             {"dumps", reals_are_written_short, 10},
                         })
