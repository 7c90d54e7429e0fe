/* STUB: replaced by the cron engine (i37-cron) */
#include "cron.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int minute_field(const char *f, size_t n)
{
    char buf[8];
    char *end;
    long v;

    if (n == 1 && f[0] == '*')
        return 0;
    if (n > 2 && f[0] == '*' && f[1] == '/') {
        f += 2;
        n -= 2;
    }
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, f, n);
    buf[n] = '\0';
    v = strtol(buf, &end, 10);
    return *end || v < 0 || v > 59 ? -1 : 0;
}

int tw_cron_check(const char *expr, char *err, size_t errlen)
{
    const char *sp = expr ? strchr(expr, ' ') : NULL;

    if (!sp || strcmp(sp, " * * * *") != 0 || minute_field(expr, (size_t)(sp - expr)) != 0) {
        snprintf(err, errlen,
                 "'%s': expected five fields (this build knows * * * * *, */N * * * * and M * * * *)",
                 expr ? expr : "");
        return -1;
    }
    return 0;
}

int tw_timezone_check(const char *name, char *err, size_t errlen)
{
    if (name && strcmp(name, "UTC") == 0)
        return 0;
    snprintf(err, errlen, "unknown time zone '%s' (this build knows UTC only)", name ? name : "");
    return -1;
}
