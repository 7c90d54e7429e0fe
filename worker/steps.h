/* Reading what an agent or tool program produced (docs/protocol.md): pure functions from a program's
 * result to what tw.apply_step / tw.deliver_result take. No worker state, so tests and fuzzers call them. */
#ifndef WRK_STEPS_H
#define WRK_STEPS_H

#include <jansson.h>

#include "config.h"
#include "runner.h"

/** The outcome of an agent step: {"complete":…} | {"tool_calls":…,"wait":…,"state":…} | {"fail":{"error",
 *  "message"}}. agent may be NULL (its program was not configured here); cfg resolves the tools it calls. */
json_t *wrk_step_outcome(const TwConfig *cfg, const TwAgentConf *agent, const WrkProcResult *r);
/** The outcome of a tool call: {"status":"ok","output":…} | {"status":"error"|"timeout","error":{…}}. */
json_t *wrk_tool_outcome(int timeout_sec, const WrkProcResult *r);

/** A program stopped by a limit (r->outcome WRK_PROC_LIMIT): its message into msg, starting with who ("the
 *  tool program"), naming the limit, with its stderr tail; returns the code, "resource_limit". */
const char *wrk_limit_failure(const WrkProcResult *r, const char *who, char *msg, size_t msg_size);

#endif
