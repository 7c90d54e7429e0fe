/* Dispatch: a submitted turn is announced by NOTIFY tw_turn; a periodic scan catches anything missed. */
#include <stdlib.h>

#include "log.h"
#include "names.h"
#include "outbox.h"
#include "pmo.h"

/* Dispatches asked for one agent at a time (NOTIFY tw_turn) that may wait on the connection at once. A burst
 * of submits past this (100,000 agents submitting together) is served by the scan instead, so the queue, and
 * the PMO's memory, stay bounded whatever the burst. */
#define PMO_DISPATCH_MAX_QUEUED 64

/* At most this many idle agents per scan; a scan that dispatched any runs again at once for the rest. */
#define PMO_DISPATCH_SCAN_LIMIT "100"

/* Publishes what a dispatch returned; returns how many events that was (0 on a failure). */
static size_t dispatched(TwPmo *pmo, TwPg *pg, const PGresult *res, const char *err)
{
    json_t *pub;

    if (err || !(pub = tw_result_json(res, &err))) {
        static TwLogLimit lim;
        tw_pg_log_failure(&lim, res, "dispatch", err);
        return 0;
    }
    size_t n = json_array_size(pub);
    /* A dispatch starts the clocks of 2.4 and 2.7; when they are shorter than the sweep, ask now when the
     * next rule is due. */
    if (pmo->wake_on_dispatch && n > 0)
        tw_due_wake(pmo->d.due);
    tw_outbox_publish(pg, pmo->d.bus, pub);
    json_decref(pub);
    return n;
}

static void dispatched_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    dispatched(arg, pg, res, err);
}

void pmo_dispatch_on_notify(TwPmo *pmo, const char *agent)
{
    const char *params[] = {agent};

    if (!tw_name_valid(agent))
        return;
    if (tw_pg_queued(pmo->pg) >= PMO_DISPATCH_MAX_QUEUED) {
        pmo->dispatch_scan_again = true;
        pmo_dispatch_scan(pmo);
        return;
    }
    tw_pg_query(pmo->pg, "SELECT tw.dispatch_next($1)", 1, params, dispatched_cb, pmo);
}

static void scanned_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    TwPmo *pmo = arg;

    pmo->dispatch_scan_busy = false;
    size_t n = dispatched(pmo, pg, res, err);
    /* More agents than one scan takes, or submits that came while it ran and were left to it: again, until a
     * scan finds nothing to dispatch. */
    if (!err && (n > 0 || pmo->dispatch_scan_again)) {
        pmo->dispatch_scan_again = false;
        pmo_dispatch_scan(pmo);
    }
}

void pmo_dispatch_scan(TwPmo *pmo)
{
    const char *params[] = {PMO_DISPATCH_SCAN_LIMIT};

    if (pmo->dispatch_scan_busy || pmo->d.stopping || !tw_pg_is_up(pmo->pg))
        return;
    pmo->dispatch_scan_busy = true;
    tw_pg_query(pmo->pg, "SELECT tw.dispatch_pending($1::integer)", 1, params, scanned_cb, pmo);
}
