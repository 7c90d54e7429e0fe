/* Reading what an agent or tool program produced (docs/protocol.md) and turning it into what
 * tw.apply_step / tw.deliver_result take. Every way a program can misbehave ends in an error code and
 * a sentence a person can act on. */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "steps.h"

#include "names.h"
#include "policy.h"
#include "utf8.h"

#define WRK_MAX_TOOL_CALLS 256
/* Longest message we put in an outcome: a sentence for a person, not a dump of the program's output. */
#define WRK_MESSAGE_MAX 2048

static json_t *fail(const char *code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Messages carry bytes the program chose (stderr, its own error text) and may be cut at any byte: jansson
 * refuses a string that is not valid UTF-8 (json_pack returns NULL), and a NULL outcome would leave the
 * item processing and the program run again and again. So every message is cleaned on the way out. */
static json_t *fail(const char *code, const char *fmt, ...)
{
    char msg[WRK_MESSAGE_MAX], clean[WRK_MESSAGE_MAX];
    int n;
    va_list ap;

    va_start(ap, fmt);
    n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tw_utf8_clean(clean, sizeof clean, msg, n < 0 ? 0 : strlen(msg));
    return json_pack("{s:{s:s,s:s}}", "fail", "error", code, "message", clean);
}

/* A tool result that is not ok; code and message may come from the tool, see fail(). */
static json_t *tool_error(const char *status, const char *code, const char *message)
{
    char c[512], m[WRK_MESSAGE_MAX];

    tw_utf8_clean(c, sizeof c, code, strlen(code));
    tw_utf8_clean(m, sizeof m, message, strlen(message));
    return json_pack("{s:s,s:{s:s,s:s}}", "status", status, "error", "code", c, "message", m);
}

/* The last line(s) of stderr, trimmed, for messages. */
static const char *tail(const WrkProcResult *r, char *buf, size_t size)
{
    const char *s = r->stderr_tail ? r->stderr_tail : "";
    size_t n = strlen(s);

    while (n && (s[n - 1] == '\n' || s[n - 1] == ' '))
        n--;
    if (n > 400) {
        s += n - 400;
        n = 400;
        /* Start on a character, not inside the one the cut went through. */
        for (int k = 0; k < 3 && n && ((unsigned char)*s & 0xc0) == 0x80; k++) {
            s++;
            n--;
        }
    }
    tw_utf8_clean(buf, size, s, n);
    for (char *p = buf; *p; p++)
        if (*p == '\n')
            *p = '|';
    return buf;
}

/* docs/security.md: stopped by its CPU limit, or ended badly at its memory limit; the limit in the message.
 */
const char *wrk_limit_failure(const WrkProcResult *r, const char *who, char *msg, size_t msg_size)
{
    char t[512];

    if (r->limit && strcmp(r->limit, "cpu_limit_seconds") == 0)
        snprintf(msg, msg_size,
                 "%s used up its cpu_limit_seconds (%ld s of CPU time) and was stopped (%s)%s%s", who,
                 r->limit_value,
                 r->term_signal == SIGXCPU ? "SIGXCPU" : "SIGKILL at the hard limit, one second later",
                 *tail(r, t, sizeof t) ? "; stderr: " : "", t);
    else if (r->term_signal)
        snprintf(
            msg, msg_size,
            "%s was killed by signal %d (%s) at its memory_limit_mb (%ld MiB; its peak resident memory was "
            "%ld MiB)%s%s",
            who, r->term_signal, strsignal(r->term_signal), r->limit_value, r->maxrss_kb / 1024,
            *tail(r, t, sizeof t) ? "; stderr: " : "", t);
    else
        snprintf(msg, msg_size,
                 "%s exited with status %d at its memory_limit_mb (%ld MiB; its peak resident memory was %ld "
                 "MiB): an allocation past the limit failed%s%s",
                 who, r->exit_code, r->limit_value, r->maxrss_kb / 1024,
                 *tail(r, t, sizeof t) ? "; stderr: " : "", t);
    return "resource_limit";
}

/* A short, printable excerpt of what the program wrote. */
static const char *excerpt(const WrkProcResult *r, char *buf, size_t size)
{
    size_t n = r->output_len < 120 ? r->output_len : 120;
    size_t k = 0;

    for (size_t i = 0; i < n && k + 1 < size; i++) {
        unsigned char c = (unsigned char)r->output[i];
        buf[k++] = (c >= 0x20 && c < 0x7f) ? (char)c : '.';
    }
    buf[k] = '\0';
    return buf;
}

/* How the process ended, when it did not end well; NULL when it exited 0. */
static const char *process_failure(const WrkProcResult *r, const char *what, int timeout, char *code,
                                   size_t code_size, char *msg, size_t msg_size, const char *timeout_code,
                                   const char *exit_code)
{
    char t[512];

    switch (r->outcome) {
    case WRK_PROC_OK:
        return NULL;
    case WRK_PROC_TIMEOUT:
        snprintf(code, code_size, "%s", timeout_code);
        snprintf(msg, msg_size,
                 "the %s program did not reply within its %d second limit and was stopped (%s)", what,
                 timeout, r->killed_hard ? "SIGKILL after SIGTERM" : "SIGTERM");
        break;
    case WRK_PROC_OVERSIZE:
        snprintf(code, code_size, "bad_output");
        snprintf(msg, msg_size, "the %s program wrote more than %d bytes to stdout and was stopped", what,
                 TW_DOC_MAX);
        break;
    case WRK_PROC_EXIT:
        snprintf(code, code_size, "%s", exit_code);
        snprintf(msg, msg_size, "the %s program exited with status %d%s%s", what, r->exit_code,
                 *tail(r, t, sizeof t) ? "; stderr: " : "", t);
        break;
    case WRK_PROC_SIGNAL:
        snprintf(code, code_size, "%s", exit_code);
        snprintf(msg, msg_size, "the %s program was killed by signal %d (%s)%s%s", what, r->term_signal,
                 strsignal(r->term_signal), *tail(r, t, sizeof t) ? "; stderr: " : "", t);
        break;
    case WRK_PROC_STOPPED:
        snprintf(code, code_size, "stopped");
        snprintf(msg, msg_size, "the %s program was stopped by the worker", what);
        break;
    case WRK_PROC_LIMIT: {
        char who[64];
        snprintf(who, sizeof who, "the %s program", what);
        snprintf(code, code_size, "%s", wrk_limit_failure(r, who, msg, msg_size));
        break;
    }
    case WRK_PROC_SPAWN:
        snprintf(code, code_size, "%s", exit_code);
        /* Said as it is: a worker out of descriptors or processes has nothing wrong with its programs. */
        if (r->spawn_why && *r->spawn_why)
            snprintf(msg, msg_size, "the %s program could not be started: %s", what, r->spawn_why);
        else if (r->spawn_errno == EMFILE || r->spawn_errno == ENFILE)
            snprintf(msg, msg_size,
                     "the %s program could not be started: the %s is out of file descriptors (%s)", what,
                     r->spawn_errno == EMFILE ? "worker" : "system",
                     r->spawn_errno == EMFILE ? "EMFILE" : "ENFILE");
        else if (r->spawn_errno == EAGAIN || r->spawn_errno == ENOMEM)
            snprintf(msg, msg_size,
                     "the %s program could not be started: the worker cannot create a process now (%s)", what,
                     strerror(r->spawn_errno));
        else if (r->spawn_errno)
            snprintf(
                msg, msg_size,
                "the %s program could not be started (%s; is it configured on this worker, and executable?)",
                what, strerror(r->spawn_errno));
        else
            snprintf(msg, msg_size,
                     "the %s program could not be started (is it configured on this worker, and executable?)",
                     what);
        break;
    }
    return code;
}

static json_t *parse_reply(const WrkProcResult *r, char *why, size_t size)
{
    json_error_t err;
    json_t *j;
    char ex[128];

    if (r->output_len == 0) {
        snprintf(why, size, "it printed nothing on stdout");
        return NULL;
    }
    j = json_loadb(r->output, r->output_len, 0, &err);
    if (!j) {
        snprintf(why, size, "stdout is not a JSON object (%s at line %d column %d); it began: %s", err.text,
                 err.line, err.column, excerpt(r, ex, sizeof ex));
        return NULL;
    }
    if (!json_is_object(j)) {
        snprintf(why, size, "stdout is JSON but not an object; it began: %s", excerpt(r, ex, sizeof ex));
        json_decref(j);
        return NULL;
    }
    return j;
}

/* Validate a tool_calls reply and normalise it for tw.apply_step: each call with its effective timeout and
 * where that came from (docs/timeouts.md: call -> tool -> agent -> global), how long the turn waits for it
 * (2.2) and when to warn. NULL with why set when invalid. */
static json_t *tool_calls(const TwConfig *cfg, const TwAgentConf *agent, json_t *reply, char *why,
                          size_t size)
{
    json_t *calls = json_object_get(reply, "tool_calls"), *wait = json_object_get(reply, "wait");
    json_t *out_calls = json_array(), *call;
    size_t n = json_array_size(calls), i;

    if (!json_is_array(calls) || n == 0 || n > WRK_MAX_TOOL_CALLS) {
        snprintf(why, size, "tool_calls must be an array of 1 to %d calls", WRK_MAX_TOOL_CALLS);
        goto bad;
    }
    json_array_foreach(calls, i, call)
    {
        const char *id = json_string_value(json_object_get(call, "id"));
        const char *tool = json_string_value(json_object_get(call, "tool"));
        json_t *args = json_object_get(call, "args"), *tos = json_object_get(call, "timeout_seconds");
        const TwToolConf *tc;
        const char *source;
        int timeout, pct = agent ? agent->policy.warn_at_percent : cfg->worker.policy.warn_at_percent;

        if (!json_is_object(call) || !tw_ident_valid(id)) {
            snprintf(why, size, "tool call %zu has no valid id (1 to 256 printable bytes)", i);
            goto bad;
        }
        for (size_t k = 0; k < i; k++)
            if (strcmp(id, json_string_value(json_object_get(json_array_get(calls, k), "id"))) == 0) {
                snprintf(why, size, "tool call id '%s' is used twice in one step", id);
                goto bad;
            }
        if (!tw_name_valid(tool)) {
            snprintf(why, size, "tool call '%s' names no valid tool", id);
            goto bad;
        }
        if (!(tc = tw_config_tool(cfg, tool))) {
            snprintf(why, size, "tool call '%s' asks for unknown tool '%s' (no [tool.%s] section)", id, tool,
                     tool);
            goto bad;
        }
        if (!json_is_object(args)) {
            snprintf(why, size, "tool call '%s': args must be a JSON object", id);
            goto bad;
        }
        if (tos && (!json_is_integer(tos) || json_integer_value(tos) < 1 ||
                    json_integer_value(tos) > TW_TIMEOUT_MAX_SEC)) {
            snprintf(why, size,
                     "tool call '%s': timeout_seconds must be a whole number from 1 to " TW_STR(
                         TW_TIMEOUT_MAX_SEC),
                     id);
            goto bad;
        }
        timeout = tw_policy_tool_timeout(cfg, agent, tc, tos ? (int)json_integer_value(tos) : 0, &source);
        /* docs/watchdogs.md, 2.2: a waiting call's deadline is the max of the worker default, the tool's
         * suspend_timeout_seconds and the call's effective timeout. */
        int wait_s = tw_policy_wait_seconds(cfg, tc, timeout);
        json_t *c = json_pack("{s:s,s:s,s:O,s:i,s:s,s:i,s:b}", "id", id, "tool", tool, "args", args,
                              "timeout_seconds", timeout, "timeout_source", source, "wait_seconds", wait_s,
                              "external", tc->external);
        if (c && pct > 0)
            json_object_set_new(c, "warn_seconds", json_real(wait_s * pct / 100.0));
        /* Flow control: the call waits for its tool's limits before it can be claimed (tw.flow_ask). */
        json_t *lims = tw_flow_tool_limits(tc);
        if (c && lims)
            json_object_set_new(c, "limits", lims);
        else
            json_decref(lims);
        if (c && tc->rate_limited_retries != TW_RATE_LIMITED_RETRIES_DEFAULT)
            json_object_set_new(c, "rate_limited_retries", json_integer(tc->rate_limited_retries));
        /* Delegation: tw.delegate starts the call's child turn on an agent of this profile. */
        if (c && tc->agent_profile)
            json_object_set_new(c, "agent_profile", json_string(tc->agent_profile));
        json_array_append_new(out_calls, c);
    }
    if (wait &&
        !(json_is_string(wait) &&
          (strcmp(json_string_value(wait), "all") == 0 || strcmp(json_string_value(wait), "any") == 0)) &&
        !(json_is_integer(wait) && json_integer_value(wait) >= 1 && (size_t)json_integer_value(wait) <= n)) {
        snprintf(why, size, "wait must be \"all\", \"any\" or a number from 1 to %zu", n);
        goto bad;
    }
    return json_pack("{s:o,s:o,s:O,s:i,s:i}", "tool_calls", out_calls, "wait",
                     wait ? json_incref(wait) : json_string("all"), "state",
                     json_object_get(reply, "state") ? json_object_get(reply, "state") : json_null(),
                     "max_delegation_depth", cfg->worker.max_delegation_depth, "max_tree_turns",
                     cfg->worker.max_tree_turns);
bad:
    json_decref(out_calls);
    return NULL;
}

/* The codes turnwatch gives its own turns' failures (common/registry.h: own, of a turn): the worker's (a step
 * timeout, a program that crashed or wrote nonsense, a resource limit) and the watchdogs' and the PMO's. A
 * fail reply may not claim one: an agent's failure must not read as a timeout (with made-up timeout details),
 * a crash or a cancel, nor retry as one. */
#define OWN_CODE(c, sc, st, r, o, k, b, m) {c, sc, o},
static const struct {
    const char *code, *scope;
    int own;
} registry_codes[] = {TW_ERROR_CODES(OWN_CODE)};

static bool code_is_own(const char *code)
{
    for (size_t i = 0; i < sizeof registry_codes / sizeof registry_codes[0]; i++)
        if (registry_codes[i].own && strcmp(registry_codes[i].scope, TW_ERR_TURN) == 0 &&
            strcmp(code, registry_codes[i].code) == 0)
            return true;
    return false;
}

/* An agent's own error code (docs/python.md): [a-z0-9_]{1,64}. */
static bool code_valid(const char *s)
{
    size_t n = 0;

    for (; s[n]; n++)
        if (n >= 64 || !((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= '0' && s[n] <= '9') || s[n] == '_'))
            return false;
    return n > 0;
}

/* A fail reply, {"fail": {"error": "words", "code": "my_code"}}: its code (agent_failed when it has none)
 * and its words. A code that is not one, or is one of turnwatch's own, is not taken: agent_failed, and the
 * message says why, so that the author finds the mistake in `turn show`. */
static json_t *fail_reply(json_t *f)
{
    json_t *jcode = json_object_get(f, "code");
    const char *e = json_string_value(json_object_get(f, "error"));
    const char *code = json_string_value(jcode);
    char *dump = e ? NULL : json_dumps(json_object_get(f, "error"), JSON_COMPACT | JSON_ENCODE_ANY);
    char *shown_code = NULL;
    json_t *out;

    if (!e)
        e = dump ? dump : "(no error given)";
    if (!jcode || json_is_null(jcode)) {
        out = fail("agent_failed", "the agent reported failure: %s", e);
    } else if (!code || !code_valid(code)) {
        shown_code = json_dumps(jcode, JSON_COMPACT | JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
        out = fail("agent_failed",
                   "the agent reported failure: %s (its code %.80s%s is not an error code ([a-z0-9_]{1,64}): "
                   "agent_failed instead)",
                   e, shown_code ? shown_code : "?", shown_code && strlen(shown_code) > 80 ? "..." : "");
    } else {
        if (code_is_own(code))
            out = fail("agent_failed",
                       "the agent reported failure: %s (its code %s is one turnwatch gives its own failures: "
                       "agent_failed instead)",
                       e, code);
        else
            out = fail(code, "the agent reported failure: %s", e);
    }
    free(dump);
    free(shown_code);
    return out;
}

json_t *wrk_step_outcome(const TwConfig *cfg, const TwAgentConf *agent, const WrkProcResult *r)
{
    char code[64], msg[1024], why[600];
    json_t *reply, *out = NULL;
    int timeout = agent ? agent->step_timeout_sec : 0;
    int kinds;

    if (process_failure(r, "agent", timeout, code, sizeof code, msg, sizeof msg, "step_timeout",
                        "agent_exit")) {
        out = fail(code, "%s", msg);
        /* The details of a step timeout (docs/timeouts.md), from the timer that enforced it. */
        if (out && r->outcome == WRK_PROC_TIMEOUT)
            json_object_set_new(json_object_get(out, "fail"), "timeout",
                                json_pack("{s:s,s:i,s:f}", "kind", "step_timeout", "limit_seconds", timeout,
                                          "elapsed_seconds", r->elapsed_sec));
        return out;
    }
    if (!(reply = parse_reply(r, why, sizeof why)))
        return fail("bad_output", "the agent program's reply is not valid: %s", why);
    kinds = !!json_object_get(reply, "complete") + !!json_object_get(reply, "tool_calls") +
            !!json_object_get(reply, "fail");
    if (kinds != 1) {
        out = fail("bad_output",
                   "the agent program's reply must have exactly one of complete, tool_calls, fail "
                   "(it had %d)",
                   kinds);
    } else if (json_object_get(reply, "complete")) {
        json_t *c = json_object_get(reply, "complete");
        if (!json_is_object(c))
            out =
                fail("bad_output", "the agent program's reply: complete must be an object {\"output\": ...}");
        else
            out = json_pack("{s:{s:O}}", "complete", "output",
                            json_object_get(c, "output") ? json_object_get(c, "output") : json_null());
    } else if (json_object_get(reply, "fail")) {
        out = fail_reply(json_object_get(reply, "fail"));
    } else if (!(out = tool_calls(cfg, agent, reply, why, sizeof why))) {
        out = fail("bad_tool_call", "the agent program's tool_calls are not valid: %s", why);
    }
    json_decref(reply);
    return out;
}

json_t *wrk_tool_outcome(int timeout, const WrkProcResult *r)
{
    char code[64], msg[1024], why[600];
    json_t *reply, *out;

    if (process_failure(r, "tool", timeout, code, sizeof code, msg, sizeof msg, "tool_timeout",
                        "tool_failed"))
        return tool_error(strcmp(code, "tool_timeout") == 0 ? "timeout" : "error", code, msg);
    if (!(reply = parse_reply(r, why, sizeof why))) {
        snprintf(msg, sizeof msg, "the tool program's reply is not valid: %s", why);
        return tool_error("error", "bad_output", msg);
    }
    if (json_object_get(reply, "output") && !json_object_get(reply, "error")) {
        out = json_pack("{s:s,s:O}", "status", "ok", "output", json_object_get(reply, "output"));
    } else if (json_is_object(json_object_get(reply, "error")) && !json_object_get(reply, "output")) {
        json_t *e = json_object_get(reply, "error");
        const char *c = json_string_value(json_object_get(e, "code"));
        const char *m = json_string_value(json_object_get(e, "message"));
        json_t *after = json_object_get(e, "retry_after_seconds");
        out = tool_error("error", c && tw_ident_valid(c) ? c : "tool_error",
                         m && *m ? m : "the tool reported an error");
        /* Pushback (docs/flow-control.md): how long the tool asks to be left alone, for tw.deliver_result. */
        if (out && c && strcmp(c, "rate_limited") == 0 && json_is_number(after) &&
            json_number_value(after) >= 0 && json_number_value(after) <= 3600)
            json_object_set_new(json_object_get(out, "error"), "retry_after_seconds",
                                json_real(json_number_value(after)));
    } else {
        out = tool_error(
            "error", "bad_output",
            "the tool program's reply must be {\"output\": ...} or {\"error\": {\"code\", \"message\"}}");
    }
    json_decref(reply);
    return out;
}
