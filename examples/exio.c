/* exio.c — stdin/stdout plumbing shared by the example agent and tool programs (docs/protocol.md). */
#include "exio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The contract caps documents at 1 MiB; allow some slack so an oversized input is reported by the parser of
 * the worker, not silently cut here. */
#define EX_MAX_INPUT_BYTES (16u * 1024u * 1024u)

json_t *ex_read_request(void)
{
    size_t cap = 64 * 1024, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fprintf(stderr, "out of memory reading stdin\n");
        exit(2);
    }
    for (;;) {
        if (len == cap) {
            if (cap >= EX_MAX_INPUT_BYTES) {
                fprintf(stderr, "stdin is larger than %u bytes\n", EX_MAX_INPUT_BYTES);
                exit(2);
            }
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) {
                fprintf(stderr, "out of memory reading stdin\n");
                exit(2);
            }
            buf = bigger;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - len, stdin);
        len += n;
        if (n == 0) {
            if (ferror(stdin)) {
                fprintf(stderr, "cannot read stdin\n");
                exit(2);
            }
            break;
        }
    }
    json_error_t jerr;
    json_t *req = json_loadb(buf, len, 0, &jerr);
    free(buf);
    if (!req || !json_is_object(req)) {
        fprintf(stderr, "stdin is not a JSON object: %s\n", req ? "wrong type" : jerr.text);
        json_decref(req);
        exit(2);
    }
    return req;
}

int ex_reply(json_t *reply)
{
    int rc = 0;
    if (!reply || json_dumpf(reply, stdout, JSON_COMPACT) != 0 || fputc('\n', stdout) == EOF ||
        fflush(stdout) != 0)
        rc = 1;
    json_decref(reply);
    return rc;
}

json_t *ex_complete(json_t *output)
{
    return json_pack("{s:{s:o}}", "complete", "output", output ? output : json_null());
}

json_t *ex_fail(const char *error)
{
    return json_pack("{s:{s:s}}", "fail", "error", error);
}

json_t *ex_tool_output(json_t *output)
{
    return json_pack("{s:o}", "output", output ? output : json_null());
}

json_t *ex_tool_error(const char *code, const char *message)
{
    return json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", message);
}

json_t *ex_tool_call(const char *id, const char *tool, json_t *args, double timeout_seconds)
{
    json_t *call = json_pack("{s:s,s:s,s:o}", "id", id, "tool", tool, "args", args ? args : json_object());
    if (call && timeout_seconds > 0)
        json_object_set_new(call, "timeout_seconds", json_integer((json_int_t)timeout_seconds));
    return call;
}

double ex_number(const json_t *obj, const char *key, double dflt)
{
    const json_t *v = json_object_get(obj, key);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

void ex_sleep_sec(double seconds)
{
    if (!(seconds > 0))
        return;
    struct timespec ts = {.tv_sec = (time_t)seconds,
                          .tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

bool ex_serving(void)
{
    const char *mode = getenv("TURNWATCH_MODE");
    return mode && strcmp(mode, "serve") == 0;
}

int ex_main(json_t *(*handle)(json_t *req))
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;

    if (!ex_serving()) {
        json_t *reply = handle(ex_read_request());
        return reply ? ex_reply(reply) : 0;
    }
    /* One request per line, one reply line each, flushed at once: the worker waits for it. */
    while ((n = getline(&line, &cap, stdin)) > 0) {
        json_error_t jerr;
        json_t *req = json_loadb(line, (size_t)n, 0, &jerr), *reply;
        if (!json_is_object(req)) {
            json_decref(req);
            fprintf(stderr, "a request line is not a JSON object: %s\n", jerr.text);
            reply = ex_fail("the request line was not a JSON object");
        } else {
            reply = handle(req);
        }
        if (reply && ex_reply(reply) != 0)
            break;
    }
    free(line);
    return 0;
}
