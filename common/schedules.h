/* Schedules (docs/schedules.md): the configuration's [schedule.NAME] sections as the database takes them. The
 * PMOs write them at every connect and after a reload (tw.sync_schedules): a schedule no longer in the file
 * is removed, and a name in the file is the file's. */
#ifndef TW_SCHEDULES_H
#define TW_SCHEDULES_H

#include <jansson.h>

#include "config.h"
#include "pgconn.h"

/** [{"name","agent","profile"?,"cron","timezone","channel"?,"input","timeout_seconds"?,"limit_key"?,"overlap",
 *  "catchup","catchup_window_seconds"}] for every schedule of cfg; NULL when out of memory (or an input that
 * is not JSON, which --check-config refuses). */
json_t *tw_schedules_doc(const TwConfig *cfg);
/** Queue tw.sync_schedules on pg (a failure is logged; the next connect or reload writes them again). */
void tw_schedules_publish(TwPg *pg, const TwConfig *cfg);

#endif
