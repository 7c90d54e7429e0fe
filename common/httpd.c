/* /metrics and /healthz: a small HTTP/1.x server on the daemon's own loop, bounded in everything a client
 * controls. libevent 2.1's evhttp could not be: it has no connection limit, its timeout is an idle timeout
 * that every byte resets, and it gives no public way to own the accept (evhttp_get_request is static in 2.1),
 * so a client trickling bytes on a thousand connections took every descriptor of the worker. Here the
 * listener is ours (an evconnlistener), a connection is refused over TW_HTTPD_MAX_CONNECTIONS or when the
 * daemon's descriptors run low, it lives at most TW_HTTPD_REQUEST_TIMEOUT_MS from accept, its request head is
 * read into a fixed buffer of TW_HTTPD_MAX_HEAD bytes, and an accept that fails (EMFILE) pauses the listener
 * instead of spinning on it.
 *
 * A connection serves one request (every reply says Connection: close):
 *
 *   READING   --a whole head; or a bad one (400, 405); or none in TW_HTTPD_MAX_HEAD bytes (431)-->  WRITING
 *   WRITING   --reply sent, then shutdown(SHUT_WR)-->  DRAINING
 *   DRAINING  --EOF from the client-->  closed
 *   any state --a socket error, or TW_HTTPD_REQUEST_TIMEOUT_MS after accept-->  closed
 *
 * At the deadline a request still READING is told 408 first, if its socket takes it. DRAINING reads and drops
 * what the client still sends, so that closing does not reset the connection (and the reply with it) while
 * the client has bytes in flight, e.g. the rest of a head that was too long. */
#include "httpd.h"

#include <errno.h>
#include <event2/listener.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "names.h"

/* Connections waiting in the kernel for accept: what is over the limit is refused anyway. */
#define HTTPD_BACKLOG 64
/* An accept that failed (out of descriptors, mostly) stops the listener this long. */
#define HTTPD_PAUSE_MS 1000
/* This many refusals in a row stop the listener for a moment, so that clients connecting faster than they are
 * refused cannot keep the loop in the listener's callback. */
#define HTTPD_REFUSALS_IN_A_ROW 64
#define HTTPD_REFUSALS_PAUSE_MS 100

typedef enum { CONN_READING, CONN_WRITING, CONN_DRAINING } ConnState;

typedef struct HttpConn HttpConn;

struct TwHttpd {
    struct event_base *base;
    struct evconnlistener *lev;
    struct event *resume; /* enables the listener again after a pause */
    char *listen;
    TwHealthFn health;
    void *arg;
    HttpConn *conns;
    int n_conns;
    int refused_in_a_row;
    bool accept_failing; /* an accept failed and was logged; the next one that works says so */
    TwLogLimit refused_log, accept_log;
};

struct HttpConn {
    HttpConn *next, *prev;
    TwHttpd *h;
    int fd;
    ConnState state;
    struct event *rd, *wr, *deadline;
    char head[TW_HTTPD_MAX_HEAD + 1];
    size_t head_len;
    /* Where the request line starts (after empty lines) and ends (its '\n'), and what the bytes read so far
     * say: each byte is looked at once however the head trickles in. */
    size_t line_start, line_end;
    bool in_request, line_has_text;
    char *out; /* the reply */
    size_t out_len, out_off;
};

static const char refused_reply[] = "HTTP/1.1 503 Service Unavailable\r\n"
                                    "Content-Type: text/plain; charset=utf-8\r\n"
                                    "Content-Length: 21\r\n"
                                    "Connection: close\r\n"
                                    "\r\n"
                                    "too many connections\n";
static const char timeout_reply[] = "HTTP/1.1 408 Request Timeout\r\n"
                                    "Content-Length: 0\r\n"
                                    "Connection: close\r\n"
                                    "\r\n";

static void conn_close(HttpConn *c)
{
    TwHttpd *h = c->h;

    event_free(c->rd);
    event_free(c->wr);
    event_free(c->deadline);
    close(c->fd);
    free(c->out);
    if (c->prev)
        c->prev->next = c->next;
    else
        h->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    h->n_conns--;
    free(c);
}

/* Best effort, on a non-blocking socket about to be closed: a client that is not reading just misses it. */
static void say_and_forget(int fd, const char *text, size_t len)
{
    ssize_t n = send(fd, text, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)n;
}

static void conn_write(HttpConn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            event_add(c->wr, NULL);
            return;
        }
        conn_close(c);
        return;
    }
    free(c->out);
    c->out = NULL;
    event_del(c->wr);
    shutdown(c->fd, SHUT_WR);
    c->state = CONN_DRAINING;
    event_add(c->rd, NULL);
}

/* Send the reply and close; a HEAD request gets the headers only (with the body's length). */
static void reply(HttpConn *c, bool head_only, int code, const char *reason, const char *type,
                  const char *headers, const char *body)
{
    size_t len = strlen(body);
    int n =
        asprintf(&c->out,
                 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n"
                 "Connection: close\r\n%s\r\n%s",
                 code, reason, type, len, headers, head_only ? "" : body);

    if (n < 0) {
        c->out = NULL;
        conn_close(c);
        return;
    }
    c->out_len = (size_t)n;
    c->out_off = 0;
    c->state = CONN_WRITING;
    event_del(c->rd);
    conn_write(c);
}

static void text_reply(HttpConn *c, bool head_only, int code, const char *reason, const char *body)
{
    reply(c, head_only, code, reason, "text/plain; charset=utf-8", "", body);
}

static void metrics_reply(HttpConn *c, bool head_only)
{
    TwHealth health = {0};
    char *text;

    c->h->health(c->h->arg, &health);
    if (!(text = tw_metrics_render(&health))) {
        text_reply(c, head_only, 500, "Internal Server Error", "out of memory\n");
        return;
    }
    reply(c, head_only, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", "", text);
    free(text);
}

static void healthz_reply(HttpConn *c, bool head_only)
{
    TwHealth health = {0};
    char body[128];
    bool ok;

    c->h->health(c->h->arg, &health);
    ok = health.pg_up && health.nats_up;
    snprintf(body, sizeof body, "%s: postgres %s, nats %s\n", ok ? "ok" : "unavailable",
             health.pg_up ? "up" : "down", health.nats_up ? "up" : "down");
    if (ok)
        text_reply(c, head_only, 200, "OK", body);
    else
        text_reply(c, head_only, 503, "Service Unavailable", body);
}

/* The request line of a whole head (line_len bytes, without its line end): "METHOD /path[?query] HTTP/1.x".
 * Only GET and HEAD of /metrics and /healthz are served; header fields are not needed and not read. */
static void answer(HttpConn *c, char *line, size_t line_len)
{
    char *method = line, *target, *version, *end;
    bool head_only;

    line[line_len] = '\0';
    if (strlen(line) != line_len || !(target = strchr(method, ' ')) || !(version = strchr(target + 1, ' ')))
        goto bad;
    *target++ = '\0';
    *version++ = '\0';
    if (strncmp(version, "HTTP/1.", 7) != 0 || version[7] < '0' || version[7] > '9' || version[8] ||
        target[0] != '/')
        goto bad;
    head_only = strcmp(method, "HEAD") == 0;
    if (!head_only && strcmp(method, "GET") != 0) {
        reply(c, false, 405, "Method Not Allowed", "text/plain; charset=utf-8", "Allow: GET, HEAD\r\n",
              "only GET and HEAD\n");
        return;
    }
    if ((end = strpbrk(target, "?#")))
        *end = '\0';
    if (strcmp(target, "/metrics") == 0)
        metrics_reply(c, head_only);
    else if (strcmp(target, "/healthz") == 0)
        healthz_reply(c, head_only);
    else
        text_reply(c, head_only, 404, "Not Found", "not found: try /metrics or /healthz\n");
    return;
bad:
    text_reply(c, false, 400, "Bad Request", "bad request\n");
}

/* Looks at n more bytes of the head: true once it is whole (request line, header lines, an empty line). Empty
 * lines before the request line are skipped (RFC 9112 2.2); a line end is "\n" or "\r\n". */
static bool head_scan(HttpConn *c, size_t n)
{
    for (size_t i = c->head_len; i < c->head_len + n; i++) {
        char b = c->head[i];

        if (!c->in_request) {
            if (b == '\r' || b == '\n') {
                c->line_start = i + 1;
                continue;
            }
            c->in_request = true;
        }
        if (b == '\n') {
            if (!c->line_has_text) {
                c->head_len = i + 1;
                return true;
            }
            if (!c->line_end)
                c->line_end = i;
            c->line_has_text = false;
        } else if (b != '\r') {
            c->line_has_text = true;
        }
    }
    c->head_len += n;
    return false;
}

static void conn_read(HttpConn *c)
{
    char sink[4096];

    /* A bounded number of reads per wake-up: a client that sends faster than we drop cannot hold the loop
     * here (the event stays readable, and the loop comes back). */
    for (int reads = 0; reads < 16; reads++) {
        ssize_t n;

        if (c->state == CONN_DRAINING)
            n = recv(c->fd, sink, sizeof sink, 0);
        else
            n = recv(c->fd, c->head + c->head_len, TW_HTTPD_MAX_HEAD - c->head_len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            /* EOF or an error: a client gone before its request was whole, or done reading the reply. */
            conn_close(c);
            return;
        }
        if (c->state == CONN_DRAINING)
            continue;
        if (head_scan(c, (size_t)n)) {
            size_t len = c->line_end - c->line_start;
            answer(c, c->head + c->line_start, len && c->head[c->line_end - 1] == '\r' ? len - 1 : len);
            return;
        }
        if (c->head_len == TW_HTTPD_MAX_HEAD) {
            char body[64];
            snprintf(body, sizeof body, "the request head is over %d bytes\n", TW_HTTPD_MAX_HEAD);
            text_reply(c, false, 431, "Request Header Fields Too Large", body);
            return;
        }
    }
}

static void rd_cb(evutil_socket_t fd, short what, void *arg)
{
    conn_read(arg);
}

static void wr_cb(evutil_socket_t fd, short what, void *arg)
{
    conn_write(arg);
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    HttpConn *c = arg;

    log_debug("metrics: a connection to %s reached its %d ms deadline while %s; closed", c->h->listen,
              TW_HTTPD_REQUEST_TIMEOUT_MS,
              c->state == CONN_READING   ? "sending its request"
              : c->state == CONN_WRITING ? "taking its reply"
                                         : "closing");
    if (c->state == CONN_READING)
        say_and_forget(c->fd, timeout_reply, sizeof timeout_reply - 1);
    conn_close(c);
}

static void conn_open(TwHttpd *h, int fd)
{
    HttpConn *c = calloc(1, sizeof *c);
    struct timeval tv = {TW_HTTPD_REQUEST_TIMEOUT_MS / 1000, (TW_HTTPD_REQUEST_TIMEOUT_MS % 1000) * 1000};

    if (c) {
        c->rd = event_new(h->base, fd, EV_READ | EV_PERSIST, rd_cb, c);
        c->wr = event_new(h->base, fd, EV_WRITE | EV_PERSIST, wr_cb, c);
        c->deadline = evtimer_new(h->base, deadline_cb, c);
    }
    if (!c || !c->rd || !c->wr || !c->deadline) {
        log_error("metrics: out of memory for a connection on %s", h->listen);
        if (c && c->rd)
            event_free(c->rd);
        if (c && c->wr)
            event_free(c->wr);
        if (c && c->deadline)
            event_free(c->deadline);
        free(c);
        close(fd);
        return;
    }
    c->h = h;
    c->fd = fd;
    c->state = CONN_READING;
    c->next = h->conns;
    if (h->conns)
        h->conns->prev = c;
    h->conns = c;
    h->n_conns++;
    evtimer_add(c->deadline, &tv);
    event_add(c->rd, NULL);
}

static void pause_accepting(TwHttpd *h, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

    evconnlistener_disable(h->lev);
    evtimer_add(h->resume, &tv);
}

static void resume_cb(evutil_socket_t fd, short what, void *arg)
{
    TwHttpd *h = arg;

    h->refused_in_a_row = 0;
    evconnlistener_enable(h->lev);
}

/* Why a connection just accepted as descriptor fd is refused, or NULL: the connection limit, or the daemon's
 * descriptors running out (fd is the lowest one free, so every one below it is in use; the last quarter of
 * the open-file limit is kept for PostgreSQL, NATS and the worker's programs). */
static const char *refusal(const TwHttpd *h, int fd, char *buf, size_t size)
{
    struct rlimit rl;

    if (h->n_conns >= TW_HTTPD_MAX_CONNECTIONS) {
        snprintf(buf, size, "%d connections open, the limit", TW_HTTPD_MAX_CONNECTIONS);
        return buf;
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (rlim_t)fd >= rl.rlim_cur - rl.rlim_cur / 4) {
        snprintf(buf, size,
                 "the daemon uses %d of its %llu descriptors; the last quarter is kept for its own work", fd,
                 (unsigned long long)rl.rlim_cur);
        return buf;
    }
    return NULL;
}

static void accept_cb(struct evconnlistener *lev, evutil_socket_t fd, struct sockaddr *sa, int len, void *arg)
{
    TwHttpd *h = arg;
    char why[160];

    if (h->accept_failing) {
        log_info("metrics: accepting connections on %s again", h->listen);
        h->accept_failing = false;
    }
    if (refusal(h, fd, why, sizeof why)) {
        tw_log_warn_limited(&h->refused_log, "metrics: refusing connections on %s: %s", h->listen, why);
        say_and_forget(fd, refused_reply, sizeof refused_reply - 1);
        close(fd);
        if (++h->refused_in_a_row >= HTTPD_REFUSALS_IN_A_ROW)
            pause_accepting(h, HTTPD_REFUSALS_PAUSE_MS);
        return;
    }
    h->refused_in_a_row = 0;
    conn_open(h, fd);
}

/* accept() failed for another reason than a connection aborted early: EMFILE, ENFILE, ENOBUFS, ENOMEM. The
 * connection stays in the kernel's queue and the listener would be woken for it at once, again and again (as
 * evhttp's was, with a warning each time): the listener pauses instead, and the failure is logged once per
 * TW_LOG_LIMIT_INTERVAL_MS at most. */
static void accept_error_cb(struct evconnlistener *lev, void *arg)
{
    TwHttpd *h = arg;
    int err = EVUTIL_SOCKET_ERROR();
    const char *why = err == EMFILE   ? " (EMFILE: the daemon is out of file descriptors)"
                      : err == ENFILE ? " (ENFILE: the system is out of file descriptors)"
                                      : "";

    tw_log_warn_limited(&h->accept_log,
                        "metrics: cannot accept connections on %s: %s%s; trying again every %d ms", h->listen,
                        strerror(err), why, HTTPD_PAUSE_MS);
    h->accept_failing = true;
    pause_accepting(h, HTTPD_PAUSE_MS);
}

/* Listen on the first address host resolves to that can be bound, as evhttp did. */
static struct evconnlistener *bind_listener(TwHttpd *h, const char *host, int port)
{
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    struct evconnlistener *lev = NULL;
    char service[16];
    int rc;

    snprintf(service, sizeof service, "%d", port);
    if ((rc = getaddrinfo(host, service, &hints, &res)) != 0) {
        log_error("metrics: cannot listen on %s: %s", h->listen, gai_strerror(rc));
        return NULL;
    }
    errno = 0;
    for (struct addrinfo *ai = res; ai && !lev; ai = ai->ai_next)
        lev = evconnlistener_new_bind(h->base, accept_cb, h,
                                      LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
                                      HTTPD_BACKLOG, ai->ai_addr, (int)ai->ai_addrlen);
    if (!lev)
        log_error("metrics: cannot listen on %s: %s", h->listen, errno ? strerror(errno) : "bind failed");
    freeaddrinfo(res);
    return lev;
}

TwHttpd *tw_httpd_new(struct event_base *base, const char *listen, TwHealthFn health, void *arg)
{
    TwHttpd *h = calloc(1, sizeof *h);
    char host[256];
    int port;

    if (!h)
        return NULL;
    h->base = base;
    h->health = health;
    h->arg = arg;
    if (!tw_listen_parse(listen, host, sizeof host, &port)) {
        log_error("metrics: '%s' is not host:port", listen);
        goto fail;
    }
    if (!(h->listen = strdup(listen)) || !(h->resume = evtimer_new(base, resume_cb, h)))
        goto fail;
    if (!(h->lev = bind_listener(h, host, port)))
        goto fail;
    evconnlistener_set_error_cb(h->lev, accept_error_cb);
    log_info("metrics: serving /metrics and /healthz on http://%s (at most %d connections, %d ms each)",
             listen, TW_HTTPD_MAX_CONNECTIONS, TW_HTTPD_REQUEST_TIMEOUT_MS);
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
    while (h->conns)
        conn_close(h->conns);
    if (h->lev)
        evconnlistener_free(h->lev);
    if (h->resume)
        event_free(h->resume);
    free(h->listen);
    free(h);
}
