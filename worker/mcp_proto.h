/* The Model Context Protocol's stdio framing, for worker/mcp.c (docs/mcp.md): newline-delimited JSON-RPC 2.0
 * messages, built and told apart here, and the outcome of a tools/call answer. No loop, no process: plain
 * functions, so that mcp.c keeps to the servers' lives. */
#ifndef WRK_MCP_PROTO_H
#define WRK_MCP_PROTO_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "registry.h"

/* The protocol versions the worker speaks, newest first: it offers the first and accepts any of them. */
#define WRK_MCP_PROTOCOL_LATEST "2025-11-25"
extern const char *const wrk_mcp_protocol_versions[];

/* The longest line a server may write (an answer carries a call's output: TW_DOC_MAX, and room around it). */
#define WRK_MCP_LINE_MAX (TW_DOC_MAX + 64 * 1024)

typedef enum {
    WRK_MCP_BAD,          /* not one JSON-RPC 2.0 message (why says what) */
    WRK_MCP_RESPONSE,     /* an answer to one of ours: id, and result or error */
    WRK_MCP_REQUEST,      /* the server asks something: method and id */
    WRK_MCP_NOTIFICATION, /* method, no id */
} WrkMcpKind;

/** One line (without its newline) as a message: its kind, the message in *msg (a new reference, NULL when
 *  BAD), and for a response or request its id in *id (-1 when the id is not a whole number: no id of ours).
 *  A BAD line that is a JSON object without a method has its id in *id too (-1 when none): a broken answer
 *  to a request of ours, which that request fails with.
 */
WrkMcpKind wrk_mcp_parse(const char *line, size_t len, json_t **msg, long long *id, char *why,
                         size_t why_len);

/** A request {"jsonrpc","id","method","params"?} as one line with its newline and a NUL (malloc'd; *len
 *  bytes without the NUL, when len is not NULL); params is taken (may be NULL). NULL when out of memory. */
char *wrk_mcp_request(long long id, const char *method, json_t *params, size_t *len);
/** A notification, likewise. */
char *wrk_mcp_notification(const char *method, json_t *params, size_t *len);
/** An answer to a request of the server's: result (taken), or when NULL the error "method not found". The
 *  request's id is copied as it came. */
char *wrk_mcp_answer(const json_t *request_id, json_t *result, size_t *len);

/** The params of our initialize. */
json_t *wrk_mcp_initialize_params(void);
/** Whether version (the server's answer to initialize) is one the worker speaks. */
bool wrk_mcp_version_ok(const char *version);

/** A tools/call answer as a tool call's outcome ({"status", "output"} or {"status", "error"}, as steps.c
 *  builds them): result with isError true is error mcp_tool_error with its text content as message; a
 *  JSON-RPC error is mcp_tool_error with its code and message; otherwise ok with output {"content",
 *  "structuredContent"?}. A result that is not an object, or whose content is not an array, is bad_output. */
json_t *wrk_mcp_call_outcome(const json_t *msg);
/** A failure's outcome: {"status": status, "error": {"code", "message"}} (message cut to fit, valid UTF-8).
 */
json_t *wrk_mcp_error_outcome(const char *status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
