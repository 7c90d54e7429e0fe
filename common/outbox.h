/* Publishing what a state-change function returned: doorbells at once, outbox events confirmed and
 * then marked published. Anything not confirmed stays in the outbox for the relay (at least once,
 * always with the same event_id). */
#ifndef TW_OUTBOX_H
#define TW_OUTBOX_H

#include <jansson.h>
#include <stdbool.h>

#include "bus.h"
#include "pgconn.h"

/** items: a JSON array that the caller's own transaction returned: doorbells {"subject","data"} and outbox
 *  events {"subject","event_id","text"}, whose payload is the outbox row's own text, published as it is (its
 *  final events count as turns this daemon ended, see metrics.h). Borrowed. */
void tw_outbox_publish(TwPg *pg, TwBus *bus, json_t *items);

/** The bytes to publish for one item: an event's "text" as it is (borrowed from item), or a doorbell's "data"
 *  encoded into *owned, which the caller frees (*owned is NULL for an event). NULL when the item has neither
 *  or memory ran out. */
const char *tw_item_payload(const json_t *item, char **owned);

/** A relay's claim (tw.outbox_claim): up to limit events older than min_age_ms that nobody published, leased
 *  for lease_sec; first what is unpublished among the newest `newest` events (0: none), then the oldest, from
 *  after (after_xid, after_seq), where the previous claim of the same drain stopped (after_xid NULL: from the
 *  cursor). */
typedef struct TwOutboxClaimReq {
    int min_age_ms, lease_sec, limit, newest;
    const char *after_xid;
    long long after_seq;
} TwOutboxClaimReq;

/** What a claim found: n events (-1 on a database error), and where the next claim of this drain goes on. */
typedef struct TwOutboxClaim {
    int n;
    bool more;             /* there may be more to claim at once */
    bool newest_more;      /* the newest events had more unpublished than their share */
    const char *after_xid; /* NULL: this drain is over, the next one starts at the cursor (borrowed) */
    long long after_seq;
} TwOutboxClaim;

typedef void (*TwOutboxClaimed)(const TwOutboxClaim *claim, void *arg);
/** A relayed batch is over: marked published (ok), or not confirmed by NATS or not marked (left to be relayed
 *  again once its lease ends). */
typedef void (*TwOutboxDone)(bool ok, void *arg);

/** Relay: claim, publish what was claimed as one batch, mark it once NATS confirmed it. claimed runs once per
 *  call, from the loop, before the batch is published; done runs once for each claim with n > 0, after it. */
void tw_outbox_relay(TwPg *pg, TwBus *bus, const TwOutboxClaimReq *req, TwOutboxClaimed claimed,
                     TwOutboxDone done, void *arg);

/** Parse the single jsonb/json column of a one-row result. NULL (with err set) if it is not there. */
json_t *tw_result_json(const PGresult *res, const char **err);

#endif
