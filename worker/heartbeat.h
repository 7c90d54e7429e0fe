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
    bool busy;
} WrkBeat;

void wrk_heartbeat_tick(WrkBeat *b);

#endif
