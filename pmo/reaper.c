/* Reaping into a terminal state with the output contract: 2.5 (dispatched too long), 2.6 (running with
 * no heartbeat), and turns past their own deadline. The SQL does finish_turn_idle, the force-termination
 * record, the fallback deliverable, both events and dispatch_next in one transaction. */
#include <stdio.h>

#include "pmo.h"

#define PMO_BATCH "100"

void pmo_reaper_setup(TwPmo *pmo)
{
    pmo->rules[PMO_RULE_REAP_DISPATCHED] = (TwRule){
        .name = "2.5 reap_dispatched",
        .sql = "SELECT tw.wd_reap('dispatched', $1::integer, 'dispatch_timeout', 'timeout', $2::integer)"};
    pmo->rules[PMO_RULE_REAP_RUNNING] = (TwRule){
        .name = "2.6 reap_running",
        .sql =
            "SELECT tw.wd_reap('running', $1::integer, 'timeout_reaped_by_watchdog', 'failed', $2::integer)"};
    pmo->rules[PMO_RULE_TURN_DEADLINE] =
        (TwRule){.name = "turn_deadline", .sql = "SELECT tw.wd_turn_deadlines($1::integer)"};
}

void pmo_reaper_tick(TwPmo *pmo)
{
    char dispatched[16], running[16];
    const char *p25[] = {dispatched, PMO_BATCH};
    const char *p26[] = {running, PMO_BATCH};
    const char *pdl[] = {PMO_BATCH};

    snprintf(dispatched, sizeof dispatched, "%d", pmo->cfg->pmo.dispatched_timeout_sec);
    snprintf(running, sizeof running, "%d", pmo->cfg->pmo.active_reap_sec);
    tw_rule_run(&pmo->rules[PMO_RULE_REAP_DISPATCHED], pmo->pg, pmo->bus, 2, p25);
    tw_rule_run(&pmo->rules[PMO_RULE_REAP_RUNNING], pmo->pg, pmo->bus, 2, p26);
    tw_rule_run(&pmo->rules[PMO_RULE_TURN_DEADLINE], pmo->pg, pmo->bus, 1, pdl);
}
