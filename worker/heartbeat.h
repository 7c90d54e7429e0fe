/* Heartbeats: renew every claim, lease and running turn this worker holds, in one call. Whatever comes back
 * lost (reclaimed, reaped, cancelled, a tool call no longer waited for) is stopped at once and its output
 * dropped: this is how fencing reaches a program that is still running. */
#ifndef WRK_HEARTBEAT_H
#define WRK_HEARTBEAT_H

#include <stdbool.h>

#include "job.h"

typedef struct WrkBeat {
    WrkJobs *jobs;
    int lease_sec;
    /* Claims of ours older than this that we do not hold go back for any worker (tw.release_unknown): an
     * answer that never reached us, a query abandoned after its commit. Twice [postgres]
     * query_timeout_seconds. */
    int unknown_grace_sec;
    bool busy;
} WrkBeat;

/** One call: renew what the worker holds, and give back what is recorded as ours but unknown to us. Runs
 *  even when the worker holds nothing. */
void wrk_heartbeat_tick(WrkBeat *b);

#endif
