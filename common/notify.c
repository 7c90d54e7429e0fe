/* sd_notify: readiness, status, reload, stop and the watchdog keep-alive. */
#include "notify.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "log.h"

struct TwNotify {
    bool active; /* NOTIFY_SOCKET is set */
    bool ready;  /* READY=1 was sent */
    bool stopping;
    bool known; /* last is set */
    TwHealth last;
    struct event *watchdog;
};

static void send_state(TwNotify *n, const char *state)
{
    int rc;

    if (!n || !n->active)
        return;
    /* Keep the environment: every later message goes to the same socket (the worker keeps these variables
     * from the programs it runs). */
    if ((rc = sd_notify(0, state)) < 0) {
        static TwLogLimit lim;
        tw_log_warn_limited(&lim, "systemd notify failed: %s", strerror(-rc));
    }
}

static void watchdog_cb(evutil_socket_t fd, short what, void *arg)
{
    send_state(arg, "WATCHDOG=1");
}

TwNotify *tw_notify_new(struct event_base *base)
{
    TwNotify *n = calloc(1, sizeof *n);
    const char *sock = getenv("NOTIFY_SOCKET");
    uint64_t usec = 0;

    if (!n)
        return NULL;
    n->active = sock && *sock;
    if (!n->active)
        return n;
    /* systemd's rule: a keep-alive every half the interval. */
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
        uint64_t half = usec / 2;
        struct timeval tv = {(time_t)(half / 1000000), (suseconds_t)(half % 1000000)};
        if (!(n->watchdog = event_new(base, -1, EV_PERSIST, watchdog_cb, n))) {
            free(n);
            return NULL;
        }
        event_add(n->watchdog, &tv);
        log_info("systemd watchdog: WATCHDOG=1 every %llu ms", (unsigned long long)(half / 1000));
        send_state(n, "WATCHDOG=1");
    }
    send_state(n, "STATUS=starting: connecting to PostgreSQL and NATS");
    return n;
}

static void status_text(const TwHealth *h, char *buf, size_t size)
{
    if (h->pg_up && h->nats_up)
        snprintf(buf, size, "running: postgres up, nats up");
    else
        snprintf(buf, size, "waiting: postgres %s, nats %s (reconnecting)", h->pg_up ? "up" : "down",
                 h->nats_up ? "up" : "down");
}

void tw_notify_health(TwNotify *n, const TwHealth *h)
{
    char status[128], msg[160];

    if (!n || !n->active || n->stopping)
        return;
    if (n->known && n->last.pg_up == h->pg_up && n->last.nats_up == h->nats_up)
        return;
    n->known = true;
    n->last = *h;
    status_text(h, status, sizeof status);
    if (!n->ready && h->pg_up && h->nats_up) {
        n->ready = true;
        snprintf(msg, sizeof msg, "READY=1\nSTATUS=%s", status);
    } else {
        snprintf(msg, sizeof msg, "STATUS=%s", status);
    }
    send_state(n, msg);
}

void tw_notify_reloading(TwNotify *n)
{
    struct timespec ts;
    char msg[128];

    if (!n || !n->active || n->stopping)
        return;
    /* MONOTONIC_USEC: systemd 253 and later want it with RELOADING=1. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(msg, sizeof msg, "RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=reloading the configuration",
             (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL);
    send_state(n, msg);
}

void tw_notify_reloaded(TwNotify *n, bool applied)
{
    char status[128], msg[256];

    if (!n || !n->active || n->stopping)
        return;
    status_text(&n->last, status, sizeof status);
    /* READY=1 ends the reload; before the first connect it would say ready too early, and the connect's own
     * READY=1 ends it then. */
    snprintf(msg, sizeof msg, "%sSTATUS=%s (%s)", n->ready ? "READY=1\n" : "", status,
             applied ? "configuration reloaded"
                     : "reload refused: the file has errors, the old configuration is kept");
    send_state(n, msg);
}

void tw_notify_stopping(TwNotify *n, const char *status)
{
    char msg[256];

    if (!n || !n->active || n->stopping)
        return;
    n->stopping = true;
    snprintf(msg, sizeof msg, "STOPPING=1\nSTATUS=%s", status);
    send_state(n, msg);
}

void tw_notify_free(TwNotify *n)
{
    if (!n)
        return;
    if (n->watchdog)
        event_free(n->watchdog);
    free(n);
}
