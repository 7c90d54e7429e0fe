/* turnwatch console: routes and query strings, validated before anything reaches the database. */
#include "console_query.h"

#include <ctype.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <string.h>
#include <sys/queue.h>

#include "names.h"

static const char *const statuses[] = {"pending", "dispatched", "running", "suspended",
                                       "done",    "failed",     "timeout", "cancelled"};

ConsoleRoute console_route(const char *path, char id[37])
{
    static const char turns[] = "/api/turns/";
    const char *rest, *slash;
    size_t n;

    id[0] = '\0';
    if (strcmp(path, "/api/turns") == 0)
        return CONSOLE_TURNS;
    if (strcmp(path, "/api/daemons") == 0)
        return CONSOLE_DAEMONS;
    if (strcmp(path, "/api/dead-letters") == 0)
        return CONSOLE_DEAD_LETTERS;
    if (strncmp(path, turns, sizeof turns - 1) == 0) {
        rest = path + sizeof turns - 1;
        slash = strchr(rest, '/');
        n = slash ? (size_t)(slash - rest) : strlen(rest);
        if (n != 36)
            return CONSOLE_BAD_ID;
        memcpy(id, rest, 36);
        id[36] = '\0';
        if (!tw_uuid_valid(id)) {
            id[0] = '\0';
            return CONSOLE_BAD_ID;
        }
        if (!slash)
            return CONSOLE_TURN;
        if (strcmp(slash, "/history") == 0)
            return CONSOLE_TURN_HISTORY;
        if (strcmp(slash, "/tree") == 0)
            return CONSOLE_TURN_TREE;
        return CONSOLE_NOT_FOUND;
    }
    if (strncmp(path, "/api/", 5) == 0 || strcmp(path, "/api") == 0)
        return CONSOLE_NOT_FOUND;
    /* Anything else is a file of the page, if there is one by that name (console.c looks it up). */
    return path[0] == '/' ? CONSOLE_ASSET : CONSOLE_NOT_FOUND;
}

static int digits(const char *s, int n)
{
    for (int i = 0; i < n; i++)
        if (!isdigit((unsigned char)s[i]))
            return 0;
    return n;
}

bool console_timestamp_valid(const char *s)
{
    size_t n = strlen(s);
    const char *p = s;

    if (n < 10 || n > 40 || !digits(p, 4) || p[4] != '-' || !digits(p + 5, 2) || p[7] != '-' ||
        !digits(p + 8, 2))
        return false;
    p += 10;
    if (*p == 'T' || *p == ' ') {
        if (!digits(p + 1, 2) || p[3] != ':' || !digits(p + 4, 2))
            return false;
        p += 6;
        if (*p == ':') {
            if (!digits(p + 1, 2))
                return false;
            p += 3;
            if (*p == '.') {
                int k = 0;
                while (isdigit((unsigned char)p[1 + k]))
                    k++;
                if (k < 1 || k > 9)
                    return false;
                p += 1 + k;
            }
        }
        if (*p == 'Z') {
            p++;
        } else if (*p == '+' || *p == '-') {
            if (!digits(p + 1, 2))
                return false;
            p += 3;
            if (*p == ':') {
                if (!digits(p + 1, 2))
                    return false;
                p += 3;
            } else if (digits(p, 2)) {
                p += 2; /* +HHMM */
            }
        }
    }
    return *p == '\0';
}

/* Copies value into dst (size bytes) when it fits; false otherwise. */
static bool put(char *dst, size_t size, const char *value)
{
    size_t n = strlen(value);

    if (n >= size)
        return false;
    memcpy(dst, value, n + 1);
    return true;
}

static bool bad(char *why, size_t why_size, const char *fmt, const char *key)
{
    snprintf(why, why_size, fmt, key);
    return false;
}

/* One key=value of the query: checked and stored, or false with why. seen: a bit per key already given. */
typedef bool (*ConsoleParamFn)(void *q, const char *key, const char *value, char *why, size_t why_size);

static bool parse_query(const char *query, const char *const *keys, size_t n_keys, ConsoleParamFn fn, void *q,
                        char *why, size_t why_size)
{
    struct evkeyvalq params;
    struct evkeyval *kv;
    unsigned seen = 0;
    bool ok = true;

    if (!query || !*query)
        return true;
    TAILQ_INIT(&params);
    if (strlen(query) > 2048) {
        snprintf(why, why_size, "the query string is longer than 2048 bytes");
        return false;
    }
    /* A NUL decoded from %00 would cut a value short unseen: "agent=echo%00x" is not the name echo. */
    if (strstr(query, "%00")) {
        snprintf(why, why_size, "the query string holds a NUL byte (%%00)");
        return false;
    }
    if (evhttp_parse_query_str(query, &params) != 0) {
        snprintf(why, why_size, "the query string cannot be read");
        evhttp_clear_headers(&params);
        return false;
    }
    TAILQ_FOREACH(kv, &params, next)
    {
        size_t k;
        for (k = 0; k < n_keys && strcmp(keys[k], kv->key) != 0; k++)
            ;
        if (k == n_keys) {
            ok = bad(why, why_size, "unknown parameter '%.40s'", kv->key);
            break;
        }
        if (seen & (1u << k)) {
            ok = bad(why, why_size, "parameter '%s' given twice", keys[k]);
            break;
        }
        seen |= 1u << k;
        if (*kv->value && !(ok = fn(q, kv->key, kv->value, why, why_size)))
            break;
    }
    evhttp_clear_headers(&params);
    return ok;
}

static bool limit_ok(const char *value, char *dst, size_t size)
{
    size_t n = strlen(value);
    long v = 0;

    if (n < 1 || n > 3 || !digits(value, (int)n))
        return false;
    for (size_t i = 0; i < n; i++)
        v = v * 10 + (value[i] - '0');
    return v >= 1 && v <= 500 && put(dst, size, value);
}

static bool turns_param(void *arg, const char *key, const char *value, char *why, size_t why_size)
{
    ConsoleTurnsQuery *q = arg;

    if (strcmp(key, "agent") == 0 || strcmp(key, "profile") == 0) {
        if (!tw_name_valid(value))
            return bad(why, why_size, "%s: a name of 1 to 64 characters [A-Za-z0-9_-]", key);
        return put(key[0] == 'a' ? q->agent : q->profile, sizeof q->agent, value);
    }
    if (strcmp(key, "status") == 0) {
        for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
            if (strcmp(value, statuses[i]) == 0)
                return put(q->status, sizeof q->status, value);
        return bad(why, why_size,
                   "%s: one of pending, dispatched, running, suspended, done, failed, timeout, cancelled",
                   key);
    }
    if (strcmp(key, "since") == 0 || strcmp(key, "before") == 0) {
        if (!console_timestamp_valid(value))
            return bad(why, why_size, "%s: a timestamp such as 2026-11-23T12:00:00Z", key);
        return put(key[0] == 's' ? q->since : q->before, sizeof q->since, value);
    }
    if (strcmp(key, "cursor") == 0) {
        size_t n = strlen(value);
        if (n < 1 || n > 18 || !digits(value, (int)n))
            return bad(why, why_size, "%s: a whole number (the \"next\" of the page before)", key);
        return put(q->cursor, sizeof q->cursor, value);
    }
    if (!limit_ok(value, q->limit, sizeof q->limit))
        return bad(why, why_size, "%s: a whole number from 1 to 500", key);
    return true;
}

bool console_turns_query_parse(const char *query, ConsoleTurnsQuery *q, char *why, size_t why_size)
{
    static const char *const keys[] = {"agent", "profile", "status", "since", "before", "cursor", "limit"};

    memset(q, 0, sizeof *q);
    strcpy(q->limit, "50");
    return parse_query(query, keys, sizeof keys / sizeof keys[0], turns_param, q, why, why_size);
}

static bool dead_letters_param(void *arg, const char *key, const char *value, char *why, size_t why_size)
{
    ConsoleDeadLettersQuery *q = arg;

    if (strcmp(key, "agent") == 0) {
        if (!tw_name_valid(value))
            return bad(why, why_size, "%s: a name of 1 to 64 characters [A-Za-z0-9_-]", key);
        return put(q->agent, sizeof q->agent, value);
    }
    if (!limit_ok(value, q->limit, sizeof q->limit))
        return bad(why, why_size, "%s: a whole number from 1 to 500", key);
    return true;
}

bool console_dead_letters_query_parse(const char *query, ConsoleDeadLettersQuery *q, char *why,
                                      size_t why_size)
{
    static const char *const keys[] = {"agent", "limit"};

    memset(q, 0, sizeof *q);
    strcpy(q->limit, "100");
    return parse_query(query, keys, sizeof keys / sizeof keys[0], dead_letters_param, q, why, why_size);
}
