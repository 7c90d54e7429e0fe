/* cron_cases.h — the one table of cron cases (tests/data/cron_cases.txt), read by the C check's unit test
 * (test_cron.c) and the SQL check's (test_cron_sql.c): each case's expression, time zone and "ok" or the
 * error both must give. Header-only: the unit test does not link the fixture. */
#ifndef TW_TESTS_CRON_CASES_H
#define TW_TESTS_CRON_CASES_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct CronCase {
    char expr[300], zone[300], want[300];
    int line;
} CronCase;

/* Every case of the table (malloc'd, *n of them); fails the test when the file is missing or a line is not
 * "EXPR | ZONE | WANT". */
static inline CronCase *cron_cases_load(size_t *n)
{
    const char *src = getenv("TW_SOURCE_DIR");
    char path[1024], buf[1024];
    CronCase *cases = NULL;
    int line = 0;

    ck_assert_ptr_nonnull(src);
    snprintf(path, sizeof path, "%s/tests/data/cron_cases.txt", src);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    *n = 0;
    while (fgets(buf, sizeof buf, f)) {
        line++;
        buf[strcspn(buf, "\n")] = '\0';
        if (buf[0] == '#' || buf[0] == '\0')
            continue;
        char *s1 = strstr(buf, " | ");
        char *s2 = s1 ? strstr(s1 + 3, " | ") : NULL;
        ck_assert_msg(s2 != NULL, "%s:%d: not EXPR | ZONE | WANT", path, line);
        cases = realloc(cases, (*n + 1) * sizeof *cases);
        ck_assert_ptr_nonnull(cases);
        CronCase *c = &cases[(*n)++];
        *s1 = *s2 = '\0';
        snprintf(c->expr, sizeof c->expr, "%.299s", buf);
        /* The zone without the spaces around it; the expression and the error exactly as written. */
        char *z = s1 + 3;
        z += strspn(z, " ");
        snprintf(c->zone, sizeof c->zone, "%.*s", (int)strcspn(z, " "), z);
        snprintf(c->want, sizeof c->want, "%.299s", s2 + 3);
        c->line = line;
    }
    fclose(f);
    ck_assert_int_gt((int)*n, 30);
    return cases;
}

#endif
