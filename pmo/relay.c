/* Outbox relay: publish events whose writer committed them but died (or lost NATS) before publishing. */
#include "log.h"
#include "outbox.h"
#include "pmo.h"

/* A writer normally publishes within milliseconds; give it this long before relaying for it. */
#define PMO_RELAY_MIN_AGE_MS 1000
#define PMO_RELAY_BATCH 500

static void relayed(int n, void *arg)
{
    TwPmo *pmo = arg;

    pmo->relay_busy = false;
}

void pmo_relay_tick(TwPmo *pmo)
{
    if (pmo->relay_busy || !tw_pg_is_up(pmo->pg) || !tw_bus_is_up(pmo->bus))
        return;
    pmo->relay_busy = true;
    tw_outbox_relay(pmo->pg, pmo->bus, PMO_RELAY_MIN_AGE_MS, PMO_RELAY_BATCH, relayed, pmo);
}
