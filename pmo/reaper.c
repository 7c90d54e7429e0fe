/* Reaping into a terminal state with the output contract: 2.5 (dispatched too long), 2.6 (running with
 * no heartbeat), turns past their own deadline, and the child turns a cancel left for later (a large tree is
 * cancelled in batches, one transaction each). The SQL does finish_turn_idle, the force-termination record,
 * the fallback deliverable, both events and dispatch_next in one transaction. */
#include "pmo.h"

void pmo_reaper_rules(TwRule *rules, const TwConfig *cfg)
{
    TwRule *r25 = &rules[PMO_RULE_REAP_DISPATCHED], *r26 = &rules[PMO_RULE_REAP_RUNNING];
    TwRule *rdl = &rules[PMO_RULE_TURN_DEADLINE], *rtc = &rules[PMO_RULE_TREE_CANCEL];

    *r25 = (TwRule){.key = "2.5",
                    .name = "2.5 reap_dispatched",
                    .sql = "SELECT tw.wd_reap_dispatched($1::integer, $2::integer, $3::integer)",
                    /* A backlog is not a failure: 2.5 runs on its profile's clock (tw.profile_clock), which
                     * judges workers by whether they were seen and had a free slot; after the database comes
                     * back they need time to write. */
                    .heartbeat_judged = true};
    tw_rule_set_params(r25, 3, (int[]){cfg->pmo.dispatched_timeout_sec, TW_LIVE_STALE_SEC, 100});
    /* 2.6 judges workers by their heartbeats: after the database comes back they need time to write. */
    *r26 = (TwRule){.key = "2.6",
                    .name = "2.6 reap_running",
                    .sql = "SELECT tw.wd_reap_running($1::integer, $2::integer)",
                    .heartbeat_judged = true};
    tw_rule_set_params(r26, 2, (int[]){cfg->pmo.active_reap_sec, 100});
    *rdl = (TwRule){
        .key = "deadline", .name = "turn_deadline", .sql = "SELECT tw.wd_turn_deadlines($1::integer)"};
    tw_rule_set_params(rdl, 1, (int[]){100});
    /* Due as soon as a transaction leaves child turns to cancel (tw.cancel_children_upto); each run cancels
     * at most one batch (tw.cancel_batch), going through up to 100 parents. */
    *rtc = (TwRule){
        .key = "tree_cancel", .name = "tree_cancel", .sql = "SELECT tw.wd_tree_cancels($1::integer)"};
    tw_rule_set_params(rtc, 1, (int[]){100});
}
