/* exio.h — stdin/stdout plumbing shared by the example agent and tool programs (docs/protocol.md). */
#ifndef TW_EXAMPLES_EXIO_H
#define TW_EXAMPLES_EXIO_H

#include <jansson.h>
#include <stdbool.h>

/* Reads all of stdin and parses it as one JSON object; on any error says why on stderr and exits 2,
 * because a program that cannot read its step has nothing sensible to reply. */
json_t *ex_read_request(void);

/* The program's main loop, for exec and serve mode alike (docs/protocol.md). handle gets each
 * request and returns the reply, which is printed as one line; it may return NULL when it wrote its reply
 * itself. Exec mode (the default): one request, all of stdin; returns the exit code for main. Serve mode
 * (TURNWATCH_MODE=serve): one request per line of stdin until EOF, then returns 0. handle owns req. */
int ex_main(json_t *(*handle)(json_t *req));

/* True when the worker runs this program in serve mode. */
bool ex_serving(void);

/* Prints `reply` as one compact JSON line on stdout, drops the reference and returns the exit code (0, or 1
 * if the write failed) so `return ex_reply(...)` ends main. */
int ex_reply(json_t *reply);

/* {"complete":{"output":output}}, {"fail":{"error":msg}}, {"output":output}, {"error":{"code","message"}};
 * all steal `output`. */
json_t *ex_complete(json_t *output);
json_t *ex_fail(const char *error);
json_t *ex_tool_output(json_t *output);
json_t *ex_tool_error(const char *code, const char *message);

/* One entry of a tool_calls reply; timeout_seconds <= 0 leaves the tool's configured timeout in force. */
json_t *ex_tool_call(const char *id, const char *tool, json_t *args, double timeout_seconds);

/* Numeric field of an object, accepting integers and reals; `dflt` when absent or not a number. */
double ex_number(const json_t *obj, const char *key, double dflt);

/* Sleeps `seconds` (fractional), resuming after signals that interrupt it. */
void ex_sleep_sec(double seconds);

#endif
