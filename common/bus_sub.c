/* Subscriptions: kept by the bus and made again on every new connection; their messages are handed to the
 * loop. */
#include "bus_int.h"

#include <nats/nats.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

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
            bus_post_to_loop(s->bus, t);
        } else {
            bus_task_free(t);
        }
    }
    natsMsg_Destroy(msg);
}

static void on_sub_complete(void *closure)
{
    bus_cb_done(((BusSub *)closure)->bus);
}

int bus_subscribe_one(TwBus *bus, BusSub *s)
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
    return bus->conn && !bus->rebuilding ? bus_subscribe_one(bus, s) : 0;
}

bool tw_bus_subscribed(const TwBus *bus, const char *subject)
{
    for (size_t i = 0; i < bus->n_subs; i++)
        if (strcmp(bus->subs[i]->subject, subject) == 0)
            return true;
    return false;
}
