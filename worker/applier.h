/* The applier (applier.c): agent steps' outcomes applied in batches, one statement for every step that
 * finished meanwhile, and tool results one by one, each kind in at most WRK_APPLY_LANES statements at once.
 * It calls into the jobs (job.h); the jobs reach it only through WrkJobs.apply_push. */
#ifndef WRK_APPLIER_H
#define WRK_APPLIER_H

#include "job.h"

/** A job's outcome waits here and goes, at once when fewer than WRK_APPLY_LANES statements of its kind are in
 *  flight: an agent step's with every other step's that finished meanwhile in one statement (tw.apply_steps),
 * a tool result alone (tw.deliver_result). Set as WrkJobs.apply_push. */
void wrk_applier_push(WrkJob *job);

#endif
