/* Claiming work: one tw.claim call for as many free slots as the worker has (none: results only). */
#ifndef WRK_CLAIM_H
#define WRK_CLAIM_H

#include <stdbool.h>

#include "job.h"

typedef struct WrkClaim {
    WrkJobs *jobs;
    const char *tools_arr; /* served (non-external) tools as a text[] literal */
    int concurrency;
    int lease_sec;
    bool busy;
    bool dirty;         /* there may be more work: a doorbell rang, or the last claim came back full */
    bool full;          /* the last claim came back full: a backlog is being worked through */
    bool results_dirty; /* an agent doorbell rang (or the poll): results may wait, even with no free slot */
    bool stopped;
    /* A claim that found only busy items (a result whose turn another transaction holds, a busy agent or
     * call): claimed again after retry_ms (doubling while it stays so), not at once, which spun a claim a
     * millisecond while a result waited for a limit (docs/flow-control.md, "Hand-over"). */
    struct event *retry;
    int retry_ms;
    /* The owner's callbacks: the claim resumed a turn whose other calls were cancelled (their programs may
     * hold slots: the heartbeat stops them now), and jobs were started. */
    void (*on_resumed)(void *arg);
    void (*on_claimed)(void *arg, int n_jobs);
    void (*on_settled)(void *arg); /* a claim came back (`full` may have changed) */
    void *arg;
} WrkClaim;

/** Claim now if work may wait and a claim can be made (a slot is free, or results may wait). */
void wrk_claim_kick(WrkClaim *c);

/** The retry timer on base (after c->jobs is set); 0, or -1 when out of memory. */
int wrk_claim_init(WrkClaim *c, struct event_base *base);
void wrk_claim_free(WrkClaim *c);

#endif
