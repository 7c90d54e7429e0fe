/* Unit tests for tools/chaos/plan.c, the soak's plan: a seed replays the same load and fault schedule, and
 * the plan holds what the soak promises (every kind of turn, faults of every kind, servers not restarted back
 * to back, inputs the soak agent understands). */
#include <check.h>
#include <string.h>

#include "chaos.h"
#include "suite.h"

#define MIN3 (3 * 60 * 1000)

/* The same number of faults, each of the same kind at the same time. */
static void assert_same_fault_times(const ChaosPlan *a, const ChaosPlan *b)
{
    ck_assert_int_eq(a->n_faults, b->n_faults);
    for (int i = 0; i < a->n_faults; i++) {
        ck_assert_int_eq(a->faults[i].at_ms, b->faults[i].at_ms);
        ck_assert_int_eq(a->faults[i].kind, b->faults[i].kind);
    }
}

START_TEST(same_seed_same_plan)
{
    ChaosPlan *a = chaos_plan_new(42, 500, MIN3), *b = chaos_plan_new(42, 500, MIN3);
    char da[17], db[17];

    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    chaos_plan_digest(a, da);
    chaos_plan_digest(b, db);
    ck_assert_str_eq(da, db);
    ck_assert_int_eq(a->n_agents, b->n_agents);
    for (int i = 0; i < a->n_turns; i++) {
        ck_assert_int_eq(a->turns[i].kind, b->turns[i].kind);
        ck_assert_int_eq(a->turns[i].agent, b->turns[i].agent);
        ck_assert_int_eq(a->turns[i].submit_ms, b->turns[i].submit_ms);
        ck_assert_str_eq(a->turns[i].input, b->turns[i].input);
    }
    assert_same_fault_times(a, b);
    for (int i = 0; i < a->n_faults; i++) {
        ck_assert_int_eq(a->faults[i].target, b->faults[i].target);
        ck_assert_int_eq(a->faults[i].duration_ms, b->faults[i].duration_ms);
    }
    chaos_plan_free(a);
    chaos_plan_free(b);
}
END_TEST

START_TEST(other_seed_other_plan)
{
    ChaosPlan *a = chaos_plan_new(1, 500, MIN3), *b = chaos_plan_new(2, 500, MIN3);
    char da[17], db[17];

    chaos_plan_digest(a, da);
    chaos_plan_digest(b, db);
    ck_assert_str_ne(da, db);
    chaos_plan_free(a);
    chaos_plan_free(b);
}
END_TEST

/* The fault schedule depends on the seed and the duration only: more turns do not move a fault. */
START_TEST(faults_do_not_depend_on_turns)
{
    ChaosPlan *a = chaos_plan_new(7, 100, MIN3), *b = chaos_plan_new(7, 900, MIN3);

    assert_same_fault_times(a, b);
    chaos_plan_free(a);
    chaos_plan_free(b);
}
END_TEST

START_TEST(load_has_every_kind)
{
    ChaosPlan *p = chaos_plan_new(3, 500, MIN3);
    int per_kind[CHAOS_KIND_N] = {0}, cancels = 0, deadlines = 0, never_answered = 0, answered = 0;

    for (int i = 0; i < p->n_turns; i++) {
        const ChaosTurnPlan *t = &p->turns[i];
        json_t *in = json_loads(t->input, 0, NULL);
        ck_assert_msg(json_is_object(in), "turn %d: input is not a JSON object: %s", i, t->input);
        ck_assert_str_eq(json_string_value(json_object_get(in, "kind")), chaos_kind_info(t->kind)->name);
        if (t->kind == CHAOS_KIND_TOOLS || t->kind == CHAOS_KIND_EXTERNAL)
            ck_assert_int_gt(json_array_size(json_object_get(in, "calls")), 0);
        json_decref(in);
        ck_assert_int_ge(t->agent, 0);
        ck_assert_int_lt(t->agent, p->n_agents);
        ck_assert_int_ge(t->submit_ms, 0);
        ck_assert_int_le(t->submit_ms, p->chaos_ms);
        if (i > 0)
            ck_assert_int_ge(t->submit_ms, p->turns[i - 1].submit_ms);
        per_kind[t->kind]++;
        cancels += t->cancel_after_ms >= 0;
        deadlines += t->timeout_sec > 0;
        ck_assert_int_eq(t->n_ext > 0, t->kind == CHAOS_KIND_EXTERNAL);
        for (int e = 0; e < t->n_ext; e++) {
            never_answered += t->ext[e].answer_after_ms < 0;
            answered += t->ext[e].answer_after_ms >= 0;
        }
    }
    for (int k = 0; k < CHAOS_KIND_N; k++)
        ck_assert_msg(per_kind[k] > 0, "no turn of kind %s in 500", chaos_kind_info((ChaosKind)k)->name);
    ck_assert_int_gt(cancels, 0);
    ck_assert_int_gt(deadlines, 0);
    ck_assert_int_gt(never_answered, 0);
    ck_assert_int_gt(answered, 0);
    chaos_plan_free(p);
}
END_TEST

START_TEST(faults_cover_every_kind_and_keep_servers_apart)
{
    ChaosPlan *p = chaos_plan_new(5, 500, 20 * 60 * 1000);
    int per_kind[CHAOS_FAULT_N] = {0};
    int64_t last_pg = -1000000;

    ck_assert_int_gt(p->n_faults, 100);
    for (int i = 0; i < p->n_faults; i++) {
        const ChaosFault *f = &p->faults[i];
        ck_assert_int_ge(f->at_ms, 0);
        ck_assert_int_lt(f->at_ms, p->chaos_ms);
        if (i > 0)
            ck_assert_int_gt(f->at_ms, p->faults[i - 1].at_ms);
        ck_assert(f->target == 0 || f->target == 1);
        ck_assert_int_ge(f->duration_ms, 0);
        if (f->kind == CHAOS_FAULT_PG_RESTART || f->kind == CHAOS_FAULT_PG_CRASH) {
            ck_assert_int_ge(f->at_ms - last_pg, 15000);
            last_pg = f->at_ms;
        }
        per_kind[f->kind]++;
    }
    for (int k = 0; k < CHAOS_FAULT_N; k++)
        ck_assert_msg(per_kind[k] > 0, "no fault of kind %s in 20 minutes",
                      chaos_fault_name((ChaosFaultKind)k));
    chaos_plan_free(p);
}
END_TEST

START_TEST(rng_range_bounds)
{
    ChaosRng r;
    bool seen_lo = false, seen_hi = false;

    chaos_rng_seed(&r, 99);
    for (int i = 0; i < 10000; i++) {
        int64_t x = chaos_rng_range(&r, -3, 3);
        ck_assert_int_ge(x, -3);
        ck_assert_int_le(x, 3);
        seen_lo |= x == -3;
        seen_hi |= x == 3;
    }
    ck_assert(seen_lo && seen_hi);
    ck_assert_int_eq(chaos_rng_range(&r, 5, 5), 5);
}
END_TEST

TW_SUITE_DEFINE(chaos_plan, {
                                {"plan", same_seed_same_plan, 30},
                                {"plan", other_seed_other_plan, 30},
                                {"plan", faults_do_not_depend_on_turns, 30},
                                {"plan", load_has_every_kind, 30},
                                {"plan", faults_cover_every_kind_and_keep_servers_apart, 30},
                                {"plan", rng_range_bounds, 30},
                            })
