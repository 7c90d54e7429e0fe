/* Schedules (docs/schedules.md): the INI's, written to the database by the PMOs. */
#include "schedules.h"

#include <stdlib.h>

#include "log.h"

/* A string key when set (the table's "" is unset). */
static void set_str(json_t *o, const char *key, const char *v)
{
    if (v && *v)
        json_object_set_new(o, key, json_string(v));
}

json_t *tw_schedules_doc(const TwConfig *cfg)
{
    json_t *doc = json_array();

    for (size_t i = 0; doc && i < cfg->n_schedules; i++) {
        const TwScheduleConf *s = &cfg->schedules[i];
        json_t *input = json_loads(s->input, 0, NULL);
        json_t *one =
            input ? json_pack("{s:s,s:s?,s:s?,s:s,s:o,s:s,s:s,s:i}", "name", s->name, "agent", s->agent,
                              "cron", s->cron, "timezone", s->timezone, "input", input, "overlap", s->overlap,
                              "catchup", s->catchup, "catchup_window_seconds", s->catchup_window_sec)
                  : NULL;
        if (one) {
            set_str(one, "profile", s->profile);
            set_str(one, "channel", s->channel);
            set_str(one, "limit_key", s->limit_key);
            if (s->timeout_sec)
                json_object_set_new(one, "timeout_seconds", json_integer(s->timeout_sec));
        }
        if (!one || json_array_append_new(doc, one) != 0) {
            json_decref(doc);
            return NULL;
        }
    }
    return doc;
}

static void synced_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    static TwLogLimit lim;

    (void)pg;
    (void)arg;
    if (err)
        tw_pg_log_failure(&lim, res, "write the schedules", err);
}

void tw_schedules_publish(TwPg *pg, const TwConfig *cfg)
{
    json_t *doc = tw_schedules_doc(cfg);
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    const char *params[] = {text};

    json_decref(doc);
    if (!text) {
        log_error("out of memory building the schedules");
        return;
    }
    tw_pg_query(pg, "SELECT tw.sync_schedules($1::jsonb)", 1, params, synced_cb, NULL);
    free(text);
}
