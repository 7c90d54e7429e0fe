/* test_cron.c — the C check of cron expressions and time zones (common/cron.c, what --check-config runs) over
 * the table that the SQL check is run through too (tests/data/cron_cases.txt, tests/test_cron_sql.c). */
#include <check.h>
#include <stdio.h>

#include "cron.h"
#include "cron_cases.h"
#include "suite.h"

START_TEST(test_cases)
{
    size_t n;
    CronCase *cases = cron_cases_load(&n);
    int bad = 0;

    for (size_t i = 0; i < n; i++) {
        char err[512] = "";
        const char *got = "ok";
        if (tw_cron_check(cases[i].expr, err, sizeof err) != 0 ||
            tw_cron_zone_check(cases[i].zone, err, sizeof err) != 0)
            got = err;
        if (strcmp(got, cases[i].want) != 0) {
            fprintf(stderr, "cron_cases.txt:%d: '%s' in '%s': want \"%s\", got \"%s\"\n", cases[i].line,
                    cases[i].expr, cases[i].zone, cases[i].want, got);
            bad++;
        }
    }
    free(cases);
    ck_assert_msg(bad == 0, "%d of %zu cases differ (see above)", bad, n);
}
END_TEST

START_TEST(test_long_and_null)
{
    char expr[400], err[256];
    memset(expr, '1', sizeof expr - 1);
    expr[sizeof expr - 1] = '\0';
    ck_assert_int_eq(tw_cron_check(expr, err, sizeof err), -1);
    ck_assert_str_eq(err, "cron expression longer than 256 characters");
    ck_assert_int_eq(tw_cron_check(NULL, err, sizeof err), -1);
    ck_assert_int_eq(tw_cron_zone_check(NULL, err, sizeof err), -1);
    ck_assert_int_eq(tw_cron_zone_check("Europe/../Europe/Berlin", err, sizeof err), -1);
    ck_assert_int_eq(tw_cron_zone_check("Europe/Berlin", err, sizeof err), 0);
}
END_TEST

TW_SUITE_DEFINE(cron, {
                          {"cron", test_cases, 30},
                          {"cron", test_long_and_null, 30},
                      })
