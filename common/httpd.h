/* The monitoring HTTP server of a daemon (contract section 12), libevent's evhttp on the daemon's own loop:
 * GET /metrics (the registry of common/metrics.h, Prometheus text format) and GET /healthz (200 when the
 * daemon's PostgreSQL and NATS connections are up, else 503; the body says which). Nothing else is served. */
#ifndef TW_HTTPD_H
#define TW_HTTPD_H

#include <event2/event.h>

#include "metrics.h"

typedef struct TwHttpd TwHttpd;

/** Fills h with the daemon's connection states at the time of a request. */
typedef void (*TwHealthFn)(void *arg, TwHealth *h);

/** Listen on listen ("host:port", see tw_listen_parse). NULL after logging why (a bad address, a port
 *  in use). */
TwHttpd *tw_httpd_new(struct event_base *base, const char *listen, TwHealthFn health, void *arg)
    __attribute__((warn_unused_result));
/** The address it listens on, as configured. */
const char *tw_httpd_listen(const TwHttpd *h);
/** Make *h serve listen: nothing to do when it already does; "" closes it; another address opens there (the
 *  old one is closed first when both cannot be open at once). Returns 0, or -1 (logged) when listen cannot be
 *  opened, in which case *h is as it was. */
int tw_httpd_configure(TwHttpd **h, struct event_base *base, const char *listen, TwHealthFn health, void *arg)
    __attribute__((warn_unused_result));
/** Accepts NULL. */
void tw_httpd_free(TwHttpd *h);

#endif
