/* NATS doorbells and events. nats.c runs its own I/O threads; everything it reports (messages,
 * connection changes, publish confirmations) is handed to the libevent loop, never handled in place. */
#ifndef TW_BUS_H
#define TW_BUS_H

#include <event2/event.h>
#include <nats/nats.h>
#include <stdbool.h>
#include <stddef.h>

#include "config.h"

typedef struct TwBus TwBus;

typedef void (*TwBusMsgCb)(TwBus *bus, const char *subject, const char *data, size_t len, void *arg);
/** up=true on the first connect and every reconnect (a daemon catches up from the database then). */
typedef void (*TwBusStateCb)(TwBus *bus, bool up, void *arg);
/** ok=true when every message of a confirmed batch reached the server (publish + flush), and with an events
 *  stream in force (tw_bus_keep_events) was kept by the stream (JetStream acknowledgments). */
typedef void (*TwBusConfirmCb)(TwBus *bus, bool ok, void *arg);

/** Must be called once, before any event_base is created: makes libevent thread-aware. */
int tw_bus_global_init(void);

/** A bus for cfg's [nats] (servers, TLS, credentials: tw_nats_options_create, whose files are read now); NULL
 *  when that fails (logged, naming the key) or out of memory. */
TwBus *tw_bus_new(struct event_base *base, const TwConfig *cfg, const char *name)
    __attribute__((warn_unused_result));
void tw_bus_set_state_cb(TwBus *bus, TwBusStateCb cb, void *arg);
/** [nats] events_stream (docs/operations.md and docs/high-availability.md): after every connect, make sure
 * the JetStream stream `stream` keeps every event for max_age_sec on `replicas` servers (on the publisher
 * thread; retried while it fails). From then on a confirmed batch is confirmed only by the stream's
 * acknowledgments: until the stream is made sure of, batches are published live but confirmed with ok=false
 * (the outbox keeps them for the relay), except on a server with no JetStream at all, where they count as
 * published as without a stream. NULL or "": off. Call before tw_bus_start. */
void tw_bus_keep_events(TwBus *bus, const char *stream, int max_age_sec, int replicas);
/** Subscribe (before or after start); the callback runs on the loop. */
int tw_bus_subscribe(TwBus *bus, const char *subject, TwBusMsgCb cb, void *arg);
/** True when subject was subscribed to already (exactly this subject). */
bool tw_bus_subscribed(const TwBus *bus, const char *subject);
/** Connect in the background; retries forever, never fails because the server is away or refuses the
 *  connection (TLS, credentials: logged as such, naming the keys to check). A connection that nats.c closes
 *  for good (a server's -ERR, say) is replaced with a new one, with capped backoff; up=false is reported
 *  meanwhile and up=true once the new one is connected and subscribed. */
int tw_bus_start(TwBus *bus);
/** Fire-and-forget publish (doorbells): losing one never loses work. A subject that is not one
 *  (tw_subject_valid) is never published: logged (at most once per 10 s) and dropped. */
void tw_bus_publish(TwBus *bus, const char *subject, const char *data, size_t len);

typedef struct TwBusBatch TwBusBatch;
TwBusBatch *tw_bus_batch_new(void);
/** id: the event's event_id (the stream keeps one copy per id), or NULL. -EINVAL (logged) for a subject that
 * is not one (tw_subject_valid), -ENOMEM; the batch is unchanged then. */
int tw_bus_batch_add(TwBusBatch *b, const char *subject, const char *data, size_t len, const char *id);
/** Publish every message then flush, on a publisher thread; cb runs on the loop, exactly once (from
 * tw_bus_free with ok false if the loop never got to it; with ok false, not waiting for a reconnect, while
 * the connection is down or being replaced). Takes the batch. */
void tw_bus_publish_confirmed(TwBus *bus, TwBusBatch *batch, TwBusConfirmCb cb, void *arg);
bool tw_bus_is_up(const TwBus *bus);
/** Up, and a confirmed batch could be confirmed now (no events stream, or the stream made sure of, or a
 * server without JetStream): the outbox relay waits for this rather than publish events that would stay
 * unconfirmed again and again. */
bool tw_bus_confirms(const TwBus *bus);
/** Stop the publisher thread, close the connection. Accepts NULL. */
void tw_bus_free(TwBus *bus);

#endif
