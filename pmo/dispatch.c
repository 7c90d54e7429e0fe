/* Dispatch: a submitted turn is announced by NOTIFY tw_turn; a periodic scan catches anything missed. */
#include <stdlib.h>

#include "log.h"
#include "names.h"
#include "outbox.h"
#include "pmo.h"

static void dispatched_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    TwPmo *pmo = arg;
    json_t *pub;

    if (err || !(pub = tw_result_json(res, &err))) {
        static TwLogLimit lim;
        tw_pg_log_failure(&lim, res, "dispatch", err);
        return;
    }
    /* A dispatch starts the clocks of 2.4 and 2.7; when they are shorter than the sweep, ask now when the
     * next rule is due. */
    if (pmo->wake_on_dispatch && json_array_size(pub) > 0)
        tw_due_wake(pmo->due);
    tw_outbox_publish(pg, pmo->bus, pub);
    json_decref(pub);
}

void pmo_dispatch_on_notify(TwPmo *pmo, const char *agent)
{
    const char *params[] = {agent};

    if (!tw_name_valid(agent))
        return;
    tw_pg_query(pmo->pg, "SELECT tw.dispatch_next($1)", 1, params, dispatched_cb, pmo);
}

static void scanned_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    TwPmo *pmo = arg;

    pmo->dispatch_scan_busy = false;
    dispatched_cb(pg, res, err, arg);
}

void pmo_dispatch_scan(TwPmo *pmo)
{
    /* At most this many idle agents per scan; the next tick takes the rest. */
    const char *params[] = {"500"};

    if (pmo->dispatch_scan_busy || !tw_pg_is_up(pmo->pg))
        return;
    pmo->dispatch_scan_busy = true;
    tw_pg_query(pmo->pg, "SELECT tw.dispatch_pending($1::integer)", 1, params, scanned_cb, pmo);
}
