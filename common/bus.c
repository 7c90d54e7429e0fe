/* The bus's core, which its other files build on: the hand-off of what nats.c's threads report to the loop
 * (tasks, run by loop_wake_cb), and the bus's own settings. The connection is bus_conn.c's, the publisher
 * thread bus_publish.c's, subscriptions bus_sub.c's. */
#include "bus.h"

#include <event2/thread.h>
#include <stdlib.h>
#include <string.h>

#include "bus_int.h"

int tw_bus_global_init(void)
{
    return evthread_use_pthreads();
}

/* From any thread: queue a task for the loop and wake it. */
void bus_post_to_loop(TwBus *bus, BusTask *t)
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

void bus_task_free(BusTask *t)
{
    free(t->msg.subject);
    free(t->msg.data);
    bus_batch_free(t->batch);
    free(t);
}

void bus_batch_free(TwBusBatch *b)
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

void bus_loop_wake_cb(evutil_socket_t fd, short what, void *arg)
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
        bus_task_free(t);
    }
}

/* The connection's last callback, and a subscription's after its last message: nothing of nats.c touches the
 * bus for them afterwards. */
void bus_cb_done(TwBus *bus)
{
    pthread_mutex_lock(&bus->lock);
    bus->pending_cbs--;
    pthread_cond_broadcast(&bus->cond);
    pthread_mutex_unlock(&bus->lock);
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

bool tw_bus_is_up(const TwBus *bus)
{
    return bus && atomic_load(&((TwBus *)bus)->up);
}
