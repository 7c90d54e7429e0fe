/* Liveness (docs/watchdogs.md): a daemon registers in state.daemons and holds a session-level advisory lock
 * on a connection of its own for as long as it lives. Every daemon polls, a few times a second, for daemons
 * whose lock can be taken: their session has ended (exit, kill -9, a vanished host found by TCP keepalives),
 * so everything they held goes back to pending for another worker at once, whatever the lease lengths. A
 * process that is alive but stuck (SIGSTOP, a hung step) keeps its session and lock: the leases and rules
 * 2.1/2.6 handle it. One lock per daemon, so the lock table never grows with the work. */
#ifndef TW_LIVENESS_H
#define TW_LIVENESS_H

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>

#include "bus.h"
#include "config.h"
#include "rule.h"

/* How often a daemon looks for daemons that are gone. Detection takes at most this long after the server has
 * ended the session (at once for an exit or kill -9), which keeps crash-to-reclaim well under a second; a
 * poll that finds nothing is one read-only query on an idle connection. */
#define TW_LIVE_POLL_MS 200

typedef struct TwLive TwLive;

/** Something was handed back (the doorbells are published too): a worker looks at its inbox now. */
typedef void (*TwLiveReclaimedCb)(void *arg);

/** kind "pmo" or "worker"; id the daemon id (host:pid, what claims record); info (borrowed) is shown by
 *  `turnwatch daemons`. grace_ms: after its connection (re)connects, the daemon judges no other daemon for
 *  this long, so that after a database restart the others have time to take their locks back. */
TwLive *tw_live_new(struct event_base *base, const TwConfig *cfg, TwBus *bus, const char *kind,
                    const char *id, json_t *info, int grace_ms, TwLiveReclaimedCb on_reclaimed, void *arg)
    __attribute__((warn_unused_result));
void tw_live_start(TwLive *l);
/** A reload: what `turnwatch daemons` shows for it (recorded now when registered, else at the next
 *  registration; borrowed) and the grace after a reconnect. */
void tw_live_reconfigure(TwLive *l, json_t *info, int grace_ms);
/** True while the daemon holds its liveness lock. */
bool tw_live_registered(const TwLive *l);
/** The reclaim rule (its counters, for the daemon's counters line). */
TwRule *tw_live_rule(TwLive *l);
/** Closes the connection, which releases the lock. Accepts NULL. */
void tw_live_free(TwLive *l);

/** "host:pid" into buf: the daemon id that claims record. */
void tw_live_daemon_id(char *buf, size_t size);

#endif
