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
    /* A relay's batch is marked on its own and done is told when it is (ok) or will not be: the relay keeps
     * a bounded number of batches between its claim and their mark. NULL for a writer's events. */
    TwOutboxDone done;
    void *done_arg;
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

static void confirm_free(Confirm *c)
{
    if (c)
        free(c->ids);
    free(c);
}

static void relay_marked_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    Confirm *c = arg;

    if (err)
        log_warn("outbox relay: could not mark %d events published (they will be published again): %s", c->n,
                 err);
    c->done(!err, c->done_arg);
    confirm_free(c);
}

static void confirmed_cb(TwBus *bus, bool ok, void *arg)
{
    Confirm *c = arg;

    if (ok && c->done) {
        const char *params[] = {c->ids};
        tw_pg_query(c->pg, "SELECT tw.outbox_mark_published($1::uuid[])", 1, params, relay_marked_cb, c);
        return;
    }
    if (ok) {
        /* c->ids is a "{...}" literal: add what is inside the braces. */
        c->ids[strlen(c->ids) - 1] = '\0';
        marks_add(c->pg, c->ids + 1, c->n);
    } else {
        log_debug("outbox: %d events not confirmed by NATS; left for the relay", c->n);
        if (c->done)
            c->done(false, c->done_arg);
    }
    confirm_free(c);
}

static void publish(TwPg *pg, TwBus *bus, json_t *items, TwOutboxDone done, void *done_arg);

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
    publish(pg, bus, items, NULL, NULL);
}

/* With done set (a relay's batch), done is called exactly once, after the mark or when there will be none. */
static void publish(TwPg *pg, TwBus *bus, json_t *items, TwOutboxDone done, void *done_arg)
{
    TwBusBatch *batch = NULL;
    Confirm *c = NULL;
    size_t i, ids_len = 1, ids_cap = 0;
    json_t *it;

    if (!json_is_array(items)) {
        if (done)
            done(true, done_arg);
        return;
    }
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
    if (!batch) {
        if (done)
            done(true, done_arg);
        return;
    }
    if (!c || !c->ids || c->n == 0) {
        /* Out of memory part-way: publish what we have; the relay covers the rest. */
        confirm_free(c);
        tw_bus_publish_confirmed(bus, batch, NULL, NULL);
        if (done)
            done(false, done_arg);
        return;
    }
    snprintf(c->ids + ids_len, ids_cap - ids_len, "}");
    c->pg = pg;
    c->done = done;
    c->done_arg = done_arg;
    tw_bus_publish_confirmed(bus, batch, confirmed_cb, c);
}

typedef struct Relay {
    TwBus *bus;
    TwOutboxClaimed claimed;
    TwOutboxDone done;
    void *arg;
} Relay;

static void relay_claimed_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    Relay *r = arg;
    TwOutboxClaim claim = {.n = -1};
    json_t *answer = NULL, *events = NULL;

    if (err) {
        log_debug("outbox relay: %s", err);
    } else if ((answer = tw_result_json(res, &err))) {
        events = json_object_get(answer, "events");
        if (json_is_array(events)) {
            json_t *seq = json_object_get(answer, "seq");
            claim.n = (int)json_array_size(events);
            claim.more = json_is_true(json_object_get(answer, "more"));
            claim.newest_more = json_is_true(json_object_get(answer, "newest"));
            claim.after_xid = json_string_value(json_object_get(answer, "xid"));
            claim.after_seq = json_is_integer(seq) ? (long long)json_integer_value(seq) : 0;
        } else {
            log_warn("outbox relay: unexpected answer from tw.outbox_claim");
        }
    }
    /* The caller counts the batch before it can be done. */
    r->claimed(&claim, r->arg);
    if (claim.n > 0) {
        /* SQL API clients leave their events to the relay as a matter of course (a claim per submit at idle):
         * worth a line only when debugging. Events over a second old were left by a writer that died or lost
         * NATS: an operator wants to know. */
        json_int_t aged = json_integer_value(json_object_get(answer, "aged"));
        if (aged > 0)
            log_info(
                "outbox relay: publishing %d events, %lld of them left by a writer that did not publish them",
                claim.n, (long long)aged);
        else
            log_debug("outbox relay: publishing %d events that SQL API clients wrote", claim.n);
        /* Not counted as turns ended (metrics.h): their writer did, or no daemon wrote them. */
        publish(pg, r->bus, events, r->done, r->arg);
    }
    json_decref(answer);
    free(r);
}

void tw_outbox_relay(TwPg *pg, TwBus *bus, const TwOutboxClaimReq *req, TwOutboxClaimed claimed,
                     TwOutboxDone done, void *arg)
{
    Relay *r = calloc(1, sizeof *r);
    char age[16], lease[16], lim[16], newest[16], seq[24];
    const char *params[] = {age, lease, lim, newest, req->after_xid, req->after_xid ? seq : NULL};

    if (!r) {
        claimed(&(TwOutboxClaim){.n = -1}, arg);
        return;
    }
    r->bus = bus;
    r->claimed = claimed;
    r->done = done;
    r->arg = arg;
    snprintf(age, sizeof age, "%d", req->min_age_ms);
    snprintf(lease, sizeof lease, "%d", req->lease_sec);
    snprintf(lim, sizeof lim, "%d", req->limit);
    snprintf(newest, sizeof newest, "%d", req->newest);
    snprintf(seq, sizeof seq, "%lld", req->after_seq);
    tw_pg_query(
        pg,
        "SELECT tw.outbox_claim($1::integer, $2::integer, $3::integer, $4::integer, $5::xid8, $6::bigint)", 6,
        params, relay_claimed_cb, r);
}
