/* The agents' timeout policies (contract section 11) as the database sees them: each daemon publishes those
 * of its configuration to state.policies when it connects, where the SQL that ends a turn (in any daemon or
 * client) reads them. */
#ifndef TW_POLICY_H
#define TW_POLICY_H

#include <jansson.h>
#include <stdbool.h>

#include "config.h"
#include "pgconn.h"

/** [{"profile","max_attempts","retry_on":[...],"retry_backoff_seconds","retry_backoff_max_seconds",
 *  "queue_timeout_seconds","warn_at_percent","tool_timeout_seconds","step_timeout_seconds"}] for every agent
 * of cfg (served_only: those this worker serves). NULL when out of memory. */
json_t *tw_policy_doc(const TwConfig *cfg, bool served_only);
/** Queue tw.publish_policies on pg (a failure is logged; the next connect publishes again). */
void tw_policy_publish(TwPg *pg, const TwConfig *cfg, bool served_only, const char *who);

#endif
