/* The timeout policies' PMO rules (contract 11): a retried turn is dispatched at its retry_at, a turn not yet
 * running at the end of its queue budget ends timeout/queue_timeout, and warnings go out at warn_at_percent
 * of turn deadlines and queue budgets. Each is due-timed like the watchdogs (tw.pmo_policy_next_due). */
#include "pmo.h"

#define PMO_POLICY_BATCH 100

void pmo_policy_rules(TwRule *rules, const TwConfig *cfg)
{
    TwRule *retry = &rules[PMO_RULE_RETRY], *queue = &rules[PMO_RULE_QUEUE];
    TwRule *warn = &rules[PMO_RULE_WARN];

    (void)cfg; /* their batch sizes are fixed; the policies themselves are in the database */
    *retry = (TwRule){.key = "retry", .name = "retry_due", .sql = "SELECT tw.wd_retry_due($1::integer)"};
    tw_rule_set_params(retry, 1, (int[]){PMO_POLICY_BATCH});
    *queue =
        (TwRule){.key = "queue", .name = "queue_timeout", .sql = "SELECT tw.wd_queue_timeouts($1::integer)"};
    tw_rule_set_params(queue, 1, (int[]){PMO_POLICY_BATCH});
    *warn = (TwRule){.key = "warn", .name = "warnings", .sql = "SELECT tw.wd_pmo_warnings($1::integer)"};
    tw_rule_set_params(warn, 1, (int[]){PMO_POLICY_BATCH});
}
