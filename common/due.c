/* Due-time firing of watchdog rules: one timer for the earliest due time the database reports. */
#include "due.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"

/* Questions to the database are spaced by at least this much: a burst of wake-ups (one per deadline other
 * daemons create) costs one query per spacing, and a deadline is never shorter than a second. */
#define DUE_QUERY_SPACING_MS 5
/* A rule whose due time stays in the past although its run did nothing (a row another daemon holds, an item
 * it must skip) is held back, doubling from the first to the second figure, so that it never spins. The hold
 * is the rule's, not the item's: every later item of the rule waits behind it, so it stays short (a rule that
 * can never act on its earliest item costs four cheap runs a second). */
#define DUE_BACKOFF_MIN_MS 25
#define DUE_BACKOFF_MAX_MS 250
/* A rule whose run failed (a statement timeout, a lock it waited for too long, a defect in its SQL) is held
 * the same way, up to this: a rule that fails every time costs one run a second, not one per round trip (a
 * broken 2.2 once ran 184 times a second). */
#define DUE_FAIL_BACKOFF_MAX_MS 1000
/* Fire this long after the due time: the database's "now" must have passed it for the rule's condition
 * (strictly older than now() - interval) to hold, and libevent rounds its timeouts to milliseconds. */
#define DUE_SLACK_MS 1
/* Parameters of the next-due statement: every due term's, one after the other. */
#define TW_DUE_MAX_PARAMS 32

/* When a rule may run, kept here beside the rule (TwRule is the runner's: what to run, and its counters). */
typedef struct DueSlot {
    int64_t due_ms;        /* monotonic ms when next due, -1 when nothing is */
    int64_t hold_until_ms; /* not before this (a due time that stayed in the past with nothing to do) */
    int64_t last_run_ms;   /* when its last run started */
    int last_actions;      /* what that run did (-1: it failed) */
    int backoff_ms;
} DueSlot;

struct TwDue {
    struct event_base *base;
    TwPgPool *pool;
    TwBus *bus;
    TwDueConf conf;
    DueSlot *slots; /* one per rule */
    char *next_sql; /* SELECT tw.ms_until(tw.due_x($1::integer)), ...: a column per due-timed rule */
    int next_nparams;
    struct event *timer; /* the earliest due time */
    struct event *sweep; /* the safety sweep, persistent */
    struct event *ask;   /* a spaced question */
    int64_t armed_ms;    /* monotonic ms the timer fires at, -1 when not armed */
    int64_t last_ask_ms;
    int64_t grace_until_ms;
    int running;      /* rule runs in flight from the current batch */
    unsigned ever_up; /* the pool's connections that were ever up, a bit each */
    bool asking, ask_again, stopped;
};

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void ask(TwDue *d);

/* When a rule may run next: its due time, no earlier than its hold and, for heartbeat-judged rules, the
 * grace. -1 when it is not due at all. */
static int64_t eligible_at(const TwDue *d, int i)
{
    const DueSlot *sl = &d->slots[i];
    int64_t at = sl->due_ms;

    if (at < 0)
        return -1;
    if (sl->hold_until_ms > at)
        at = sl->hold_until_ms;
    if (d->conf.rules[i].heartbeat_judged && d->grace_until_ms > at)
        at = d->grace_until_ms;
    return at;
}

static void arm(TwDue *d)
{
    int64_t first = -1, now = now_ms();

    for (int i = 0; i < d->conf.n_rules; i++) {
        int64_t at = eligible_at(d, i);
        if (at >= 0 && (first < 0 || at < first))
            first = at;
    }
    evtimer_del(d->timer);
    d->armed_ms = first;
    if (first < 0 || d->stopped)
        return;
    int64_t in = first - now;
    if (in < 0)
        in = 0;
    log_debug("%s watchdogs: next rule due in %lld ms", d->conf.who, (long long)in);
    struct timeval tv = {(time_t)(in / 1000), (suseconds_t)((in % 1000) * 1000)};
    evtimer_add(d->timer, &tv);
}

static void rule_done(TwRule *r, int actions, void *arg)
{
    TwDue *d = arg;
    DueSlot *sl = &d->slots[r - d->conf.rules];

    /* Of a rule's concurrent runs: the actions of all, or -1 when one failed and none acted. */
    if (actions > 0)
        sl->last_actions = (sl->last_actions > 0 ? sl->last_actions : 0) + actions;
    else if (actions < 0 && sl->last_actions == 0)
        sl->last_actions = -1;
    if (actions > 0) {
        sl->backoff_ms = 0;
        if (d->conf.on_acted)
            d->conf.on_acted(d->conf.arg);
    }
    if (--d->running == 0)
        ask(d); /* after each batch: what is due next? */
}

/* Run the rules that are due (all of them for the sweep), each at most once at a time (a parallel rule: as
 * many runs as it takes, on connections of their own). */
static void run_rules(TwDue *d, bool all)
{
    int64_t now = now_ms();

    if (d->stopped || !tw_pgpool_any_up(d->pool))
        return;
    for (int i = 0; i < d->conf.n_rules; i++) {
        TwRule *r = &d->conf.rules[i];
        int64_t at = eligible_at(d, i);
        if (r->heartbeat_judged && now < d->grace_until_ms)
            continue;
        if (!all && (at < 0 || at > now))
            continue;
        /* A rule that shares its items between concurrent runs gets one run per connection (each its own). */
        for (int k = 0; k < r->parallel && k < d->pool->n; k++) {
            if (!tw_rule_run(r, tw_pgpool_pick(d->pool), d->bus, rule_done, d))
                break;
            if (k == 0)
                d->slots[i].last_actions = 0; /* the runs' sum, rule_done */
            d->running++;
            d->slots[i].last_run_ms = now;
            d->slots[i].due_ms = -1; /* until the next answer */
        }
    }
    if (d->running == 0)
        ask(d);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    TwDue *d = arg;

    log_debug("%s watchdogs: timer fired %lld ms after its time", d->conf.who,
              (long long)(now_ms() - d->armed_ms));
    d->armed_ms = -1;
    run_rules(d, false);
}

static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    tw_due_sweep(arg);
}

void tw_due_sweep(TwDue *d)
{
    run_rules(d, true);
}

/* The statement that asks every due term of the rules at once, a column each (NULL: nothing waits), and how
 * many parameters it takes: each rule's first due_nparams, one rule after the other. */
static char *next_due_sql(const TwRule *rules, int n, int *nparams)
{
    char *sql = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&sql, &size);
    int k = 0, terms = 0;

    if (!f)
        return NULL;
    fputs("SELECT", f);
    for (int i = 0; i < n; i++) {
        if (!rules[i].due)
            continue;
        fprintf(f, "%s tw.ms_until(%s(", terms++ ? "," : "", rules[i].due);
        for (int j = 0; j < rules[i].due_nparams; j++)
            fprintf(f, "%s$%d::integer", j ? ", " : "", ++k);
        fputs("))", f);
    }
    if (fclose(f) != 0) {
        free(sql);
        return NULL;
    }
    *nparams = k;
    return sql;
}

static void answered(TwPg *pg, const PGresult *res, const char *err, void *arg)
{
    TwDue *d = arg;
    int64_t now = now_ms();
    int col = 0;

    d->asking = false;
    if (!err && (!res || PQntuples(res) != 1))
        err = "empty result";
    if (err) {
        static TwLogLimit lim;
        tw_pg_log_failure(&lim, res, "next due time", err);
        return; /* the sweep, or the reconnect, asks again */
    }
    for (int i = 0; i < d->conf.n_rules; i++) {
        TwRule *r = &d->conf.rules[i];
        DueSlot *sl = &d->slots[i];
        int c = r->due ? col++ : -1;
        if (c < 0 || c >= PQnfields(res) || PQgetisnull(res, 0, c)) {
            sl->due_ms = -1;
            sl->backoff_ms = 0;
            continue;
        }
        int64_t in = strtoll(PQgetvalue(res, 0, c), NULL, 10); /* negative: overdue by that much */
        /* It was due already when it last ran, and that run did nothing: whatever is due cannot be acted on
         * yet (a row another daemon holds, an item to skip later). Hold it back rather than spin. */
        if (now + in < sl->last_run_ms && sl->last_actions <= 0 && r->running == 0) {
            int max = sl->last_actions < 0 ? DUE_FAIL_BACKOFF_MAX_MS : DUE_BACKOFF_MAX_MS;
            sl->backoff_ms = sl->backoff_ms ? sl->backoff_ms * 2 : DUE_BACKOFF_MIN_MS;
            if (sl->backoff_ms > max)
                sl->backoff_ms = max;
            log_debug("%s watchdogs: rule %s is due but %s; held %d ms", d->conf.who, r->name,
                      sl->last_actions < 0 ? "failed" : "did nothing", sl->backoff_ms);
            sl->hold_until_ms = now + sl->backoff_ms;
        } else if (in > 0) {
            sl->backoff_ms = 0;
        }
        sl->due_ms = now + in + DUE_SLACK_MS;
    }
    if (d->ask_again) {
        d->ask_again = false;
        ask(d);
    }
    arm(d);
}

static void ask_now(TwDue *d)
{
    const char *params[TW_DUE_MAX_PARAMS];
    TwPg *pg;
    int k = 0;

    if (d->stopped || !(pg = tw_pgpool_pick(d->pool)) || !tw_pg_is_up(pg))
        return;
    /* The rules' parameters as they are now: a reload has updated them (tw_rules_update_params). */
    for (int i = 0; i < d->conf.n_rules; i++)
        for (int j = 0; j < d->conf.rules[i].due_nparams && k < TW_DUE_MAX_PARAMS; j++)
            params[k++] = d->conf.rules[i].params[j];
    d->asking = true;
    d->last_ask_ms = now_ms();
    tw_pg_query(pg, d->next_sql, k, params, answered, d);
}

static void ask_cb(evutil_socket_t fd, short what, void *arg)
{
    TwDue *d = arg;

    if (d->asking)
        d->ask_again = true;
    else
        ask_now(d);
}

static void ask(TwDue *d)
{
    int64_t since = now_ms() - d->last_ask_ms;

    if (d->asking) {
        d->ask_again = true;
        return;
    }
    if (evtimer_pending(d->ask, NULL))
        return;
    if (since >= DUE_QUERY_SPACING_MS) {
        ask_now(d);
        return;
    }
    struct timeval tv = {0, (suseconds_t)((DUE_QUERY_SPACING_MS - since) * 1000)};
    evtimer_add(d->ask, &tv);
}

TwDue *tw_due_new(struct event_base *base, TwPgPool *pool, TwBus *bus, const TwDueConf *conf)
{
    TwDue *d = calloc(1, sizeof *d);

    if (!d)
        return NULL;
    d->base = base;
    d->pool = pool;
    d->bus = bus;
    d->conf = *conf;
    d->armed_ms = -1;
    d->last_ask_ms = -DUE_QUERY_SPACING_MS;
    if (!(d->slots = calloc((size_t)conf->n_rules, sizeof *d->slots)) ||
        !(d->next_sql = next_due_sql(conf->rules, conf->n_rules, &d->next_nparams)) ||
        d->next_nparams > TW_DUE_MAX_PARAMS) {
        tw_due_free(d);
        return NULL;
    }
    for (int i = 0; i < conf->n_rules; i++)
        d->slots[i].due_ms = -1;
    d->timer = evtimer_new(base, timer_cb, d);
    d->sweep = event_new(base, -1, EV_PERSIST, sweep_cb, d);
    d->ask = evtimer_new(base, ask_cb, d);
    if (!d->timer || !d->sweep || !d->ask) {
        tw_due_free(d);
        return NULL;
    }
    return d;
}

void tw_due_start(TwDue *d)
{
    struct timeval sweep = {d->conf.sweep_sec, 0};

    event_add(d->sweep, &sweep);
    ask(d);
}

void tw_due_wake(TwDue *d)
{
    if (!d->stopped)
        ask(d);
}

void tw_due_expect(TwDue *d, const char *key, int64_t in_ms)
{
    int64_t at = now_ms() + (in_ms > 0 ? in_ms : 0);

    if (d->stopped)
        return;
    for (int i = 0; i < d->conf.n_rules; i++) {
        DueSlot *sl = &d->slots[i];
        if (!d->conf.rules[i].key || strcmp(d->conf.rules[i].key, key) != 0)
            continue;
        if (sl->due_ms < 0 || at < sl->due_ms) {
            sl->due_ms = at;
            arm(d);
        }
        return;
    }
    ask(d);
}

void tw_due_pg_up(TwDue *d, const TwPg *pg)
{
    unsigned bit = 0;

    for (int i = 0; i < d->pool->n; i++)
        if (d->pool->conns[i] == pg)
            bit = 1u << i;
    /* Only a reconnect needs the grace: at the first connect the others' heartbeats are as fresh as ever. */
    if (d->ever_up & bit)
        d->grace_until_ms = now_ms() + d->conf.grace_ms;
    d->ever_up |= bit;
    if (!d->stopped)
        ask(d);
}

void tw_due_reconfigure(TwDue *d, const TwDueConf *conf)
{
    bool sweep_changed = conf->sweep_sec != d->conf.sweep_sec;

    d->conf.sweep_sec = conf->sweep_sec;
    d->conf.grace_ms = conf->grace_ms;
    if (d->stopped)
        return;
    if (sweep_changed && event_pending(d->sweep, EV_TIMEOUT, NULL)) {
        struct timeval sweep = {d->conf.sweep_sec, 0};
        event_del(d->sweep);
        event_add(d->sweep, &sweep);
    }
    ask(d);
}

void tw_due_stop(TwDue *d)
{
    d->stopped = true;
    evtimer_del(d->timer);
    evtimer_del(d->ask);
    event_del(d->sweep);
}

long tw_due_armed_in_ms(const TwDue *d)
{
    return d->armed_ms < 0 ? -1 : (long)(d->armed_ms - now_ms());
}

void tw_due_free(TwDue *d)
{
    if (!d)
        return;
    if (d->timer)
        event_free(d->timer);
    if (d->sweep)
        event_free(d->sweep);
    if (d->ask)
        event_free(d->ask);
    free(d->slots);
    free(d->next_sql);
    free(d);
}

int tw_due_grace_ms(const TwConfig *cfg)
{
    return cfg->worker.heartbeat_sec * 1000 + TW_PG_RETRY_MAX_MS + 1000;
}

void tw_due_wake_peers(TwBus *bus, const char *kind)
{
    char subject[64];
    json_t *data = json_pack("{s:s,s:s}", "target", kind, "reason", "deadline");
    char *text = json_dumps(data, JSON_COMPACT);

    snprintf(subject, sizeof subject, "cmd.%s.wakeup", kind);
    if (text)
        tw_bus_publish(bus, subject, text, strlen(text));
    free(text);
    json_decref(data);
}
