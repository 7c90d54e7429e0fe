/* tw-serve-agent — example of a serve-mode agent (docs/protocol.md) in C. With `mode = serve` the worker
 * starts it once per slot and keeps it: it does its costly set-up once, then reads one step document per
 * line on stdin and writes one reply line on stdout (flushed at once: the worker waits for it), until EOF on
 * stdin. TURNWATCH_MODE=serve is in its environment; the turn, agent and epoch are in each document, not in
 * the environment. The same loop serves exec mode too, where stdin holds one document and then ends.
 *
 * It completes each step with its input echoed back, plus the pid that served it and how many steps this
 * process has served, so that the reuse shows in `turnwatch turn show`. A step it cannot read is answered
 * with a fail reply rather than skipped: the worker expects exactly one line per request. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Stands for what a real agent does once: load a model or a prompt library, open a connection pool. */
static double set_up(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static json_t *step(json_t *doc, double started_at, long served)
{
    json_t *input = json_object_get(doc, "input");

    return json_pack("{s:{s:{s:O,s:I,s:i,s:i,s:f}}}", "complete", "output", "echo",
                     input ? input : json_null(), "step", json_integer_value(json_object_get(doc, "step")),
                     "pid", (int)getpid(), "served", (int)served, "process_started_at", started_at);
}

int main(void)
{
    const char *mode = getenv("TURNWATCH_MODE");
    double started_at = set_up();
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long served = 0;

    fprintf(stderr, "tw-serve-agent: pid %d ready (%s mode)\n", (int)getpid(), mode ? mode : "exec");
    while ((n = getline(&line, &cap, stdin)) > 0) {
        json_error_t err;
        json_t *doc = json_loadb(line, (size_t)n, 0, &err), *reply;

        if (json_is_object(doc))
            reply = step(doc, started_at, ++served);
        else
            reply = json_pack("{s:{s:s}}", "fail", "error", "the step document is not a JSON object");
        json_decref(doc);
        /* One line: compact JSON escapes every newline inside strings. */
        if (!reply || json_dumpf(reply, stdout, JSON_COMPACT) != 0 || fputc('\n', stdout) == EOF ||
            fflush(stdout) != 0) {
            json_decref(reply);
            break;
        }
        json_decref(reply);
    }
    free(line);
    return 0;
}
