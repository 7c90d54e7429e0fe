/* systemd's notify protocol (docs/operations.md), through libsystemd's sd_notify: READY=1 once the daemon's
 * PostgreSQL and NATS connections are first up, STATUS=… whenever their state changes, RELOADING=1 and
 * READY=1 around a SIGHUP reload, STOPPING=1 on shutdown, and WATCHDOG=1 every half WATCHDOG_USEC from the
 * daemon's loop (so a loop that hangs stops feeding it; an unreachable database does not, for the daemon
 * waits for it and must not be restarted for it). Without NOTIFY_SOCKET in the environment every call does
 * nothing. */
#ifndef TW_NOTIFY_H
#define TW_NOTIFY_H

#include <event2/event.h>
#include <stdbool.h>

#include "metrics.h"

typedef struct TwNotify TwNotify;

/** NULL when out of memory; a daemon runs on without it. */
TwNotify *tw_notify_new(struct event_base *base) __attribute__((warn_unused_result));
/** The connections' states now: STATUS when they changed, READY=1 the first time both are up. */
void tw_notify_health(TwNotify *n, const TwHealth *h);
/** SIGHUP: RELOADING=1 before reading the file, then READY=1 with STATUS saying whether it was applied. */
void tw_notify_reloading(TwNotify *n);
void tw_notify_reloaded(TwNotify *n, bool applied);
/** STOPPING=1 with a STATUS (e.g. what is still being finished). */
void tw_notify_stopping(TwNotify *n, const char *status);
/** Accepts NULL. */
void tw_notify_free(TwNotify *n);

#endif
