/* Cron expressions (docs/schedules.md): five fields, minute hour day-of-month month day-of-week, each `*`,
 * `*\/n`, `a`, `a-b`, `a-b/n` or a comma list of them, with names of months and days. The grammar, the
 * fields' ranges and names are common/registry.h's TW_CRON_FIELDS, which the SQL's tw.cron_check reads too;
 * both give the same errors (tests/data/cron_cases.txt). */
#ifndef TW_CRON_H
#define TW_CRON_H

#include <stddef.h>

/* 0 when expr is a valid cron expression; otherwise -1 and the error in err ("cron field 2 (hour) value 25
 * out of range 0-23"). */
int tw_cron_check(const char *expr, char *err, size_t errlen);

/* 0 when name is an IANA time zone of the system's database (a file under /usr/share/zoneinfo, the name
 * checked first: no absolute path, no "." or ".." part); otherwise -1 and "unknown time zone NAME" in err. */
int tw_cron_zone_check(const char *name, char *err, size_t errlen);

#endif
