/* The agents' timeout policies (docs/timeouts.md): which applies to an agent or a tool call, from the
 * configuration; and as the database sees them: each daemon publishes those of its configuration to
 * state.policies when it connects, where the SQL that ends a turn (in any daemon or client) reads them. */
#ifndef TW_POLICY_H
#define TW_POLICY_H

#include <jansson.h>
#include <stdbool.h>

#include "config.h"
#include "pgconn.h"

/** The policy that applies to an agent: its section's, or [worker]'s for an agent this file does not name. */
const TwPolicyConf *tw_policy_of(const TwConfig *cfg, const char *agent);
/** A tool call's timeout (docs/timeouts.md, the hierarchy): the call's own (call_sec > 0), else [tool.X]
 *  timeout_seconds, else [agent.A] tool_timeout_seconds, else [worker] tool_timeout_seconds. *source (may be
 *  NULL) gets "call", "tool", "agent" or "global". agent and tool may be NULL. */
int tw_policy_tool_timeout(const TwConfig *cfg, const TwAgentConf *agent, const TwToolConf *tool,
                           int call_sec, const char **source);
/** Seconds a call of this tool may wait (docs/watchdogs.md, 2.2): the largest of the worker default, the
 * tool's suspend_timeout_seconds and the call's timeout (tw_policy_tool_timeout). */
int tw_policy_wait_seconds(const TwConfig *cfg, const TwToolConf *tool, int timeout_sec);

/** [{"profile","max_attempts","retry_on":[...],"retry_backoff_seconds","retry_backoff_max_seconds",
 *  "queue_timeout_seconds","warn_at_percent","tool_timeout_seconds","step_timeout_seconds"}] for every agent
 * of cfg (served_only: those this worker serves). NULL when out of memory. */
json_t *tw_policy_doc(const TwConfig *cfg, bool served_only);
/** Queue tw.publish_policies on pg (a failure is logged; the next connect publishes again). */
void tw_policy_publish(TwPg *pg, const TwConfig *cfg, bool served_only, const char *who);
/** Flow control (docs/flow-control.md): the configuration's limits ([limit.NAME], and each [tool.T]
 *  max_concurrent as a limit of its own) as tw.sync_limits takes them; NULL when out of memory. */
json_t *tw_flow_limits_doc(const TwConfig *cfg);
/* The profiles' [agent.P] limits: {"P": ["a", ...] or null, ...} for every profile of cfg. */
json_t *tw_flow_profile_limits_doc(const TwConfig *cfg);
/** Write them to the database (a worker, at every connect and after a reload): an INI limit no longer in
 *  the file is removed. Asynchronous on pg, like tw_policy_publish. */
void tw_flow_limits_publish(TwPg *pg, const TwConfig *cfg);
/** The limits a call of tool t holds, as the JSON array apply_step takes; NULL when it has none. */
json_t *tw_flow_tool_limits(const TwToolConf *t);

#endif
