/* The metrics registry and its Prometheus text exposition. */
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "names.h"
#include "tw_build.h"

/* Step and tool call durations in seconds: from a fast tool to the longest step limits people set. */
static const double dur_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,   2.5,
                                    5,     10,   30,    60,   120, 300,  600, 1800};
#define N_DUR (sizeof dur_bounds / sizeof dur_bounds[0])

typedef struct Series {
    char *lv[3];
    long long value;             /* a counter */
    long long bucket[N_DUR + 1]; /* a histogram: per bucket (not cumulative), the last is above every bound */
    long long count;
    double sum;
} Series;

typedef struct Family {
    const char *name, *help;
    bool histogram;
    int nlabels;
    const char *labels[3];
    Series *series;
    size_t n, cap;
    bool overflow_logged;
} Family;

typedef struct RuleSet {
    const TwRule *rules;
    int n;
} RuleSet;

static struct {
    char daemon[64];
    char **agents, **tools;
    size_t n_agents, n_tools;
    Family turns, steps, calls;
    RuleSet *rule_sets;
    size_t n_rule_sets;
    int reload;     /* -1: no reload yet, 0: the last one was refused, 1: applied */
    json_t *limits; /* flow control: tw.limits_metrics()'s last answer (a PMO's), or NULL */
} reg = {.reload = -1};

static void families_init(void)
{
    reg.turns =
        (Family){.name = "turnwatch_turns_ended_total",
                 .help = "Turns this daemon ended (its transaction wrote the final event), by agent profile, "
                         "final status and error code.",
                 .nlabels = 3,
                 .labels = {"agent", "status", "error"}};
    reg.steps = (Family){.name = "turnwatch_step_duration_seconds",
                         .help = "Run time of the agent steps this worker ran, by agent profile.",
                         .histogram = true,
                         .nlabels = 1,
                         .labels = {"agent"}};
    reg.calls = (Family){.name = "turnwatch_tool_call_duration_seconds",
                         .help = "Run time of the tool programs this worker ran, by tool and result status.",
                         .histogram = true,
                         .nlabels = 2,
                         .labels = {"tool", "status"}};
}

static void family_free(Family *f)
{
    for (size_t i = 0; i < f->n; i++)
        for (int k = 0; k < f->nlabels; k++)
            free(f->series[i].lv[k]);
    free(f->series);
    f->series = NULL;
    f->n = f->cap = 0;
}

static void names_free(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

void tw_metrics_reset(void)
{
    family_free(&reg.turns);
    family_free(&reg.steps);
    family_free(&reg.calls);
    names_free(reg.agents, reg.n_agents);
    names_free(reg.tools, reg.n_tools);
    reg.agents = reg.tools = NULL;
    reg.n_agents = reg.n_tools = 0;
    free(reg.rule_sets);
    reg.rule_sets = NULL;
    reg.n_rule_sets = 0;
    reg.reload = -1;
    reg.daemon[0] = '\0';
    json_decref(reg.limits);
    reg.limits = NULL;
}

void tw_metrics_init(const char *daemon)
{
    tw_metrics_reset();
    families_init();
    snprintf(reg.daemon, sizeof reg.daemon, "%s", daemon);
}

static bool in_set(char **names, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0)
            return true;
    return false;
}

static void learn(char ***names, size_t *n, const char *name)
{
    char **g;

    if (in_set(*names, *n, name) || !(g = realloc(*names, (*n + 1) * sizeof *g)))
        return;
    *names = g;
    if ((g[*n] = strdup(name)))
        (*n)++;
}

void tw_metrics_learn_names(const TwConfig *cfg)
{
    if (!reg.turns.name)
        families_init();
    for (size_t i = 0; i < cfg->n_agents; i++)
        learn(&reg.agents, &reg.n_agents, cfg->agents[i].name);
    for (size_t i = 0; i < cfg->n_tools; i++)
        learn(&reg.tools, &reg.n_tools, cfg->tools[i].name);
}

static const char *one_of(const char *v, const char *const *allowed)
{
    for (; v && *allowed; allowed++)
        if (strcmp(v, *allowed) == 0)
            return v;
    return "other";
}

/* An error code: lower-case letters, digits and '_' (what the daemons and the SQL write); "" for none. */
static const char *error_label(const char *e)
{
    size_t n;

    if (!e || !*e)
        return "";
    n = strlen(e);
    if (n > TW_NAME_MAX)
        return "other";
    for (size_t i = 0; i < n; i++)
        if (!((e[i] >= 'a' && e[i] <= 'z') || (e[i] >= '0' && e[i] <= '9') || e[i] == '_'))
            return "other";
    return e;
}

/* The series with these label values, created when new. A full family counts the rest in one series whose
 * labels are all "other" (the one series allowed past the limit). */
static Series *series_get(Family *f, const char *const *lv)
{
    static const char *const others[3] = {"other", "other", "other"};
    Series *s;

    if (!f->name)
        families_init();
    for (size_t i = 0; i < f->n; i++) {
        int k = 0;
        while (k < f->nlabels && strcmp(f->series[i].lv[k], lv[k]) == 0)
            k++;
        if (k == f->nlabels)
            return &f->series[i];
    }
    if (f->n >= TW_METRICS_MAX_SERIES && lv != others) {
        if (!f->overflow_logged)
            log_warn("metrics: %s has %d series; further label values are counted as \"other\"", f->name,
                     TW_METRICS_MAX_SERIES);
        f->overflow_logged = true;
        return series_get(f, others);
    }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        Series *g = realloc(f->series, cap * sizeof *g);
        if (!g)
            return NULL;
        f->series = g;
        f->cap = cap;
    }
    s = &f->series[f->n];
    memset(s, 0, sizeof *s);
    for (int k = 0; k < f->nlabels; k++)
        if (!(s->lv[k] = strdup(lv[k]))) {
            while (k--)
                free(s->lv[k]);
            return NULL;
        }
    f->n++;
    return s;
}

static void observe(Series *s, double seconds)
{
    size_t b = 0;

    if (!s)
        return;
    if (seconds < 0)
        seconds = 0;
    while (b < N_DUR && seconds > dur_bounds[b])
        b++;
    s->bucket[b]++;
    s->count++;
    s->sum += seconds;
}

void tw_metrics_turn_ended(const char *agent, const char *status, const char *error)
{
    static const char *const statuses[] = {"done", "failed", "timeout", "cancelled", NULL};
    const char *lv[3] = {agent && in_set(reg.agents, reg.n_agents, agent) ? agent : "other",
                         one_of(status, statuses), error_label(error)};
    Series *s = series_get(&reg.turns, lv);

    if (s)
        s->value++;
}

void tw_metrics_count_final_events(json_t *items)
{
    size_t i;
    json_t *it;

    json_array_foreach(items, i, it)
    {
        const char *subject = json_string_value(json_object_get(it, "subject"));
        const char *text = json_string_value(json_object_get(it, "text"));
        size_t len = subject ? strlen(subject) : 0;
        if (!text || !json_object_get(it, "event_id") || len < 15 ||
            strncmp(subject, "evt.agent.", 10) != 0 || strcmp(subject + len - 5, ".task") != 0)
            continue;
        /* One parse per ended turn; an integer wider than 64 bits in it must not lose the count. */
        json_t *data = json_loads(text, JSON_DECODE_INT_AS_REAL, NULL);
        /* The profile names the program (and is bounded by the config); before profiles, the agent did. */
        const char *agent = json_string_value(json_object_get(data, "profile"));
        if (!agent)
            agent = json_string_value(json_object_get(data, "agent"));
        tw_metrics_turn_ended(agent, json_string_value(json_object_get(data, "status")),
                              json_string_value(json_object_get(data, "error")));
        json_decref(data);
    }
}

void tw_metrics_step(const char *agent, double seconds)
{
    const char *lv[1] = {agent && in_set(reg.agents, reg.n_agents, agent) ? agent : "other"};

    observe(series_get(&reg.steps, lv), seconds);
}

void tw_metrics_tool_call(const char *tool, const char *status, double seconds)
{
    static const char *const statuses[] = {"ok", "error", "timeout", NULL};
    const char *lv[2] = {tool && in_set(reg.tools, reg.n_tools, tool) ? tool : "other",
                         one_of(status, statuses)};

    observe(series_get(&reg.calls, lv), seconds);
}

void tw_metrics_watch_rules(const TwRule *rules, int n)
{
    RuleSet *g = realloc(reg.rule_sets, (reg.n_rule_sets + 1) * sizeof *g);

    if (!g)
        return;
    reg.rule_sets = g;
    g[reg.n_rule_sets++] = (RuleSet){rules, n};
}

void tw_metrics_forget_rules(void)
{
    free(reg.rule_sets);
    reg.rule_sets = NULL;
    reg.n_rule_sets = 0;
}

void tw_metrics_set_limits(json_t *limits)
{
    json_decref(reg.limits);
    reg.limits = json_is_array(limits) ? limits : NULL;
    if (!reg.limits)
        json_decref(limits);
}

void tw_metrics_reload_result(bool ok)
{
    reg.reload = ok;
}

/* ---- exposition
 * ------------------------------------------------------------------------------------------------- */

typedef struct Buf {
    char *s;
    size_t len, cap;
    bool oom;
} Buf;

static void put(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(Buf *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (b->oom)
        return;
    for (;;) {
        va_start(ap, fmt);
        n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap ? b->cap : 4096) * 2;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *g = realloc(b->s, cap);
        if (!g) {
            b->oom = true;
            return;
        }
        b->s = g;
        b->cap = cap;
    }
}

/* A label value: backslash, double quote and newline escaped, as the text format wants. */
static void put_value(Buf *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            put(b, "\\%c", *v);
        else if (*v == '\n')
            put(b, "\\n");
        else
            put(b, "%c", *v);
    }
}

/* {a="x",b="y"[,le="…"]} */
static void put_labels(Buf *b, const Family *f, const Series *s, const char *le)
{
    if (f->nlabels == 0 && !le)
        return;
    put(b, "{");
    for (int k = 0; k < f->nlabels; k++) {
        put(b, "%s%s=\"", k ? "," : "", f->labels[k]);
        put_value(b, s->lv[k]);
        put(b, "\"");
    }
    if (le)
        put(b, "%sle=\"%s\"", f->nlabels ? "," : "", le);
    put(b, "}");
}

static void put_head(Buf *b, const char *name, const char *type, const char *help)
{
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void put_family(Buf *b, const Family *f)
{
    put_head(b, f->name, f->histogram ? "histogram" : "counter", f->help);
    for (size_t i = 0; i < f->n; i++) {
        const Series *s = &f->series[i];
        if (!f->histogram) {
            put(b, "%s", f->name);
            put_labels(b, f, s, NULL);
            put(b, " %lld\n", s->value);
            continue;
        }
        long long cum = 0;
        for (size_t k = 0; k <= N_DUR; k++) {
            char le[32];
            cum += s->bucket[k];
            if (k < N_DUR)
                snprintf(le, sizeof le, "%g", dur_bounds[k]);
            else
                snprintf(le, sizeof le, "+Inf");
            put(b, "%s_bucket", f->name);
            put_labels(b, f, s, le);
            put(b, " %lld\n", cum);
        }
        put(b, "%s_sum", f->name);
        put_labels(b, f, s, NULL);
        put(b, " %.6f\n%s_count", s->sum, f->name);
        put_labels(b, f, s, NULL);
        put(b, " %lld\n", s->count);
    }
}

static void put_rule_name(Buf *b, const char *metric, const TwRule *r, const char *le)
{
    put(b, "%s{rule=\"", metric);
    put_value(b, r->name);
    if (le)
        put(b, "\",le=\"%s\"} ", le);
    else
        put(b, "\"} ");
}

static void put_rules(Buf *b)
{
    put_head(b, "turnwatch_watchdog_actions_total", "counter",
             "Actions of this daemon's watchdog rules (one per turn, item or daemon acted on), by rule.");
    for (size_t i = 0; i < reg.n_rule_sets; i++)
        for (int k = 0; k < reg.rule_sets[i].n; k++) {
            put_rule_name(b, "turnwatch_watchdog_actions_total", &reg.rule_sets[i].rules[k], NULL);
            put(b, "%ld\n", reg.rule_sets[i].rules[k].actions);
        }
    put_head(b, "turnwatch_deadline_lateness_seconds", "histogram",
             "How long after its due time (database clock) each watchdog action happened, by rule.");
    for (size_t i = 0; i < reg.n_rule_sets; i++)
        for (int k = 0; k < reg.rule_sets[i].n; k++) {
            const TwRule *r = &reg.rule_sets[i].rules[k];
            const TwLateness *l = &r->lateness;
            long long cum = 0;
            for (int j = 0; j < TW_LATE_BUCKETS; j++) {
                char le[32];
                cum += l->bucket[j];
                if (j < TW_LATE_BUCKETS - 1)
                    snprintf(le, sizeof le, "%g", tw_late_bounds_ms[j] / 1000.0);
                else
                    snprintf(le, sizeof le, "+Inf");
                put_rule_name(b, "turnwatch_deadline_lateness_seconds_bucket", r, le);
                put(b, "%lld\n", cum);
            }
            put_rule_name(b, "turnwatch_deadline_lateness_seconds_sum", r, NULL);
            put(b, "%.3f\n", (double)l->sum_ms / 1000.0);
            put_rule_name(b, "turnwatch_deadline_lateness_seconds_count", r, NULL);
            put(b, "%ld\n", l->count);
        }
}

/* Flow control's gauges and wait histogram, as tw.limits_metrics() last gave them. */
static void put_limits(Buf *b)
{
    json_t *l;
    size_t i;

    if (!reg.limits)
        return;
    put_head(b, "turnwatch_limit_in_use", "gauge", "Tool calls holding the limit now (flow control).");
    json_array_foreach(reg.limits, i, l)
    {
        put(b, "turnwatch_limit_in_use{limit=\"");
        put_value(b, json_string_value(json_object_get(l, "limit")));
        put(b, "\"} %lld\n", (long long)json_integer_value(json_object_get(l, "in_use")));
    }
    put_head(b, "turnwatch_limit_waiting", "gauge", "Tool calls waiting for the limit now (flow control).");
    json_array_foreach(reg.limits, i, l)
    {
        put(b, "turnwatch_limit_waiting{limit=\"");
        put_value(b, json_string_value(json_object_get(l, "limit")));
        put(b, "\"} %lld\n", (long long)json_integer_value(json_object_get(l, "waiting")));
    }
    put_head(b, "turnwatch_limit_wait_seconds", "histogram",
             "How long the calls that got the limit waited for it (flow control).");
    json_array_foreach(reg.limits, i, l)
    {
        const char *name = json_string_value(json_object_get(l, "limit"));
        json_t *bounds = json_object_get(l, "bounds"), *buckets = json_object_get(l, "buckets");
        for (size_t k = 0; k < json_array_size(buckets); k++) {
            put(b, "turnwatch_limit_wait_seconds_bucket{limit=\"");
            put_value(b, name);
            if (k < json_array_size(bounds))
                put(b, "\",le=\"%g\"}", json_number_value(json_array_get(bounds, k)));
            else
                put(b, "\",le=\"+Inf\"}");
            put(b, " %lld\n", (long long)json_number_value(json_array_get(buckets, k)));
        }
        put(b, "turnwatch_limit_wait_seconds_sum{limit=\"");
        put_value(b, name);
        put(b, "\"} %.6f\n", json_number_value(json_object_get(l, "sum")));
        put(b, "turnwatch_limit_wait_seconds_count{limit=\"");
        put_value(b, name);
        put(b, "\"} %lld\n", (long long)json_number_value(json_object_get(l, "count")));
    }
}

char *tw_metrics_render(const TwHealth *h)
{
    Buf b = {0};

    if (!reg.turns.name)
        families_init();
    put_family(&b, &reg.turns);
    put_rules(&b);
    put_family(&b, &reg.steps);
    put_family(&b, &reg.calls);
    put_limits(&b);
    put_head(&b, "turnwatch_postgres_up", "gauge",
             "1 when every PostgreSQL connection of this daemon is up, else 0.");
    put(&b, "turnwatch_postgres_up %d\n", h && h->pg_up);
    put_head(&b, "turnwatch_nats_up", "gauge", "1 when this daemon's NATS connection is up, else 0.");
    put(&b, "turnwatch_nats_up %d\n", h && h->nats_up);
    if (reg.reload >= 0) {
        put_head(&b, "turnwatch_config_last_reload_successful", "gauge",
                 "1 when the last SIGHUP reload applied the file, 0 when it was refused (the old one kept).");
        put(&b, "turnwatch_config_last_reload_successful %d\n", reg.reload);
    }
    put_head(&b, "turnwatch_build_info", "gauge", "Always 1; the labels say which build and daemon this is.");
    put(&b, "turnwatch_build_info{version=\"");
    put_value(&b, TW_VERSION);
    put(&b, "\",daemon=\"");
    put_value(&b, reg.daemon);
    put(&b, "\"} 1\n");
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
