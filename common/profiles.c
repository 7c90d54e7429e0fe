/* Publishing the config's profiles (see profiles.h). */
#include "profiles.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "outbox.h"

char *tw_profiles_array(const TwConfig *cfg)
{
    size_t len = 3;
    char *s;

    for (size_t i = 0; i < cfg->n_agents; i++)
        len += strlen(cfg->agents[i].name) + 1;
    if (!(s = malloc(len)))
        return NULL;
    strcpy(s, "{");
    for (size_t i = 0; i < cfg->n_agents; i++) {
        if (i)
            strcat(s, ",");
        strcat(s, cfg->agents[i].name);
    }
    strcat(s, "}");
    return s;
}

typedef struct Publish {
    TwProfilesCb cb;
    void *arg;
} Publish;

static void published_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    Publish p = *(Publish *)arg;
    TwProfilesOutcome outcome = TW_PROFILES_PUBLISHED;
    const char *why = NULL;
    json_t *out = NULL;
    const char *state = err && res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

    free(arg);
    /* tw.publish_profiles raises 22023 for a profile bound elsewhere (its names were checked at load). */
    if (state && strcmp(state, "22023") == 0) {
        outcome = TW_PROFILES_REFUSED;
        why = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
        if (!why)
            why = err;
    } else if (err || !(out = tw_result_json(res, &err))) {
        static TwLogLimit lim;
        tw_pg_log_failure(&lim, res, "publish profiles", err);
        outcome = TW_PROFILES_UNKNOWN;
        why = err;
    }
    json_decref(out);
    if (p.cb)
        p.cb(outcome, why, p.arg);
}

void tw_profiles_publish(TwPg *pg, const TwConfig *cfg, TwProfilesCb cb, void *arg)
{
    char *arr = tw_profiles_array(cfg);
    Publish *p = malloc(sizeof *p);
    const char *params[] = {arr};

    if (!arr || !p) {
        free(arr);
        free(p);
        log_error("publish profiles: out of memory");
        if (cb)
            cb(TW_PROFILES_UNKNOWN, "out of memory", arg);
        return;
    }
    *p = (Publish){cb, arg};
    tw_pg_query(pg, "SELECT tw.publish_profiles($1::text[])", 1, params, published_cb, p);
    free(arr);
}

bool tw_profiles_refused_at_start(TwProfilesOutcome outcome, const char *why, const char *path,
                                  const char *prog, bool *taken)
{
    if (outcome == TW_PROFILES_PUBLISHED)
        *taken = true;
    if (outcome != TW_PROFILES_REFUSED)
        return false;
    if (*taken) {
        log_error("the database refuses the profiles of the running configuration %s: %s", path, why);
        return false;
    }
    log_error("configuration refused: %s: %s; %s stops (exit status 1)", path, why, prog);
    return true;
}
