/* test_policies.c — timeout policies (issue 14, contract section 11): a step timeout retried and then done;
 * retries used up into the dead letters, replay and --again; no retry for codes outside retry_on or by
 * default; the backoff doubling with its jitter inside its bounds; the queue budget; warnings at
 * warn_at_percent of each kind of deadline, then the timeout with its details; the four levels of a tool
 * call's timeout; a turn's history with a reclaim and a retry; two PMOs and two workers retrying the same
 * turns with no attempt or event twice. Real PostgreSQL, nats-server and daemons. */
#include "turn_helpers.h"
#include "config.h"
#include "suite.h"

#include <stdarg.h>
#include <sys/wait.h>

static double pl_min(double a, double b)
{
    return a < b ? a : b;
}

/* Short PMO clocks that stay out of the way (no 2.4/2.5/2.7 action within a test), a fast heartbeat. */
static const char pl_base[] =
    "[pmo]\nwatchdog_interval_seconds = 1\ndispatched_retry_seconds = 30\ndispatched_timeout_seconds = 60\n"
    "pending_wakeup_seconds = 60\npending_wakeup_skip_seconds = 300\nactive_reap_seconds = 60\n"
    "[worker]\nheartbeat_seconds = 1\n";

/* "[agent.NAME]" running tw-test-agent with `keys` (lines) after its exec (malloc'd). */
static char *pl_agent(const char *name, const char *keys)
{
    char *exec = tw_fx_build_path("examples/agents/tw-test-agent");
    char *s = wd_fmt("[agent.%s]\nexec = %s\nkill_grace_seconds = 1\n%s", name, exec, keys ? keys : "");
    free(exec);
    return s;
}

/* pl_base, then pl_agent(name, keys) and `more` (may be NULL), as a malloc'd override text. */
static char *pl_conf(const char *name, const char *keys, const char *more)
{
    char *agent = pl_agent(name, keys);
    char *conf = wd_fmt("%s%s%s", pl_base, agent, more ? more : "");
    free(agent);
    return conf;
}

/* The stack (servers, a PMO and a worker) on pl_conf(name, keys, more), collecting the events that match
 * `pattern` (none when NULL). */
static TwFxStack pl_stack(const char *pattern, const char *name, const char *keys, const char *more)
{
    char *conf = pl_conf(name, keys, more);
    TwFxStack st = tw_fx_stack_start_events(conf, pattern);
    free(conf);
    return st;
}

/* pl_stack (all events) with an agent `name` of a `step_s` second step limit, two attempts and no warnings,
 * and a turn of it that sleeps past that limit on attempt 1 and completes on attempt 2, with `output` (a JSON
 * text) unless NULL: its id into *turn (malloc'd). */
static TwFxStack pl_retried_turn(const char *name, int step_s, const char *output, char **turn)
{
    char *keys = wd_fmt("step_timeout_seconds = %d\nmax_attempts = 2\nwarn_at_percent = 0\n", step_s);
    char *input =
        wd_fmt("{\"mode\":\"sleep\",\"seconds\":30,\"on_attempt\":{\"2\":{\"mode\":\"complete\"%s%s}}}",
               output ? ",\"output\":" : "", output ? output : "");
    TwFxStack st = pl_stack("evt.>", name, keys, NULL);
    *turn = wd_submit(st.fx, name, input);
    free(input);
    free(keys);
    return st;
}

/* The end of a test: frees the turn ids given (a NULL ends them), checks that PostgreSQL logged no deadlock,
 * and stops the fixture. */
static void pl_end(TwFx *fx, ...)
{
    va_list ap;
    va_start(ap, fx);
    for (char *s = va_arg(ap, char *); s; s = va_arg(ap, char *))
        free(s);
    va_end(ap);
    wd_assert_no_deadlock(fx);
    tw_fx_free(fx);
}

static json_t *pl_cli_json(TwFx *fx, const char *a, const char *b, const char *c, const char *d)
{
    char *out = NULL, *err = NULL;
    int rc = d   ? tw_fx_cli(fx, &out, &err, a, b, c, d, "--json", NULL)
             : c ? tw_fx_cli(fx, &out, &err, a, b, c, "--json", NULL)
                 : tw_fx_cli(fx, &out, &err, a, b, "--json", NULL);
    ck_assert_msg(rc == 0, "turnwatch %s %s %s: exit %d: %s", a, b, c ? c : "", rc, err);
    json_t *j = json_loads(out, JSON_DECODE_ANY, NULL);
    ck_assert_msg(j != NULL, "turnwatch %s %s: not JSON: %s", a, b, out);
    free(out);
    free(err);
    return j;
}

static json_t *pl_show(TwFx *fx, const char *turn)
{
    return pl_cli_json(fx, "turn", "show", turn, NULL);
}

static json_t *pl_history(TwFx *fx, const char *turn)
{
    return pl_cli_json(fx, "turn", "history", turn, NULL);
}

static long long pl_int(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_integer(v), "%s is not an integer", key);
    return json_integer_value(v);
}

static const char *pl_str(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

static double pl_num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_number(v), "%s is not a number", key);
    return json_number_value(v);
}

/* Seconds between two of the database's ISO timestamps (b - a). */
static double pl_secs(TwFx *fx, const char *a, const char *b)
{
    char *s =
        tw_fx_sql_str(fx, "SELECT extract(epoch FROM $2::timestamptz - $1::timestamptz)::text", 2, a, b);
    double d = atof(s);
    free(s);
    return d;
}

static size_t pl_events(TwFxEvents *ev, const char *kind, const char *turn)
{
    char *subject = wd_fmt("evt.agent.*.%s", kind);
    size_t n = tw_fx_events_count(ev, subject, turn);
    free(subject);
    return n;
}

static json_t *pl_event(TwFxEvents *ev, const char *kind, const char *turn, size_t k)
{
    char *subject = wd_fmt("evt.agent.*.%s", kind);
    json_t *j = tw_fx_events_get(ev, subject, turn, k, NULL, NULL);
    free(subject);
    ck_assert_msg(j != NULL, "no %s event #%zu for %s", kind, k, turn);
    return j;
}

static void pl_wait_events(TwFxEvents *ev, const char *kind, const char *turn, size_t n)
{
    char *subject = wd_fmt("evt.agent.*.%s", kind);
    bool ok = tw_fx_events_wait(ev, subject, turn, n, WD_WAIT_MS);
    if (!ok)
        tw_fx_events_dump(ev);
    ck_assert_msg(ok, "fewer than %zu %s events for %s", n, kind, turn);
    free(subject);
}

/* ---- attempt 1 times out, attempt 2 succeeds
 * ---------------------------------------------------------------------- */

START_TEST(test_retry_then_success)
{
    char *t = NULL;
    TwFxStack st = pl_retried_turn("flaky", 2, "{\"second\":true}", &t);
    WD_STATUS_IS(st.fx, t, "done");
    pl_wait_events(st.ev, "task", t, 1);
    tw_fx_sleep_ms(300);

    /* One retry event: attempt 2 after step_timeout, with its details and a retry_at about 1 s later. */
    ck_assert_uint_eq(pl_events(st.ev, "retry", t), 1);
    json_t *r = pl_event(st.ev, "retry", t, 0);
    ck_assert_int_eq(pl_int(r, "attempt"), 2);
    ck_assert_str_eq(pl_str(r, "error"), "step_timeout");
    ck_assert(json_is_string(json_object_get(r, "event_id")));
    ck_assert(json_is_integer(json_object_get(r, "turn_epoch")));
    double wait = pl_secs(st.fx, pl_str(r, "at"), pl_str(r, "retry_at"));
    ck_assert_msg(wait >= 0.79 && wait <= 1.21, "retry_at is %.3f s after the retry", wait);
    json_t *d = json_object_get(r, "timeout");
    ck_assert_str_eq(pl_str(d, "kind"), "step_timeout");
    ck_assert_str_eq(pl_str(d, "policy"), "retry");
    ck_assert_int_eq(pl_int(d, "attempt"), 1);
    ck_assert_int_eq((int)pl_num(d, "limit_seconds"), 2);
    ck_assert(pl_num(d, "elapsed_seconds") >= 2.0);
    json_decref(r);
    /* The agent's idle state event of attempt 1 carries the error and the details too. */
    WdStateMatch idle = {t, "idle"};
    json_t *s = tw_fx_events_get_if(st.ev, wd_is_state, &idle, 0, NULL, NULL);
    ck_assert_ptr_nonnull(s);
    ck_assert_str_eq(pl_str(s, "error"), "step_timeout");
    ck_assert_str_eq(pl_str(json_object_get(s, "timeout"), "policy"), "retry");
    json_decref(s);

    /* One final event, done, from attempt 2; no fallback card, no force termination. */
    ck_assert_uint_eq(wd_task_events(st.ev, t), 1);
    json_t *task = pl_event(st.ev, "task", t, 0);
    ck_assert_str_eq(pl_str(task, "status"), "done");
    ck_assert_int_eq(pl_int(task, "attempt"), 2);
    ck_assert_ptr_null(json_object_get(task, "timeout"));
    ck_assert_ptr_null(json_object_get(task, "error"));
    json_decref(task);
    ck_assert_int_eq(
        tw_fx_sql_int(st.fx,
                      "SELECT count(*) FROM state.cards WHERE turn_id = $1 AND "
                      "card_type = 'task.deliverable' AND content -> 'output' ->> 'second' = 'true'",
                      1, t),
        1);
    ck_assert_int_eq(
        tw_fx_sql_int(st.fx, "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND kind = 'task'", 1, t),
        1);

    /* turn show: attempt 2 of 2. */
    json_t *show = pl_show(st.fx, t);
    ck_assert_int_eq(pl_int(show, "attempt"), 2);
    ck_assert_int_eq(pl_int(show, "max_attempts"), 2);
    ck_assert_str_eq(pl_str(show, "status"), "done");
    ck_assert(json_is_null(json_object_get(show, "replay_of")));
    json_decref(show);
    char *out = NULL, *err = NULL;
    ck_assert_int_eq(tw_fx_cli(st.fx, &out, &err, "turn", "show", t, NULL), 0);
    ck_assert_msg(strstr(out, "attempt              2\n") && strstr(out, "max_attempts         2\n"), "%s",
                  out);
    free(out);
    free(err);

    /* The history: attempt 1 up to the retry, attempt 2 from it. */
    json_t *h = pl_history(st.fx, t), *row;
    size_t i;
    static const char *const want[][3] = {
        {"", "pending", "1"},        {"pending", "dispatched", "1"}, {"dispatched", "running", "1"},
        {"running", "pending", "2"}, {"pending", "dispatched", "2"}, {"dispatched", "running", "2"},
        {"running", "done", "2"},
    };
    ck_assert_uint_eq(json_array_size(h), sizeof want / sizeof want[0]);
    json_array_foreach(h, i, row)
    {
        ck_assert_str_eq(pl_str(row, "from"), want[i][0]);
        ck_assert_str_eq(pl_str(row, "to"), want[i][1]);
        ck_assert_int_eq(pl_int(row, "attempt"), atoi(want[i][2]));
    }
    ck_assert_ptr_nonnull(strstr(pl_str(json_array_get(h, 3), "reason"), "retry after step_timeout"));
    ck_assert_str_eq(pl_str(json_array_get(h, 0), "actor"), "cli");
    json_decref(h);
    pl_end(st.fx, t, NULL);
}
END_TEST

/* ---- retries used up: dead letters, replay, --again
 * -------------------------------------------------------------- */

START_TEST(test_dead_letters_and_replay)
{
    TwFxStack st = pl_stack("evt.>", "doomed", "max_attempts = 2\n", NULL);
    const char *input = "{\"mode\":\"exit\",\"code\":3}";
    char *t = wd_submit_full(st.fx, "doomed", input, "box-d", NULL);
    char *ok = wd_submit(st.fx, "echo", "{\"text\":\"fine\"}");
    WD_STATUS_IS(st.fx, t, "failed");
    WD_STATUS_IS(st.fx, ok, "done");
    pl_wait_events(st.ev, "task", t, 1);
    tw_fx_sleep_ms(300);
    ck_assert_uint_eq(pl_events(st.ev, "retry", t), 1);
    ck_assert_uint_eq(wd_task_events(st.ev, t), 1);
    json_t *task = pl_event(st.ev, "task", t, 0);
    ck_assert_str_eq(pl_str(task, "error"), "agent_exit");
    ck_assert_int_eq(pl_int(task, "attempt"), 2);
    ck_assert_ptr_null(json_object_get(task, "timeout")); /* agent_exit is no timeout */
    json_decref(task);

    /* Listed, with --agent too; a done turn is not. */
    json_t *list = pl_cli_json(st.fx, "dead-letters", "list", NULL, NULL), *e;
    size_t i;
    bool found = false;
    json_array_foreach(list, i, e)
    {
        ck_assert_str_ne(pl_str(e, "turn_id"), ok);
        if (strcmp(pl_str(e, "turn_id"), t) == 0) {
            found = true;
            ck_assert_str_eq(pl_str(e, "status"), "failed");
            ck_assert_int_eq(pl_int(e, "attempt"), 2);
            ck_assert_int_eq(pl_int(e, "max_attempts"), 2);
            ck_assert_int_eq(pl_int(e, "replays"), 0);
        }
    }
    ck_assert_msg(found, "the failed turn is not a dead letter");
    json_decref(list);
    list = pl_cli_json(st.fx, "dead-letters", "list", "--agent", "echo");
    ck_assert_uint_eq(json_array_size(list), 0);
    json_decref(list);
    char *out = NULL, *err = NULL;
    ck_assert_int_eq(tw_fx_cli(st.fx, &out, &err, "dead-letters", "list", NULL), 0);
    ck_assert_ptr_nonnull(strstr(out, t));
    ck_assert_ptr_nonnull(strstr(out, "2/2"));
    free(out);
    free(err);

    /* Replay: a new turn with the same agent, channel, box and input, replay_of = t. */
    ck_assert_int_eq(tw_fx_cli(st.fx, &out, &err, "dead-letters", "replay", t, NULL), 0);
    char *r1 = strndup(out, strcspn(out, "\n"));
    free(out);
    free(err);
    ck_assert_str_ne(r1, t);
    /* Its attempt is not the original's: the replay wrote attempt 1 (read from its history's first row, the
     * one the replay wrote: the worker may already have failed it and retried it as attempt 2). */
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.turns r JOIN state.turns o ON o.turn_id = $2 "
                                   "WHERE r.turn_id = $1 AND r.replay_of = o.turn_id AND r.agent = o.agent "
                                   "AND r.channel_id = o.channel_id AND r.input = o.input "
                                   "AND r.output_box_id = o.output_box_id",
                                   2, r1, t),
                     1);
    json_t *h = pl_history(st.fx, r1);
    ck_assert_str_eq(pl_str(json_array_get(h, 0), "to"), "pending");
    ck_assert_int_eq(pl_int(json_array_get(h, 0), "attempt"), 1);
    json_decref(h);
    json_t *show = pl_show(st.fx, r1);
    ck_assert_str_eq(pl_str(show, "replay_of"), t);
    json_decref(show);
    /* Again without --again: the same turn, nothing new. */
    json_t *again = pl_cli_json(st.fx, "dead-letters", "replay", t, NULL);
    ck_assert_str_eq(pl_str(again, "turn_id"), r1);
    ck_assert(json_is_false(json_object_get(again, "created")));
    json_decref(again);
    ck_assert_int_eq(tw_fx_sql_int(st.fx, "SELECT count(*) FROM state.turns WHERE replay_of = $1", 1, t), 1);
    /* With --again: a second one. */
    again = pl_cli_json(st.fx, "dead-letters", "replay", t, "--again");
    ck_assert(json_is_true(json_object_get(again, "created")));
    ck_assert_str_ne(pl_str(again, "turn_id"), r1);
    char *r2 = strdup(pl_str(again, "turn_id"));
    json_decref(again);
    ck_assert_int_eq(tw_fx_sql_int(st.fx, "SELECT count(*) FROM state.turns WHERE replay_of = $1", 1, t), 2);
    /* The replays run (and fail like the original: the input is the same). */
    WD_STATUS_IS(st.fx, r1, "failed");
    WD_STATUS_IS(st.fx, r2, "failed");
    /* Each with retries of its own: attempt 1, then 2 of max_attempts = 2, as the original had. */
    h = pl_history(st.fx, r1);
    char *why = wd_fmt("replay of %s", t);
    ck_assert_str_eq(pl_str(json_array_get(h, 0), "reason"), why);
    free(why);
    ck_assert_int_eq(pl_int(json_array_get(h, json_array_size(h) - 1), "attempt"), 2);
    json_decref(h);
    list = pl_cli_json(st.fx, "dead-letters", "list", "--agent", "doomed");
    json_array_foreach(list, i, e) if (strcmp(pl_str(e, "turn_id"), t) == 0)
        ck_assert_int_eq(pl_int(e, "replays"), 2);
    json_decref(list);
    /* What is not a dead letter cannot be replayed; a bad id is a usage error. */
    ck_assert_int_eq(tw_fx_cli(st.fx, &out, &err, "dead-letters", "replay", ok, NULL), 2);
    ck_assert_ptr_nonnull(strstr(err, "not a dead letter"));
    free(out);
    free(err);
    ck_assert_int_eq(tw_fx_cli(st.fx, &out, &err, "dead-letters", "replay", "nope", NULL), 2);
    free(out);
    free(err);
    pl_end(st.fx, r1, r2, ok, t, NULL);
}
END_TEST

/* ---- no retry: by default, and for a code outside retry_on
 * ------------------------------------------------------- */

START_TEST(test_no_retry_outside_retry_on)
{
    char *picky = pl_agent("picky", "max_attempts = 3\nretry_on = step_timeout\n");
    /* plain has the defaults: max_attempts = 1 */
    TwFxStack st = pl_stack("evt.>", "plain", "step_timeout_seconds = 2\n", picky);
    free(picky);
    char *t1 = wd_submit(st.fx, "plain", "{\"mode\":\"sleep\",\"seconds\":30}");
    char *t2 = wd_submit(st.fx, "picky", "{\"mode\":\"fail\",\"error\":\"no\"}");
    char *t3 = wd_submit(st.fx, "picky", "{\"mode\":\"exit\",\"code\":4}");
    const char *turns[] = {t1, t2, t3};
    for (int k = 0; k < 3; k++)
        WD_STATUS_IS(st.fx, turns[k], "failed");
    pl_wait_events(st.ev, "task", t1, 1);
    pl_wait_events(st.ev, "task", t3, 1);
    tw_fx_sleep_ms(500);
    const char *codes[] = {"step_timeout", "agent_failed", "agent_exit"};
    for (int k = 0; k < 3; k++) {
        ck_assert_uint_eq(pl_events(st.ev, "retry", turns[k]), 0);
        ck_assert_uint_eq(wd_task_events(st.ev, turns[k]), 1);
        json_t *task = pl_event(st.ev, "task", turns[k], 0);
        ck_assert_str_eq(pl_str(task, "error"), codes[k]);
        ck_assert_int_eq(pl_int(task, "attempt"), 1);
        json_decref(task);
        ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                       "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND "
                                       "kind = 'retry'",
                                       1, turns[k]),
                         0);
    }
    /* The default's timeout is final by policy: "fail", not "dead_letter". */
    json_t *task = pl_event(st.ev, "task", t1, 0);
    json_t *d = json_object_get(task, "timeout");
    ck_assert_str_eq(pl_str(d, "kind"), "step_timeout");
    ck_assert_str_eq(pl_str(d, "policy"), "fail");
    json_decref(task);
    json_t *show = pl_show(st.fx, t1);
    ck_assert_int_eq(pl_int(show, "attempt"), 1);
    ck_assert_int_eq(pl_int(show, "max_attempts"), 1);
    json_decref(show);
    free(t1);
    free(t2);
    free(t3);
    tw_fx_free(st.fx);
}
END_TEST

/* ---- backoff: doubling, jitter within +-20 %, the cap
 * ---------------------------------------------------------------- */

START_TEST(test_backoff_bounds)
{
    char *conf = pl_conf(
        "backoff", "max_attempts = 4\nretry_backoff_seconds = 1\nretry_backoff_max_seconds = 3\n", NULL);
    TwFx *fx = wd_fixture(conf);
    free(conf);

    /* The function, many times: attempt n waits base * 2^(n-1) +-20 %, never above the cap, and the jitter
     * is spread over its whole range. */
    for (int n = 1; n <= 5; n++) {
        char *q =
            wd_fmt("SELECT min(d)::text || ' ' || max(d)::text FROM (SELECT tw.retry_delay(%d, 2, 20) AS d "
                   "FROM generate_series(1, 400)) x",
                   n);
        char *mm = tw_fx_sql_str(fx, q, 0);
        double lo, hi, b = pl_min(2.0 * (double)(1 << (n - 1)), 20.0);
        ck_assert_int_eq(sscanf(mm, "%lf %lf", &lo, &hi), 2);
        ck_assert_msg(lo >= 0.8 * b - 1e-9 && hi <= pl_min(1.2 * b, 20.0) + 1e-9, "attempt %d: %s, base %.1f",
                      n, mm, b);
        /* 400 draws: both ends of the range are reached within 5 % (a chance of 0.9^400 each to miss). */
        ck_assert_msg(lo < 0.84 * b && hi > pl_min(1.16 * b, 19.0), "attempt %d: jitter %s too narrow", n,
                      mm);
        free(q);
        free(mm);
    }

    /* End to end: three retries of one turn, each retry_at within its bounds, growing, the last one capped.
     */
    TwFxEvents *evt = tw_fx_events_new(fx, "evt.>");
    tw_fx_start_pmo(fx, NULL);
    tw_fx_start_worker(fx, NULL);
    char *t = wd_submit(fx, "backoff", "{\"mode\":\"exit\",\"code\":2}");
    WD_STATUS_IS(fx, t, "failed");
    pl_wait_events(evt, "task", t, 1);
    pl_wait_events(evt, "retry", t, 3);
    tw_fx_sleep_ms(300);
    ck_assert_uint_eq(pl_events(evt, "retry", t), 3);
    const double base[] = {1, 2, 3}; /* 1, 2, then 4 capped at 3 */
    double prev = 0;
    for (size_t k = 0; k < 3; k++) {
        json_t *r = pl_event(evt, "retry", t, k);
        ck_assert_int_eq(pl_int(r, "attempt"), (long long)k + 2);
        double w = pl_secs(fx, pl_str(r, "at"), pl_str(r, "retry_at"));
        ck_assert_msg(w >= 0.8 * base[k] - 0.001 && w <= pl_min(1.2 * base[k], 3.0) + 0.001,
                      "retry %zu: waits %.3f s, base %.0f", k + 1, w, base[k]);
        /* Each attempt starts no earlier than its retry_at. */
        char *attempt = wd_fmt("%zu", k + 2);
        char *started = tw_fx_sql_str(fx,
                                      "SELECT min(at)::text FROM state.turn_history WHERE turn_id = $1 AND "
                                      "attempt = $2::integer AND to_status = 'dispatched'",
                                      2, t, attempt);
        free(attempt);
        ck_assert_ptr_nonnull(started);
        ck_assert_msg(pl_secs(fx, pl_str(r, "retry_at"), started) >= 0, "attempt %zu started before retry_at",
                      k + 2);
        free(started);
        if (k < 2)
            ck_assert_msg(w > prev, "retry %zu waited %.3f s after %.3f s", k + 1, w, prev);
        prev = w;
        json_decref(r);
    }
    json_t *task = pl_event(evt, "task", t, 0);
    ck_assert_int_eq(pl_int(task, "attempt"), 4);
    json_decref(task);
    free(t);
    tw_fx_free(fx);
}
END_TEST

/* ---- the queue budget
 * ------------------------------------------------------------------------------------------- */

START_TEST(test_queue_timeout)
{
    /* No worker serves `queued`: its turns never run. */
    TwFxStack st = pl_stack("evt.>", "queued", "queue_timeout_seconds = 2\n", "[worker]\nagents = echo\n");
    char *t1 = wd_submit_full(st.fx, "queued", "{\"n\":1}", "box-q", NULL);
    char *t2 = wd_submit(st.fx, "queued", "{\"n\":2}");
    char *t3 = wd_submit(st.fx, "echo", "{\"text\":\"runs in time\"}");
    WD_STATUS_IS(st.fx, t3, "done");
    WD_STATUS_IS(st.fx, t1, "timeout");
    WD_STATUS_IS(st.fx, t2, "timeout");
    /* The first was dispatched (its agent idle), the second still pending behind it: both end at their due
     * time with the output contract of a forced end. */
    free(wd_check_forced_end(st.fx, st.ev, t1, "timeout", "queue_timeout", "box-q", -1));
    free(wd_check_forced_end(st.fx, st.ev, t2, "timeout", "queue_timeout", NULL, -1));
    for (int k = 0; k < 2; k++) {
        const char *t = k ? t2 : t1;
        json_t *task = pl_event(st.ev, "task", t, 0);
        json_t *d = json_object_get(task, "timeout");
        ck_assert_str_eq(pl_str(d, "kind"), "queue");
        ck_assert_str_eq(pl_str(d, "policy"), "fail");
        ck_assert_int_eq((int)pl_num(d, "limit_seconds"), 2);
        ck_assert(pl_num(d, "elapsed_seconds") >= 2.0);
        json_decref(task);
        /* Warned once at 80 %, before the end. */
        ck_assert_uint_eq(pl_events(st.ev, "warning", t), 1);
        json_t *w = pl_event(st.ev, "warning", t, 0);
        ck_assert_str_eq(pl_str(w, "kind"), "queue");
        ck_assert(pl_num(w, "elapsed_seconds") >= 1.6 && pl_num(w, "elapsed_seconds") < 2.0);
        json_decref(w);
    }
    ck_assert_uint_eq(pl_events(st.ev, "task", t3), 1);
    ck_assert_uint_eq(pl_events(st.ev, "warning", t3), 0);
    wd_assert_acted(&st.pmo, 1, "queue_timeout", 2, "queue_timeout", 2000);
    pl_end(st.fx, t1, t2, t3, NULL);
}
END_TEST

/* ---- warnings at 80 %, then the timeout with its details
 * ------------------------------------------------------------ */

START_TEST(test_warnings_then_timeout)
{
    /* A waiting call's deadline: max(3, the tool's 1, its timeout 1) = 3 s. */
    TwFxStack st = pl_stack("evt.>", "slow", "step_timeout_seconds = 3\n",
                            "[worker]\nsuspend_timeout_seconds = 3\n[tool.ext]\ntimeout_seconds = 1\n"
                            "suspend_timeout_seconds = 1\n");
    /* The turn's deadline (3 s), a step's timeout (3 s) and a tool call's wait (3 s). */
    char *td = wd_submit_full(st.fx, "tester", "{\"mode\":\"sleep\",\"seconds\":30}", NULL, "3");
    char *ts = wd_submit(st.fx, "slow", "{\"mode\":\"sleep\",\"seconds\":30}");
    char *tc = wd_submit(st.fx, "echo", "{\"text\":\"x\"}");
    WD_STATUS_IS(st.fx, tc, "done");
    /* The test agent in mode tools waits for an external call that never answers. */
    char *tx = wd_submit(st.fx, "slow",
                         "{\"mode\":\"tools\",\"calls\":[{\"id\":\"x1\",\"tool\":\"ext\",\"args\":{}}]}");

    WD_STATUS_IS(st.fx, td, "timeout");
    WD_STATUS_IS(st.fx, ts, "failed");
    WD_STATUS_IS(st.fx, tx, "done");
    pl_wait_events(st.ev, "task", td, 1);
    pl_wait_events(st.ev, "task", ts, 1);
    tw_fx_sleep_ms(300);

    struct {
        const char *turn, *kind, *code;
    } cases[] = {{td, "turn_deadline", "turn_deadline_exceeded"}, {ts, "step_timeout", "step_timeout"}};
    for (size_t k = 0; k < 2; k++) {
        ck_assert_uint_eq(pl_events(st.ev, "warning", cases[k].turn), 1);
        json_t *w = pl_event(st.ev, "warning", cases[k].turn, 0);
        int64_t w_ms = 0, end_ms = 0;
        json_decref(tw_fx_events_get(st.ev, "evt.agent.*.warning", cases[k].turn, 0, NULL, &w_ms));
        json_decref(tw_fx_events_get(st.ev, "evt.agent.*.task", cases[k].turn, 0, NULL, &end_ms));
        ck_assert_msg(w_ms <= end_ms, "%s: the warning came after the end", cases[k].kind);
        ck_assert_str_eq(pl_str(w, "kind"), cases[k].kind);
        ck_assert_int_eq((int)pl_num(w, "limit_seconds"), 3);
        double el = pl_num(w, "elapsed_seconds");
        ck_assert_msg(el >= 2.39 && el < 3.0, "%s: warned at %.3f s of 3", cases[k].kind, el);
        ck_assert(json_is_string(json_object_get(w, "due_at")));
        ck_assert(json_is_string(json_object_get(w, "event_id")));
        ck_assert(json_is_integer(json_object_get(w, "turn_epoch")));
        json_decref(w);
        json_t *task = pl_event(st.ev, "task", cases[k].turn, 0);
        ck_assert_str_eq(pl_str(task, "error"), cases[k].code);
        json_t *d = json_object_get(task, "timeout");
        ck_assert_msg(json_is_object(d), "%s: no timeout details on the final event", cases[k].kind);
        ck_assert_int_eq((int)pl_num(d, "limit_seconds"), 3);
        ck_assert(pl_num(d, "elapsed_seconds") >= 3.0);
        ck_assert_int_eq(pl_int(d, "attempt"), 1);
        ck_assert_str_eq(pl_str(d, "policy"), "fail");
        json_decref(task);
        /* The state event of the end carries them as well. */
        WdStateMatch idle = {cases[k].turn, "idle"};
        json_t *s = tw_fx_events_get_if(st.ev, wd_is_state, &idle, 0, NULL, NULL);
        ck_assert_ptr_nonnull(s);
        ck_assert_str_eq(pl_str(json_object_get(s, "timeout"), "kind"),
                         k == 0 ? "turn_deadline" : "step_timeout");
        json_decref(s);
    }
    /* The tool call: warned at 80 % of its 3 s wait, then timed out by 2.2 (the agent went on). */
    ck_assert_uint_eq(pl_events(st.ev, "warning", tx), 1);
    json_t *w = pl_event(st.ev, "warning", tx, 0);
    ck_assert_str_eq(pl_str(w, "kind"), "tool_call");
    ck_assert_str_eq(pl_str(w, "tool_call_id"), "x1");
    ck_assert_int_eq((int)pl_num(w, "limit_seconds"), 3);
    ck_assert(pl_num(w, "elapsed_seconds") >= 2.39 && pl_num(w, "elapsed_seconds") < 3.0);
    json_decref(w);
    ck_assert_int_eq(tw_fx_sql_int(st.fx,
                                   "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1 AND "
                                   "tool_call_id = 'x1' AND wait_status = 'timeout'",
                                   1, tx),
                     1);
    /* turn show lists the warnings. */
    json_t *show = pl_show(st.fx, ts);
    ck_assert_uint_eq(json_array_size(json_object_get(show, "warnings")), 1);
    ck_assert_str_eq(pl_str(json_array_get(json_object_get(show, "warnings"), 0), "kind"), "step_timeout");
    ck_assert_str_eq(pl_str(json_object_get(show, "timeout"), "kind"), "step_timeout");
    json_decref(show);
    /* No warning for what ended well in time. */
    ck_assert_uint_eq(pl_events(st.ev, "warning", tc), 0);
    pl_end(st.fx, td, ts, tc, tx, NULL);
}
END_TEST

/* ---- the timeout hierarchy: call, tool, agent, global
 * ------------------------------------------------------------------ */

START_TEST(test_timeout_hierarchy)
{
    char *dflt = pl_agent("dflt", "");
    char *more = wd_fmt("%s[worker]\ntool_timeout_seconds = 2\nsuspend_timeout_seconds = 1\n"
                        "[tool.ext]\n!timeout_seconds\nsuspend_timeout_seconds = 1\n"
                        "[tool.ext9]\nexternal = true\ntimeout_seconds = 9\nsuspend_timeout_seconds = 1\n",
                        dflt);
    TwFxStack st = pl_stack(NULL, "own", "tool_timeout_seconds = 13\n", more);
    free(more);
    free(dflt);
    char *t1 = wd_submit(st.fx, "own",
                         "{\"mode\":\"tools\",\"calls\":["
                         "{\"id\":\"c\",\"tool\":\"ext\",\"args\":{},\"timeout_seconds\":7},"
                         "{\"id\":\"t\",\"tool\":\"ext9\",\"args\":{}},"
                         "{\"id\":\"a\",\"tool\":\"ext\",\"args\":{}}]}");
    char *t2 = wd_submit(st.fx, "dflt",
                         "{\"mode\":\"tools\",\"calls\":[{\"id\":\"g\",\"tool\":\"ext\",\"args\":{}}]}");
    WD_STATUS_IS(st.fx, t1, "suspended");
    json_t *show = pl_show(st.fx, t1), *call;
    size_t i;
    const char *want[][2] = {{"c", "7 call"}, {"t", "9 tool"}, {"a", "13 agent"}};
    ck_assert_uint_eq(json_array_size(json_object_get(show, "tool_calls")), 3);
    json_array_foreach(json_object_get(show, "tool_calls"), i, call)
    {
        char *got = wd_fmt("%lld %s", pl_int(call, "timeout_seconds"), pl_str(call, "timeout_source"));
        ck_assert_str_eq(pl_str(call, "tool_call_id"), want[i][0]);
        ck_assert_str_eq(got, want[i][1]);
        /* 2.2 waits max(suspend_timeout_seconds 1, the tool's 1, the call's timeout): the timeout itself. */
        char *wait = tw_fx_sql_str(st.fx,
                                   "SELECT extract(epoch FROM deadline_at - created_at)::integer::text FROM "
                                   "state.turn_waiting_tools WHERE turn_id = $1 AND tool_call_id = $2",
                                   2, t1, want[i][0]);
        ck_assert_int_eq(atoi(wait), atoi(want[i][1]));
        free(wait);
        free(got);
    }
    json_decref(show);
    char *out = NULL, *err = NULL;
    ck_assert_int_eq(tw_fx_cli(st.fx, &out, &err, "turn", "show", t1, NULL), 0);
    ck_assert_msg(strstr(out, "timeout=7s(call)") && strstr(out, "timeout=9s(tool)") &&
                      strstr(out, "timeout=13s(agent)"),
                  "%s", out);
    free(out);
    free(err);
    /* The global level, 2 s: 2.2 reports the call timed out at its deadline and the agent completes. */
    WD_STATUS_IS(st.fx, t2, "done");
    show = pl_show(st.fx, t2);
    call = json_array_get(json_object_get(show, "tool_calls"), 0);
    ck_assert_int_eq(pl_int(call, "timeout_seconds"), 2);
    ck_assert_str_eq(pl_str(call, "timeout_source"), "global");
    ck_assert_str_eq(pl_str(call, "result_status"), "timeout");
    ck_assert_ptr_nonnull(strstr(pl_str(json_object_get(call, "error"), "message"), "within 2 seconds"));
    json_decref(show);
    free(t1);
    free(t2);
    tw_fx_free(st.fx);
}
END_TEST

/* ---- history with a reclaim and a retry
 * ---------------------------------------------------------------------------- */

START_TEST(test_history_reclaim_and_retry)
{
    char *t = NULL;
    TwFxStack st = pl_retried_turn("hist", 6, NULL, &t);
    WD_STATUS_IS(st.fx, t, "running");
    char *a_id = tw_fx_sql_str(st.fx,
                               "SELECT claimed_by FROM state.agent_inbox WHERE turn_id = $1 AND "
                               "status = 'processing'",
                               1, t);
    ck_assert_ptr_nonnull(a_id);
    /* Worker A dies holding the step; B takes it again (the liveness reclaim), times out, and retries. */
    TwFxProc *wb = tw_fx_start_worker(st.fx, NULL);
    tw_fx_proc_kill9(st.worker);
    WD_STATUS_IS(st.fx, t, "done");
    pl_wait_events(st.ev, "task", t, 1);
    char *b_pid = wd_fmt("%d", (int)tw_fx_proc_pid(wb));
    char *b_id =
        tw_fx_sql_str(st.fx, "SELECT daemon_id FROM state.daemons WHERE pid = $1::integer", 1, b_pid);
    free(b_pid);
    ck_assert_ptr_nonnull(b_id);

    json_t *h = pl_history(st.fx, t), *row;
    size_t i;
    /* from -> to, attempt, and who: the transitions in order. */
    struct {
        const char *from, *to;
        int attempt;
        const char *actor, *reason;
    } want[] = {
        {"", "pending", 1, "cli", "submitted"},
        {"pending", "dispatched", 1, NULL, "dispatched"},
        {"dispatched", "running", 1, a_id, "claimed"},
        {"running", "running", 1, NULL, "reclaimed"},
        {"running", "pending", 2, b_id, "retry after step_timeout"},
        {"pending", "dispatched", 2, NULL, "dispatched"},
        {"dispatched", "running", 2, b_id, "claimed"},
        {"running", "done", 2, b_id, "completed"},
    };
    if (json_array_size(h) != sizeof want / sizeof want[0]) {
        char *dump = json_dumps(h, JSON_INDENT(1));
        fprintf(stderr, "history: %s\n", dump);
        free(dump);
    }
    ck_assert_uint_eq(json_array_size(h), sizeof want / sizeof want[0]);
    char *prev = NULL;
    json_array_foreach(h, i, row)
    {
        ck_assert_str_eq(pl_str(row, "from"), want[i].from);
        ck_assert_str_eq(pl_str(row, "to"), want[i].to);
        ck_assert_int_eq(pl_int(row, "attempt"), want[i].attempt);
        if (want[i].actor)
            ck_assert_str_eq(pl_str(row, "actor"), want[i].actor);
        ck_assert_msg(strstr(pl_str(row, "reason"), want[i].reason), "row %zu: reason '%s', want '%s'", i,
                      pl_str(row, "reason"), want[i].reason);
        /* Times on the database clock, never going back. */
        if (prev)
            ck_assert(pl_secs(st.fx, prev, pl_str(row, "at")) >= 0);
        free(prev);
        prev = strdup(pl_str(row, "at"));
    }
    free(prev);
    /* The reclaim names the worker that was gone, and is not A's own doing. */
    json_t *rec = json_array_get(h, 3);
    ck_assert_ptr_nonnull(strstr(pl_str(rec, "reason"), a_id));
    ck_assert_str_ne(pl_str(rec, "actor"), a_id);
    /* The epoch moves with each dispatch and with the retry. */
    ck_assert_int_lt(pl_int(json_array_get(h, 2), "turn_epoch"), pl_int(json_array_get(h, 4), "turn_epoch"));
    ck_assert_int_lt(pl_int(json_array_get(h, 4), "turn_epoch"), pl_int(json_array_get(h, 5), "turn_epoch"));
    json_decref(h);
    /* The human table has the same rows. */
    char *out = NULL, *err = NULL;
    ck_assert_int_eq(tw_fx_cli(st.fx, &out, &err, "turn", "history", t, NULL), 0);
    ck_assert_ptr_nonnull(strstr(out, "running -> pending"));
    ck_assert_ptr_nonnull(strstr(out, "reclaimed"));
    free(out);
    free(err);
    ck_assert_uint_eq(wd_task_events(st.ev, t), 1);
    ck_assert_uint_eq(pl_events(st.ev, "retry", t), 1);
    pl_end(st.fx, a_id, b_id, t, NULL);
}
END_TEST

/* ---- two PMOs and two workers retrying the same turns
 * ------------------------------------------------------------------ */

#define PL_WORKER_TURNS 16
#define PL_QUEUE_TURNS 6

START_TEST(test_retries_many_daemons)
{
    char *exec = tw_fx_build_path("examples/agents/tw-test-agent");
    char *more = NULL;
    wd_agents(&more, "p", 4, exec);
    /* q: served by no worker, so each attempt ends in the queue and a PMO retries it. */
    char *q = pl_agent("q", "queue_timeout_seconds = 1\nretry_on = queue_timeout\n");
    wd_append(&more,
              "%s[worker]\nagents = p01,p02,p03,p04\nmax_attempts = 3\nretry_backoff_seconds = 1\n"
              "retry_backoff_max_seconds = 2\n",
              q);
    char *conf = wd_fmt("%s%s", pl_base, more);
    TwFx *fx = wd_fixture(conf);
    TwFxEvents *evt = tw_fx_events_new(fx, "evt.>");
    TwFxProc *procs[4] = {tw_fx_start_pmo(fx, NULL), tw_fx_start_pmo(fx, NULL), tw_fx_start_worker(fx, NULL),
                          tw_fx_start_worker(fx, NULL)};
    (void)procs;
    char *turns[PL_WORKER_TURNS + PL_QUEUE_TURNS];
    /* Attempts 1 and 2 exit non-zero (agent_exit, retried by the worker that ran them), attempt 3 completes.
     */
    for (int i = 0; i < PL_WORKER_TURNS; i++) {
        char *agent = wd_fmt("p%02d", i % 4 + 1);
        turns[i] = wd_submit_sql(
            fx, agent, "{\"mode\":\"exit\",\"code\":1,\"on_attempt\":{\"3\":{\"mode\":\"complete\"}}}", NULL);
        free(agent);
    }
    for (int i = 0; i < PL_QUEUE_TURNS; i++)
        turns[PL_WORKER_TURNS + i] = wd_submit_sql(fx, "q", "{}", NULL);
    for (int i = 0; i < PL_WORKER_TURNS + PL_QUEUE_TURNS; i++) {
        bool worker_side = i < PL_WORKER_TURNS;
        WD_STATUS_IS(fx, turns[i], worker_side ? "done" : "timeout");
        pl_wait_events(evt, "task", turns[i], 1);
    }
    tw_fx_sleep_ms(1000);
    for (int i = 0; i < PL_WORKER_TURNS + PL_QUEUE_TURNS; i++) {
        const char *t = turns[i];
        bool worker_side = i < PL_WORKER_TURNS;
        /* Exactly attempts 1, 2, 3: two retries with attempts 2 and 3, one final event, in the outbox and on
         * NATS (the same event_id if published twice). */
        ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT attempt FROM state.turns WHERE turn_id = $1", 1, t), 3);
        ck_assert_int_eq(
            tw_fx_sql_int(fx, "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND kind = 'retry'", 1,
                          t),
            2);
        ck_assert_int_eq(
            tw_fx_sql_int(fx,
                          "SELECT count(DISTINCT payload ->> 'attempt') FROM state.outbox "
                          "WHERE turn_id = $1 AND kind = 'retry' AND payload ->> 'attempt' IN ('2', '3')",
                          1, t),
            2);
        ck_assert_int_eq(
            tw_fx_sql_int(fx, "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND kind = 'task'", 1, t),
            1);
        json_t *ids = json_array();
        for (size_t k = 0; k < pl_events(evt, "retry", t); k++) {
            json_t *r = pl_event(evt, "retry", t, k);
            bool dup = false;
            json_t *id;
            size_t j;
            json_array_foreach(ids, j, id) dup |= json_equal(id, json_object_get(r, "event_id"));
            if (!dup)
                json_array_append(ids, json_object_get(r, "event_id"));
            json_decref(r);
        }
        ck_assert_uint_eq(json_array_size(ids), 2);
        json_decref(ids);
        ck_assert_uint_eq(wd_task_events(evt, t), 1);
        /* The history: each attempt starts once (one pending -> dispatched per attempt), one change of
         * attempt per retry. */
        ck_assert_int_eq(tw_fx_sql_int(fx,
                                       "SELECT count(*) FROM state.turn_history WHERE turn_id = $1 AND "
                                       "to_status = 'pending' AND reason LIKE 'retry after %'",
                                       1, t),
                         2);
        ck_assert_int_eq(
            tw_fx_sql_int(fx, "SELECT count(DISTINCT attempt) FROM state.turn_history WHERE turn_id = $1", 1,
                          t),
            3);
        /* No attempt leaves pending twice (dispatched, or dispatched and claimed at once by the worker whose
         * slot was free); the worker's turns start every attempt (the queue's may end still pending). */
        ck_assert_int_eq(tw_fx_sql_int(fx,
                                       "SELECT count(*) FROM (SELECT attempt FROM state.turn_history WHERE "
                                       "turn_id = $1 AND from_status = 'pending' AND to_status <> 'pending' "
                                       "GROUP BY attempt HAVING count(*) > 1) x",
                                       1, t),
                         0);
        if (worker_side)
            ck_assert_int_eq(
                tw_fx_sql_int(fx,
                              "SELECT count(DISTINCT attempt) FROM state.turn_history WHERE "
                              "turn_id = $1 AND from_status = 'pending' AND to_status <> 'pending'",
                              1, t),
                3);
        if (!worker_side) {
            /* At most one queue warning per attempt, whichever PMO sent it (a warning due while its attempt
             * is retried already is not sent late). */
            ck_assert_int_eq(tw_fx_sql_int(fx,
                                           "SELECT count(*) - count(DISTINCT payload ->> 'attempt') FROM "
                                           "state.outbox WHERE turn_id = $1 AND kind = 'warning'",
                                           1, t),
                             0);
            ck_assert_int_ge(tw_fx_sql_int(fx,
                                           "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND "
                                           "kind = 'warning'",
                                           1, t),
                             1);
            ck_assert_int_eq(
                tw_fx_sql_int(fx,
                              "SELECT count(*) FROM state.turns WHERE turn_id = $1 AND "
                              "error = 'queue_timeout' AND timeout_detail ->> 'policy' = 'dead_letter'",
                              1, t),
                1);
        }
        free(turns[i]);
    }
    ck_assert(tw_fx_sql_wait(fx, WD_WAIT_MS, "0",
                             "SELECT count(*) FROM state.outbox WHERE published_at IS NULL", 0));
    free(exec);
    free(q);
    free(more);
    free(conf);
    wd_assert_no_deadlock(fx);
    tw_fx_free(fx);
}
END_TEST

/* ---- timeouts suggest (contract 18)
 * ---------------------------------------------------------------------------------------------- */

/* The entry `name` of list `list` ("profiles" or "tools") of `timeouts suggest --json`, borrowed. */
static json_t *pl_suggest_entry(json_t *doc, const char *list, const char *name)
{
    json_t *e;
    size_t i;
    json_array_foreach(json_object_get(doc, list), i, e)
    {
        if (strcmp(pl_str(e, strcmp(list, "tools") == 0 ? "tool" : "profile"), name) == 0)
            return e;
    }
    ck_abort_msg("timeouts suggest: no %s entry %s", list, name);
    return NULL;
}

static long pl_round_up(double x)
{
    long v = (long)x;
    return (double)v < x ? v + 1 : v;
}

/* Steps and tool calls of known lengths, run for real: profile `timed` (step limit 3 s) has 6 steps of 0.1 s,
 * two of 2.2 s, one that outlives its limit and the two quick steps of a turn that calls tool `sleep` (limit
 * 2 s) 4 times for 0.1 s, twice for 0.3 s and once for 30 s (which times out). `timeouts suggest` counts
 * them, suggests from the p99 of the successful ones (no less: the two 2.2 s steps are above it) times 1.5,
 * and not below the limit in force for the tool whose calls timed out; its INI lines, pasted into the
 * configuration, pass
 * --check-config; names it does not know are exit 2. */
START_TEST(test_timeouts_suggest)
{
    char *tools = wd_fmt("[tool.sleep]\ntimeout_seconds = 2\n");
    TwFxStack st = pl_stack(NULL, "timed", "step_timeout_seconds = 3\nwarn_at_percent = 0\n", tools);
    TwFx *fx = st.fx;
    static const char *const inputs[] = {
        "{\"mode\":\"sleep\",\"seconds\":0.1}",
        "{\"mode\":\"sleep\",\"seconds\":0.1}",
        "{\"mode\":\"sleep\",\"seconds\":0.1}",
        "{\"mode\":\"sleep\",\"seconds\":0.1}",
        "{\"mode\":\"sleep\",\"seconds\":0.1}",
        "{\"mode\":\"sleep\",\"seconds\":0.1}",
        "{\"mode\":\"sleep\",\"seconds\":2.2}",
        "{\"mode\":\"sleep\",\"seconds\":2.2}",
        "{\"mode\":\"sleep\",\"seconds\":30}",
        "{\"mode\":\"tools\",\"calls\":["
        "{\"id\":\"a\",\"tool\":\"sleep\",\"args\":{\"seconds\":0.1}},"
        "{\"id\":\"b\",\"tool\":\"sleep\",\"args\":{\"seconds\":0.1}},"
        "{\"id\":\"c\",\"tool\":\"sleep\",\"args\":{\"seconds\":0.1}},"
        "{\"id\":\"d\",\"tool\":\"sleep\",\"args\":{\"seconds\":0.1}},"
        "{\"id\":\"e\",\"tool\":\"sleep\",\"args\":{\"seconds\":0.3}},"
        "{\"id\":\"f\",\"tool\":\"sleep\",\"args\":{\"seconds\":0.3}},"
        "{\"id\":\"g\",\"tool\":\"sleep\",\"args\":{\"seconds\":30}}]}",
    };
    enum { N = sizeof inputs / sizeof inputs[0] };
    char *turns[N];
    for (size_t i = 0; i < N; i++)
        turns[i] = wd_submit(fx, "timed", inputs[i]);
    for (size_t i = 0; i < N; i++)
        WD_STATUS_WITHIN(fx, turns[i], i == 8 ? "failed" : "done", 60000);

    json_t *doc = pl_cli_json(fx, "timeouts", "suggest", NULL, NULL);
    json_t *p = pl_suggest_entry(doc, "profiles", "timed");
    ck_assert_int_eq(pl_int(p, "count"), 11);
    ck_assert_int_eq(pl_int(p, "timed_out"), 1);
    ck_assert_int_eq(pl_int(p, "ok"), 10);
    double ok_p99 = pl_num(p, "ok_p99_seconds");
    ck_assert_msg(ok_p99 >= 2.2, "p99 of the successful steps %.3f, below the 2.2 s two of them slept",
                  ok_p99);
    ck_assert_msg(pl_num(p, "p50_seconds") <= pl_num(p, "p95_seconds") &&
                      pl_num(p, "p95_seconds") <= pl_num(p, "p99_seconds") &&
                      pl_num(p, "p99_seconds") <= pl_num(p, "max_seconds"),
                  "percentiles out of order");
    ck_assert_msg(pl_num(p, "max_seconds") >= 3.0, "the timed-out step ran %.3f s", pl_num(p, "max_seconds"));
    ck_assert_int_eq(pl_int(p, "timeout_seconds"), 3);
    ck_assert_str_eq(pl_str(p, "timeout_source"), "agent");
    long sp = (long)pl_int(p, "suggested_seconds");
    ck_assert_int_eq(sp, pl_round_up(ok_p99 * 1.5));
    ck_assert_msg((double)sp >= ok_p99 && sp > 3, "suggested %ld for p99 %.3f", sp, ok_p99);

    json_t *t = pl_suggest_entry(doc, "tools", "sleep");
    ck_assert_int_eq(pl_int(t, "count"), 7);
    ck_assert_int_eq(pl_int(t, "timed_out"), 1);
    ck_assert_int_eq(pl_int(t, "ok"), 6);
    ck_assert_msg(pl_num(t, "ok_p99_seconds") >= 0.3, "tool p99 %.3f", pl_num(t, "ok_p99_seconds"));
    ck_assert_int_eq(pl_int(t, "timeout_seconds"), 2);
    ck_assert_str_eq(pl_str(t, "timeout_source"), "tool");
    /* 0.3 s x 1.5 would be 1 s, below the 2 s at which one call was stopped: not below it. */
    ck_assert_int_eq(pl_int(t, "suggested_seconds"), 2);
    ck_assert_msg(strstr(pl_str(t, "note"), "timed out at the 2 s in force"), "note: %s", pl_str(t, "note"));
    ck_assert_int_eq(pl_int(json_object_get(t, "by_source"), "tool"), 7);
    /* A profile of the configuration without steps is listed, with nothing to suggest. */
    json_t *idle = pl_suggest_entry(doc, "profiles", "echo");
    ck_assert_int_eq(pl_int(idle, "count"), 0);
    ck_assert(json_is_null(json_object_get(idle, "suggested_seconds")));

    /* The text output ends with the same INI lines; pasted into the configuration (each key into its section,
     * as the fixture's overrides do) they pass --check-config and set the suggested values. */
    const char *ini = pl_str(doc, "ini");
    char *want = wd_fmt("[agent.timed]\n; p99 ");
    ck_assert_msg(strstr(ini, want) && strstr(ini, "[tool.sleep]\n"), "ini:\n%s", ini);
    free(want);
    char *out = NULL, *err = NULL;
    ck_assert_int_eq(tw_fx_cli(fx, &out, &err, "timeouts", "suggest", NULL), 0);
    ck_assert_msg(strstr(out, ini) && strstr(out, "PROFILE") && strstr(out, "TOOL"), "text output:\n%s", out);
    fprintf(stderr, "turnwatch timeouts suggest:\n%s", out);
    free(out);
    free(err);
    char *conf = pl_conf("timed", "step_timeout_seconds = 3\nwarn_at_percent = 0\n", tools);
    char *pasted = wd_fmt("%s\n%s", conf, ini);
    const char *path = tw_fx_write_config(fx, "suggested.ini", pasted);
    const char *check[] = {tw_fx_cli_path(), "-c", path, "--check-config", NULL};
    ck_assert_msg(tw_fx_run(check, &out, &err) == 0, "--check-config of the pasted lines: %s%s", out, err);
    free(out);
    free(err);
    const char *wcheck[] = {tw_fx_worker_path(), "-c", path, "--check-config", NULL};
    ck_assert_msg(tw_fx_run(wcheck, &out, &err) == 0, "worker --check-config: %s%s", out, err);
    free(out);
    free(err);
    TwConfig cfg;
    ck_assert_int_eq(tw_config_load(&cfg, path), 0);
    ck_assert_int_eq(tw_config_agent(&cfg, "timed")->step_timeout_sec, sp);
    ck_assert_int_eq(tw_config_tool(&cfg, "sleep")->timeout_sec, 2);
    tw_config_free(&cfg);
    json_decref(doc);

    /* Filters: one profile, no tools; one tool, no profiles. */
    doc = pl_cli_json(fx, "timeouts", "suggest", "--profile=timed", "--days=1");
    ck_assert_int_eq(json_array_size(json_object_get(doc, "profiles")), 1);
    ck_assert_int_eq(json_array_size(json_object_get(doc, "tools")), 0);
    ck_assert_int_eq(pl_int(pl_suggest_entry(doc, "profiles", "timed"), "count"), 11);
    json_decref(doc);
    doc = pl_cli_json(fx, "timeouts", "suggest", "--tool=sleep", NULL);
    ck_assert_int_eq(json_array_size(json_object_get(doc, "profiles")), 0);
    ck_assert_int_eq(json_array_size(json_object_get(doc, "tools")), 1);
    json_decref(doc);

    /* Names it does not know, and bad input: exit 2 with one line saying so. */
    static const char *const bad[][3] = {
        {"--profile", "nosuch", "unknown profile 'nosuch': no [agent.nosuch] section in"},
        {"--tool", "nosuch", "unknown tool 'nosuch': no [tool.nosuch] section in"},
        {"--profile", "no such", "invalid profile name"},
        {"--days", "0", "--days must be a whole number from 1 to 3650"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = tw_fx_cli(fx, &out, &err, "timeouts", "suggest", bad[i][0], bad[i][1], NULL);
        ck_assert_msg(rc == 2 && strstr(err, bad[i][2]), "%s %s: exit %d, stderr %s", bad[i][0], bad[i][1],
                      rc, err);
        free(out);
        free(err);
    }
    free(conf);
    free(pasted);
    free(tools);
    for (size_t i = 0; i < N; i++)
        free(turns[i]);
    pl_end(fx, NULL);
}
END_TEST

TW_SUITE_DEFINE(policies, {
                              {"retries", test_retry_then_success, 120},
                              {"retries", test_dead_letters_and_replay, 120},
                              {"retries", test_no_retry_outside_retry_on, 120},
                              {"retries", test_backoff_bounds, 120},
                              {"budgets", test_queue_timeout, 120},
                              {"budgets", test_warnings_then_timeout, 120},
                              {"budgets", test_timeout_hierarchy, 120},
                              {"history", test_history_reclaim_and_retry, 120},
                              {"many", test_retries_many_daemons, 240},
                              {"suggest", test_timeouts_suggest, 180},
                          })
