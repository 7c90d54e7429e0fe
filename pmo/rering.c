/* Doorbell re-rings: 2.4 (agent dispatched but nobody took the turn) and 2.7 (inbox item still pending). */
#include "pmo.h"

/* Re-rings change nothing but a doorbell and are many under a large backlog: 20 lines per 10 s at info (the
 * rest at debug, counted in a summary line), where 2.7 alone once wrote 642,089 lines in 6 minutes. */
#define PMO_RERING_INFO_LINES 20

void pmo_rering_rules(TwRule *rules, const TwConfig *cfg)
{
    TwRule *r24 = &rules[PMO_RULE_RERING_DISPATCHED], *r27 = &rules[PMO_RULE_RERING_PENDING];

    *r24 = (TwRule){
        .key = "2.4",
        .name = "2.4 rering_dispatched",
        .sql = "SELECT tw.wd_rering_dispatched($1::integer, $2::integer, $3::integer)",
        /* judges workers by whether they were seen and had a free slot: held back after a reconnect */
        .heartbeat_judged = true,
        .info_lines_per_10s = PMO_RERING_INFO_LINES};
    tw_rule_set_params(r24, 3, (int[]){cfg->pmo.dispatched_retry_sec, TW_LIVE_STALE_SEC, 200});
    *r27 = (TwRule){.key = "2.7",
                    .name = "2.7 rering_pending",
                    .sql = "SELECT tw.wd_rering_pending($1::integer, $2::integer, $3::integer)",
                    .info_lines_per_10s = PMO_RERING_INFO_LINES};
    tw_rule_set_params(r27, 3, (int[]){cfg->pmo.pending_wakeup_sec, cfg->pmo.pending_wakeup_skip_sec, 200});
}
