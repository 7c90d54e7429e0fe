/* Worker watchdogs (seed 002, 2.1-2.3): reclaim expired processing leases, inject tool-timeout reports at
 * each waiting call's deadline, requeue resume ledger entries whose lease expired; and the tool calls'
 * warnings (contract 11). Fired at their due times by TwDue (common/due.h). */
#ifndef WRK_WATCHDOG_H
#define WRK_WATCHDOG_H

#include "config.h"
#include "rule.h"

/* WRK_RULE_TOOL_WARNINGS: warnings at warn_at_percent of a waiting tool call's deadline (contract 11). */
enum {
    WRK_RULE_RECLAIM_INBOX,
    WRK_RULE_TOOL_TIMEOUTS,
    WRK_RULE_REQUEUE_LEDGERS,
    WRK_RULE_TOOL_WARNINGS,
    WRK_RULE_COUNT
};

/** Fill rules[WRK_RULE_COUNT] from the configuration. */
void wrk_watchdog_rules(TwRule *rules, const TwConfig *cfg);

#endif
