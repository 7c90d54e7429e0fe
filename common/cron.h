/* STUB: replaced by the cron engine (i37-cron) */
#ifndef TW_CRON_H
#define TW_CRON_H

#include <stddef.h>

int tw_cron_check(const char *expr, char *err, size_t errlen);
int tw_timezone_check(const char *name, char *err, size_t errlen);

#endif
