/* Outbox relay: publish events whose writer committed them but died (or lost NATS) before publishing, and
 * those of SQL API clients, which leave them to the relay (NOTIFY tw_outbox). A backlog drains at the speed
 * of the database and NATS: while a claim says there is more, the next follows at once, with a few batches
 * between their claim and their mark (flow control: never claim faster than NATS confirms), and each claim
 * looks at the newest events first when a tick or a NOTIFY asked for it, so that an old flood never holds up
 * the events that came after it (tw.outbox_claim). */
#include <string.h>

#include "log.h"
#include "outbox.h"
#include "pmo.h"

/* A writer normally publishes within milliseconds; give it this long before relaying for it. */
#define PMO_RELAY_MIN_AGE_MS 1000
/* Events per claim, and claimed batches not yet confirmed and marked (a bound on what is leased and in memory
 * at once). tools/bench relay on 2 cores: batches of 250 to 2,000 drained 150,000 events alike (20,000 to
 * 35,000 a second, within the spread between runs), 4,000 no faster and with the fresh event 0.2 s later;
 * 1, 2 and 4 batches in flight alike. */
#define PMO_RELAY_BATCH 1000
#define PMO_RELAY_IN_FLIGHT 4
/* The newest events looked at first: a SQL API client's, announced by NOTIFY, are among them. */
#define PMO_RELAY_NEWEST (4 * PMO_RELAY_BATCH)
/* Longer than a batch takes to be confirmed and marked, so that two relays rarely publish an event twice. */
#define PMO_RELAY_LEASE_SEC 10

static void relay_next(TwPmo *pmo);

/* A drain ends: the next claim starts at the cursor again. */
static void relay_rewind(PmoRelay *r)
{
    r->more = false;
    r->after_xid[0] = '\0';
    r->after_seq = 0;
}

static void relay_done(bool ok, void *arg)
{
    TwPmo *pmo = arg;

    pmo->relay.batches--;
    /* NATS did not take it (or the mark failed): no more claims until the next tick, whose claim starts at
     * the cursor and finds these events again once their lease ends, rather than lease the whole backlog
     * batch after batch for nothing. */
    if (!ok) {
        relay_rewind(&pmo->relay);
        pmo->relay.failed = true;
    }
    relay_next(pmo);
}

static void relay_claimed(const TwOutboxClaim *claim, void *arg)
{
    TwPmo *pmo = arg;
    PmoRelay *r = &pmo->relay;

    r->claiming = false;
    if (claim->n < 0) {
        relay_rewind(r); /* the database: until the next tick */
        return;
    }
    if (claim->n > 0)
        r->batches++;
    r->more = claim->more;
    /* More of the newest than one batch takes: the next claim looks there again, as the NOTIFY asked. */
    if (claim->newest_more) {
        r->due = true;
        r->now = r->now || r->claiming_now;
    }
    if (claim->after_xid && strlen(claim->after_xid) < sizeof r->after_xid) {
        strcpy(r->after_xid, claim->after_xid);
        r->after_seq = claim->after_seq;
    } else {
        r->after_xid[0] = '\0';
    }
    relay_next(pmo);
}

static void relay_next(TwPmo *pmo)
{
    PmoRelay *r = &pmo->relay;

    /* Not while the events stream is not ready: what it published would stay unconfirmed, and be published
     * again, every lease. */
    if (pmo->d.stopping || r->claiming || r->failed || r->batches >= PMO_RELAY_IN_FLIGHT ||
        !(r->due || r->more) || !tw_pg_is_up(pmo->pg) || !tw_bus_confirms(pmo->d.bus))
        return;
    TwOutboxClaimReq req = {
        .min_age_ms = r->now ? 0 : PMO_RELAY_MIN_AGE_MS,
        .lease_sec = PMO_RELAY_LEASE_SEC,
        .limit = PMO_RELAY_BATCH,
        .newest = r->due ? PMO_RELAY_NEWEST : 0,
        .after_xid = r->after_xid[0] ? r->after_xid : NULL,
        .after_seq = r->after_seq,
    };
    r->claiming_now = r->now;
    r->due = false;
    r->now = false;
    r->claiming = true;
    tw_outbox_relay(pmo->pg, pmo->d.bus, &req, relay_claimed, relay_done, pmo);
}

void pmo_relay_tick(TwPmo *pmo)
{
    pmo->relay.failed = false;
    pmo->relay.due = true;
    relay_next(pmo);
}

/* NOTIFY tw_outbox: a client of the SQL API committed events it does not publish itself; relay them now. */
void pmo_relay_now(TwPmo *pmo)
{
    pmo->relay.due = true;
    pmo->relay.now = true;
    relay_next(pmo);
}
