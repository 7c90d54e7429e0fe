/* The applier (applier.c): agent steps' outcomes applied in batches, one statement for every step that
 * finished meanwhile. It calls into the jobs (job.h); the jobs reach it only through WrkJobs.apply_push. */
#ifndef WRK_APPLIER_H
#define WRK_APPLIER_H

#include "job.h"

/** An agent step's outcome waits here and goes with every other step's that finished meanwhile in one
 *  statement (tw.apply_steps), at once when fewer than WRK_APPLY_LANES batches are in flight. Set as
 *  WrkJobs.apply_push. */
void wrk_applier_push(WrkJob *job);

#endif
