/* Worker watchdogs (seed 002, 2.1-2.3): reclaim expired processing leases, inject tool-timeout reports at
 * each waiting call's deadline, requeue resume ledger entries whose lease expired. Bounded batches, SKIP
 * LOCKED, database clock: any number of workers may run them at once. They never emit final events. */
#include <stdio.h>

#include "worker.h"

#define WRK_BATCH "200"

void wrk_watchdog_setup(TwWorker *w)
{
    w->rules[WRK_RULE_RECLAIM_INBOX] =
        (TwRule){.name = "2.1 reclaim_inbox", .sql = "SELECT tw.wd_reclaim_inbox($1::integer, $2::integer)"};
    w->rules[WRK_RULE_TOOL_TIMEOUTS] =
        (TwRule){.name = "2.2 tool_timeouts", .sql = "SELECT tw.wd_tool_timeouts($1::integer)"};
    w->rules[WRK_RULE_REQUEUE_LEDGERS] =
        (TwRule){.name = "2.3 requeue_expired_resume_ledgers",
                 .sql = "SELECT tw.requeue_expired_resume_ledgers($1::integer)"};
}

void wrk_watchdog_tick(TwWorker *w)
{
    char timeout[16];
    const char *p21[] = {timeout, WRK_BATCH};
    const char *batch[] = {WRK_BATCH};

    snprintf(timeout, sizeof timeout, "%d", w->cfg->worker.inbox_processing_timeout_sec);
    tw_rule_run(&w->rules[WRK_RULE_RECLAIM_INBOX], wrk_pg(w), w->bus, 2, p21);
    tw_rule_run(&w->rules[WRK_RULE_TOOL_TIMEOUTS], wrk_pg(w), w->bus, 1, batch);
    tw_rule_run(&w->rules[WRK_RULE_REQUEUE_LEDGERS], wrk_pg(w), w->bus, 1, batch);
}
