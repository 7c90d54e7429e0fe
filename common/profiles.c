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

static void published_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    json_t *out, *conflict;
    size_t i;

    if (err || !(out = tw_result_json(res, &err))) {
        static TwLogLimit lim;
        tw_pg_log_failure(&lim, res, "publish profiles", err);
        return;
    }
    json_array_foreach(json_object_get(out, "conflicts"), i, conflict)
        log_warn("profile %s: the agent of that name is bound to profile %s (submit to it as that profile)",
                 json_string_value(json_object_get(conflict, "agent")),
                 json_string_value(json_object_get(conflict, "profile")));
    json_decref(out);
}

void tw_profiles_publish(TwPg *pg, const TwConfig *cfg)
{
    char *arr = tw_profiles_array(cfg);
    const char *params[] = {arr};

    if (!arr)
        return;
    tw_pg_query(pg, "SELECT tw.publish_profiles($1::text[])", 1, params, published_cb, NULL);
    free(arr);
}
