/* A worker's capacity in state.daemons: since when it has had a free slot, or NULL while every slot is busy
 * (or it takes no new work). Rules 2.4 and 2.5 read it (tw.profile_clock): a dispatched turn that waits while
 * every serving worker is busy is a backlog, not a lost dispatch (docs/roster.md).
 *
 * Writes are rare: "full" is written at once (it stops 2.4/2.5 acting on a backlog), "free" only once a slot
 * has stayed free for WRK_CAPACITY_LAZY_MS (with the time it became free), so a worker that frees a slot and
 * fills it again at once, as it does under a backlog, writes nothing. Written late, "free" only makes 2.5
 * later; never earlier. */
#ifndef WRK_CAPACITY_H
#define WRK_CAPACITY_H

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>

#include "pgpool.h"

#define WRK_CAPACITY_LAZY_MS 1000

typedef struct WrkCapacity {
    TwPgPool *pool; /* one connection: the writes stay in order */
    const char *id; /* daemon id */
    int slots;
    struct event *timer;
    int64_t free_since_ms; /* monotonic; 0 while full */
    int reported;          /* what the row says: -1 unknown, 0 full, 1 free */
    int in_flight;         /* the state of the write on its way, or -1 */
} WrkCapacity;

int wrk_capacity_init(WrkCapacity *c, struct event_base *base, TwPgPool *pool, const char *id, int slots)
    __attribute__((warn_unused_result));
/** The worker's state now: free when it has a free slot and takes new work. */
void wrk_capacity_update(WrkCapacity *c, bool free_now);
/** The connection came back: what the row says is unknown; write the state again. */
void wrk_capacity_reset(WrkCapacity *c, bool free_now);
void wrk_capacity_free(WrkCapacity *c);

#endif
