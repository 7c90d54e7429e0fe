/* test_cron_sql.c — the SQL side of cron expressions (sql/fn/cron.sql) on a real PostgreSQL: tw.cron_check
 * over the table the C check is run through too (tests/data/cron_cases.txt), and tw.cron_next over the days
 * daylight saving changes in Europe/Berlin (2026-03-29, 2026-10-25) and America/New_York (2026-03-08,
 * 2026-11-01), names, steps, 29 February and the day-of-month/day-of-week rule. */
#include "cron_cases.h"
#include "fixture.h"
#include "suite.h"

START_TEST(test_check_cases)
{
    size_t n;
    CronCase *cases = cron_cases_load(&n);
    TwFx *fx = tw_fx_new_migrated(NULL);
    int bad = 0;

    for (size_t i = 0; i < n; i++) {
        char *got = tw_fx_sql_str(fx, "SELECT coalesce(tw.cron_check($1, $2), 'ok')", 2, cases[i].expr,
                                  cases[i].zone);
        if (strcmp(got, cases[i].want) != 0) {
            fprintf(stderr, "cron_cases.txt:%d: '%s' in '%s': want \"%s\", got \"%s\"\n", cases[i].line,
                    cases[i].expr, cases[i].zone, cases[i].want, got);
            bad++;
        }
        free(got);
    }
    free(cases);
    ck_assert_msg(bad == 0, "%d of %zu cases differ (see above)", bad, n);
    tw_fx_free(fx);
}
END_TEST

/* The next `count` fire times of expr in zone after `after`, each "UTC/local" (HH:MI, with the day when
 * `days`), separated by spaces. */
static char *fires(TwFx *fx, const char *expr, const char *zone, const char *after, int count, bool days)
{
    char n[16];
    snprintf(n, sizeof n, "%d", count);
    return tw_fx_sql_str(
        fx,
        "WITH RECURSIVE r (i, t) AS (SELECT 0, $3::timestamptz UNION ALL "
        "SELECT i + 1, tw.cron_next($1, $2, t) FROM r WHERE i < $4::integer) "
        "SELECT string_agg(to_char(t AT TIME ZONE 'UTC', $5) || '/' || to_char(t AT TIME ZONE $2, $5), ' ' "
        "ORDER BY i) FROM r WHERE i > 0",
        5, expr, zone, after, n, days ? "MM-DD HH24:MI" : "HH24:MI");
}

#define FIRES(fx, expr, zone, after, count, days, want)                                                      \
    do {                                                                                                     \
        char *got_ = fires((fx), (expr), (zone), (after), (count), (days));                                  \
        ck_assert_msg(strcmp(got_, (want)) == 0, "%s in %s after %s:\n  want %s\n  got  %s", (expr), (zone), \
                      (after), (want), got_);                                                                \
        free(got_);                                                                                          \
    } while (0)

START_TEST(test_next_dst_berlin)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    /* Spring forward (02:00 CET -> 03:00 CEST, 01:00 UTC): 02:30 does not exist; it fires once, at 03:00. */
    FIRES(fx, "30 2 * * *", "Europe/Berlin", "2026-03-27T12:00Z", 3, true,
          "03-28 01:30/03-28 02:30 03-29 01:00/03-29 03:00 03-30 00:30/03-30 02:30");
    FIRES(fx, "0 * * * *", "Europe/Berlin", "2026-03-28T23:30Z", 3, false,
          "00:00/01:00 01:00/03:00 02:00/04:00");
    FIRES(fx, "30 1-3 * * *", "Europe/Berlin", "2026-03-28T12:00Z", 4, true,
          "03-29 00:30/03-29 01:30 03-29 01:00/03-29 03:00 03-29 01:30/03-29 03:30 03-29 23:30/03-30 01:30");
    FIRES(fx, "*/15 * * * *", "Europe/Berlin", "2026-03-29T00:30Z", 4, false,
          "00:45/01:45 01:00/03:00 01:15/03:15 01:30/03:30");
    /* Fall back (03:00 CEST -> 02:00 CET, 01:00 UTC): 02:30 happens twice; it fires once, at the first. An
     * hourly schedule fires every real hour, both 02:00s. */
    FIRES(fx, "30 2 * * *", "Europe/Berlin", "2026-10-24T12:00Z", 3, true,
          "10-25 00:30/10-25 02:30 10-26 01:30/10-26 02:30 10-27 01:30/10-27 02:30");
    FIRES(fx, "0 * * * *", "Europe/Berlin", "2026-10-24T22:30Z", 4, false,
          "23:00/01:00 00:00/02:00 01:00/02:00 02:00/03:00");
    FIRES(fx, "30 1-3 * * *", "Europe/Berlin", "2026-10-24T12:00Z", 4, true,
          "10-24 23:30/10-25 01:30 10-25 00:30/10-25 02:30 10-25 02:30/10-25 03:30 10-26 00:30/10-26 01:30");
    /* After the first 02:30, within the repeated hour: the next day's. */
    FIRES(fx, "30 2 * * *", "Europe/Berlin", "2026-10-25T01:10Z", 1, true, "10-26 01:30/10-26 02:30");
    /* 09:00 local in winter and in summer. */
    FIRES(fx, "0 9 * * mon-fri", "Europe/Berlin", "2026-01-09T09:00Z", 2, true,
          "01-12 08:00/01-12 09:00 01-13 08:00/01-13 09:00");
    FIRES(fx, "0 9 * * mon-fri", "Europe/Berlin", "2026-07-10T09:00Z", 2, true,
          "07-13 07:00/07-13 09:00 07-14 07:00/07-14 09:00");
    tw_fx_free(fx);
}
END_TEST

START_TEST(test_next_dst_new_york)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    /* Spring forward 2026-03-08 (02:00 EST -> 03:00 EDT, 07:00 UTC). */
    FIRES(fx, "30 2 * * *", "America/New_York", "2026-03-07T05:00Z", 3, true,
          "03-07 07:30/03-07 02:30 03-08 07:00/03-08 03:00 03-09 06:30/03-09 02:30");
    FIRES(fx, "0 * * * *", "America/New_York", "2026-03-08T05:30Z", 3, false,
          "06:00/01:00 07:00/03:00 08:00/04:00");
    FIRES(fx, "30 1-3 * * *", "America/New_York", "2026-03-08T05:00Z", 3, false,
          "06:30/01:30 07:00/03:00 07:30/03:30");
    /* Fall back 2026-11-01 (02:00 EDT -> 01:00 EST, 06:00 UTC): 01:00-01:59 happens twice. */
    FIRES(fx, "30 1 * * *", "America/New_York", "2026-10-31T12:00Z", 2, true,
          "11-01 05:30/11-01 01:30 11-02 06:30/11-02 01:30");
    FIRES(fx, "0 * * * *", "America/New_York", "2026-11-01T04:30Z", 4, false,
          "05:00/01:00 06:00/01:00 07:00/02:00 08:00/03:00");
    FIRES(fx, "30 1-3 * * *", "America/New_York", "2026-11-01T04:00Z", 3, false,
          "05:30/01:30 07:30/02:30 08:30/03:30");
    FIRES(fx, "0 9 * * mon-fri", "America/New_York", "2026-11-02T12:00Z", 1, true, "11-02 14:00/11-02 09:00");
    tw_fx_free(fx);
}
END_TEST

START_TEST(test_next_fields)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    FIRES(fx, "*/15 * * * *", "UTC", "2026-05-01T10:07Z", 3, false, "10:15/10:15 10:30/10:30 10:45/10:45");
    FIRES(fx, "0 12 * jan,JUL sun", "UTC", "2026-02-01T00:00Z", 2, true,
          "07-05 12:00/07-05 12:00 07-12 12:00/07-12 12:00");
    /* Day-of-week 7 is Sunday, as 0 is. */
    FIRES(fx, "0 0 * * 7", "UTC", "2026-01-01T00:00Z", 1, true, "01-04 00:00/01-04 00:00");
    /* Both day fields restricted: either matches (1 January 2026 is a Thursday; the 13th of February, a
     * Friday the 13th, ...). Only one restricted: that one. */
    FIRES(fx, "0 0 13 * fri", "UTC", "2026-01-01T00:00Z", 3, true,
          "01-02 00:00/01-02 00:00 01-09 00:00/01-09 00:00 01-13 00:00/01-13 00:00");
    FIRES(fx, "0 0 * * fri", "UTC", "2026-01-01T00:00Z", 1, true, "01-02 00:00/01-02 00:00");
    FIRES(fx, "0 0 */10 * *", "UTC", "2026-01-01T00:00Z", 3, true,
          "01-11 00:00/01-11 00:00 01-21 00:00/01-21 00:00 01-31 00:00/01-31 00:00");
    /* 29 February: the next leap year. */
    char *t = tw_fx_sql_str(fx, "SELECT tw.cron_next('0 0 29 2 *', 'UTC', '2026-01-01T00:00Z')::text", 0);
    ck_assert_str_eq(t, "2028-02-29 00:00:00+00");
    free(t);
    /* Strictly after. */
    t = tw_fx_sql_str(fx, "SELECT tw.cron_next('0 9 * * *', 'UTC', '2026-01-01T09:00Z')::text", 0);
    ck_assert_str_eq(t, "2026-01-02 09:00:00+00");
    free(t);
    /* A bad expression is refused. */
    char *err = NULL;
    ck_assert(!tw_fx_sql_try(fx, &err, "SELECT tw.cron_next('0 25 * * *', 'UTC', now())", 0));
    ck_assert_msg(err && strstr(err, "cron field 2 (hour) value 25 out of range 0-23"), "%s", err ? err : "");
    free(err);
    tw_fx_free(fx);
}
END_TEST

TW_SUITE_DEFINE(cron_sql, {
                              {"check", test_check_cases, 120},
                              {"next", test_next_dst_berlin, 120},
                              {"next", test_next_dst_new_york, 120},
                              {"next", test_next_fields, 120},
                          })
