/* Publishing outbox events and doorbells after commit, and the relay for those left behind. */
#include "outbox.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"

typedef struct Confirm {
    TwPg *pg;
    char *ids; /* a uuid[] literal */
    int n;
} Confirm;

json_t *tw_result_json(const PGresult *res, const char **err)
{
    json_error_t jerr;
    json_t *j;

    if (!res || PQntuples(res) < 1 || PQnfields(res) < 1 || PQgetisnull(res, 0, 0)) {
        *err = "empty result";
        return NULL;
    }
    j = json_loadb(PQgetvalue(res, 0, 0), (size_t)PQgetlength(res, 0, 0), JSON_DECODE_ANY, &jerr);
    if (!j)
        *err = "result is not JSON";
    return j;
}

/* Confirmed event ids waiting to be marked published. While one mark query is in flight, later
 * confirmations gather here and go in the next one: under load one UPDATE covers many turns, at idle
 * each confirmation is marked at once. One batch per process (both daemons have one outbox writer). */
static struct {
    TwPg *pg;
    char *ids; /* "id,id,..." */
    size_t len, cap;
    int n;
    bool busy;
} marks;

static void marks_send(void);

static void marked_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    if (err)
        log_warn("outbox: could not mark events published (the relay will publish them again): %s", err);
    marks.busy = false;
    marks_send();
}

static void marks_send(void)
{
    char *literal;

    if (marks.busy || marks.n == 0 || !marks.pg)
        return;
    if (!(literal = malloc(marks.len + 3)))
        return;
    snprintf(literal, marks.len + 3, "{%s}", marks.ids);
    marks.len = 0;
    marks.n = 0;
    marks.ids[0] = '\0';
    marks.busy = true;
    const char *params[] = {literal};
    tw_pg_query(marks.pg, "SELECT tw.outbox_mark_published($1::uuid[])", 1, params, marked_cb, NULL);
    free(literal);
}

static void marks_add(TwPg *pg, const char *ids, int n)
{
    size_t add = strlen(ids);

    if (marks.len + add + 2 > marks.cap) {
        size_t cap = (marks.len + add + 2) * 2;
        char *g = realloc(marks.ids, cap);
        if (!g)
            return; /* left unpublished in the table: the relay publishes them again */
        marks.ids = g;
        marks.cap = cap;
    }
    marks.len +=
        (size_t)snprintf(marks.ids + marks.len, marks.cap - marks.len, "%s%s", marks.len ? "," : "", ids);
    marks.n += n;
    marks.pg = pg;
    marks_send();
}

static void confirmed_cb(TwBus *bus, bool ok, void *arg)
{
    Confirm *c = arg;

    if (ok) {
        /* c->ids is a "{...}" literal: add what is inside the braces. */
        c->ids[strlen(c->ids) - 1] = '\0';
        marks_add(c->pg, c->ids + 1, c->n);
    } else {
        log_debug("outbox: %d events not confirmed by NATS; left for the relay", c->n);
    }
    free(c->ids);
    free(c);
}

static void publish(TwPg *pg, TwBus *bus, json_t *items);

const char *tw_item_payload(const json_t *item, char **owned)
{
    const char *text = json_string_value(json_object_get(item, "text"));

    *owned = text ? NULL : json_dumps(json_object_get(item, "data"), JSON_COMPACT | JSON_ENCODE_ANY);
    return text ? text : *owned;
}

void tw_outbox_publish(TwPg *pg, TwBus *bus, json_t *items)
{
    /* The daemon's own transaction wrote these: its final events are the turns it ended (metrics.h). */
    tw_metrics_count_final_events(items);
    publish(pg, bus, items);
}

static void publish(TwPg *pg, TwBus *bus, json_t *items)
{
    TwBusBatch *batch = NULL;
    Confirm *c = NULL;
    size_t i, ids_len = 1, ids_cap = 0;
    json_t *it;

    if (!json_is_array(items))
        return;
    json_array_foreach(items, i, it)
    {
        const char *subject = json_string_value(json_object_get(it, "subject"));
        const char *event_id = json_string_value(json_object_get(it, "event_id"));
        const char *data;
        char *owned = NULL;

        if (!subject || !(data = tw_item_payload(it, &owned)))
            continue;
        if (!event_id) {
            tw_bus_publish(bus, subject, data, strlen(data));
            free(owned);
            continue;
        }
        if (!batch) {
            batch = tw_bus_batch_new();
            c = calloc(1, sizeof *c);
            ids_cap = 40 * json_array_size(items) + 2;
            if (c)
                c->ids = malloc(ids_cap);
            if (!batch || !c || !c->ids) {
                free(owned);
                break;
            }
            c->ids[0] = '{';
        }
        if (tw_bus_batch_add(batch, subject, data, strlen(data), event_id) == 0) {
            ids_len +=
                (size_t)snprintf(c->ids + ids_len, ids_cap - ids_len, "%s%s", c->n ? "," : "", event_id);
            c->n++;
        }
        free(owned);
    }
    if (!batch)
        return;
    if (!c || !c->ids || c->n == 0) {
        /* Out of memory part-way: publish what we have; the relay covers the rest. */
        if (c)
            free(c->ids);
        free(c);
        tw_bus_publish_confirmed(bus, batch, NULL, NULL);
        return;
    }
    snprintf(c->ids + ids_len, ids_cap - ids_len, "}");
    c->pg = pg;
    tw_bus_publish_confirmed(bus, batch, confirmed_cb, c);
}

typedef struct Relay {
    TwBus *bus;
    void (*done)(int n, void *arg);
    void *arg;
} Relay;

static void relay_claimed_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    Relay *r = arg;
    json_t *items = NULL;
    int n = -1;

    if (err) {
        log_debug("outbox relay: %s", err);
    } else if ((items = tw_result_json(res, &err))) {
        n = (int)json_array_size(items);
        if (n > 0) {
            log_info("outbox relay: publishing %d events their writer did not publish", n);
            publish(pg, r->bus, items); /* not counted: their writer did, or no daemon wrote them */
        }
        json_decref(items);
    }
    if (r->done)
        r->done(n, r->arg);
    free(r);
}

void tw_outbox_relay(TwPg *pg, TwBus *bus, int min_age_ms, int limit, void (*done)(int n, void *arg),
                     void *arg)
{
    Relay *r = calloc(1, sizeof *r);
    char age[16], lim[16];
    const char *params[] = {age, lim};

    if (!r)
        return;
    r->bus = bus;
    r->done = done;
    r->arg = arg;
    snprintf(age, sizeof age, "%d", min_age_ms);
    snprintf(lim, sizeof lim, "%d", limit);
    tw_pg_query(pg, "SELECT tw.outbox_claim($1::integer, 10, $2::integer)", 2, params, relay_claimed_cb, r);
}
