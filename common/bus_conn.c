/* The NATS connection: its options, nats.c's callbacks about it, and the repair of one that nats.c closed for
 * good (made anew by the publisher thread, put in place by the loop); the bus made, started and freed. */
#include "bus.h"

#include <errno.h>
#include <nats/nats.h>
#include <stdlib.h>
#include <string.h>

#include "bus_int.h"
#include "log.h"
#include "names.h"
#include "natsopts.h"

/* A connection that nats.c closed for good is made anew after this, doubling per try up to the maximum. */
#define BUS_REBUILD_FIRST_MS 250
#define BUS_REBUILD_MAX_MS 5000
/* A connection that lived this long before it was closed starts the backoff over. */
#define BUS_REBUILD_STABLE_SEC 30
/* How often the loop looks again whether the publisher thread let go of a closed connection. */
#define BUS_REBUILD_POLL_MS 20

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
    bus_post_to_loop(bus, t);
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
    bus_cb_done(bus);
}

static void on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *closure)
{
    log_warn("nats: %s", natsStatus_GetText(err));
}

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
        (void)bus_subscribe_one(bus, bus->subs[i]); /* a failure is logged; doorbells are hints */
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
    bus->wake = event_new(base, -1, EV_PERSIST, bus_loop_wake_cb, bus);
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
        if (bus_subscribe_one(bus, bus->subs[i]) != 0)
            return -1;
    if (pthread_create(&bus->publisher, NULL, bus_publisher_main, bus) != 0)
        return -1;
    bus->publisher_started = true;
    return 0;
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
        bus_task_free(t);
    }
    while ((t = bus->pub_head)) {
        bus->pub_head = t->next;
        if (t->kind == TASK_CONFIRM && t->confirm_cb)
            t->confirm_cb(bus, false, t->confirm_arg);
        bus_task_free(t);
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
