/* fixture_nats.c — the fixture's nats-server and its NATS event collector. See fixture.h. */
#include "fixture_int.h"

#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <glob.h>
#include <libpq-fe.h>
#include <math.h>
#include <nats/nats.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- nats-server
 * ------------------------------------------------------------------------------------------------ */

static char *fx_nats_server_bin(void)
{
    const char *env = getenv("TW_NATS_SERVER");
    return env && *env ? fx_xstrdup(env) : fx_which("nats-server");
}

/* Stops nats-server if it runs; never fails the test (used by tw_fx_free too). */
void fx_nats_halt(TwFx *fx)
{
    if (!fx->nats)
        return;
    if (tw_fx_proc_signal(fx->nats, SIGCONT))
        kill(fx->nats->pid, SIGINT);
    if (!tw_fx_proc_wait(fx->nats, 10000, NULL))
        tw_fx_proc_kill9(fx->nats);
    fx_proc_destroy(fx->nats);
    fx->nats = NULL;
}

void tw_fx_nats_start(TwFx *fx)
{
    if (fx->nats)
        fx_fail("nats-server is already running");
    char *bin = fx_nats_server_bin();
    if (!bin)
        fx_fail("nats-server not found (install the nats-server package or set TW_NATS_SERVER)");
    bool fresh_port = fx->nats_port == 0;
    /* A freshly chosen port can be taken between our probe and the server's bind: then try another one. On a
     * restart the port must stay the same, so there is no second chance. */
    for (int attempt = 0; attempt < (fresh_port ? 3 : 1); attempt++) {
        if (fresh_port)
            fx->nats_port = fx_free_port();
        char port[16];
        snprintf(port, sizeof port, "%d", fx->nats_port);
        /* JetStream on, its store in the fixture's dir (kept across restarts): [nats] events_stream needs it.
         */
        char *store = fx_asprintf("%s/nats-js", fx->dir);
        const char *argv[] = {bin, "-a", "127.0.0.1", "-p", port, "-js", "-sd", store, NULL, NULL, NULL};
        if (fx->nats_conf) { /* flags win over the file: its TLS and authorization are what it adds */
            argv[8] = "-c";
            argv[9] = fx->nats_conf;
        }
        fx->nats = fx_proc_start(fx, "nats-server", "nats", argv);
        free(store);
        if (!fx->nats)
            fx_fail("cannot start nats-server: %s", strerror(errno));
        int64_t deadline = tw_fx_now_ms() + 10000;
        while (tw_fx_proc_alive(fx->nats) && !fx_loopback_probe(fx->nats_port, true) &&
               tw_fx_now_ms() < deadline)
            tw_fx_sleep_ms(10);
        if (tw_fx_proc_alive(fx->nats) && fx_loopback_probe(fx->nats_port, true))
            break;
        fx_nats_halt(fx);
    }
    free(bin);
    if (!fx->nats) {
        char *log_path = fx_asprintf("%s/nats.log", fx->dir);
        char *tail = fx_file_tail(log_path, 2000);
        fprintf(stderr, "fixture: nats-server did not start; %s (tail):\n%s\n", log_path, tail);
        free(tail);
        free(log_path);
        fx_fail("nats-server did not start on port %d", fx->nats_port);
    }
    free(fx->nats_url);
    fx->nats_url = fx_asprintf("nats://127.0.0.1:%d", fx->nats_port);
}

void tw_fx_nats_stop(TwFx *fx)
{
    if (!fx->nats)
        fx_fail("nats-server is not running");
    fx_nats_halt(fx);
}

void tw_fx_nats_restart(TwFx *fx)
{
    tw_fx_nats_stop(fx);
    tw_fx_nats_start(fx);
}

bool tw_fx_nats_running(const TwFx *fx)
{
    return fx->nats != NULL;
}

const char *tw_fx_nats_url(const TwFx *fx)
{
    return fx->nats_url;
}

int tw_fx_nats_port(const TwFx *fx)
{
    return fx->nats_port;
}

pid_t tw_fx_nats_pid(const TwFx *fx)
{
    return fx->nats ? fx->nats->pid : 0;
}

/* A connection that rides out server restarts: reconnects forever, every 100 ms, and (with `retry_first`)
 * also when the server is down at the first attempt. */
static natsStatus fx_nats_connect(TwFx *fx, natsConnection **nc, bool retry_first)
{
    natsOptions *opts = NULL;
    natsStatus s = natsOptions_Create(&opts);
    /* One URL, or a cluster's comma-separated list (tw_fx_use_servers). */
    char *urls = fx_xstrdup(fx->nats_url), *save = NULL;
    const char *servers[8];
    int n = 0;
    for (char *u = strtok_r(urls, ",", &save); u && n < 8; u = strtok_r(NULL, ",", &save))
        servers[n++] = u;
    if (s == NATS_OK)
        s = natsOptions_SetServers(opts, servers, n);
    if (s == NATS_OK && fx->nats_setup)
        s = fx->nats_setup(opts, fx->nats_setup_arg);
    free(urls);
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(opts, -1);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(opts, 100);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(opts, 2000);
    if (s == NATS_OK && retry_first)
        s = natsOptions_SetRetryOnFailedConnect(opts, true, NULL, NULL);
    if (s == NATS_OK) {
        s = natsConnection_Connect(nc, opts);
        if (s == NATS_NOT_YET_CONNECTED)
            s = NATS_OK;
    }
    natsOptions_Destroy(opts);
    return s;
}

bool tw_fx_nats_publish(TwFx *fx, const char *subject, const char *data)
{
    if (!fx->nats_url)
        fx_fail("nats-server was never started");
    if (!fx->pub && fx_nats_connect(fx, &fx->pub, false) != NATS_OK)
        return false;
    /* While disconnected nats.c would buffer the message and send it after reconnecting; a test asking to
     * publish into a dead server means "this one is lost". */
    if (natsConnection_Status(fx->pub) != NATS_CONN_STATUS_CONNECTED)
        return false;
    natsStatus s = natsConnection_PublishString(fx->pub, subject, data);
    if (s == NATS_OK)
        s = natsConnection_FlushTimeout(fx->pub, 2000);
    return s == NATS_OK;
}

bool tw_fx_nats_wait_echo(TwFx *fx, TwFxEvents *ev, const char *subject, const char *data, int timeout_ms)
{
    int64_t deadline = tw_fx_now_ms() + timeout_ms;
    while (tw_fx_events_count(ev, subject, NULL) == 0) {
        bool sent = tw_fx_nats_publish(fx, subject, data);
        (void)sent;
        if (!tw_fx_poll(deadline))
            return false;
    }
    return true;
}

void tw_fx_nats_set_conf(TwFx *fx, const char *conf)
{
    free(fx->nats_conf);
    fx->nats_conf = NULL;
    if (!conf)
        return;
    fx->nats_conf = fx_asprintf("%s/nats.conf", fx->dir);
    FILE *f = fopen(fx->nats_conf, "w");
    if (!f || fputs(conf, f) == EOF || fclose(f) != 0)
        fx_fail("cannot write %s: %s", fx->nats_conf, strerror(errno));
}

void tw_fx_nats_client(TwFx *fx, TwFxNatsSetup fn, void *arg)
{
    fx->nats_setup = fn;
    fx->nats_setup_arg = arg;
}

/* ---- NATS event collector
 * --------------------------------------------------------------------------------------- */

/* NATS subject matching: "*" matches one token, ">" one or more trailing tokens. */
static bool fx_subject_match(const char *pattern, const char *subject)
{
    if (!pattern)
        return true;
    while (*pattern && *subject) {
        const char *pe = strchr(pattern, '.'), *se = strchr(subject, '.');
        size_t pl = pe ? (size_t)(pe - pattern) : strlen(pattern);
        size_t sl = se ? (size_t)(se - subject) : strlen(subject);
        if (pl == 1 && pattern[0] == '>')
            return true;
        if (!(pl == 1 && pattern[0] == '*') && (pl != sl || memcmp(pattern, subject, pl) != 0))
            return false;
        if (!pe || !se)
            return !pe && !se;
        pattern = pe + 1;
        subject = se + 1;
    }
    return false;
}

static void fx_events_on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    (void)nc, (void)sub;
    TwFxEvents *ev = closure;
    FxMsg *m = fx_xmalloc(sizeof *m);
    int len = natsMsg_GetDataLength(msg);
    m->recv_ms = tw_fx_now_ms();
    m->subject = fx_xstrdup(natsMsg_GetSubject(msg));
    m->data = fx_xmalloc((size_t)len + 1);
    if (len > 0)
        memcpy(m->data, natsMsg_GetData(msg), (size_t)len);
    m->data[len] = '\0';
    m->json = json_loadb(m->data, (size_t)len, 0, NULL);
    natsMsg_Destroy(msg);
    pthread_mutex_lock(&ev->mu);
    /* Delivery is at least once (an event the relay takes while its writer is still publishing it goes out
     * twice, under one event_id): the collector keeps the first, as the contract asks of every observer. */
    const char *id = json_string_value(json_object_get(m->json, "event_id"));
    if (ev->seen && id && json_object_get(ev->seen, id)) {
        ev->duplicates++;
        pthread_mutex_unlock(&ev->mu);
        free(m->subject);
        free(m->data);
        json_decref(m->json);
        free(m);
        return;
    }
    if (ev->seen && id)
        json_object_set_new(ev->seen, id, json_true());
    if (ev->n == ev->cap) {
        ev->cap = ev->cap ? ev->cap * 2 : 64;
        ev->msgs = fx_xrealloc(ev->msgs, ev->cap * sizeof *ev->msgs);
    }
    ev->msgs[ev->n++] = m;
    pthread_cond_broadcast(&ev->cv);
    pthread_mutex_unlock(&ev->mu);
}

static TwFxEvents *fx_events_new(TwFx *fx, const char *pattern, bool once);

TwFxEvents *tw_fx_events_new(TwFx *fx, const char *pattern)
{
    return fx_events_new(fx, pattern, true);
}

TwFxEvents *tw_fx_events_new_every(TwFx *fx, const char *pattern)
{
    return fx_events_new(fx, pattern, false);
}

static TwFxEvents *fx_events_new(TwFx *fx, const char *pattern, bool once)
{
    if (!fx->nats_url)
        fx_fail("start nats-server before collecting events");
    TwFxEvents *ev = calloc(1, sizeof *ev);
    if (!ev)
        abort();
    ev->fx = fx;
    ev->seen = once ? json_object() : NULL;
    pthread_mutex_init(&ev->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ev->cv, &ca);
    pthread_condattr_destroy(&ca);
    ev->next = fx->events;
    fx->events = ev;
    natsStatus s = fx_nats_connect(fx, &ev->nc, true);
    if (s == NATS_OK)
        s = natsConnection_Subscribe(&ev->sub, ev->nc, pattern, fx_events_on_msg, ev);
    if (s == NATS_OK && natsConnection_Status(ev->nc) == NATS_CONN_STATUS_CONNECTED)
        s = natsConnection_FlushTimeout(ev->nc, 5000);
    if (s != NATS_OK)
        fx_fail("event collector on %s: %s", pattern, natsStatus_GetText(s));
    return ev;
}

static void fx_msgs_clear(TwFxEvents *ev)
{
    for (size_t i = 0; i < ev->n; i++) {
        free(ev->msgs[i]->subject);
        free(ev->msgs[i]->data);
        json_decref(ev->msgs[i]->json);
        free(ev->msgs[i]);
    }
    ev->n = 0;
}

void tw_fx_events_free(TwFxEvents *ev)
{
    if (!ev)
        return;
    for (TwFxEvents **pp = &ev->fx->events; *pp; pp = &(*pp)->next)
        if (*pp == ev) {
            *pp = ev->next;
            break;
        }
    /* Destroying the subscription first guarantees no callback runs on a freed collector. */
    if (ev->sub) {
        natsSubscription_Unsubscribe(ev->sub);
        natsSubscription_Destroy(ev->sub);
    }
    natsConnection_Destroy(ev->nc);
    pthread_mutex_lock(&ev->mu);
    fx_msgs_clear(ev);
    pthread_mutex_unlock(&ev->mu);
    free(ev->msgs);
    json_decref(ev->seen);
    pthread_cond_destroy(&ev->cv);
    pthread_mutex_destroy(&ev->mu);
    free(ev);
}

typedef struct FxMatch {
    const char *subject, *substr;
    TwFxEventPred pred;
    void *arg;
} FxMatch;

static bool fx_match(const FxMatch *mt, const FxMsg *m)
{
    if (mt->pred)
        return mt->pred(m->subject, m->json, mt->arg);
    return fx_subject_match(mt->subject, m->subject) && (!mt->substr || strstr(m->data, mt->substr));
}

/* Index of the k-th match (0-based) or -1; with k == SIZE_MAX counts instead (returned in *count). Lock held.
 */
static ssize_t fx_find(TwFxEvents *ev, const FxMatch *mt, size_t k, size_t *count)
{
    size_t seen = 0;
    for (size_t i = 0; i < ev->n; i++)
        if (fx_match(mt, ev->msgs[i]) && seen++ == k)
            return (ssize_t)i;
    if (count)
        *count = seen;
    return -1;
}

static size_t fx_events_count(TwFxEvents *ev, const FxMatch *mt)
{
    size_t n = 0;
    pthread_mutex_lock(&ev->mu);
    fx_find(ev, mt, SIZE_MAX, &n);
    pthread_mutex_unlock(&ev->mu);
    return n;
}

static bool fx_events_wait(TwFxEvents *ev, const FxMatch *mt, size_t n, int timeout_ms)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L)
        deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&ev->mu);
    size_t have = 0;
    int rc = 0;
    for (;;) {
        fx_find(ev, mt, SIZE_MAX, &have);
        if (have >= n || rc == ETIMEDOUT)
            break;
        rc = pthread_cond_timedwait(&ev->cv, &ev->mu, &deadline);
    }
    pthread_mutex_unlock(&ev->mu);
    return have >= n;
}

static json_t *fx_events_get(TwFxEvents *ev, const FxMatch *mt, size_t k, const char **subject_out,
                             int64_t *recv_ms)
{
    json_t *j = NULL;
    pthread_mutex_lock(&ev->mu);
    ssize_t i = fx_find(ev, mt, k, NULL);
    if (i >= 0) {
        j = json_incref(ev->msgs[i]->json);
        if (subject_out)
            *subject_out = ev->msgs[i]->subject;
        if (recv_ms)
            *recv_ms = ev->msgs[i]->recv_ms;
    }
    pthread_mutex_unlock(&ev->mu);
    return j;
}

size_t tw_fx_events_count(TwFxEvents *ev, const char *subject, const char *substr)
{
    return fx_events_count(ev, &(FxMatch){.subject = subject, .substr = substr});
}

size_t tw_fx_events_count_if(TwFxEvents *ev, TwFxEventPred pred, void *arg)
{
    return fx_events_count(ev, &(FxMatch){.pred = pred, .arg = arg});
}

bool tw_fx_events_wait(TwFxEvents *ev, const char *subject, const char *substr, size_t n, int timeout_ms)
{
    return fx_events_wait(ev, &(FxMatch){.subject = subject, .substr = substr}, n, timeout_ms);
}

bool tw_fx_events_wait_if(TwFxEvents *ev, TwFxEventPred pred, void *arg, size_t n, int timeout_ms)
{
    return fx_events_wait(ev, &(FxMatch){.pred = pred, .arg = arg}, n, timeout_ms);
}

json_t *tw_fx_events_get(TwFxEvents *ev, const char *subject, const char *substr, size_t k,
                         const char **subject_out, int64_t *recv_ms)
{
    return fx_events_get(ev, &(FxMatch){.subject = subject, .substr = substr}, k, subject_out, recv_ms);
}

json_t *tw_fx_events_get_if(TwFxEvents *ev, TwFxEventPred pred, void *arg, size_t k, const char **subject_out,
                            int64_t *recv_ms)
{
    return fx_events_get(ev, &(FxMatch){.pred = pred, .arg = arg}, k, subject_out, recv_ms);
}

void tw_fx_events_clear(TwFxEvents *ev)
{
    pthread_mutex_lock(&ev->mu);
    fx_msgs_clear(ev);
    pthread_mutex_unlock(&ev->mu);
}

void tw_fx_events_dump(TwFxEvents *ev)
{
    pthread_mutex_lock(&ev->mu);
    fprintf(stderr, "fixture: %zu event(s) collected:\n", ev->n);
    for (size_t i = 0; i < ev->n; i++)
        fprintf(stderr, "  [%zu] +%lldms %s %s\n", i,
                (long long)(ev->msgs[i]->recv_ms - ev->msgs[0]->recv_ms), ev->msgs[i]->subject,
                ev->msgs[i]->data);
    pthread_mutex_unlock(&ev->mu);
}
