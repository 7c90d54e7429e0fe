/* /metrics and /healthz over evhttp. */
#include "httpd.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "names.h"

/* A scraper that stalls is dropped after this long, so it never holds a connection slot for good. */
#define HTTPD_TIMEOUT_SEC 10

struct TwHttpd {
    struct evhttp *http;
    char *listen;
    TwHealthFn health;
    void *arg;
};

static void reply(struct evhttp_request *req, int code, const char *reason, const char *type, char *body)
{
    struct evbuffer *buf = evbuffer_new();

    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", type);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Cache-Control", "no-store");
    if (buf && body)
        evbuffer_add(buf, body, strlen(body));
    evhttp_send_reply(req, code, reason, buf);
    if (buf)
        evbuffer_free(buf);
}

static void metrics_cb(struct evhttp_request *req, void *arg)
{
    TwHttpd *h = arg;
    TwHealth health = {0};
    char *text;

    h->health(h->arg, &health);
    if (!(text = tw_metrics_render(&health))) {
        reply(req, 500, "Internal Server Error", "text/plain; charset=utf-8", "out of memory\n");
        return;
    }
    reply(req, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", text);
    free(text);
}

static void healthz_cb(struct evhttp_request *req, void *arg)
{
    TwHttpd *h = arg;
    TwHealth health = {0};
    char body[128];
    bool ok;

    h->health(h->arg, &health);
    ok = health.pg_up && health.nats_up;
    snprintf(body, sizeof body, "%s: postgres %s, nats %s\n", ok ? "ok" : "unavailable",
             health.pg_up ? "up" : "down", health.nats_up ? "up" : "down");
    if (ok)
        reply(req, 200, "OK", "text/plain; charset=utf-8", body);
    else
        reply(req, 503, "Service Unavailable", "text/plain; charset=utf-8", body);
}

static void other_cb(struct evhttp_request *req, void *arg)
{
    reply(req, 404, "Not Found", "text/plain; charset=utf-8", "not found: try /metrics or /healthz\n");
}

TwHttpd *tw_httpd_new(struct event_base *base, const char *listen, TwHealthFn health, void *arg)
{
    TwHttpd *h = calloc(1, sizeof *h);
    char host[256];
    int port;

    if (!h)
        return NULL;
    h->health = health;
    h->arg = arg;
    if (!tw_listen_parse(listen, host, sizeof host, &port)) {
        log_error("metrics: '%s' is not host:port", listen);
        goto fail;
    }
    if (!(h->listen = strdup(listen)) || !(h->http = evhttp_new(base)))
        goto fail;
    evhttp_set_allowed_methods(h->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
    evhttp_set_timeout(h->http, HTTPD_TIMEOUT_SEC);
    evhttp_set_max_body_size(h->http, 4096);
    if (evhttp_set_cb(h->http, "/metrics", metrics_cb, h) != 0 ||
        evhttp_set_cb(h->http, "/healthz", healthz_cb, h))
        goto fail;
    evhttp_set_gencb(h->http, other_cb, h);
    errno = 0;
    if (!evhttp_bind_socket_with_handle(h->http, host, (ev_uint16_t)port)) {
        log_error("metrics: cannot listen on %s: %s", listen, errno ? strerror(errno) : "bind failed");
        goto fail;
    }
    log_info("metrics: serving /metrics and /healthz on http://%s", listen);
    return h;
fail:
    tw_httpd_free(h);
    return NULL;
}

const char *tw_httpd_listen(const TwHttpd *h)
{
    return h ? h->listen : "";
}

int tw_httpd_configure(TwHttpd **h, struct event_base *base, const char *listen, TwHealthFn health, void *arg)
{
    TwHttpd *fresh;
    char *old;

    if (strcmp(tw_httpd_listen(*h), listen) == 0)
        return 0;
    if (!*listen) {
        log_info("metrics: no longer serving on %s", tw_httpd_listen(*h));
        tw_httpd_free(*h);
        *h = NULL;
        return 0;
    }
    if ((fresh = tw_httpd_new(base, listen, health, arg))) {
        if (*h)
            log_info("metrics: no longer serving on %s", (*h)->listen);
        tw_httpd_free(*h);
        *h = fresh;
        return 0;
    }
    if (!*h)
        return -1;
    /* Perhaps the same port on another address: close the old one, try again, and reopen it when that fails.
     */
    if (!(old = strdup((*h)->listen)))
        return -1;
    tw_httpd_free(*h);
    if (!(*h = tw_httpd_new(base, listen, health, arg))) {
        *h = tw_httpd_new(base, old, health, arg);
        free(old);
        return -1;
    }
    free(old);
    return 0;
}

void tw_httpd_free(TwHttpd *h)
{
    if (!h)
        return;
    if (h->http)
        evhttp_free(h->http);
    free(h->listen);
    free(h);
}
