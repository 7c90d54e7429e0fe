/* suite.h — builds a test file's Check suite from one table: a row per test with its case's name and
 * timeout. Header-only, so the unit tests that do not link the fixture use it too. */
#ifndef TW_TESTS_SUITE_H
#define TW_TESTS_SUITE_H

#include <check.h>
#include <stddef.h>
#include <string.h>

/* One test of a Check test case: rows that name the case of the row before add their test to that case (one
 * TCase, so CK_RUN_CASE=<name> runs them all); a case keeps the timeout of its first row. */
typedef struct TwCase {
    const char *name;
    const TTest *test;
    int timeout_sec;
} TwCase;

/* A suite of `n` rows; `setup`/`teardown` (NULL for none) become a checked fixture of every case. */
static inline Suite *tw_suite_new(const char *name, const TwCase *cases, size_t n, SFun setup, SFun teardown)
{
    Suite *s = suite_create(name);
    TCase *tc = NULL;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || strcmp(cases[i].name, cases[i - 1].name) != 0) {
            tc = tcase_create(cases[i].name);
            if (setup || teardown)
                tcase_add_checked_fixture(tc, setup, teardown);
            tcase_set_timeout(tc, cases[i].timeout_sec);
            suite_add_tcase(s, tc);
        }
        tcase_add_test(tc, cases[i].test);
    }
    return s;
}

/* Defines `Suite *<name>_suite(void)`, the constructor the runner calls, from the table given inline:
 *     TW_SUITE_DEFINE(utf8, {
 *         {"clean", valid_text_is_unchanged, 10},
 *         {"clean", char_len, 10},
 *     })
 * TW_SUITE_DEFINE_CHECKED gives every case the checked fixture `setup`/`teardown`. */
#define TW_SUITE_DEFINE_CHECKED(name, setup, teardown, ...)                                                  \
    Suite *name##_suite(void);                                                                               \
    Suite *name##_suite(void)                                                                                \
    {                                                                                                        \
        const TwCase cases[] = __VA_ARGS__;                                                                  \
        return tw_suite_new(#name, cases, sizeof cases / sizeof cases[0], (setup), (teardown));              \
    }

#define TW_SUITE_DEFINE(name, ...) TW_SUITE_DEFINE_CHECKED(name, NULL, NULL, __VA_ARGS__)

#endif
