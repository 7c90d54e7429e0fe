/* Every event on evt.agent.> for the whole run, as delivered by NATS (core subscription, reconnecting through
 * every nats-server restart), and the times the subscriber itself was away. An event the server handled while
 * the subscriber was away never reached it; the events stream the daemons keep ([nats] events_stream) has it,
 * so at the end the stream is read back too, and the checker holds turnwatch to every event. */
#include "chaos.h"

#include <nats/nats.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct ChaosEvents {
    pthread_mutex_t lock;
    natsOptions *opts;
    natsConnection *nc;
    natsSubscription *sub;
    json_t *seen; /* [{"subject","payload" (its text),"source"}] */
    json_t *gaps; /* [[from_ms, to_ms]], Unix ms */
    int64_t away_since_ms;
    bool closing; /* our own close: not a time away */
};

static int64_t realtime_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Keeps one event as seen, {"subject","payload","source"}, and destroys msg. The payload is the text NATS
 * carried (the checker compares it with the outbox as jsonb, so a number is compared as the decimal it was,
 * not as a double this process would re-encode), or null when it is not a JSON object: the checker counts
 * that. */
static void keep_seen(ChaosEvents *ev, natsMsg *msg, const char *source)
{
    const char *data = natsMsg_GetData(msg);
    size_t len = (size_t)natsMsg_GetDataLength(msg);
    json_t *parsed = json_loadb(data, len, JSON_DECODE_INT_AS_REAL, NULL);
    json_t *text = json_is_object(parsed) ? json_stringn(data, len) : NULL;
    json_t *e = json_pack("{s:s,s:o,s:s}", "subject", natsMsg_GetSubject(msg), "payload",
                          text ? text : json_null(), "source", source);

    json_decref(parsed);
    pthread_mutex_lock(&ev->lock);
    if (e)
        json_array_append_new(ev->seen, e);
    pthread_mutex_unlock(&ev->lock);
    natsMsg_Destroy(msg);
}

static void on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    keep_seen(closure, msg, "live");
}

static void on_disconnected(natsConnection *nc, void *closure)
{
    ChaosEvents *ev = closure;
    pthread_mutex_lock(&ev->lock);
    if (!ev->away_since_ms && !ev->closing)
        ev->away_since_ms = realtime_ms();
    pthread_mutex_unlock(&ev->lock);
}

static void on_reconnected(natsConnection *nc, void *closure)
{
    ChaosEvents *ev = closure;
    pthread_mutex_lock(&ev->lock);
    if (ev->away_since_ms)
        json_array_append_new(ev->gaps,
                              json_pack("[I,I]", (json_int_t)ev->away_since_ms, (json_int_t)realtime_ms()));
    ev->away_since_ms = 0;
    pthread_mutex_unlock(&ev->lock);
}

ChaosEvents *chaos_events_start(const char *url)
{
    ChaosEvents *ev = calloc(1, sizeof *ev);
    natsStatus s;

    if (!ev)
        return NULL;
    pthread_mutex_init(&ev->lock, NULL);
    ev->seen = json_array();
    ev->gaps = json_array();
    s = natsOptions_Create(&ev->opts);
    {
        /* One server, or a cluster's comma-separated list (--ha). */
        char *copy = strdup(url), *save = NULL;
        const char *servers[8];
        int n = 0;
        for (char *u = copy ? strtok_r(copy, ",", &save) : NULL; u && n < 8; u = strtok_r(NULL, ",", &save))
            servers[n++] = u;
        if (s == NATS_OK)
            s = n ? natsOptions_SetServers(ev->opts, servers, n) : NATS_NO_MEMORY;
        free(copy);
    }
    if (s == NATS_OK)
        s = natsOptions_SetName(ev->opts, "turnwatch-soak");
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(ev->opts, -1);
    /* Back as soon as the server is: every moment away is a moment of events only the stream can show. */
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(ev->opts, 20);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectJitter(ev->opts, 0, 0);
    if (s == NATS_OK)
        s = natsOptions_SetDisconnectedCB(ev->opts, on_disconnected, ev);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(ev->opts, on_reconnected, ev);
    if (s == NATS_OK)
        s = natsConnection_Connect(&ev->nc, ev->opts);
    if (s == NATS_OK)
        s = natsConnection_Subscribe(&ev->sub, ev->nc, "evt.agent.>", on_msg, ev);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(ev->sub, -1, -1);
    if (s == NATS_OK)
        s = natsConnection_Flush(ev->nc);
    if (s != NATS_OK) {
        fprintf(stderr, "turnwatch-soak: cannot subscribe to evt.agent.> at %s: %s\n", url,
                natsStatus_GetText(s));
        chaos_events_free(ev);
        return NULL;
    }
    return ev;
}

int chaos_events_replay(ChaosEvents *ev, const char *stream, char *why, size_t why_size)
{
    jsCtx *js = NULL;
    jsStreamInfo *si = NULL;
    jsSubOptions so;
    natsSubscription *sub = NULL;
    jsErrCode jerr = 0;
    uint64_t total = 0, got = 0;
    natsStatus s = natsConnection_JetStream(&js, ev->nc, NULL);

    if (s == NATS_OK)
        s = js_GetStreamInfo(&si, js, stream, NULL, &jerr);
    if (s == NATS_OK) {
        total = si->State.Msgs;
        jsSubOptions_Init(&so);
        so.Stream = stream;
        so.Ordered = true;
        so.Config.DeliverPolicy = js_DeliverAll;
        /* Every message of the stream (the agents' events and the schedules' ticks), as many as it holds. */
        s = js_SubscribeSync(&sub, js, "evt.>", NULL, &so, &jerr);
    }
    while (s == NATS_OK && got < total) {
        natsMsg *msg = NULL;
        if ((s = natsSubscription_NextMsg(&msg, sub, 10000)) != NATS_OK)
            break;
        keep_seen(ev, msg, "stream");
        got++;
    }
    if (s != NATS_OK)
        snprintf(why, why_size, "read %llu of the %llu events in stream %s: %s (JetStream error %d)",
                 (unsigned long long)got, (unsigned long long)total, stream, natsStatus_GetText(s),
                 (int)jerr);
    natsSubscription_Destroy(sub);
    jsStreamInfo_Destroy(si);
    jsCtx_Destroy(js);
    return s == NATS_OK ? 0 : -1;
}

void chaos_events_stop(ChaosEvents *ev)
{
    if (!ev || !ev->nc)
        return;
    pthread_mutex_lock(&ev->lock);
    ev->closing = true;
    pthread_mutex_unlock(&ev->lock);
    natsSubscription_Unsubscribe(ev->sub);
    natsConnection_Close(ev->nc);
    pthread_mutex_lock(&ev->lock);
    if (ev->away_since_ms)
        json_array_append_new(ev->gaps,
                              json_pack("[I,I]", (json_int_t)ev->away_since_ms, (json_int_t)realtime_ms()));
    ev->away_since_ms = 0;
    pthread_mutex_unlock(&ev->lock);
}

void chaos_events_free(ChaosEvents *ev)
{
    if (!ev)
        return;
    natsSubscription_Destroy(ev->sub);
    natsConnection_Destroy(ev->nc);
    natsOptions_Destroy(ev->opts);
    json_decref(ev->seen);
    json_decref(ev->gaps);
    pthread_mutex_destroy(&ev->lock);
    free(ev);
}

size_t chaos_events_count(ChaosEvents *ev)
{
    size_t n;
    pthread_mutex_lock(&ev->lock);
    n = json_array_size(ev->seen);
    pthread_mutex_unlock(&ev->lock);
    return n;
}

json_t *chaos_events_json(ChaosEvents *ev)
{
    json_t *copy;
    pthread_mutex_lock(&ev->lock);
    copy = json_copy(ev->seen);
    pthread_mutex_unlock(&ev->lock);
    return copy;
}

json_t *chaos_events_gaps(ChaosEvents *ev)
{
    json_t *copy;
    pthread_mutex_lock(&ev->lock);
    copy = json_deep_copy(ev->gaps);
    pthread_mutex_unlock(&ev->lock);
    return copy;
}
