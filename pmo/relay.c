/* Outbox relay: publish events whose writer committed them but died (or lost NATS) before publishing. */
#include <string.h>

#include "log.h"
#include "outbox.h"
#include "pmo.h"

/* A writer normally publishes within milliseconds; give it this long before relaying for it. */
#define PMO_RELAY_MIN_AGE_MS 1000
#define PMO_RELAY_BATCH 500

static void relay(TwPmo *pmo, int min_age_ms);

static void relayed(int n, void *arg)
{
    TwPmo *pmo = arg;

    pmo->relay_busy = false;
    if (pmo->relay_now) {
        pmo->relay_now = false;
        relay(pmo, 0);
    }
}

static void relay(TwPmo *pmo, int min_age_ms)
{
    /* Not while the events stream is not ready: what it published would stay unconfirmed, and be published
     * again, every lease. */
    if (pmo->relay_busy || !tw_pg_is_up(pmo->pg) || !tw_bus_confirms(pmo->bus))
        return;
    pmo->relay_busy = true;
    tw_outbox_relay(pmo->pg, pmo->bus, min_age_ms, PMO_RELAY_BATCH, relayed, pmo);
}

void pmo_relay_tick(TwPmo *pmo)
{
    relay(pmo, PMO_RELAY_MIN_AGE_MS);
}

/* NOTIFY tw_outbox: a client of the SQL API committed events it does not publish itself; relay them now. */
void pmo_relay_now(TwPmo *pmo)
{
    if (pmo->relay_busy)
        pmo->relay_now = true;
    else
        relay(pmo, 0);
}
