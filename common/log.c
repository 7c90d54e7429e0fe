/* Logging to stderr with a timestamp, level and process ident. */
#include "log.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static char log_ident[32] = "turnwatch";
static TwLogLevel log_max = TW_LOG_INFO;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

void tw_log_init(const char *ident, TwLogLevel level)
{
    snprintf(log_ident, sizeof log_ident, "%s", ident);
    log_max = level;
}

void tw_log_set_level(TwLogLevel level)
{
    log_max = level;
}

TwLogLevel tw_log_level(void)
{
    return log_max;
}

void tw_log_write(TwLogLevel level, const char *fmt, ...)
{
    static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    char stamp[32];
    struct timeval tv;
    struct tm tm;
    va_list ap;

    if (level > log_max)
        return;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    /* One lock so that lines from nats.c threads never interleave with the loop's. */
    pthread_mutex_lock(&log_lock);
    fprintf(stderr, "%s.%03ldZ %s[%d] %s: ", stamp, (long)(tv.tv_usec / 1000), log_ident, (int)getpid(),
            names[level]);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    pthread_mutex_unlock(&log_lock);
}

void tw_log_warn_limited(TwLogLimit *lim, const char *fmt, ...)
{
    struct timespec now;
    long long now_ms;
    char msg[1024];
    va_list ap;

    clock_gettime(CLOCK_MONOTONIC, &now);
    now_ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    if (lim->last_ms && now_ms - lim->last_ms < TW_LOG_LIMIT_INTERVAL_MS) {
        lim->held++;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (lim->held)
        tw_log_write(TW_LOG_WARN, "%s (and %u more like it in the last %d s)", msg, lim->held,
                     TW_LOG_LIMIT_INTERVAL_MS / 1000);
    else
        tw_log_write(TW_LOG_WARN, "%s", msg);
    lim->last_ms = now_ms;
    lim->held = 0;
}

const char *tw_redact_dsn(const char *dsn, char *buf, unsigned long size)
{
    PQconninfoOption *opts;
    char *err = NULL;
    size_t off = 0;

    if (!dsn) {
        snprintf(buf, size, "(none)");
        return buf;
    }
    /* Let libpq parse both URI and key=value forms; never hand-parse a DSN. */
    opts = PQconninfoParse(dsn, &err);
    if (!opts) {
        PQfreemem(err);
        snprintf(buf, size, "(unparsable connection string)");
        return buf;
    }
    buf[0] = '\0';
    for (PQconninfoOption *o = opts; o->keyword; o++) {
        if (!o->val || !*o->val)
            continue;
        int n = snprintf(buf + off, size > off ? size - off : 0, "%s%s=%s", off ? " " : "", o->keyword,
                         strcmp(o->keyword, "password") == 0 ? "***" : o->val);
        if (n > 0)
            off += (size_t)n;
        if (off >= size)
            break;
    }
    PQconninfoFree(opts);
    return buf;
}

const char *tw_redact_urls(const char *urls, char *buf, unsigned long size)
{
    size_t off = 0;

    if (!urls) {
        snprintf(buf, size, "(none)");
        return buf;
    }
    buf[0] = '\0';
    /* Each URL of the comma list: whatever stands between "scheme://" and the last '@' of the authority is
     * credentials (user:password, or a token) and is replaced. */
    for (const char *u = urls; *u && off + 1 < size;) {
        const char *end = strchr(u, ',');
        size_t len = end ? (size_t)(end - u) : strlen(u);
        const char *scheme = memmem(u, len, "://", 3);
        const char *host = scheme ? scheme + 3 : u;
        const char *slash = memchr(host, '/', len - (size_t)(host - u));
        const char *auth_end = slash ? slash : u + len;
        const char *at = NULL;
        for (const char *p = host; p < auth_end; p++)
            if (*p == '@')
                at = p;
        int n;
        if (at)
            n = snprintf(buf + off, size - off, "%s%.*s***%.*s", off ? "," : "", (int)(host - u), u,
                         (int)(u + len - at), at);
        else
            n = snprintf(buf + off, size - off, "%s%.*s", off ? "," : "", (int)len, u);
        if (n > 0)
            off += (size_t)n;
        if (!end)
            break;
        u = end + 1;
    }
    return buf;
}
