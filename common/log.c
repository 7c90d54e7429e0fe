/* Logging to stderr with a timestamp, level and process ident. */
#include "log.h"

#include <ctype.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "utf8.h"

static char log_ident[32] = "turnwatch";
static TwLogLevel log_max = TW_LOG_INFO;
static TwLogFormat log_format = TW_LOG_TEXT;
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

void tw_log_set_format(TwLogFormat format)
{
    log_format = format;
}

int tw_log_level_parse(const char *name)
{
    static const char *names[] = {"error", "warn", "info", "debug"};

    for (int i = 0; name && i < 4; i++)
        if (strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

/* The event's fields for a JSON line: every key=value (or key="value") word of the message, named as the
 * contract names them (turn -> turn_id, call -> tool_call_id; whole numbers as numbers), and the fields of a
 * JSON object that ends the line (a watchdog action). The message itself stays whole in "msg". */
static void add_fields(json_t *o, const char *msg)
{
    const char *p = msg, *brace = strstr(msg, " {");
    const char *end = msg + strlen(msg);

    if (brace && end > brace && end[-1] == '}') {
        json_t *action = json_loadb(brace + 1, (size_t)(end - brace - 1), 0, NULL);
        if (json_is_object(action)) {
            const char *k;
            json_t *v;
            json_object_foreach(action, k, v) if (!json_object_get(o, k)) json_object_set(o, k, v);
            end = brace;
        }
        json_decref(action);
    }
    while (p < end) {
        const char *k = p, *eq;
        while (k < end && *k == ' ')
            k++;
        eq = k;
        while (eq < end && (islower((unsigned char)*eq) || isdigit((unsigned char)*eq) || *eq == '_'))
            eq++;
        if (eq == k || eq >= end || *eq != '=') {
            /* Not key=value: skip the word. */
            for (p = k; p < end && *p != ' ';)
                p++;
            if (p == k)
                p++;
            continue;
        }
        const char *v = eq + 1, *ve;
        if (*v == '"') {
            v++;
            ve = memchr(v, '"', (size_t)(end - v));
            if (!ve)
                ve = end;
            p = ve < end ? ve + 1 : end;
        } else {
            ve = v;
            while (ve < end && *ve != ' ')
                ve++;
            p = ve;
        }
        char key[32];
        size_t kl = (size_t)(eq - k);
        if (kl >= sizeof key)
            continue;
        memcpy(key, k, kl);
        key[kl] = '\0';
        const char *name = strcmp(key, "turn") == 0   ? "turn_id"
                           : strcmp(key, "call") == 0 ? "tool_call_id"
                                                      : key;
        if (json_object_get(o, name))
            continue;
        bool digits = ve > v && ve - v < 18;
        for (const char *d = v; d < ve && digits; d++)
            digits = isdigit((unsigned char)*d) || (d == v && *d == '-' && ve - v > 1);
        json_object_set_new(
            o, name, digits ? json_integer(strtoll(v, NULL, 10)) : json_stringn_nocheck(v, (size_t)(ve - v)));
    }
}

static void write_json(const char *stamp, long ms, TwLogLevel level, const char *msg)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    char ts[64];
    json_t *o;
    char *line;

    snprintf(ts, sizeof ts, "%s.%03ldZ", stamp, ms);
    /* A message may carry bytes from outside (a program's stderr): jansson refuses invalid UTF-8, so such a
     * line keeps its text with the bad bytes replaced rather than being lost. */
    o = json_pack("{s:s,s:s,s:s,s:i}", "ts", ts, "level", names[level], "daemon", log_ident, "pid",
                  (int)getpid());
    json_t *m = json_string(msg);
    if (!m) {
        /* msg is at most 8 KiB (tw_log_write); each bad byte becomes U+FFFD, three bytes. */
        char safe[3 * 8192 + 1];
        tw_utf8_clean(safe, sizeof safe, msg, strlen(msg));
        m = json_string(safe);
    }
    json_object_set_new(o, "msg", m);
    if (json_is_string(m) && strcmp(json_string_value(m), msg) == 0)
        add_fields(o, msg);
    line = json_dumps(o, JSON_COMPACT);
    if (line) {
        fputs(line, stderr);
        fputc('\n', stderr);
    }
    free(line);
    json_decref(o);
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
    if (log_format == TW_LOG_JSON) {
        char msg[8192];
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        pthread_mutex_lock(&log_lock);
        write_json(stamp, (long)(tv.tv_usec / 1000), level, msg);
        pthread_mutex_unlock(&log_lock);
        return;
    }
    /* The message may carry text from outside (a program's stderr, an agent's fail message, a tool's error):
     * its control characters are escaped (tw_text_escape), so that it stays one line, a CR cannot make it
     * read as another line and nothing in it reaches a terminal as a sequence. A line end closing the message
     * is dropped: the line ends there anyway. */
    char small[1024], *msg = small;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof small && (msg = malloc((size_t)n + 1))) {
        va_start(ap, fmt);
        vsnprintf(msg, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    if (!msg) /* out of memory: what fits */
        msg = small, n = (int)sizeof small - 1;
    size_t len = (size_t)n;
    while (len > 0 && msg[len - 1] == '\n')
        len--;
    char escaped_small[4 * sizeof small];
    char *escaped = 4 * len < sizeof escaped_small ? NULL : tw_text_escaped(msg, len);
    if (!escaped) /* short, or out of memory: what fits */
        tw_text_escape(escaped = escaped_small, sizeof escaped_small, msg, len);
    /* One lock so that lines from nats.c threads never interleave with the loop's. */
    pthread_mutex_lock(&log_lock);
    fprintf(stderr, "%s.%03ldZ %s[%d] %s: %s\n", stamp, (long)(tv.tv_usec / 1000), log_ident, (int)getpid(),
            names[level], escaped);
    pthread_mutex_unlock(&log_lock);
    if (escaped != escaped_small)
        free(escaped);
    if (msg != small)
        free(msg);
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
        /* Every option libpq itself marks secret ('*': password, sslpassword, and whatever a later libpq
         * adds), not a list of ours. */
        bool secret = o->dispchar && strchr(o->dispchar, '*');
        int n = snprintf(buf + off, size > off ? size - off : 0, "%s%s=%s", off ? " " : "", o->keyword,
                         secret ? "***" : o->val);
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
