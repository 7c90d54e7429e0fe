/* MCP over stdio: JSON-RPC 2.0 messages, one per line (worker/mcp_proto.h). */
#include "mcp_proto.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

const char *const wrk_mcp_protocol_versions[] = {WRK_MCP_PROTOCOL_LATEST, "2025-06-18", "2025-03-26",
                                                 "2024-11-05", NULL};

/* Error messages are cut here, as steps.c cuts a tool's. */
#define MCP_MESSAGE_MAX 2048

WrkMcpKind wrk_mcp_parse(const char *line, size_t len, json_t **msg, long long *id, char *why, size_t why_len)
{
    json_error_t jerr;
    json_t *m, *jid;
    bool has_method, rpc;

    *msg = NULL;
    *id = -1;
    if (!(m = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr))) {
        snprintf(why, why_len, "not JSON (%s at byte %d)", jerr.text, jerr.position);
        return WRK_MCP_BAD;
    }
    if (!json_is_object(m)) {
        snprintf(why, why_len, "not a JSON-RPC 2.0 message (an object with \"jsonrpc\": \"2.0\")");
        json_decref(m);
        return WRK_MCP_BAD;
    }
    jid = json_object_get(m, "id");
    has_method = json_is_string(json_object_get(m, "method"));
    rpc = json_is_string(json_object_get(m, "jsonrpc")) &&
          strcmp(json_string_value(json_object_get(m, "jsonrpc")), "2.0") == 0;
    /* No method: it can only be an answer, so its id says which request it fails, even when it is bad. */
    if (!has_method && json_is_integer(jid) && json_integer_value(jid) >= 0)
        *id = (long long)json_integer_value(jid);
    if (!rpc) {
        snprintf(why, why_len, "not a JSON-RPC 2.0 message (no \"jsonrpc\": \"2.0\")");
    } else if (has_method) {
        *msg = m;
        return jid && !json_is_null(jid) ? WRK_MCP_REQUEST : WRK_MCP_NOTIFICATION;
    } else if (jid && (json_object_get(m, "result") || json_is_object(json_object_get(m, "error")))) {
        *msg = m;
        return WRK_MCP_RESPONSE;
    } else {
        snprintf(why, why_len,
                 "neither a request, a notification nor an answer (no method; no id with a result or an "
                 "error object)");
    }
    json_decref(m);
    return WRK_MCP_BAD;
}

/* m (taken) as one line with its newline. */
static char *line_of(json_t *m, size_t *len)
{
    char *s = m ? json_dumps(m, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    char *out = NULL;

    json_decref(m);
    if (s) {
        size_t n = strlen(s) + 1;
        if ((out = malloc(n + 1))) {
            memcpy(out, s, n - 1);
            out[n - 1] = '\n';
            out[n] = '\0';
            if (len)
                *len = n;
        }
    }
    free(s);
    return out;
}

char *wrk_mcp_request(long long id, const char *method, json_t *params, size_t *len)
{
    json_t *m = json_pack("{s:s,s:I,s:s}", "jsonrpc", "2.0", "id", (json_int_t)id, "method", method);

    if (m && params)
        json_object_set(m, "params", params);
    json_decref(params);
    return line_of(m, len);
}

char *wrk_mcp_notification(const char *method, json_t *params, size_t *len)
{
    json_t *m = json_pack("{s:s,s:s}", "jsonrpc", "2.0", "method", method);

    if (m && params)
        json_object_set(m, "params", params);
    json_decref(params);
    return line_of(m, len);
}

char *wrk_mcp_answer(const json_t *request_id, json_t *result, size_t *len)
{
    json_t *m = json_pack("{s:s,s:O}", "jsonrpc", "2.0", "id", request_id);

    if (m && result)
        json_object_set(m, "result", result);
    else if (m)
        json_object_set_new(m, "error",
                            json_pack("{s:i,s:s}", "code", -32601, "message",
                                      "the turnwatch worker does not serve this method"));
    json_decref(result);
    return line_of(m, len);
}

json_t *wrk_mcp_initialize_params(void)
{
    return json_pack("{s:s,s:{},s:{s:s,s:s}}", "protocolVersion", WRK_MCP_PROTOCOL_LATEST, "capabilities",
                     "clientInfo", "name", "turnwatch-worker", "version", "1");
}

bool wrk_mcp_version_ok(const char *version)
{
    for (size_t i = 0; version && wrk_mcp_protocol_versions[i]; i++)
        if (strcmp(version, wrk_mcp_protocol_versions[i]) == 0)
            return true;
    return false;
}

json_t *wrk_mcp_error_outcome(const char *status, const char *code, const char *fmt, ...)
{
    char raw[MCP_MESSAGE_MAX * 2], m[MCP_MESSAGE_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    tw_utf8_clean(m, sizeof m, raw, strlen(raw));
    return json_pack("{s:s,s:{s:s,s:s}}", "status", status, "error", "code", code, "message", m);
}

/* The text parts of content, joined by newlines, cut to buf's size. */
static void content_text(const json_t *content, char *buf, size_t size)
{
    size_t off = 0, i;
    const json_t *part;

    buf[0] = '\0';
    json_array_foreach(content, i, part)
    {
        const char *t = json_string_value(json_object_get(part, "text"));
        if (!t || off + 2 >= size)
            continue;
        off += (size_t)snprintf(buf + off, size - off, "%s%s", off ? "\n" : "", t);
        if (off >= size)
            off = size - 1;
    }
}

json_t *wrk_mcp_call_outcome(const json_t *msg)
{
    const json_t *err = json_object_get(msg, "error"), *res = json_object_get(msg, "result");
    const json_t *content;
    char text[MCP_MESSAGE_MAX];

    if (json_is_object(err)) {
        const char *m = json_string_value(json_object_get(err, "message"));
        return wrk_mcp_error_outcome("error", "mcp_tool_error", "the MCP server answered error %lld: %s",
                                     (long long)json_integer_value(json_object_get(err, "code")),
                                     m ? m : "(no message)");
    }
    if (!json_is_object(res))
        return wrk_mcp_error_outcome("error", "bad_output",
                                     "the MCP server's answer to tools/call has no result object");
    content = json_object_get(res, "content");
    if (content && !json_is_array(content))
        return wrk_mcp_error_outcome("error", "bad_output",
                                     "the MCP server's tools/call result: content is not an array");
    if (json_is_true(json_object_get(res, "isError"))) {
        content_text(content, text, sizeof text);
        return wrk_mcp_error_outcome("error", "mcp_tool_error", "%s",
                                     *text ? text : "the MCP tool reported an error (no text content)");
    }
    json_t *out = json_pack("{s:o}", "content", content ? json_incref((json_t *)content) : json_array());
    if (out && json_object_get(res, "structuredContent"))
        json_object_set(out, "structuredContent", json_object_get(res, "structuredContent"));
    return out ? json_pack("{s:s,s:o}", "status", "ok", "output", out) : NULL;
}
