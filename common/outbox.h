/* Publishing what a state-change function returned: doorbells at once, outbox events confirmed and
 * then marked published. Anything not confirmed stays in the outbox for the relay (at least once,
 * always with the same event_id). */
#ifndef TW_OUTBOX_H
#define TW_OUTBOX_H

#include <jansson.h>

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

/** Relay: claim events older than min_age_ms that nobody published, publish them, mark them. Calls done
 *  (may be NULL) with the number relayed, or -1 on a database error. */
void tw_outbox_relay(TwPg *pg, TwBus *bus, int min_age_ms, int limit, void (*done)(int n, void *arg),
                     void *arg);

/** Parse the single jsonb/json column of a one-row result. NULL (with err set) if it is not there. */
json_t *tw_result_json(const PGresult *res, const char **err);

#endif
