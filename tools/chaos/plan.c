/* The soak's plan: every random choice of a run (the load mix, each turn's input, cancels, deadlines, when
 * and how external calls are answered, the fault schedule) drawn from the seed before anything starts, so
 * that a seed replays the same run. */
#include "chaos.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- random numbers: xoshiro256** (Blackman and Vigna), seeded through splitmix64
 * ---------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void chaos_rng_seed(ChaosRng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t chaos_rng_next(ChaosRng *r)
{
    uint64_t *s = r->s, result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

int64_t chaos_rng_range(ChaosRng *r, int64_t lo, int64_t hi)
{
    if (hi <= lo)
        return lo;
    return lo + (int64_t)(chaos_rng_next(r) % (uint64_t)(hi - lo + 1));
}

bool chaos_rng_chance(ChaosRng *r, int percent)
{
    return chaos_rng_range(r, 0, 99) < percent;
}

/* ---- kinds and faults
 * ------------------------------------------------------------------------------------------ */

static const ChaosKindInfo kinds[CHAOS_KIND_N] = {
    [CHAOS_KIND_DONE] = {"done", 22, "done", NULL},
    [CHAOS_KIND_SLOW] = {"slow", 15, "done", NULL},
    [CHAOS_KIND_FAIL] = {"fail", 8, "failed", "agent_failed"},
    [CHAOS_KIND_EXIT] = {"exit", 4, "failed", "agent_exit"},
    [CHAOS_KIND_OVERRUN] = {"overrun", 2, "failed", "step_timeout"},
    [CHAOS_KIND_TOOLS] = {"tools", 30, "done", NULL},
    [CHAOS_KIND_EXTERNAL] = {"external", 19, "done", NULL},
};

const ChaosKindInfo *chaos_kind_info(ChaosKind k)
{
    return &kinds[k];
}

static const char *fault_names[CHAOS_FAULT_N] = {
    [CHAOS_FAULT_WORKER_KILL] = "worker SIGKILL",
    [CHAOS_FAULT_WORKER_STOP] = "worker SIGSTOP/SIGCONT",
    [CHAOS_FAULT_PMO_KILL] = "pmo SIGKILL",
    [CHAOS_FAULT_PMO_STOP] = "pmo SIGSTOP/SIGCONT",
    [CHAOS_FAULT_WORKER_TERM] = "worker SIGTERM (graceful restart)",
    [CHAOS_FAULT_PMO_TERM] = "pmo SIGTERM (graceful restart)",
    [CHAOS_FAULT_NATS_RESTART] = "nats restart",
    [CHAOS_FAULT_PG_RESTART] = "postgres restart (fast)",
    [CHAOS_FAULT_PG_CRASH] = "postgres crash (immediate)",
};

/* Weights of the fault kinds; PostgreSQL and NATS faults are further spaced out below. */
static const int fault_weights[CHAOS_FAULT_N] = {
    [CHAOS_FAULT_WORKER_KILL] = 20,  [CHAOS_FAULT_WORKER_STOP] = 16, [CHAOS_FAULT_PMO_KILL] = 12,
    [CHAOS_FAULT_PMO_STOP] = 9,      [CHAOS_FAULT_WORKER_TERM] = 6,  [CHAOS_FAULT_PMO_TERM] = 6,
    [CHAOS_FAULT_NATS_RESTART] = 12, [CHAOS_FAULT_PG_RESTART] = 10,  [CHAOS_FAULT_PG_CRASH] = 9,
};

/* A server needs this long between two of its own faults, or a run spends its time in crash recovery. */
#define PG_FAULT_SPACING_MS 15000
#define NATS_FAULT_SPACING_MS 8000

const char *chaos_fault_name(ChaosFaultKind k)
{
    return fault_names[k];
}

static int pick_weighted(ChaosRng *r, const int *weights, int n)
{
    int total = 0, x;
    for (int i = 0; i < n; i++)
        total += weights[i];
    x = (int)chaos_rng_range(r, 0, total - 1);
    for (int i = 0; i < n; i++) {
        if (x < weights[i])
            return i;
        x -= weights[i];
    }
    return n - 1;
}

/* ---- turns
 * ----------------------------------------------------------------------------------------------------- */

/* The calls of one round of a tools turn: 1 to 4 calls, of tool `work` and (every second call) of
 * `work_limited`, the same program holding a limit (flow control), a few asked to fail. */
static json_t *plan_work_calls(ChaosRng *r, int n, const char *prefix)
{
    json_t *calls = json_array();
    for (int i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "%s%d", prefix, i);
        json_t *args = json_pack("{s:f}", "seconds", (double)chaos_rng_range(r, 0, 1500) / 1000.0);
        if (chaos_rng_chance(r, 10))
            json_object_set_new(args, "fail", json_true());
        json_array_append_new(calls, json_pack("{s:s,s:s,s:o}", "id", id, "tool",
                                               i % 2 ? "work_limited" : "work", "args", args));
    }
    return calls;
}

static json_t *plan_input(ChaosRng *r, ChaosTurnPlan *t)
{
    json_t *in = json_pack("{s:s}", "kind", kinds[t->kind].name);
    json_t *calls;
    int n;

    switch (t->kind) {
    case CHAOS_KIND_SLOW:
        json_object_set_new(in, "seconds", json_real((double)chaos_rng_range(r, 300, 3000) / 1000.0));
        break;
    case CHAOS_KIND_OVERRUN:
        json_object_set_new(in, "seconds", json_integer(CHAOS_STEP_TIMEOUT_SEC + 2));
        break;
    case CHAOS_KIND_TOOLS:
        n = (int)chaos_rng_range(r, 1, 4);
        json_object_set_new(in, "calls", plan_work_calls(r, n, "w"));
        json_object_set_new(in, "rounds", json_integer(chaos_rng_chance(r, 30) ? 2 : 1));
        json_object_set_new(in, "step_sleep", json_real((double)chaos_rng_range(r, 0, 500) / 1000.0));
        switch (chaos_rng_range(r, 0, 4)) {
        case 0:
            json_object_set_new(in, "wait", json_string("any"));
            break;
        case 1:
            json_object_set_new(in, "wait", json_integer(chaos_rng_range(r, 1, n)));
            break;
        default:
            json_object_set_new(in, "wait", json_string("all"));
        }
        break;
    case CHAOS_KIND_EXTERNAL:
        t->n_ext = (int)chaos_rng_range(r, 1, CHAOS_MAX_EXT);
        calls = plan_work_calls(r, (int)chaos_rng_range(r, 0, 1), "w");
        for (int i = 0; i < t->n_ext; i++) {
            char id[16];
            snprintf(id, sizeof id, "ext%d", i);
            json_array_append_new(calls, json_pack("{s:s,s:s,s:{}}", "id", id, "tool", "ext", "args"));
            /* Most are answered, some too late or never (the 2.2 timeout report answers those). */
            t->ext[i].answer_after_ms =
                chaos_rng_chance(r, 25) ? -1 : chaos_rng_range(r, 100, CHAOS_EXT_TIMEOUT_SEC * 1000);
            t->ext[i].error = chaos_rng_chance(r, 15);
        }
        json_object_set_new(in, "calls", calls);
        json_object_set_new(in, "wait", json_string("all"));
        break;
    default:
        break;
    }
    return in;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int plan_turns(ChaosPlan *p, ChaosRng *r)
{
    int kind_w[CHAOS_KIND_N];
    /* Submits spread over the chaos phase, leaving its last seconds for the last turns to run under faults.
     */
    int64_t span = p->chaos_ms > 10000 ? p->chaos_ms - 5000 : p->chaos_ms;
    int64_t *times = malloc(sizeof *times * (size_t)(p->n_turns ? p->n_turns : 1));

    if (!times)
        return -1;
    for (int k = 0; k < CHAOS_KIND_N; k++)
        kind_w[k] = kinds[k].weight;
    for (int i = 0; i < p->n_turns; i++)
        times[i] = chaos_rng_range(r, 0, span);
    qsort(times, (size_t)p->n_turns, sizeof *times, cmp_i64);
    for (int i = 0; i < p->n_turns; i++) {
        ChaosTurnPlan *t = &p->turns[i];
        t->submit_ms = times[i];
        t->agent = (int)chaos_rng_range(r, 0, p->n_agents - 1);
        t->kind = (ChaosKind)pick_weighted(r, kind_w, CHAOS_KIND_N);
        t->cancel_after_ms = -1;
        json_t *in = plan_input(r, t);
        if (t->kind == CHAOS_KIND_SLOW || t->kind == CHAOS_KIND_TOOLS || t->kind == CHAOS_KIND_EXTERNAL) {
            if (chaos_rng_chance(r, 8))
                t->timeout_sec = (int)chaos_rng_range(r, 2, 5);
            if (chaos_rng_chance(r, 10))
                t->cancel_after_ms = chaos_rng_range(r, 0, 4000);
        } else if (t->kind == CHAOS_KIND_DONE && chaos_rng_chance(r, 5)) {
            t->cancel_after_ms = chaos_rng_range(r, 0, 500);
        }
        t->input = json_dumps(in, JSON_COMPACT | JSON_SORT_KEYS);
        json_decref(in);
        if (!t->input) {
            free(times);
            return -1;
        }
    }
    free(times);
    return 0;
}

/* ---- faults
 * ---------------------------------------------------------------------------------------------------- */

static bool is_pg(ChaosFaultKind k)
{
    return k == CHAOS_FAULT_PG_RESTART || k == CHAOS_FAULT_PG_CRASH;
}

static int plan_faults(ChaosPlan *p, ChaosRng *r)
{
    int cap = (int)(p->chaos_ms / 1500) + 1;
    int64_t at = 3000, last_pg = -PG_FAULT_SPACING_MS, last_nats = -NATS_FAULT_SPACING_MS;

    if (!(p->faults = calloc((size_t)cap, sizeof *p->faults)))
        return -1;
    while (p->n_faults < cap && at < p->chaos_ms - 3000) {
        ChaosFault *f = &p->faults[p->n_faults];
        ChaosFaultKind k = (ChaosFaultKind)pick_weighted(r, fault_weights, CHAOS_FAULT_N);
        /* A server fault too soon after the last one becomes a daemon fault instead. */
        if ((is_pg(k) && at - last_pg < PG_FAULT_SPACING_MS) ||
            (k == CHAOS_FAULT_NATS_RESTART && at - last_nats < NATS_FAULT_SPACING_MS))
            k = (ChaosFaultKind)chaos_rng_range(r, CHAOS_FAULT_WORKER_KILL, CHAOS_FAULT_PMO_TERM);
        f->at_ms = at;
        f->kind = k;
        f->target = (int)chaos_rng_range(r, 0, 1);
        switch (k) {
        case CHAOS_FAULT_WORKER_KILL:
        case CHAOS_FAULT_PMO_KILL:
        case CHAOS_FAULT_WORKER_TERM:
        case CHAOS_FAULT_PMO_TERM:
            f->duration_ms = chaos_rng_range(r, 200, 4000); /* until the restart */
            break;
        case CHAOS_FAULT_WORKER_STOP:
        case CHAOS_FAULT_PMO_STOP:
            /* Some shorter than the reap and lease periods (the frozen process resumes as if nothing
             * happened), some longer (its work is taken away and its late writes must change nothing). */
            f->duration_ms = chaos_rng_range(r, 300, 10000);
            break;
        case CHAOS_FAULT_NATS_RESTART:
            f->duration_ms = chaos_rng_range(r, 200, 4000);
            last_nats = at;
            break;
        default:
            f->duration_ms = chaos_rng_range(r, 0, 2000);
            last_pg = at;
        }
        p->n_faults++;
        at += chaos_rng_range(r, 1500, 5000);
    }
    return 0;
}

ChaosPlan *chaos_plan_new(uint64_t seed, int n_turns, int64_t chaos_ms)
{
    ChaosPlan *p = calloc(1, sizeof *p);
    ChaosRng turns_rng, faults_rng;
    double per_sec;

    if (!p)
        return NULL;
    p->seed = seed;
    p->n_turns = n_turns;
    p->chaos_ms = chaos_ms;
    /* One turn at a time per agent: enough agents that the load keeps up (a turn takes two seconds or more
     * with its tools, several under faults) even with one worker down. */
    per_sec = (double)n_turns / ((double)(chaos_ms > 1000 ? chaos_ms : 1000) / 1000.0);
    p->n_agents = (int)(per_sec * 6.0) + 1;
    p->n_agents = p->n_agents < 4 ? 4 : p->n_agents > 64 ? 64 : p->n_agents;
    /* Two streams, so that the fault schedule of a seed does not change with --turns, nor the load with
     * --minutes beyond the submit times. */
    chaos_rng_seed(&turns_rng, seed);
    chaos_rng_seed(&faults_rng, seed ^ 0x5eed5eed5eed5eedULL);
    if (!(p->turns = calloc((size_t)(n_turns ? n_turns : 1), sizeof *p->turns)) ||
        plan_turns(p, &turns_rng) != 0 || plan_faults(p, &faults_rng) != 0) {
        chaos_plan_free(p);
        return NULL;
    }
    return p;
}

void chaos_plan_free(ChaosPlan *p)
{
    if (!p)
        return;
    for (int i = 0; p->turns && i < p->n_turns; i++)
        free(p->turns[i].input);
    free(p->turns);
    free(p->faults);
    free(p);
}

static void fnv(uint64_t *h, const void *data, size_t len)
{
    const unsigned char *b = data;
    for (size_t i = 0; i < len; i++) {
        *h ^= b[i];
        *h *= 0x100000001b3ULL;
    }
}

static void fnv_i64(uint64_t *h, int64_t v)
{
    fnv(h, &v, sizeof v);
}

void chaos_plan_digest(const ChaosPlan *p, char out[17])
{
    uint64_t h = 0xcbf29ce484222325ULL;

    fnv_i64(&h, (int64_t)p->seed);
    fnv_i64(&h, p->n_agents);
    for (int i = 0; i < p->n_turns; i++) {
        const ChaosTurnPlan *t = &p->turns[i];
        fnv_i64(&h, t->agent);
        fnv_i64(&h, t->kind);
        fnv_i64(&h, t->submit_ms);
        fnv_i64(&h, t->timeout_sec);
        fnv_i64(&h, t->cancel_after_ms);
        fnv(&h, t->input, strlen(t->input));
        for (int e = 0; e < t->n_ext; e++) {
            fnv_i64(&h, t->ext[e].answer_after_ms);
            fnv_i64(&h, t->ext[e].error);
        }
    }
    for (int i = 0; i < p->n_faults; i++) {
        fnv_i64(&h, p->faults[i].at_ms);
        fnv_i64(&h, p->faults[i].kind);
        fnv_i64(&h, p->faults[i].target);
        fnv_i64(&h, p->faults[i].duration_ms);
    }
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}
