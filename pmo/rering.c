/* Doorbell re-rings: 2.4 (agent dispatched but nobody took the turn) and 2.7 (inbox item still pending). */
#include <stdio.h>

#include "pmo.h"

#define PMO_BATCH "200"

void pmo_rering_setup(TwPmo *pmo)
{
    pmo->rules[PMO_RULE_RERING_DISPATCHED] = (TwRule){
        .name = "2.4 rering_dispatched", .sql = "SELECT tw.wd_rering_dispatched($1::integer, $2::integer)"};
    pmo->rules[PMO_RULE_RERING_PENDING] =
        (TwRule){.name = "2.7 rering_pending",
                 .sql = "SELECT tw.wd_rering_pending($1::integer, $2::integer, $3::integer)"};
}

void pmo_rering_tick(TwPmo *pmo)
{
    char retry[16], wake[16], skip[16];
    const char *p24[] = {retry, PMO_BATCH};
    const char *p27[] = {wake, skip, PMO_BATCH};

    snprintf(retry, sizeof retry, "%d", pmo->cfg->pmo.dispatched_retry_sec);
    snprintf(wake, sizeof wake, "%d", pmo->cfg->pmo.pending_wakeup_sec);
    snprintf(skip, sizeof skip, "%d", pmo->cfg->pmo.pending_wakeup_skip_sec);
    tw_rule_run(&pmo->rules[PMO_RULE_RERING_DISPATCHED], pmo->pg, pmo->bus, 2, p24);
    tw_rule_run(&pmo->rules[PMO_RULE_RERING_PENDING], pmo->pg, pmo->bus, 3, p27);
}
