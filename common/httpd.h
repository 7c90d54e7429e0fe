/* The monitoring HTTP server of a daemon (docs/operations.md), on the daemon's own loop: GET (or HEAD)
 * /metrics (the registry of common/metrics.h, Prometheus text format) and /healthz (200 when the daemon's
 * PostgreSQL and NATS connections are up, else 503; the body says which). Nothing else is served. Whatever
 * its clients do, it holds at most TW_HTTPD_MAX_CONNECTIONS descriptors and TW_HTTPD_MAX_HEAD bytes of
 * request per connection, each connection for at most TW_HTTPD_REQUEST_TIMEOUT_MS, and it never takes the
 * last quarter of the daemon's open-file limit (see httpd.c). */
#ifndef TW_HTTPD_H
#define TW_HTTPD_H

#include <event2/event.h>

#include "metrics.h"

/** Connections open at once; more are refused (503) until one ends. */
#define TW_HTTPD_MAX_CONNECTIONS 64
/** A connection is closed this long after it was accepted, whatever it is doing: sending its request (then
 *  with a 408), or reading the reply. One request per connection. */
#define TW_HTTPD_REQUEST_TIMEOUT_MS 5000
/** Request line and header fields together, in bytes; a longer head is refused with 431. Request bodies are
 *  never read. */
#define TW_HTTPD_MAX_HEAD 8192

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
