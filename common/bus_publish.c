/* The publisher thread: confirmed batches of events, published and flushed (or acknowledged by the events
 * stream through JetStream), the events stream made sure of after every connect, and the new connection
 * that replaces one nats.c closed; and the loop's fire-and-forget doorbells. */
#include "bus_int.h"

#include <errno.h>
#include <nats/nats.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "names.h"
#include "stream.h"

#define BUS_FLUSH_TIMEOUT_MS 2000
/* While the events stream cannot be made sure of, it is tried again after 1 s, doubling to this (a leader
 * election in a cluster takes seconds; a server without JetStream for good is asked every 10 s). */
#define BUS_STREAM_RETRY_FIRST_MS 1000
#define BUS_STREAM_RETRY_MAX_MS 10000

TwBusBatch *tw_bus_batch_new(void)
{
    return calloc(1, sizeof(TwBusBatch));
}

/* A subject that is no subject would end nats.c's PUB line and start another: never published, whoever asks.
 * On the loop thread (the callers of tw_bus_publish and tw_bus_batch_add). */
static bool subject_ok(const char *subject)
{
    static TwLogLimit lim;
    char shown[200];

    if (tw_subject_valid(subject))
        return true;
    tw_log_warn_limited(&lim, "nats: not publishing on an invalid subject \"%s\"",
                        subject ? tw_shown(subject, strlen(subject), shown, sizeof shown) : "(none)");
    return false;
}

int tw_bus_batch_add(TwBusBatch *b, const char *subject, const char *data, size_t len, const char *id)
{
    if (!subject_ok(subject))
        return -EINVAL;
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 8;
        BusMsg *g = realloc(b->msgs, cap * sizeof *g);
        if (!g)
            return -ENOMEM;
        b->msgs = g;
        b->cap = cap;
    }
    BusMsg *m = &b->msgs[b->n];
    m->subject = strdup(subject);
    m->data = malloc(len + 1);
    m->id = id ? strdup(id) : NULL;
    if (!m->subject || !m->data || (id && !m->id)) {
        free(m->subject);
        free(m->data);
        free(m->id);
        return -ENOMEM;
    }
    memcpy(m->data, data, len);
    m->data[len] = '\0';
    m->len = len;
    b->n++;
    return 0;
}

/* Publishes a list of batches through JetStream, each event with its event_id as Nats-Msg-Id, and waits for
 * every acknowledgment: NATS_OK only when the stream kept them all. */
static natsStatus publish_js(TwBus *bus, BusTask *list, size_t *n)
{
    jsPubOptions po;
    natsStatus s = NATS_OK;

    atomic_store(&bus->js_failed, 0);
    for (BusTask *t = list; s == NATS_OK && t; t = t->next)
        for (size_t i = 0; s == NATS_OK && i < t->batch->n; i++, (*n)++) {
            BusMsg *m = &t->batch->msgs[i];
            natsMsg *msg = NULL;
            s = tw_stream_msg(&msg, m->subject, m->data, m->len, m->id);
            if (s == NATS_OK)
                s = js_PublishMsgAsync(bus->js, &msg, NULL);
            natsMsg_Destroy(msg); /* no-op when the library took it */
        }
    jsPubOptions_Init(&po);
    po.MaxWait = BUS_FLUSH_TIMEOUT_MS;
    if (s == NATS_OK)
        s = js_PublishAsyncComplete(bus->js, &po);
    if (s == NATS_OK && atomic_load(&bus->js_failed) > 0)
        s = NATS_ERR;
    if (s != NATS_OK) {
        /* Not confirmed: the relay publishes them again. Drop what still waits for an acknowledgment. */
        natsMsgList pending;
        if (js_PublishAsyncGetPendingList(&pending, bus->js) == NATS_OK)
            natsMsgList_Destroy(&pending);
    }
    return s;
}

/* A negative acknowledgment, or none in time, for an event published through JetStream (a nats.c thread). */
static void js_pub_failed(jsCtx *js, jsPubAckErr *pae, void *closure)
{
    TwBus *bus = closure;

    atomic_fetch_add(&bus->js_failed, 1);
    if (pae->Err == NATS_NO_RESPONDERS || pae->ErrCode == JSStreamNotFoundErr) {
        /* The stream is gone (deleted, or a server that lost it): make sure of it again. */
        pthread_mutex_lock(&bus->lock);
        bus->stream_ok = false;
        bus->stream_due = true;
        bus->stream_retry_at = (struct timespec){0};
        pthread_mutex_unlock(&bus->lock);
    }
}

/* Makes sure of the events stream (blocking JetStream requests, hence here and not on the loop); tried again
 * every BUS_STREAM_RETRY_SEC while it fails. Called and returns with the lock held. */
static void publisher_stream(TwBus *bus)
{
    char what[64], why[512] = "cannot use JetStream";
    int rc = -1;

    bus->stream_due = false;
    bus->pub_busy = true;
    pthread_mutex_unlock(&bus->lock);
    if (!bus->js) {
        jsOptions jo;
        jsOptions_Init(&jo);
        jo.PublishAsync.MaxPending = 1 << 16;
        jo.PublishAsync.ErrHandler = js_pub_failed;
        jo.PublishAsync.ErrHandlerClosure = bus;
        if (natsConnection_JetStream(&bus->js, bus->conn, &jo) != NATS_OK)
            bus->js = NULL;
    }
    if (bus->js)
        rc = tw_stream_ensure(bus->conn, bus->stream, bus->stream_max_age_sec, bus->stream_replicas, what,
                              sizeof what, why, sizeof why);
    pthread_mutex_lock(&bus->lock);
    bus->pub_busy = false;
    bus->stream_ok = rc == 0 && atomic_load(&bus->up) && !bus->conn_gone;
    bus->no_jetstream = rc == -ENOENT;
    if (rc == 0) {
        bus->stream_retry_ms = 0;
    } else {
        int ms = bus->stream_retry_ms ? bus->stream_retry_ms * 2 : BUS_STREAM_RETRY_FIRST_MS;
        bus->stream_retry_ms = ms < BUS_STREAM_RETRY_MAX_MS ? ms : BUS_STREAM_RETRY_MAX_MS;
        bus->stream_due = true;
        clock_gettime(CLOCK_REALTIME, &bus->stream_retry_at);
        bus->stream_retry_at.tv_sec += bus->stream_retry_ms / 1000;
    }
    if (rc == 0) {
        log_info("events stream %s (%s): keeps %s and %s for %d s, %d replica%s", bus->stream, what,
                 TW_STREAM_SUBJECTS, TW_STREAM_SCHEDULE_SUBJECTS, bus->stream_max_age_sec,
                 bus->stream_replicas, bus->stream_replicas == 1 ? "" : "s");
    } else {
        static TwLogLimit lim;
        tw_log_warn_limited(&lim, "events stream %s: %s; %s; trying again in %d s", bus->stream, why,
                            rc == -ENOENT ? "the server has no JetStream: events are published without "
                                            "being kept"
                                          : "events stay in the outbox until the stream acknowledges them",
                            bus->stream_retry_ms / 1000);
    }
}

static bool stream_ready(const TwBus *bus)
{
    struct timespec now;

    if (!bus->stream_due || !atomic_load(&bus->up) || bus->conn_gone || !bus->conn)
        return false;
    clock_gettime(CLOCK_REALTIME, &now);
    return now.tv_sec > bus->stream_retry_at.tv_sec ||
           (now.tv_sec == bus->stream_retry_at.tv_sec && now.tv_nsec >= bus->stream_retry_at.tv_nsec);
}

/* A new connection in place of one nats.c closed (blocking, hence here and not on the loop), handed to the
 * loop. Called and returns with the lock held. */
static void publisher_connect(TwBus *bus)
{
    natsConnection *nc = NULL;
    natsStatus s;

    bus->connect_due = false;
    pthread_mutex_unlock(&bus->lock);
    /* One try of each server, waited for: a failure then comes with nats.c's reason (a server refusing the
     * credentials, a TLS handshake that fails), which its own retrying in the background would lose ("no
     * server available"); the loop's backoff makes the next try. Only this thread connects now, and a
     * connection keeps its own copy of the options. */
    s = natsOptions_SetRetryOnFailedConnect(bus->opts, false, NULL, NULL);
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, bus->opts);
    const char *last = s != NATS_OK ? nats_GetLastError(NULL) : NULL;
    pthread_mutex_lock(&bus->lock);
    if (nc)
        bus->pending_cbs++; /* its closed callback */
    bus->fresh = nc;
    bus->fresh_status = s;
    snprintf(bus->fresh_error, sizeof bus->fresh_error, "%s", last ? last : "");
    bus->fresh_done = true;
    pthread_mutex_unlock(&bus->lock);
    event_active(bus->conn_ev, EV_READ, 0);
    pthread_mutex_lock(&bus->lock);
}

/* The publisher thread: publishes queued batches and confirms them with one flush (a PING answered by the
 * server after everything before it). It takes every batch queued meanwhile, so under load one round trip
 * confirms many turns' events instead of one. After a connect it first makes sure of the events
 * stream (then the events it publishes are kept), and tries again between batches while that fails. It also
 * makes the new connection that replaces one nats.c closed (publisher_connect). */
void *bus_publisher_main(void *arg)
{
    TwBus *bus = arg;

    for (;;) {
        BusTask *list, *t;
        natsStatus s = NATS_OK;
        natsConnection *conn;
        size_t n = 0;
        bool use_js, hold;

        pthread_mutex_lock(&bus->lock);
        while (!bus->pub_head && !bus->stopping && !stream_ready(bus) && !bus->connect_due) {
            if (bus->stream_due && atomic_load(&bus->up) && !bus->conn_gone)
                pthread_cond_timedwait(&bus->cond, &bus->lock, &bus->stream_retry_at);
            else
                pthread_cond_wait(&bus->cond, &bus->lock);
        }
        if (!bus->stopping && bus->connect_due) {
            publisher_connect(bus);
            pthread_mutex_unlock(&bus->lock);
            continue;
        }
        /* The stream first: after a connect, the events published next are then kept too. */
        if (!bus->stopping && stream_ready(bus)) {
            publisher_stream(bus);
            pthread_mutex_unlock(&bus->lock);
            continue;
        }
        if (!bus->pub_head) {
            pthread_mutex_unlock(&bus->lock);
            return NULL;
        }
        list = bus->pub_head;
        bus->pub_head = bus->pub_tail = NULL;
        /* A connection that nats.c closed is not ours to touch any more: its batches fail at once (the relay
         * publishes them again), and the loop may destroy it as soon as we are not busy. */
        conn = bus->conn_gone || bus->stopping || !atomic_load(&bus->up) ? NULL : bus->conn;
        use_js = conn && bus->stream_ok && bus->js;
        /* With an events stream in force, only the stream's acknowledgments confirm: until it is made sure of
         * (after a connect, while a cluster elects its leader) events are published live for observers, but
         * stay in the outbox, and the relay publishes them into the stream later under the same Nats-Msg-Id
         * (the stream keeps one copy). A server with no JetStream at all has nothing to keep them in. */
        hold = bus->stream && !use_js && !bus->no_jetstream;
        bus->pub_busy = conn != NULL;
        pthread_mutex_unlock(&bus->lock);

        if (!conn)
            s = NATS_NOT_YET_CONNECTED;
        else if (use_js)
            s = publish_js(bus, list, &n);
        for (t = list; s == NATS_OK && !use_js && t; t = t->next)
            for (size_t i = 0; s == NATS_OK && i < t->batch->n; i++, n++)
                s = natsConnection_Publish(conn, t->batch->msgs[i].subject, t->batch->msgs[i].data,
                                           (int)t->batch->msgs[i].len);
        if (s == NATS_OK && !use_js)
            s = natsConnection_FlushTimeout(conn, BUS_FLUSH_TIMEOUT_MS);
        if (s != NATS_OK)
            log_debug("nats: confirmed publish failed after %zu events: %s", n, natsStatus_GetText(s));
        else if (hold)
            log_debug("nats: %zu events published live; the events stream is not ready, so they stay in the "
                      "outbox",
                      n);
        pthread_mutex_lock(&bus->lock);
        bus->pub_busy = false;
        pthread_mutex_unlock(&bus->lock);
        while ((t = list)) {
            list = t->next;
            t->next = NULL;
            t->flag = s == NATS_OK && !hold;
            bus_post_to_loop(bus, t);
        }
    }
}

void tw_bus_publish(TwBus *bus, const char *subject, const char *data, size_t len)
{
    natsStatus s;

    if (!subject_ok(subject) || !bus->conn || bus->rebuilding)
        return;
    s = natsConnection_Publish(bus->conn, subject, data, (int)len);
    if (s != NATS_OK)
        log_debug("nats: publish %s dropped: %s", subject, natsStatus_GetText(s));
}

void tw_bus_publish_confirmed(TwBus *bus, TwBusBatch *batch, TwBusConfirmCb cb, void *arg)
{
    BusTask *t = calloc(1, sizeof *t);

    if (!t) {
        bus_batch_free(batch);
        if (cb)
            cb(bus, false, arg);
        return;
    }
    t->kind = TASK_CONFIRM;
    t->batch = batch;
    t->confirm_cb = cb;
    t->confirm_arg = arg;
    pthread_mutex_lock(&bus->lock);
    if (bus->pub_tail)
        bus->pub_tail->next = t;
    else
        bus->pub_head = t;
    bus->pub_tail = t;
    pthread_cond_signal(&bus->cond);
    pthread_mutex_unlock(&bus->lock);
}

bool tw_bus_confirms(const TwBus *bus)
{
    TwBus *b = (TwBus *)bus;
    bool ok;

    if (!tw_bus_is_up(bus))
        return false;
    if (!b->stream)
        return true;
    pthread_mutex_lock(&b->lock);
    ok = b->stream_ok || b->no_jetstream;
    pthread_mutex_unlock(&b->lock);
    return ok;
}
