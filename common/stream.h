/* The durable event stream (docs/operations.md, [nats] events_stream): a JetStream stream that keeps every
 * evt.agent.> event for a while, so that an observer that was away can replay what it missed. */
#ifndef TW_STREAM_H
#define TW_STREAM_H

#include <nats/nats.h>
#include <stdbool.h>
#include <stddef.h>

/** The subjects the stream must hold: the agents' events, and the schedules' ticks (docs/schedules.md), which
 *  are published through it like every event (an event no stream holds would never be acknowledged). */
#define TW_STREAM_SUBJECTS "evt.agent.>"
#define TW_STREAM_SCHEDULE_SUBJECTS "evt.schedule.>"

/** Make sure the JetStream stream `name` exists, holds TW_STREAM_SUBJECTS and TW_STREAM_SCHEDULE_SUBJECTS,
 * keeps messages for max_age_sec and has `replicas` replicas ([nats] events_replicas): created when missing,
 * updated when its subjects lack ours (ours are added to its own), its age limit or its replicas differ, left
 * alone otherwise. Blocking (JetStream API requests): call it off the event loop. Returns 0 and says what it
 * did in `what`
 *  ("created", "updated", "as configured"); -ENOENT when the server has no JetStream at all (nothing answers
 *  its API), -1 otherwise, with the reason in `why`. */
int tw_stream_ensure(natsConnection *nc, const char *name, int max_age_sec, int replicas, char *what,
                     size_t what_size, char *why, size_t why_size) __attribute__((warn_unused_result));

/** A message for the stream: `subject` and `data`, with header Nats-Msg-Id = id when id is not NULL (the
 * stream then keeps one copy of an event published twice within its duplicate window, two minutes). */
natsStatus tw_stream_msg(natsMsg **msg, const char *subject, const char *data, size_t len, const char *id);

/** Publish one event through JetStream and wait up to wait_ms for the stream's acknowledgment: NATS_OK means
 *  stored, not only received by the server. Core subscribers receive it as any message. */
natsStatus tw_stream_publish(jsCtx *js, const char *subject, const char *data, size_t len, const char *id,
                             int wait_ms);

#endif
