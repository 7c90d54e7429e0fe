/* Worker watchdogs (seed 002, 2.1-2.3). Bounded batches, SKIP LOCKED, database clock: any number of workers
 * may run them at once. They never emit final events. */
#include "watchdog.h"

#define WRK_BATCH 200

void wrk_watchdog_rules(TwRule *rules, const TwConfig *cfg)
{
    /* 2.1 and 2.3 judge other workers by their leases, which heartbeats renew: held back for a grace after
     * the database comes back, so that the others can renew first. */
    rules[WRK_RULE_RECLAIM_INBOX] = (TwRule){.key = "2.1",
                                             .name = "2.1 reclaim_inbox",
                                             .sql = "SELECT tw.wd_reclaim_inbox($1::integer, $2::integer)",
                                             .heartbeat_judged = true};
    tw_rule_set_params(&rules[WRK_RULE_RECLAIM_INBOX], 2,
                       (int[]){cfg->worker.inbox_processing_timeout_sec, WRK_BATCH});
    rules[WRK_RULE_TOOL_TIMEOUTS] =
        (TwRule){.key = "2.2", .name = "2.2 tool_timeouts", .sql = "SELECT tw.wd_tool_timeouts($1::integer)"};
    tw_rule_set_params(&rules[WRK_RULE_TOOL_TIMEOUTS], 1, (int[]){WRK_BATCH});
    rules[WRK_RULE_REQUEUE_LEDGERS] = (TwRule){.key = "2.3",
                                               .name = "2.3 requeue_expired_resume_ledgers",
                                               .sql = "SELECT tw.requeue_expired_resume_ledgers($1::integer)",
                                               .heartbeat_judged = true};
    tw_rule_set_params(&rules[WRK_RULE_REQUEUE_LEDGERS], 1, (int[]){WRK_BATCH});
    rules[WRK_RULE_TOOL_WARNINGS] = (TwRule){
        .key = "warn", .name = "tool_call_warnings", .sql = "SELECT tw.wd_tool_warnings($1::integer)"};
    tw_rule_set_params(&rules[WRK_RULE_TOOL_WARNINGS], 1, (int[]){WRK_BATCH});
}
