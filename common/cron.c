/* Cron expressions: the check that `--check-config` runs without a database, the same grammar and errors as
 * the SQL's tw.cron_check (sql/fn/cron.sql), from the same table of fields (common/registry.h). */
#include "cron.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "registry.h"

typedef struct {
    int field;
    const char *name;
    int lo, hi;
    const char *names;
} CronField;

static const CronField fields[] = {
#define CRON_FIELD(n, name, lo, hi, names) {n, name, lo, hi, names},
    TW_CRON_FIELDS(CRON_FIELD)
#undef CRON_FIELD
};

/* A value: digits, or one of the field's names. */
static bool value(const CronField *f, const char *s, size_t len, int *out, char *err, size_t errlen)
{
    size_t i;

    if (len > 0 && strspn(s, "0123456789") >= len) {
        int n = 0;
        for (i = 0; i < len && i < 4; i++)
            n = n * 10 + (s[i] - '0');
        if (len > 4 || n < f->lo || n > f->hi) {
            snprintf(err, errlen, "cron field %d (%s) value %.*s out of range %d-%d", f->field, f->name,
                     (int)len, s, f->lo, f->hi);
            return false;
        }
        *out = n;
        return true;
    }
    if (len == 3 && *f->names) {
        const char *p = f->names;
        for (i = 0; *p; i++, p += p[3] ? 4 : 3) {
            if (tolower((unsigned char)s[0]) == p[0] && tolower((unsigned char)s[1]) == p[1] &&
                tolower((unsigned char)s[2]) == p[2]) {
                *out = f->lo + (int)i;
                return true;
            }
        }
    }
    snprintf(err, errlen, "cron field %d (%s): '%.*s' is not a number or a name", f->field, f->name, (int)len,
             s);
    return false;
}

/* One element of a field's list. */
static bool element(const CronField *f, const char *s, size_t len, char *err, size_t errlen)
{
    const char *slash = memchr(s, '/', len);
    size_t blen = slash ? (size_t)(slash - s) : len;
    int a, b;

    if (len == 0) {
        snprintf(err, errlen, "cron field %d (%s): empty list element", f->field, f->name);
        return false;
    }
    if (!(blen == 1 && s[0] == '*')) {
        const char *dash = memchr(s, '-', blen);
        if (dash) {
            if (!value(f, s, (size_t)(dash - s), &a, err, errlen) ||
                !value(f, dash + 1, blen - (size_t)(dash - s) - 1, &b, err, errlen))
                return false;
            if (a > b) {
                snprintf(err, errlen, "cron field %d (%s) range %.*s is backwards", f->field, f->name,
                         (int)blen, s);
                return false;
            }
        } else {
            if (!value(f, s, blen, &a, err, errlen))
                return false;
            if (slash) {
                snprintf(err, errlen, "cron field %d (%s): a step needs * or a range before it in '%.*s'",
                         f->field, f->name, (int)len, s);
                return false;
            }
        }
    }
    if (slash) {
        const char *st = slash + 1;
        size_t slen = len - blen - 1, i;
        int n = 0;
        bool ok = slen > 0 && slen <= 4 && strspn(st, "0123456789") >= slen;
        for (i = 0; ok && i < slen; i++)
            n = n * 10 + (st[i] - '0');
        if (!ok || n < 1 || n > f->hi) {
            snprintf(err, errlen, "cron field %d (%s) step '%.*s' is not a number from 1 to %d", f->field,
                     f->name, (int)slen, st, f->hi);
            return false;
        }
    }
    return true;
}

int tw_cron_check(const char *expr, char *err, size_t errlen)
{
    const char *p = expr, *tok[5];
    size_t toklen[5];
    int n = 0;

    if (!expr)
        expr = p = "";
    if (strlen(expr) > TW_CRON_EXPR_MAX) {
        snprintf(err, errlen, "cron expression longer than %d characters", TW_CRON_EXPR_MAX);
        return -1;
    }
    for (;;) {
        p += strspn(p, " \t");
        if (!*p)
            break;
        size_t len = strcspn(p, " \t");
        if (n < 5) {
            tok[n] = p;
            toklen[n] = len;
        }
        n++;
        p += len;
    }
    if (n != 5) {
        snprintf(err, errlen,
                 "cron expression has %d fields, not 5 (minute hour day-of-month month day-of-week)", n);
        return -1;
    }
    for (int i = 0; i < 5; i++) {
        const char *s = tok[i], *end = tok[i] + toklen[i];
        for (;;) {
            const char *comma = memchr(s, ',', (size_t)(end - s));
            const char *e = comma ? comma : end;
            if (!element(&fields[i], s, (size_t)(e - s), err, errlen))
                return -1;
            if (!comma)
                break;
            s = comma + 1;
        }
    }
    return 0;
}

int tw_cron_zone_check(const char *name, char *err, size_t errlen)
{
    char path[512];
    struct stat st;
    bool ok =
        name && *name && strlen(name) < 200 && name[0] != '/' &&
        strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+-/") == strlen(name);

    /* No "." or ".." part, no empty part: the name stays under the zone directory. */
    if (ok && (strstr(name, "//") || name[strlen(name) - 1] == '/'))
        ok = false;
    if (ok) {
        snprintf(path, sizeof path, "/usr/share/zoneinfo/%s", name);
        ok = stat(path, &st) == 0 && S_ISREG(st.st_mode);
    }
    if (!ok) {
        snprintf(err, errlen, "unknown time zone %.200s", name ? name : "");
        return -1;
    }
    return 0;
}
