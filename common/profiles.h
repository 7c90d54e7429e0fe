/* Profiles (docs/roster.md): the [agent.NAME] sections of a config, published in state.profiles by each
 * daemon when it connects (and by `turnwatch migrate`), each also an agent of its own name. A profile whose
 * name the roster binds, as an agent, to another profile is refused by the database (issue 23), and with it
 * the configuration: a daemon does not start on it, and a reload to it is not applied. */
#ifndef TW_PROFILES_H
#define TW_PROFILES_H

#include <stdbool.h>

#include "config.h"
#include "pgconn.h"

/** What the database answered to a configuration's profiles. */
typedef enum {
    TW_PROFILES_PUBLISHED, /* published (or there was nothing new) */
    TW_PROFILES_REFUSED,   /* a profile is an agent of another profile: the configuration is refused */
    TW_PROFILES_UNKNOWN,   /* no answer (the database is away, the query failed otherwise): logged here */
} TwProfilesOutcome;

/** why: the database's reason (for TW_PROFILES_REFUSED), valid during the call only. */
typedef void (*TwProfilesCb)(TwProfilesOutcome outcome, const char *why, void *arg);

/** Every profile of cfg as a text[] literal ("{a,b}"; names need no quoting). Caller frees. */
char *tw_profiles_array(const TwConfig *cfg) __attribute__((warn_unused_result));
/** Publish cfg's profiles through pg (async); cb (may be NULL) hears the outcome, always once (at once,
 * before this returns, only when memory runs out). */
void tw_profiles_publish(TwPg *pg, const TwConfig *cfg, TwProfilesCb cb, void *arg);
/** A daemon's reading of the answer to the profiles of its configuration `path` (`prog` names it): *taken
 *  becomes true once the database took them. A refusal before that is a configuration the daemon must not run
 *  on: logged as such, and true is returned (stop, exit status 1); a refusal after that (the roster changed
 *  under a running daemon) is logged as an error and changes nothing. */
bool tw_profiles_refused_at_start(TwProfilesOutcome outcome, const char *why, const char *path,
                                  const char *prog, bool *taken);

#endif
