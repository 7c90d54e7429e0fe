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
    if (pmo->relay_busy || !tw_pg_is_up(pmo->pg) || !tw_bus_is_up(pmo->bus))
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

/* NOTIFY tw_ring: the doorbells of a SQL API call (a JSON array of {"subject","data"}), rung for it. Only
 * doorbell subjects are published, whoever sent the notification. */
void pmo_ring(TwPmo *pmo, const char *payload)
{
    json_t *items = json_loads(payload, 0, NULL), *out = json_array(), *it;
    size_t i;

    json_array_foreach(items, i, it)
    {
        const char *subject = json_string_value(json_object_get(it, "subject"));
        if (subject && strncmp(subject, "cmd.", 4) == 0 && json_is_object(json_object_get(it, "data")) &&
            !json_object_get(it, "event_id"))
            json_array_append(out, it);
    }
    if (json_array_size(out) > 0)
        tw_outbox_publish(pmo->pg, pmo->bus, out);
    json_decref(out);
    json_decref(items);
}
