/* NOTIFY tw_ring: the doorbells of a SQL API call, rung for it by the PMO. Any role that can connect to the
 * database can NOTIFY, so the payload is untrusted input: only doorbells as tw.doorbell makes them are rung,
 * and what is dropped is said without echoing its bytes. */
#include <string.h>

#include "log.h"
#include "names.h"
#include "pmo.h"

/* tw.doorbell's data is {"target","reason","profile"}: a few names. */
#define PMO_RING_DATA_MAX 1024

static void dropped(const char *why, const char *what, size_t len)
{
    static TwLogLimit lim;
    char shown[200];

    tw_log_warn_limited(&lim, "NOTIFY tw_ring: doorbell dropped, %s: \"%s\"", why,
                        tw_shown(what, len, shown, sizeof shown));
}

/* NULL when item is a doorbell to ring, its data's text in *data (to free); else what is wrong with it. */
static const char *doorbell_check(const json_t *item, char **data)
{
    const char *subject = json_string_value(json_object_get(item, "subject"));
    const json_t *d = json_object_get(item, "data");
    const char *why = NULL;

    *data = NULL;
    if (!json_is_object(item))
        return "an item that is not an object";
    if (json_object_get(item, "event_id"))
        return "an event (events come through NOTIFY tw_outbox)";
    if (!subject)
        return "no subject";
    if (!tw_doorbell_parse(subject, NULL, NULL, &why))
        return why;
    if (!json_is_object(d))
        return "data that is not a JSON object";
    if (!(*data = json_dumps(d, JSON_COMPACT)))
        return "data that cannot be encoded";
    if (strlen(*data) > PMO_RING_DATA_MAX) {
        free(*data);
        *data = NULL;
        return "data larger than 1024 bytes";
    }
    return NULL;
}

/* The payload is a JSON array of {"subject","data"}. */
void pmo_ring(TwPmo *pmo, const char *payload)
{
    json_t *items = json_loads(payload, 0, NULL), *it;
    size_t i;

    if (!json_is_array(items)) {
        dropped(items ? "a payload that is not a JSON array" : "a payload that is not JSON", payload,
                strlen(payload));
        json_decref(items);
        return;
    }
    json_array_foreach(items, i, it)
    {
        char *data = NULL;
        const char *why = doorbell_check(it, &data);
        if (!why) {
            tw_bus_publish(pmo->d.bus, json_string_value(json_object_get(it, "subject")), data, strlen(data));
            free(data);
        } else if (json_is_string(json_object_get(it, "subject"))) {
            json_t *s = json_object_get(it, "subject");
            dropped(why, json_string_value(s), json_string_length(s));
        } else {
            char *text = json_dumps(it, JSON_COMPACT | JSON_ENCODE_ANY);
            dropped(why, text ? text : "", text ? strlen(text) : 0);
            free(text);
        }
    }
    json_decref(items);
}
