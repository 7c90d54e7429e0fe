/* Logging: one line per event on stderr, with a level and key=value context. */
#ifndef TW_LOG_H
#define TW_LOG_H

#include <stdarg.h>

typedef enum {
    TW_LOG_ERROR = 0,
    TW_LOG_WARN = 1,
    TW_LOG_INFO = 2,
    TW_LOG_DEBUG = 3,
} TwLogLevel;

typedef enum { TW_LOG_TEXT, TW_LOG_JSON } TwLogFormat;

/** Set the process name shown on every line and the most verbose level printed. */
void tw_log_init(const char *ident, TwLogLevel level);
void tw_log_set_level(TwLogLevel level);
/** [log] format: text lines, or one JSON object per line with ts, level, daemon, pid, msg and the event's
 *  fields (the key=value context of the message, and the fields of a watchdog action). */
void tw_log_set_format(TwLogFormat format);
/** "debug", "info", "warn", "error" -> the level; -1 for anything else. */
int tw_log_level_parse(const char *name);
TwLogLevel tw_log_level(void);
void tw_log_write(TwLogLevel level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) tw_log_write(TW_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) tw_log_write(TW_LOG_WARN, __VA_ARGS__)
#define log_info(...) tw_log_write(TW_LOG_INFO, __VA_ARGS__)
#define log_debug(...)                                                                                       \
    do {                                                                                                     \
        if (tw_log_level() >= TW_LOG_DEBUG)                                                                  \
            tw_log_write(TW_LOG_DEBUG, __VA_ARGS__);                                                         \
    } while (0)

/** A warning that may repeat (a query that fails on every try): printed at most once per interval, the
 *  next line saying how many were held back. Zero-initialise one per call site. */
typedef struct {
    long long last_ms;
    unsigned held;
} TwLogLimit;
#define TW_LOG_LIMIT_INTERVAL_MS 10000
void tw_log_warn_limited(TwLogLimit *lim, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/** Copy a libpq DSN into buf with any password replaced by "***", for logs and errors. */
const char *tw_redact_dsn(const char *dsn, char *buf, unsigned long size);
/** Copy a NATS URL list (comma-separated) into buf with any user:password or token replaced by "***". */
const char *tw_redact_urls(const char *urls, char *buf, unsigned long size);

#endif
