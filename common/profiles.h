/* Profiles (contract section 14): the [agent.NAME] sections of a config, published in state.profiles by each
 * daemon when it connects (and by `turnwatch migrate`), each also an agent of its own name. */
#ifndef TW_PROFILES_H
#define TW_PROFILES_H

#include "config.h"
#include "pgconn.h"

/** Every profile of cfg as a text[] literal ("{a,b}"; names need no quoting). Caller frees. */
char *tw_profiles_array(const TwConfig *cfg) __attribute__((warn_unused_result));
/** Publish cfg's profiles through pg (async); a profile whose agent name is bound to another profile is
 *  logged as a warning. */
void tw_profiles_publish(TwPg *pg, const TwConfig *cfg);

#endif
