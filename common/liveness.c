/* Liveness: registration, the session lock, and the poll for daemons that are gone. */
#include "liveness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "outbox.h"
#include "pgconn.h"
#include "watchdogs.h"

/* last_seen_at is for people (`turnwatch daemons`), not for judging: the lock does that. A write this rarely
 * costs nothing. */
#define LIVE_SEEN_MS 10000
/* A registration the database refused (another live session has our id) is tried again this often. */
#define LIVE_REGISTER_RETRY_MS 1000

struct TwLive {
    struct event_base *base;
    TwPg *pg;
    TwBus *bus;
    char kind[16];
    char id[128];
    char host[64];
    char pid[16];
    char incarnation[40];
    char *info;
    int grace_ms;
    int64_t grace_until_ms;
    int64_t last_register_ms;
    int64_t last_seen_ms;
    bool registered, registering, ever_up;
    struct event *poll;
    TwRule rule;
    TwLiveReclaimedCb on_reclaimed;
    void *arg;
};

static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void tw_live_daemon_id(char *buf, size_t size)
{
    char host[64] = "localhost";

    gethostname(host, sizeof host - 1);
    snprintf(buf, size, "%s:%d", host, (int)getpid());
}

static void registered_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    TwLive *l = arg;
    json_t *out, *a;
    size_t i;

    l->registering = false;
    if (err || !(out = tw_result_json(res, &err))) {
        static TwLogLimit lim;
        tw_log_warn_limited(&lim, "%s %s: could not register as alive: %s", l->kind, l->id, err);
        return;
    }
    l->registered = true;
    json_array_foreach(json_object_get(out, "actions"), i, a)
    {
        char *line = json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS);
        log_info("liveness: a process that had our id %s is gone; handed back %s", l->id, line ? line : "");
        free(line);
    }
    tw_outbox_publish(pg, l->bus, json_object_get(out, "publish"));
    log_info("liveness: registered as %s %s (lock %lld)%s", l->kind, l->id,
             (long long)json_integer_value(json_object_get(out, "daemon_no")),
             json_is_true(json_object_get(out, "was_gone")) ? "; others had judged us gone meanwhile" : "");
    json_decref(out);
}

static void do_register(TwLive *l)
{
    const char *params[] = {l->id, l->kind, l->host, l->pid, l->incarnation, l->info};

    l->registering = true;
    l->last_register_ms = mono_ms();
    tw_pg_query(l->pg, "SELECT tw.daemon_register($1, $2, $3, $4::integer, $5, $6::jsonb)", 6, params,
                registered_cb, l);
}

static void on_state(TwPg *pg, bool up, void *arg)
{
    TwLive *l = arg;

    l->registered = false;
    if (!up)
        return;
    /* After a database restart every daemon's lock was gone at once: judge nobody until they had time to
     * reconnect and take theirs back. (At the first connect there is nothing to wait for.) */
    if (l->ever_up)
        l->grace_until_ms = mono_ms() + l->grace_ms;
    l->ever_up = true;
    do_register(l);
}

static void reclaimed(TwRule *rule, int actions, void *arg)
{
    TwLive *l = arg;

    if (actions > 0 && l->on_reclaimed)
        l->on_reclaimed(l->arg);
}

static void seen_cb(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
}

static void poll_cb(evutil_socket_t fd, short what, void *arg)
{
    TwLive *l = arg;
    int64_t now = mono_ms();

    if (!tw_pg_is_up(l->pg))
        return;
    if (!l->registered) {
        if (!l->registering && now - l->last_register_ms >= LIVE_REGISTER_RETRY_MS)
            do_register(l);
        return;
    }
    if (now - l->last_seen_ms >= LIVE_SEEN_MS) {
        const char *params[] = {l->id, l->incarnation};
        l->last_seen_ms = now;
        tw_pg_query(l->pg, "SELECT tw.daemon_seen($1, $2)", 2, params, seen_cb, l);
    }
    if (now >= l->grace_until_ms)
        tw_rule_run(&l->rule, l->pg, l->bus, reclaimed, l);
}

TwLive *tw_live_new(struct event_base *base, const TwConfig *cfg, TwBus *bus, const char *kind,
                    const char *id, json_t *info, int grace_ms, TwLiveReclaimedCb on_reclaimed, void *arg)
{
    TwLive *l = calloc(1, sizeof *l);
    unsigned char rnd[8] = {0};
    char name[32];

    if (!l)
        return NULL;
    l->base = base;
    l->bus = bus;
    l->grace_ms = grace_ms;
    l->on_reclaimed = on_reclaimed;
    l->arg = arg;
    snprintf(l->kind, sizeof l->kind, "%s", kind);
    snprintf(l->id, sizeof l->id, "%s", id);
    gethostname(l->host, sizeof l->host - 1);
    snprintf(l->pid, sizeof l->pid, "%d", (int)getpid());
    /* A restarted process may get the same pid on the same host; the incarnation tells it from its
     * predecessor, whose leftovers it must hand back rather than adopt. */
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        memcpy(rnd, &ts.tv_nsec, sizeof ts.tv_nsec < sizeof rnd ? sizeof ts.tv_nsec : sizeof rnd);
    }
    for (size_t i = 0; i < sizeof rnd; i++)
        snprintf(l->incarnation + 2 * i, 3, "%02x", rnd[i]);
    l->info = json_dumps(info, JSON_COMPACT);
    snprintf(name, sizeof name, "%s/live", kind);
    if (!l->info || tw_watchdogs_fill(&l->rule, TW_RULES_LIVENESS, cfg, l->id) != 1 ||
        !(l->pg = tw_pg_new(base, cfg->pg_dsn, name)) ||
        !(l->poll = event_new(base, -1, EV_PERSIST, poll_cb, l))) {
        tw_live_free(l);
        return NULL;
    }
    tw_pg_set_keepalive(l->pg, cfg->pg_keepalive_sec);
    tw_pg_set_callbacks(l->pg, on_state, NULL, l);
    return l;
}

void tw_live_start(TwLive *l)
{
    struct timeval tv = {0, TW_LIVE_POLL_MS * 1000};

    event_add(l->poll, &tv);
    tw_pg_start(l->pg);
}

void tw_live_reconfigure(TwLive *l, json_t *info, int grace_ms)
{
    char *text = json_dumps(info, JSON_COMPACT);

    l->grace_ms = grace_ms;
    if (!text || (l->info && strcmp(text, l->info) == 0)) {
        free(text);
        return;
    }
    free(l->info);
    l->info = text;
    /* Registering again with the same incarnation only updates the row (and takes the lock it holds). */
    if (l->registered && !l->registering && tw_pg_is_up(l->pg))
        do_register(l);
}

bool tw_live_registered(const TwLive *l)
{
    return l->registered;
}

TwRule *tw_live_rule(TwLive *l)
{
    return &l->rule;
}

void tw_live_free(TwLive *l)
{
    if (!l)
        return;
    if (l->poll)
        event_free(l->poll);
    tw_pg_free(l->pg);
    free(l->info);
    free(l);
}
