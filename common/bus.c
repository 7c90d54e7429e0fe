/* NATS connection with hand-off to the libevent loop, and a publisher thread for confirmed batches. */
#include "bus.h"

#include <errno.h>
#include <event2/thread.h>
#include <nats/nats.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "names.h"
#include "natsopts.h"
#include "stream.h"

#define BUS_FLUSH_TIMEOUT_MS 2000
/* While the events stream cannot be made sure of, it is tried again after 1 s, doubling to this (a leader
 * election in a cluster takes seconds; a server without JetStream for good is asked every 10 s). */
#define BUS_STREAM_RETRY_FIRST_MS 1000
#define BUS_STREAM_RETRY_MAX_MS 10000
/* A connection that nats.c closed for good is made anew after this, doubling per try up to the maximum. */
#define BUS_REBUILD_FIRST_MS 250
#define BUS_REBUILD_MAX_MS 5000
/* A connection that lived this long before it was closed starts the backoff over. */
#define BUS_REBUILD_STABLE_SEC 30
/* How often the loop looks again whether the publisher thread let go of a closed connection. */
#define BUS_REBUILD_POLL_MS 20

typedef struct BusMsg {
    char *subject;
    char *data;
    size_t len;
    char *id; /* event_id (Nats-Msg-Id for the stream), or NULL */
} BusMsg;

struct TwBusBatch {
    BusMsg *msgs;
    size_t n, cap;
};

typedef enum { TASK_MSG, TASK_STATE, TASK_CONFIRM } TaskKind;

typedef struct BusSub {
    TwBus *bus;
    TwBusMsgCb cb;
    void *arg;
    char *subject;
    natsSubscription *sub;
} BusSub;

typedef struct BusTask {
    struct BusTask *next;
    TaskKind kind;
    BusSub *sub;       /* TASK_MSG */
    BusMsg msg;        /* TASK_MSG */
    bool flag;         /* TASK_STATE: up; TASK_CONFIRM: ok */
    TwBusBatch *batch; /* TASK_CONFIRM: pending, then done */
    TwBusConfirmCb confirm_cb;
    void *confirm_arg;
} BusTask;

struct TwBus {
    struct event_base *base;
    char *urls;
    char name[32];
    const char *auth_keys; /* tw_nats_auth_keys: what to check when a server refuses us (a literal) */
    natsOptions *opts;
    natsConnection *conn;
    atomic_bool up;
    atomic_bool closing;
    BusSub **subs;
    size_t n_subs;
    TwBusStateCb state_cb;
    void *state_arg;
    /* Tasks for the loop. */
    pthread_mutex_t lock;
    BusTask *inbox_head, *inbox_tail;
    struct event *wake;
    /* Work for the publisher thread. */
    pthread_cond_t cond;
    BusTask *pub_head, *pub_tail;
    pthread_t publisher;
    bool publisher_started;
    bool stopping;
    /* nats.c callbacks still to come that use this struct: the connection's closed callback and one
     * on-complete per subscription. tw_bus_free waits for them (under lock) before freeing. */
    int pending_cbs;
    /* [nats] events_stream: made sure of by the publisher thread after every (re)connect (under lock). */
    char *stream;
    int stream_max_age_sec;
    int stream_replicas;
    bool stream_due;
    struct timespec stream_retry_at;
    int stream_retry_ms; /* the last wait between two checks that failed */
    /* Once the stream is made sure of (and until the connection drops), confirmed batches are published
     * through JetStream: confirmed then means kept by the stream, not only taken by the server (a server
     * shutting down answers a flush but stores nothing more). The publisher thread owns js. */
    bool stream_ok;
    /* The last check found no JetStream on the server at all (nothing answers its API): there is no stream
     * to keep events in, so they count as published when the server took them, as without events_stream,
     * and the daemon says so every 10 s. Anything else that fails the check (a cluster electing a leader,
     * a stream that cannot be read) holds the events in the outbox instead (stream_ok false). */
    bool no_jetstream;
    jsCtx *js;
    atomic_int js_failed; /* negative or missing acknowledgments in the batch being confirmed */
    /* A connection that nats.c closes for good (a server's -ERR such as a protocol error, an expired
     * authorization, a slow consumer) is rebuilt, never on a nats.c thread: nats.c's closed callback hands it
     * to the loop (closed_nc, conn_ev); the loop marks it gone (the publisher thread then leaves conn and js
     * alone and fails what it is given), destroys it with its js and subscriptions once the publisher is not
     * using it, and asks the publisher thread for a new one (connect_due: connecting blocks, so not on the
     * loop); the publisher hands that back (fresh, conn_ev) and the loop puts it in place, subscribes again
     * and reports up, after which the events stream is checked again. Tries back off up to 5 s. */
    struct event *conn_ev;     /* loop: a closed connection or a fresh one to look at */
    struct event *rebuild;     /* loop: timer of the next step */
    bool rebuilding;           /* loop: conn is closed (or NULL) and being replaced */
    bool was_up;               /* loop: conn has been reported up */
    int rebuild_delay_ms;      /* loop: the last wait */
    struct timespec built_at;  /* loop: when conn came up (CLOCK_MONOTONIC) */
    natsConnection *closed_nc; /* under lock: the connection nats.c reported closed */
    bool conn_gone;            /* under lock: conn is closed, the publisher must not use conn or js */
    bool pub_busy;             /* under lock: the publisher thread is using conn or js */
    bool connect_due;          /* under lock: the publisher thread is to make a new connection */
    bool fresh_done;           /* under lock: it tried; fresh is its connection (NULL: it failed) */
    natsConnection *fresh;
    natsStatus fresh_status;
    char fresh_error[256]; /* nats.c's last error of a failed try (it is per thread) */
};

int tw_bus_global_init(void)
{
    return evthread_use_pthreads();
}

static void batch_free(TwBusBatch *b)
{
    if (!b)
        return;
    for (size_t i = 0; i < b->n; i++) {
        free(b->msgs[i].subject);
        free(b->msgs[i].data);
        free(b->msgs[i].id);
    }
    free(b->msgs);
    free(b);
}

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

/* From any thread: queue a task for the loop and wake it. */
static void post_to_loop(TwBus *bus, BusTask *t)
{
    pthread_mutex_lock(&bus->lock);
    if (bus->inbox_tail)
        bus->inbox_tail->next = t;
    else
        bus->inbox_head = t;
    bus->inbox_tail = t;
    pthread_mutex_unlock(&bus->lock);
    event_active(bus->wake, EV_READ, 0);
}

static void task_free(BusTask *t)
{
    free(t->msg.subject);
    free(t->msg.data);
    batch_free(t->batch);
    free(t);
}

static void loop_wake_cb(evutil_socket_t fd, short what, void *arg)
{
    TwBus *bus = arg;
    BusTask *list, *t;

    pthread_mutex_lock(&bus->lock);
    list = bus->inbox_head;
    bus->inbox_head = bus->inbox_tail = NULL;
    pthread_mutex_unlock(&bus->lock);
    while ((t = list)) {
        list = t->next;
        switch (t->kind) {
        case TASK_MSG:
            t->sub->cb(bus, t->msg.subject, t->msg.data, t->msg.len, t->sub->arg);
            break;
        case TASK_STATE:
            if (t->flag && !bus->was_up) {
                bus->was_up = true;
                clock_gettime(CLOCK_MONOTONIC, &bus->built_at);
            }
            if (bus->state_cb)
                bus->state_cb(bus, t->flag, bus->state_arg);
            break;
        case TASK_CONFIRM:
            if (t->confirm_cb)
                t->confirm_cb(bus, t->flag, t->confirm_arg);
            break;
        }
        task_free(t);
    }
}

static void on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    BusSub *s = closure;
    BusTask *t = calloc(1, sizeof *t);
    int len = natsMsg_GetDataLength(msg);

    if (t) {
        t->kind = TASK_MSG;
        t->sub = s;
        t->msg.subject = strdup(natsMsg_GetSubject(msg));
        t->msg.data = malloc((size_t)len + 1);
        if (t->msg.subject && t->msg.data) {
            memcpy(t->msg.data, natsMsg_GetData(msg), (size_t)len);
            t->msg.data[len] = '\0';
            t->msg.len = (size_t)len;
            post_to_loop(s->bus, t);
        } else {
            task_free(t);
        }
    }
    natsMsg_Destroy(msg);
}

static void post_state(TwBus *bus, bool up)
{
    BusTask *t = calloc(1, sizeof *t);

    atomic_store(&bus->up, up);
    if (!up && bus->stream) {
        pthread_mutex_lock(&bus->lock);
        bus->stream_ok = false;
        pthread_mutex_unlock(&bus->lock);
    }
    if (up && bus->stream) {
        /* A server that restarted may have lost the stream (memory storage, a new server): check each time.
         */
        pthread_mutex_lock(&bus->lock);
        bus->stream_due = true;
        bus->stream_retry_at = (struct timespec){0};
        pthread_cond_broadcast(&bus->cond);
        pthread_mutex_unlock(&bus->lock);
    }
    if (!t)
        return;
    t->kind = TASK_STATE;
    t->flag = up;
    post_to_loop(bus, t);
}

static void on_connected(natsConnection *nc, void *closure)
{
    TwBus *bus = closure;

    log_info("nats connection %s up", bus->name);
    post_state(bus, true);
}

static void on_disconnected(natsConnection *nc, void *closure)
{
    TwBus *bus = closure;

    /* Our own close also ends up here: only a loss we did not ask for is worth a warning. */
    if (atomic_load(&bus->up) && !atomic_load(&bus->closing))
        log_warn("nats connection %s lost; reconnecting", bus->name);
    post_state(bus, false);
}

/* The connection's last callback, and a subscription's after its last message: nothing of nats.c touches the
 * bus for them afterwards. */
static void cb_done(TwBus *bus)
{
    pthread_mutex_lock(&bus->lock);
    bus->pending_cbs--;
    pthread_cond_broadcast(&bus->cond);
    pthread_mutex_unlock(&bus->lock);
}

/* The connection is closed for good: ours (tw_bus_free), or nats.c's decision (a server's -ERR and the
 * like), which the loop repairs. cb_done last: tw_bus_free waits for it before freeing conn_ev. */
static void on_closed(natsConnection *nc, void *closure)
{
    TwBus *bus = closure;

    if (!atomic_load(&bus->closing)) {
        pthread_mutex_lock(&bus->lock);
        bus->closed_nc = nc;
        pthread_mutex_unlock(&bus->lock);
        event_active(bus->conn_ev, EV_READ, 0);
    }
    cb_done(bus);
}

static void on_sub_complete(void *closure)
{
    cb_done(((BusSub *)closure)->bus);
}

static void on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *closure)
{
    log_warn("nats: %s", natsStatus_GetText(err));
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
        log_info("events stream %s (%s): keeps %s for %d s, %d replica%s", bus->stream, what,
                 TW_STREAM_SUBJECTS, bus->stream_max_age_sec, bus->stream_replicas,
                 bus->stream_replicas == 1 ? "" : "s");
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
static void *publisher_main(void *arg)
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
            post_to_loop(bus, t);
        }
    }
}

static int do_subscribe(TwBus *bus, BusSub *s);

static void rebuild_later(TwBus *bus, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

    evtimer_add(bus->rebuild, &tv);
}

/* The wait before the next try: BUS_REBUILD_FIRST_MS after a connection that lasted, doubled after one that
 * failed or did not last, at most BUS_REBUILD_MAX_MS. */
static int rebuild_delay(TwBus *bus)
{
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    if (bus->rebuild_delay_ms == 0 ||
        (bus->was_up && now.tv_sec - bus->built_at.tv_sec >= BUS_REBUILD_STABLE_SEC))
        bus->rebuild_delay_ms = BUS_REBUILD_FIRST_MS;
    else
        bus->rebuild_delay_ms =
            bus->rebuild_delay_ms * 2 > BUS_REBUILD_MAX_MS ? BUS_REBUILD_MAX_MS : bus->rebuild_delay_ms * 2;
    return bus->rebuild_delay_ms;
}

/* Why a connection failed, for the log: a server that refuses us (credentials) or a TLS handshake that fails
 * names the keys to check. nats.c's text may quote the server: shown escaped. */
static const char *failure_text(const TwBus *bus, natsStatus st, const char *detail, char *out, size_t len)
{
    char shown[300];
    const char *d = detail && *detail ? detail : natsStatus_GetText(st);
    const char *where = d[0] == '(' ? strstr(d, "): ") : NULL;

    if (where) /* nats.c's "(conn.c:1905): " */
        d = where + 3;
    tw_shown(d, strlen(d), shown, sizeof shown);
    if (tw_nats_refused(st))
        snprintf(out, len, "the server refused the credentials: %s; check %s", shown,
                 *bus->auth_keys ? bus->auth_keys : "[nats]: it asks for credentials and none are set");
    else if (st == NATS_SSL_ERROR || st == NATS_SECURE_CONNECTION_REQUIRED)
        snprintf(out, len, "TLS failed: %s; check [nats] url, tls_ca_file, tls_cert_file and tls_key_file",
                 shown);
    else
        snprintf(out, len, "%s", shown);
    return out;
}

/* nats.c closed bus->conn for good: say why, report NATS down, and replace it after the backoff. */
static void conn_lost(TwBus *bus)
{
    static TwLogLimit lim;
    const char *text = NULL;
    natsStatus st = natsConnection_GetLastError(bus->conn, &text);
    char shown[512];
    int delay = rebuild_delay(bus);

    pthread_mutex_lock(&bus->lock);
    bus->conn_gone = true;
    bus->stream_ok = false;
    pthread_mutex_unlock(&bus->lock);
    bus->rebuilding = true;
    /* The reason may quote the server's error line: shown escaped. */
    failure_text(bus, st, text, shown, sizeof shown);
    if (bus->was_up)
        log_warn(
            "nats connection %s closed: %s; nats.c does not reconnect it, a new connection follows in %d ms",
            bus->name, shown, delay);
    else /* one that never came up: again and again while no server takes it */
        tw_log_warn_limited(&lim, "nats connection %s: a new connection failed: %s; trying again in %d ms",
                            bus->name, shown, delay);
    bus->was_up = false;
    if (atomic_load(&bus->up))
        post_state(bus, false);
    rebuild_later(bus, delay);
}

/* The timer after a close: once the publisher thread is not using the closed connection, destroy it (with
 * its js and subscriptions; their callbacks stay counted in pending_cbs until nats.c makes them) and ask the
 * publisher thread for a new one. Also the next try after a failed one (nothing left to destroy then). */
static void rebuild_cb(evutil_socket_t fd, short what, void *arg)
{
    TwBus *bus = arg;
    natsConnection *old;
    jsCtx *js;

    pthread_mutex_lock(&bus->lock);
    if (bus->pub_busy) {
        pthread_mutex_unlock(&bus->lock);
        rebuild_later(bus, BUS_REBUILD_POLL_MS);
        return;
    }
    old = bus->conn;
    js = bus->js;
    bus->conn = NULL;
    bus->js = NULL;
    pthread_mutex_unlock(&bus->lock);
    jsCtx_Destroy(js);
    for (size_t i = 0; old && i < bus->n_subs; i++) {
        natsSubscription_Destroy(bus->subs[i]->sub);
        bus->subs[i]->sub = NULL;
    }
    natsConnection_Destroy(old);
    pthread_mutex_lock(&bus->lock);
    bus->connect_due = true;
    pthread_cond_broadcast(&bus->cond);
    pthread_mutex_unlock(&bus->lock);
}

/* The publisher thread's new connection: in place of the closed one, with every subscription; or, when it
 * could not be made, another try after the (doubled) backoff. */
static void conn_fresh(TwBus *bus, natsConnection *nc, natsStatus st)
{
    if (!nc) {
        static TwLogLimit lim;
        int delay = rebuild_delay(bus);
        char why[512];
        pthread_mutex_lock(&bus->lock);
        failure_text(bus, st, bus->fresh_error, why, sizeof why);
        pthread_mutex_unlock(&bus->lock);
        tw_log_warn_limited(&lim, "nats connection %s: a new connection failed: %s; trying again in %d ms",
                            bus->name, why, delay);
        rebuild_later(bus, delay);
        return;
    }
    pthread_mutex_lock(&bus->lock);
    bus->conn = nc;
    bus->conn_gone = false;
    pthread_mutex_unlock(&bus->lock);
    bus->rebuilding = false;
    if (natsConnection_IsClosed(nc)) {
        /* Closed before we got to it (nats.c gives up at once on a server that takes the TCP connection but
         * not the handshake): destroyed by the next rebuild. */
        conn_lost(bus);
        return;
    }
    for (size_t i = 0; i < bus->n_subs; i++)
        (void)do_subscribe(bus, bus->subs[i]); /* a failure is logged; doorbells are hints */
    if (natsConnection_Status(nc) == NATS_CONN_STATUS_CONNECTED) {
        log_info("nats connection %s up (a new connection)", bus->name);
        post_state(bus, true);
    } else {
        /* on_connected reports it up once a server answers. */
        log_info("nats connection %s made anew; waiting for a server", bus->name);
    }
}

/* On the loop: a connection that nats.c closed, or the publisher thread's new one. */
static void conn_cb(evutil_socket_t fd, short what, void *arg)
{
    TwBus *bus = arg;
    natsConnection *closed, *fresh;
    natsStatus st;
    bool fresh_done;

    pthread_mutex_lock(&bus->lock);
    closed = bus->closed_nc;
    fresh = bus->fresh;
    fresh_done = bus->fresh_done;
    st = bus->fresh_status;
    bus->closed_nc = bus->fresh = NULL;
    bus->fresh_done = false;
    pthread_mutex_unlock(&bus->lock);
    if (fresh_done)
        conn_fresh(bus, fresh, st);
    /* A fresh connection closed before it was put in place was seen closed there. */
    if (closed && closed == bus->conn && !bus->rebuilding)
        conn_lost(bus);
}

TwBus *tw_bus_new(struct event_base *base, const TwConfig *cfg, const char *name)
{
    TwBus *bus = calloc(1, sizeof *bus);

    if (!bus)
        return NULL;
    bus->base = base;
    bus->urls = strdup(cfg->nats_url);
    snprintf(bus->name, sizeof bus->name, "%s", name);
    bus->auth_keys = tw_nats_auth_keys(cfg);
    pthread_mutex_init(&bus->lock, NULL);
    pthread_cond_init(&bus->cond, NULL);
    bus->wake = event_new(base, -1, EV_PERSIST, loop_wake_cb, bus);
    bus->conn_ev = event_new(base, -1, EV_PERSIST, conn_cb, bus);
    bus->rebuild = evtimer_new(base, rebuild_cb, bus);
    if (!bus->urls || !bus->wake || !bus->conn_ev || !bus->rebuild) {
        tw_bus_free(bus);
        return NULL;
    }
    /* TLS and credentials: their files are read now (a problem here is the configuration's, not the
     * server's). */
    char why[1024];
    if (tw_nats_options_create(&bus->opts, cfg, why, sizeof why) != NATS_OK) {
        log_error("nats connection %s: %s", bus->name, why);
        tw_bus_free(bus);
        return NULL;
    }
    return bus;
}

void tw_bus_keep_events(TwBus *bus, const char *stream, int max_age_sec, int replicas)
{
    free(bus->stream);
    bus->stream = stream && *stream ? strdup(stream) : NULL;
    bus->stream_max_age_sec = max_age_sec;
    bus->stream_replicas = replicas > 0 ? replicas : 1;
}

void tw_bus_set_state_cb(TwBus *bus, TwBusStateCb cb, void *arg)
{
    bus->state_cb = cb;
    bus->state_arg = arg;
}

static int do_subscribe(TwBus *bus, BusSub *s)
{
    natsStatus st = natsConnection_Subscribe(&s->sub, bus->conn, s->subject, on_msg, s);

    if (st != NATS_OK) {
        log_error("nats: cannot subscribe to %s: %s", s->subject, natsStatus_GetText(st));
        return -1;
    }
    /* Doorbells are hints: never let a slow consumer error pile up behind a busy loop. */
    natsSubscription_SetPendingLimits(s->sub, -1, -1);
    if (natsSubscription_SetOnCompleteCB(s->sub, on_sub_complete, s) == NATS_OK) {
        pthread_mutex_lock(&bus->lock);
        bus->pending_cbs++;
        pthread_mutex_unlock(&bus->lock);
    }
    return 0;
}

int tw_bus_subscribe(TwBus *bus, const char *subject, TwBusMsgCb cb, void *arg)
{
    BusSub **g = realloc(bus->subs, (bus->n_subs + 1) * sizeof *g);
    BusSub *s;

    if (!g)
        return -1;
    bus->subs = g;
    if (!(s = calloc(1, sizeof *s)) || !(s->subject = strdup(subject))) {
        free(s);
        return -1;
    }
    s->bus = bus;
    s->cb = cb;
    s->arg = arg;
    bus->subs[bus->n_subs++] = s;
    /* While a closed connection is replaced, the new one subscribes to it with the others. */
    return bus->conn && !bus->rebuilding ? do_subscribe(bus, s) : 0;
}

bool tw_bus_subscribed(const TwBus *bus, const char *subject)
{
    for (size_t i = 0; i < bus->n_subs; i++)
        if (strcmp(bus->subs[i]->subject, subject) == 0)
            return true;
    return false;
}

int tw_bus_start(TwBus *bus)
{
    natsStatus s = natsOptions_SetName(bus->opts, bus->name);

    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(bus->opts, -1);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(bus->opts, 250);
    if (s == NATS_OK)
        s = natsOptions_SetPingInterval(bus->opts, 5000);
    if (s == NATS_OK)
        s = natsOptions_SetMaxPingsOut(bus->opts, 2);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectBufSize(bus->opts, 8 * 1024 * 1024);
    if (s == NATS_OK)
        s = natsOptions_SetDisconnectedCB(bus->opts, on_disconnected, bus);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(bus->opts, on_connected, bus);
    if (s == NATS_OK)
        s = natsOptions_SetErrorHandler(bus->opts, on_error, bus);
    if (s == NATS_OK)
        s = natsOptions_SetClosedCB(bus->opts, on_closed, bus);
    if (s == NATS_OK) {
        /* First one try, waited for, so that a server that answers but will not have us (credentials, TLS)
         * says why; only when none answers at all does nats.c keep trying in the background. */
        s = natsConnection_Connect(&bus->conn, bus->opts);
        if (s == NATS_NO_SERVER) {
            s = natsOptions_SetRetryOnFailedConnect(bus->opts, true, on_connected, bus);
            if (s == NATS_OK)
                s = natsConnection_Connect(&bus->conn, bus->opts);
        }
        if (bus->conn)
            bus->pending_cbs++; /* its closed callback */
        if (s == NATS_OK) {
            log_info("nats connection %s up", bus->name);
            post_state(bus, true);
        } else if (s == NATS_NOT_YET_CONNECTED) {
            char shown[512];
            log_warn("nats server not reachable yet (%s); retrying in the background",
                     tw_redact_urls(bus->urls, shown, sizeof shown));
            s = NATS_OK;
        } else {
            /* A server that would not have us (credentials, TLS) is a runtime failure as one that is away:
             * said clearly, and tried again with backoff (the rebuild path) until it takes us. */
            char shown[512], why[512];
            int delay = rebuild_delay(bus);
            log_error("nats connection %s to %s failed: %s; trying again in %d ms", bus->name,
                      tw_redact_urls(bus->urls, shown, sizeof shown),
                      failure_text(bus, s, nats_GetLastError(NULL), why, sizeof why), delay);
            bus->rebuilding = true;
            rebuild_later(bus, delay);
            s = NATS_OK;
        }
    }
    if (s != NATS_OK) {
        char shown[512];
        log_error("nats: cannot set up connection to %s: %s", tw_redact_urls(bus->urls, shown, sizeof shown),
                  natsStatus_GetText(s));
        return -1;
    }
    for (size_t i = 0; i < bus->n_subs && !bus->rebuilding; i++) /* else: with the new connection */
        if (do_subscribe(bus, bus->subs[i]) != 0)
            return -1;
    if (pthread_create(&bus->publisher, NULL, publisher_main, bus) != 0)
        return -1;
    bus->publisher_started = true;
    return 0;
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
        batch_free(batch);
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

bool tw_bus_is_up(const TwBus *bus)
{
    return bus && atomic_load(&((TwBus *)bus)->up);
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

void tw_bus_free(TwBus *bus)
{
    BusTask *t;

    if (!bus)
        return;
    /* From here on a close is ours, not one to repair. */
    atomic_store(&bus->closing, true);
    pthread_mutex_lock(&bus->lock);
    bus->stopping = true;
    pthread_cond_broadcast(&bus->cond);
    pthread_mutex_unlock(&bus->lock);
    if (bus->publisher_started)
        pthread_join(bus->publisher, NULL);
    if (bus->rebuild)
        evtimer_del(bus->rebuild);
    jsCtx_Destroy(bus->js);
    bus->js = NULL;
    /* The connection in use, and one the publisher thread made that the loop never put in place. */
    natsConnection *conns[] = {bus->conn, bus->fresh};
    if (bus->conn && !bus->rebuilding)
        natsConnection_FlushTimeout(bus->conn, 500);
    for (size_t i = 0; i < bus->n_subs; i++)
        natsSubscription_Destroy(bus->subs[i]->sub);
    for (size_t i = 0; i < sizeof conns / sizeof conns[0]; i++)
        natsConnection_Close(conns[i]);
    /* The disconnected and closed callbacks (and subscription threads) run on nats.c threads after Close
     * returns and use this struct, also those of a connection closed and replaced before: wait for the last
     * of them before freeing it. */
    struct timespec until;
    int rc = 0;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    pthread_mutex_lock(&bus->lock);
    while (bus->pending_cbs > 0 && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&bus->cond, &bus->lock, &until);
    pthread_mutex_unlock(&bus->lock);
    for (size_t i = 0; i < sizeof conns / sizeof conns[0]; i++)
        natsConnection_Destroy(conns[i]);
    if (rc == ETIMEDOUT) {
        /* Better a leak at exit than a callback writing into freed memory. */
        log_warn("nats connection %s: callbacks still pending at shutdown; not freeing it", bus->name);
        return;
    }
    natsOptions_Destroy(bus->opts);
    for (size_t i = 0; i < bus->n_subs; i++) {
        free(bus->subs[i]->subject);
        free(bus->subs[i]);
    }
    free(bus->subs);
    /* Every confirm callback runs exactly once: those the loop never got to are told "not confirmed" (the
     * outbox relay publishes such events again), so that they can free what they hold. */
    while ((t = bus->inbox_head)) {
        bus->inbox_head = t->next;
        if (t->kind == TASK_CONFIRM && t->confirm_cb)
            t->confirm_cb(bus, false, t->confirm_arg);
        task_free(t);
    }
    while ((t = bus->pub_head)) {
        bus->pub_head = t->next;
        if (t->kind == TASK_CONFIRM && t->confirm_cb)
            t->confirm_cb(bus, false, t->confirm_arg);
        task_free(t);
    }
    if (bus->wake)
        event_free(bus->wake);
    if (bus->conn_ev)
        event_free(bus->conn_ev);
    if (bus->rebuild)
        event_free(bus->rebuild);
    pthread_mutex_destroy(&bus->lock);
    pthread_cond_destroy(&bus->cond);
    free(bus->urls);
    free(bus->stream);
    free(bus);
}
