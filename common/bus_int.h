/* The bus's own header, for its three files only: bus.c (the connection, its options and its repair, and
 * the hand-off to the loop), bus_publish.c (the publisher thread: confirmed batches, the events stream) and
 * bus_sub.c (subscriptions). What they share: the struct, and the few calls between them. */
#ifndef TW_BUS_INT_H
#define TW_BUS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "bus.h"

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

/* bus.c: from any thread, queue a task for the loop and wake it. */
void bus_post_to_loop(TwBus *bus, BusTask *t);
/* bus.c: free a task and what it holds. */
void bus_task_free(BusTask *t);
/* bus.c: one callback of nats.c's that tw_bus_free waits for has come. */
void bus_cb_done(TwBus *bus);
/* bus.c: free a batch and its messages (NULL: nothing). */
void bus_batch_free(TwBusBatch *b);
/* bus.c: the loop's side of bus->wake: run the queued tasks. */
void bus_loop_wake_cb(evutil_socket_t fd, short what, void *arg);
/* bus_publish.c: the publisher thread. */
void *bus_publisher_main(void *arg);
/* bus_sub.c: subscribe s on bus->conn; -1 (logged) when nats.c refuses. */
int bus_subscribe_one(TwBus *bus, BusSub *s);

#endif
