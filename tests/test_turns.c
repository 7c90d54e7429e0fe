/* test_turns.c — a turn's life against real servers: the happy path with its one final event and deliverable
 * card, one turn at a time per agent in FIFO order while agents run in parallel, and every way an agent step
 * can fail (reported failure, non-zero exit, garbage output, step timeout with SIGTERM and with SIGKILL). */
#include "fixture.h"
#include "suite.h"

#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define WAIT_MS 20000

/* ---- helpers
 * ---------------------------------------------------------------------------------------------------- */

/* SIGTERM; the daemon must exit 0 (its log goes to stderr when it does not). */
static void stop_daemon(TwFxProc *p)
{
    int rc = tw_fx_proc_terminate(p, 15000);
    if (rc != 0)
        tw_fx_proc_dump(p);
    ck_assert_msg(rc == 0, "%s exited %d on SIGTERM", tw_fx_proc_log_path(p), rc);
}

/* `turnwatch submit --json`; returns the new turn id. */
static char *submit(TwFxStack *e, const char *agent, const char *channel, const char *input)
{
    char *out = NULL, *err = NULL;
    int rc = tw_fx_cli(e->fx, &out, &err, "submit", "--json", "--agent", agent, "--channel", channel,
                       "--input", input, NULL);
    ck_assert_msg(rc == 0, "submit exited %d: %s", rc, err);
    json_t *j = json_loads(out, 0, NULL);
    ck_assert_msg(j != NULL, "submit --json printed no JSON: %s", out);
    ck_assert(json_is_true(json_object_get(j, "created")));
    const char *id = json_string_value(json_object_get(j, "turn_id"));
    ck_assert_ptr_nonnull(id);
    char *copy = strdup(id);
    json_decref(j);
    free(out);
    free(err);
    return copy;
}

static char *turn_col(TwFxStack *e, const char *col, const char *turn)
{
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT %s::text FROM state.turns WHERE turn_id = $1", col);
    return tw_fx_sql_str(e->fx, sql, 1, turn);
}

/* Waits until the turn has ended, then returns its status. */
static char *wait_ended(TwFxStack *e, const char *turn, int timeout_ms)
{
    if (!tw_fx_sql_wait(e->fx, timeout_ms, "t",
                        "SELECT status IN ('done', 'failed', 'timeout', 'cancelled') FROM state.turns "
                        "WHERE turn_id = $1",
                        1, turn)) {
        tw_fx_stack_dump(e);
        char *st = turn_col(e, "status", turn);
        ck_abort_msg("turn %s did not end within %d ms (status %s)", turn, timeout_ms, st ? st : "?");
    }
    return turn_col(e, "status", turn);
}

/* Waits until every outbox event of the turn is published (so no relay copy can still come), then returns the
 * turn's final task event as seen on NATS and checks it was the only one: all copies carry one event_id (the
 * contract allows at-least-once delivery only with the same id), and the outbox holds exactly one task row.
 */
static json_t *final_event(TwFxStack *e, const char *agent, const char *turn)
{
    char subject[128];
    snprintf(subject, sizeof subject, "evt.agent.%s.task", agent);
    ck_assert_msg(
        tw_fx_sql_wait(e->fx, WAIT_MS, "0",
                       "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND published_at IS NULL", 1,
                       turn),
        "outbox events of turn %s were not all published", turn);
    if (!tw_fx_events_wait(e->ev, subject, turn, 1, WAIT_MS)) {
        tw_fx_stack_dump(e);
        ck_abort_msg("no %s event for turn %s", subject, turn);
    }
    /* Published means flushed to the server; give its delivery to our subscriber a moment. */
    tw_fx_sleep_ms(300);
    size_t n = tw_fx_events_count(e->ev, "evt.agent.*.task", turn);
    json_t *first = tw_fx_events_get(e->ev, subject, turn, 0, NULL, NULL);
    ck_assert_ptr_nonnull(first);
    const char *id0 = json_string_value(json_object_get(first, "event_id"));
    ck_assert_ptr_nonnull(id0);
    for (size_t k = 1; k < n; k++) {
        json_t *other = tw_fx_events_get(e->ev, "evt.agent.*.task", turn, k, NULL, NULL);
        ck_assert_msg(other &&
                          json_equal(json_object_get(other, "event_id"), json_object_get(first, "event_id")),
                      "turn %s has more than one final event", turn);
        json_decref(other);
    }
    ck_assert_int_eq(tw_fx_sql_int(e->fx,
                                   "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND kind = 'task'",
                                   1, turn),
                     1);
    char *db_id = tw_fx_sql_str(
        e->fx, "SELECT event_id::text FROM state.outbox WHERE turn_id = $1 AND kind = 'task'", 1, turn);
    ck_assert_str_eq(db_id, id0);
    free(db_id);
    return first;
}

static const char *jstr(json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

/* The agent's state events for this turn, in commit order (outbox seq), as "dispatched,running,idle". Also
 * checks each one reached NATS. */
static char *state_sequence(TwFxStack *e, const char *agent, const char *turn)
{
    char *seq = tw_fx_sql_str(e->fx,
                              "SELECT string_agg(payload->>'status', ',' ORDER BY seq) FROM state.outbox "
                              "WHERE turn_id = $1 AND kind = 'state'",
                              1, turn);
    ck_assert_ptr_nonnull(seq);
    char subject[128];
    snprintf(subject, sizeof subject, "evt.agent.%s.state", agent);
    const char *statuses[] = {"\"dispatched\"", "\"running\"", "\"idle\""};
    for (size_t i = 0; i < 3; i++) {
        /* Both the turn id and the status must be in one payload. */
        size_t n = tw_fx_events_count(e->ev, subject, turn), seen = 0;
        for (size_t k = 0; k < n; k++) {
            json_t *j = tw_fx_events_get(e->ev, subject, turn, k, NULL, NULL);
            char want[32];
            snprintf(want, sizeof want, "%.*s", (int)strlen(statuses[i]) - 2, statuses[i] + 1);
            if (j && jstr(j, "status") && strcmp(jstr(j, "status"), want) == 0)
                seen++;
            json_decref(j);
        }
        ck_assert_msg(seen >= 1, "no %s state event %s on NATS for turn %s", subject, statuses[i], turn);
    }
    return seq;
}

static int64_t turn_ms(TwFxStack *e, const char *col, const char *turn)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT (extract(epoch FROM %s) * 1000)::bigint FROM state.turns WHERE turn_id = $1", col);
    return tw_fx_sql_int(e->fx, sql, 1, turn);
}

/* ---- the happy path
 * --------------------------------------------------------------------------------------------- */

START_TEST(test_turn_completes)
{
    TwFxStack e = tw_fx_stack_start(NULL);
    char *turn = submit(&e, "echo", "chan-1", "{\"hello\":\"world\",\"n\":[1,2,3]}");
    char *status = wait_ended(&e, turn, WAIT_MS);
    ck_assert_str_eq(status, "done");
    free(status);

    json_t *ev = final_event(&e, "echo", turn);
    ck_assert_str_eq(jstr(ev, "status"), "done");
    ck_assert_str_eq(jstr(ev, "agent"), "echo");
    ck_assert_str_eq(jstr(ev, "turn_id"), turn);
    ck_assert_str_eq(jstr(ev, "channel_id"), "chan-1");
    ck_assert_ptr_nonnull(jstr(ev, "at"));
    ck_assert_ptr_null(json_object_get(ev, "error"));
    ck_assert(json_is_integer(json_object_get(ev, "turn_epoch")));
    char *epoch = turn_col(&e, "turn_epoch", turn);
    ck_assert_int_eq(json_integer_value(json_object_get(ev, "turn_epoch")), atoll(epoch));
    ck_assert_int_ge(atoll(epoch), 1);
    free(epoch);

    /* The deliverable named by the event exists, is this turn's task.deliverable, and holds the agent's
     * output. */
    const char *card = jstr(ev, "deliverable_card_id");
    ck_assert_ptr_nonnull(card);
    char *type = tw_fx_sql_str(e.fx, "SELECT card_type FROM state.cards WHERE card_id = $1::uuid", 1, card);
    ck_assert_ptr_nonnull(type);
    ck_assert_str_eq(type, "task.deliverable");
    free(type);
    char *card_turn =
        tw_fx_sql_str(e.fx, "SELECT turn_id::text FROM state.cards WHERE card_id = $1::uuid", 1, card);
    ck_assert_str_eq(card_turn, turn);
    free(card_turn);
    char *hello = tw_fx_sql_str(
        e.fx, "SELECT content #>> '{output,echo,hello}' FROM state.cards WHERE card_id = $1::uuid", 1, card);
    ck_assert_str_eq(hello, "world");
    free(hello);
    char *turn_card = turn_col(&e, "deliverable_card_id", turn);
    ck_assert_str_eq(turn_card, card);
    free(turn_card);
    ck_assert_int_eq(tw_fx_sql_int(e.fx, "SELECT count(*) FROM state.cards WHERE turn_id = $1", 1, turn), 1);

    /* The turn row: ended cleanly, every timestamp set. (Each is its transaction's now(): a claim whose
     * transaction began just before the dispatch committed may carry a started_at a little before
     * dispatched_at, so only the order that one worker's own transactions guarantee is checked.) */
    ck_assert_ptr_null(turn_col(&e, "error", turn));
    ck_assert_int_eq(
        tw_fx_sql_int(e.fx,
                      "SELECT count(*) FROM state.turns WHERE turn_id = $1 AND created_at IS NOT NULL "
                      "AND dispatched_at IS NOT NULL AND started_at <= ended_at AND created_at < ended_at",
                      1, turn),
        1);
    /* The turn message was claimed and archived; the agent is idle again with nothing active. */
    ck_assert_int_eq(
        tw_fx_sql_int(e.fx,
                      "SELECT count(*) FROM state.agent_inbox WHERE turn_id = $1 AND message_type = 'turn' "
                      "AND status = 'archived' AND processed_at IS NOT NULL AND archived_at IS NOT NULL",
                      1, turn),
        1);
    char *agent_status =
        tw_fx_sql_str(e.fx,
                      "SELECT status || '/' || coalesce(active_agent_turn_id::text, '-') FROM "
                      "state.agents WHERE agent = 'echo'",
                      0);
    ck_assert_str_eq(agent_status, "idle/-");
    free(agent_status);

    char *seq = state_sequence(&e, "echo", turn);
    ck_assert_str_eq(seq, "dispatched,running,idle");
    free(seq);
    json_decref(ev);
    free(turn);
    stop_daemon(e.worker);
    stop_daemon(e.pmo);
    tw_fx_free(e.fx);
}
END_TEST

/* ---- ordering and parallelism
 * ----------------------------------------------------------------------------------- */

#define ORDER_TURNS 4
#define CLOCK_SKEW_MS 100

START_TEST(test_fifo_per_agent_parallel_across_agents)
{
    char *agent_exec = tw_fx_build_path("examples/agents/tw-test-agent");
    char overrides[1024];
    snprintf(overrides, sizeof overrides,
             "[agent.tester2]\nexec = %s\nstep_timeout_seconds = 10\nkill_grace_seconds = 1\n", agent_exec);
    free(agent_exec);
    TwFxStack e = tw_fx_stack_start(overrides);
    const char *agents[2] = {"tester", "tester2"};
    char *turns[2][ORDER_TURNS];
    /* Interleaved submission, all in one transaction so that both agents have their queues at once whatever
     * the machine's speed (one CLI submit after another can take longer than a step on a loaded machine);
     * every step sleeps long enough that a second step of the same agent would overlap. */
    char n[8];
    snprintf(n, sizeof n, "%d", ORDER_TURNS);
    tw_fx_sql_exec(
        e.fx,
        "SELECT tw.submit_turn(a, 'order-' || i, jsonb_build_object('mode', 'sleep', 'seconds', 0.5, "
        "'i', i)) FROM generate_series(0, $1::integer - 1) i, unnest(ARRAY['tester', 'tester2']) "
        "WITH ORDINALITY u(a, k) ORDER BY i, k",
        1, n);
    for (int i = 0; i < ORDER_TURNS; i++)
        for (int a = 0; a < 2; a++) {
            char idx[8];
            snprintf(idx, sizeof idx, "%d", i);
            turns[a][i] = tw_fx_sql_str(e.fx,
                                        "SELECT turn_id::text FROM state.turns WHERE agent = $1 "
                                        "AND channel_id = 'order-' || $2",
                                        2, agents[a], idx);
        }
    for (int a = 0; a < 2; a++)
        for (int i = 0; i < ORDER_TURNS; i++) {
            char *st = wait_ended(&e, turns[a][i], 30000);
            ck_assert_msg(strcmp(st, "done") == 0, "turn %d of %s ended %s", i, agents[a], st);
            free(st);
        }

    int64_t start[2][ORDER_TURNS], end[2][ORDER_TURNS], disp[2][ORDER_TURNS];
    for (int a = 0; a < 2; a++)
        for (int i = 0; i < ORDER_TURNS; i++) {
            start[a][i] = turn_ms(&e, "started_at", turns[a][i]);
            end[a][i] = turn_ms(&e, "ended_at", turns[a][i]);
            disp[a][i] = turn_ms(&e, "dispatched_at", turns[a][i]);
            ck_assert_int_ge(end[a][i] - start[a][i], 450); /* the step really ran its 0.5 s */
        }
    /* One agent: one turn at a time, in submit order (database clock). The next dispatch is part of the
     * previous turn's ending transaction, so it is never earlier; started_at is the claim transaction's
     * now(), which may precede the commit it then sees by a moment, hence the small allowance (steps last 500
     * ms). */
    for (int a = 0; a < 2; a++)
        for (int i = 1; i < ORDER_TURNS; i++) {
            ck_assert_msg(disp[a][i] >= end[a][i - 1] && start[a][i] >= end[a][i - 1] - CLOCK_SKEW_MS,
                          "%s: turn %d was dispatched/started (%lld/%lld) before turn %d ended (%lld)",
                          agents[a], i, (long long)disp[a][i], (long long)start[a][i], i - 1,
                          (long long)end[a][i - 1]);
            ck_assert_int_gt(end[a][i], end[a][i - 1]);
        }
    /* Two agents: their running intervals overlap (the worker runs up to 4 programs at once). */
    int overlaps = 0;
    for (int i = 0; i < ORDER_TURNS; i++)
        for (int j = 0; j < ORDER_TURNS; j++) {
            int64_t lo = start[0][i] > start[1][j] ? start[0][i] : start[1][j];
            int64_t hi = end[0][i] < end[1][j] ? end[0][i] : end[1][j];
            if (hi - lo > CLOCK_SKEW_MS)
                overlaps++;
        }
    /* Two sequences of 0.5 s steps started together overlap in 4 to 7 pairs; one turn of lag still leaves 3.
     */
    ck_assert_msg(overlaps >= 2, "tester and tester2 did not run in parallel (%d overlapping pairs)",
                  overlaps);

    /* The same from the events: per agent, the final events arrive in submit order, and the agent's state
     * events (commit order) never show a second dispatch before the previous turn's idle. */
    for (int a = 0; a < 2; a++) {
        char subject[64];
        snprintf(subject, sizeof subject, "evt.agent.%s.task", agents[a]);
        ck_assert(tw_fx_events_wait(e.ev, subject, NULL, ORDER_TURNS, WAIT_MS));
        for (int i = 0; i < ORDER_TURNS; i++) {
            json_t *j = tw_fx_events_get(e.ev, subject, NULL, (size_t)i, NULL, NULL);
            ck_assert_str_eq(jstr(j, "turn_id"), turns[a][i]);
            ck_assert_str_eq(jstr(j, "status"), "done");
            json_decref(j);
        }
        char *seq = tw_fx_sql_str(e.fx,
                                  "SELECT string_agg(payload->>'status', ',' ORDER BY seq) FROM state.outbox "
                                  "WHERE kind = 'state' AND payload->>'agent' = $1",
                                  1, agents[a]);
        ck_assert_str_eq(seq, "dispatched,running,idle,dispatched,running,idle,dispatched,running,idle,"
                              "dispatched,running,idle");
        free(seq);
        /* Epochs grow by one per dispatch. */
        for (int i = 1; i < ORDER_TURNS; i++) {
            char *p = turn_col(&e, "turn_epoch", turns[a][i - 1]),
                 *q = turn_col(&e, "turn_epoch", turns[a][i]);
            ck_assert_int_eq(atoll(q), atoll(p) + 1);
            free(p);
            free(q);
        }
    }
    for (int a = 0; a < 2; a++)
        for (int i = 0; i < ORDER_TURNS; i++)
            free(turns[a][i]);
    tw_fx_free(e.fx);
}
END_TEST

/* ---- failures
 * --------------------------------------------------------------------------------------------------- */

typedef struct FailCase {
    const char *input;
    const char *error;
    const char *message_part[3];
} FailCase;

/* Checks a failed turn: status, error code, message, one final event saying the same, agent back to idle. */
static void check_failed(TwFxStack *e, const char *turn, const FailCase *fc)
{
    char *st = wait_ended(e, turn, WAIT_MS);
    ck_assert_msg(strcmp(st, "failed") == 0, "input %s: turn ended %s", fc->input, st);
    free(st);
    char *err = turn_col(e, "error", turn), *msg = turn_col(e, "error_message", turn);
    ck_assert_msg(err && strcmp(err, fc->error) == 0, "input %s: error %s, want %s", fc->input, err,
                  fc->error);
    ck_assert_ptr_nonnull(msg);
    for (size_t i = 0; i < 3 && fc->message_part[i]; i++)
        ck_assert_msg(strstr(msg, fc->message_part[i]), "input %s: message '%s' lacks '%s'", fc->input, msg,
                      fc->message_part[i]);

    json_t *ev = final_event(e, "tester", turn);
    ck_assert_str_eq(jstr(ev, "status"), "failed");
    ck_assert_str_eq(jstr(ev, "error"), fc->error);
    ck_assert_str_eq(jstr(ev, "error_message"), msg);
    json_decref(ev);
    char *seq = state_sequence(e, "tester", turn);
    ck_assert_str_eq(seq, "dispatched,running,idle");
    free(seq);
    /* The idle state event names the error too. */
    char *idle_err =
        tw_fx_sql_str(e->fx,
                      "SELECT payload->>'error' FROM state.outbox WHERE turn_id = $1 AND kind = 'state' "
                      "AND payload->>'status' = 'idle'",
                      1, turn);
    ck_assert_str_eq(idle_err, fc->error);
    free(idle_err);
    free(err);
    free(msg);
}

/* Submits each case's input to the agent tester, each on a channel of its own (PREFIX-i), all at once, then
 * checks each turn failed as its case says; the turn ids in turns[]. */
static void run_failing(TwFxStack *e, const char *prefix, const FailCase *cases, size_t n, char **turns)
{
    for (size_t i = 0; i < n; i++) {
        char channel[32];
        snprintf(channel, sizeof channel, "%s-%zu", prefix, i);
        turns[i] = submit(e, "tester", channel, cases[i].input);
    }
    for (size_t i = 0; i < n; i++)
        check_failed(e, turns[i], &cases[i]);
}

START_TEST(test_failures)
{
    TwFxStack e = tw_fx_stack_start("[agent.tester]\nstep_timeout_seconds = 2\n");
    static const FailCase cases[] = {
        {"{\"mode\":\"fail\",\"error\":\"the widget is broken\"}",
         "agent_failed",
         {"reported failure", "the widget is broken"}},
        {"{\"mode\":\"exit\",\"code\":3}",
         "agent_exit",
         {"exited with status 3", "tw-test-agent: exiting with code 3 as asked"}},
        {"{\"mode\":\"garbage\"}", "bad_output", {"not valid", "this is not json"}},
        /* A program that honours SIGTERM is stopped by it. */
        {"{\"mode\":\"sleep\",\"seconds\":60}", "step_timeout", {"2 second limit", "(SIGTERM)"}},
    };
    size_t n = sizeof cases / sizeof cases[0];
    char *turns[4];
    run_failing(&e, "fail", cases, n, turns);
    /* The timed-out step ran for its limit, not for the 60 s it asked for. */
    int64_t ran = turn_ms(&e, "ended_at", turns[3]) - turn_ms(&e, "started_at", turns[3]);
    ck_assert_msg(ran >= 1900 && ran < 10000, "step_timeout turn ran %lld ms", (long long)ran);
    /* The worker logged the agent's stderr line. */
    char *log = tw_fx_proc_log(e.worker);
    ck_assert_ptr_nonnull(strstr(log, "tw-test-agent: exiting with code 3 as asked"));
    free(log);
    /* Nothing failed stays behind: the agent is idle and can take the next turn. */
    char *ok = submit(&e, "tester", "after", "{\"mode\":\"complete\"}");
    char *st = wait_ended(&e, ok, WAIT_MS);
    ck_assert_str_eq(st, "done");
    free(st);
    free(ok);
    for (size_t i = 0; i < n; i++)
        free(turns[i]);
    tw_fx_free(e.fx);
}
END_TEST

/* `turnwatch submit --json` with --timeout: the new turn id. */
static char *submit_timeout(TwFxStack *e, const char *channel, const char *input, const char *timeout)
{
    char *out = NULL, *err = NULL;
    int rc = tw_fx_cli(e->fx, &out, &err, "submit", "--json", "--agent", "tester", "--channel", channel,
                       "--input", input, "--timeout", timeout, NULL);
    ck_assert_msg(rc == 0, "submit exited %d: %s", rc, err);
    json_t *j = json_loads(out, 0, NULL);
    ck_assert_msg(j && json_string_value(json_object_get(j, "turn_id")), "submit --json printed %s", out);
    char *copy = strdup(json_string_value(json_object_get(j, "turn_id")));
    json_decref(j);
    free(out);
    free(err);
    return copy;
}

/* Contract 18, the worker's part: a fail reply's own code ends the turn with that error (turn show, the final
 * event, the idle state event) and is what retry_on sees; a code that is not one, or one turnwatch gives its
 * own failures, ends it agent_failed saying why; the step document carries deadline_at (when the step's time
 * limit ends, on the database clock: its step_timeout_seconds from the claim, or the turn's deadline when
 * that comes first) and attempt. */
START_TEST(test_fail_code_and_step_document)
{
    TwFxStack e = tw_fx_stack_start("[agent.tester]\nstep_timeout_seconds = 10\nmax_attempts = 2\n"
                                    "retry_on = my_retry\nretry_backoff_seconds = 1\n");
    static const FailCase cases[] = {
        {"{\"mode\":\"fail\",\"error\":\"no quota left\",\"code\":\"my_code\"}",
         "my_code",
         {"reported failure", "no quota left"}},
        {"{\"mode\":\"fail\",\"error\":\"it broke\",\"code\":\"Not A Code!\"}",
         "agent_failed",
         {"it broke", "is not an error code ([a-z0-9_]{1,64})"}},
        {"{\"mode\":\"fail\",\"error\":\"spoofed\",\"code\":\"step_timeout\"}",
         "agent_failed",
         {"spoofed", "is one turnwatch gives its own failures"}},
    };
    size_t n = sizeof cases / sizeof cases[0];
    char *turns[3];
    run_failing(&e, "code", cases, n, turns);
    /* turn show says the agent's code, in text and in JSON. */
    char *out = NULL, *err = NULL;
    ck_assert_int_eq(tw_fx_cli(e.fx, &out, &err, "turn", "show", "--json", turns[0], NULL), 0);
    json_t *shown = json_loads(out, 0, NULL);
    ck_assert_msg(shown && jstr(shown, "error") && strcmp(jstr(shown, "error"), "my_code") == 0,
                  "turn show --json: %s", out);
    json_decref(shown);
    free(out);
    free(err);
    ck_assert_int_eq(tw_fx_cli(e.fx, &out, &err, "turn", "show", turns[0], NULL), 0);
    ck_assert_msg(strstr(out, "my_code"), "turn show: %s", out);
    free(out);
    free(err);
    /* A spoofed timeout code got no timeout details. */
    char *det = turn_col(&e, "timeout_detail", turns[2]);
    ck_assert_msg(det == NULL, "timeout_detail %s", det);

    /* retry_on sees the agent's own code: attempt 1 fails my_retry and is tried again; attempt 2 echoes its
     * step document. */
    char *retried = submit(&e, "tester", "code-retry",
                           "{\"mode\":\"fail\",\"error\":\"busy\",\"code\":\"my_retry\","
                           "\"on_attempt\":{\"2\":{\"mode\":\"echo\"}}}");
    char *st = wait_ended(&e, retried, WAIT_MS);
    ck_assert_str_eq(st, "done");
    free(st);
    ck_assert_int_eq(tw_fx_sql_int(e.fx,
                                   "SELECT count(*) FROM state.turn_history WHERE turn_id = $1 "
                                   "AND reason LIKE 'retry after my_retry: %busy%'",
                                   1, retried),
                     1);
    static const char doc_sql[] =
        "SELECT c.content->'output'->'doc' FROM state.cards c "
        "JOIN state.turns t ON c.card_id = t.deliverable_card_id WHERE t.turn_id = $1";
    char *doc = tw_fx_sql_str(e.fx, doc_sql, 1, retried);
    json_t *d = json_loads(doc, 0, NULL);
    ck_assert_msg(d && json_integer_value(json_object_get(d, "attempt")) == 2 &&
                      json_is_integer(json_object_get(d, "step")) &&
                      json_integer_value(json_object_get(d, "step")) == 0 && jstr(d, "deadline_at"),
                  "attempt 2's step document: %s", doc);
    json_decref(d);
    free(doc);

    /* deadline_at: the step's limit (10 s from the claim) when the turn's deadline is later ... */
    char *late = submit_timeout(&e, "doc-late", "{\"mode\":\"echo\"}", "600");
    /* ... and the turn's deadline when it comes first. */
    char *early = submit_timeout(&e, "doc-early", "{\"mode\":\"echo\"}", "3");
    char *plain = submit(&e, "tester", "doc-plain", "{\"mode\":\"echo\"}");
    const char *docs[] = {late, early, plain};
    for (size_t i = 0; i < 3; i++) {
        st = wait_ended(&e, docs[i], WAIT_MS);
        ck_assert_str_eq(st, "done");
        free(st);
        doc = tw_fx_sql_str(e.fx, doc_sql, 1, docs[i]);
        d = json_loads(doc, 0, NULL);
        ck_assert_msg(d && json_integer_value(json_object_get(d, "attempt")) == 1 && jstr(d, "deadline_at"),
                      "step document: %s", doc);
        json_decref(d);
        free(doc);
    }
    /* The first step is claimed in the transaction that sets started_at: the limit counts from there. */
    ck_assert_int_eq(tw_fx_sql_int(e.fx,
                                   "SELECT count(*) FROM state.turns t JOIN state.cards c "
                                   "ON c.card_id = t.deliverable_card_id WHERE t.turn_id IN ($1, $2) "
                                   "AND (c.content->'output'->'doc'->>'deadline_at')::timestamptz "
                                   "= t.started_at + interval '10 seconds'",
                                   2, late, plain),
                     2);
    ck_assert_int_eq(
        tw_fx_sql_int(e.fx,
                      "SELECT count(*) FROM state.turns t JOIN state.cards c "
                      "ON c.card_id = t.deliverable_card_id WHERE t.turn_id = $1 "
                      "AND (c.content->'output'->'doc'->>'deadline_at')::timestamptz = t.deadline_at",
                      1, early),
        1);
    free(late);
    free(early);
    free(plain);
    free(retried);
    for (size_t i = 0; i < n; i++)
        free(turns[i]);
    tw_fx_free(e.fx);
}
END_TEST

/* Lines of the worker log that carry the agent's stderr for this turn ("<label> stderr: ..."), and the
 * first of them that contains `needle` (NULL if none; malloc'd). */
static size_t stderr_log_lines(TwFxStack *e, const char *turn, const char *needle, char **found)
{
    char *log = tw_fx_proc_log(e->worker);
    size_t n = 0;
    *found = NULL;
    for (char *l = log; l && *l;) {
        char *eol = strchr(l, '\n');
        if (eol)
            *eol = '\0';
        if (strstr(l, turn) && strstr(l, " stderr: ")) {
            n++;
            if (!*found && strstr(l, needle))
                *found = strdup(l);
        }
        l = eol ? eol + 1 : NULL;
    }
    free(log);
    return n;
}

/* A program that floods stderr: the worker logs a budget of it per run (100 lines or 16 KiB, whichever ends
 * first), then one line saying how much it dropped; the turn's error still quotes the last line. */
START_TEST(test_stderr_flood_is_capped)
{
    TwFxStack e = tw_fx_stack_start("[agent.tester]\nstep_timeout_seconds = 120\n");
    /* 100,000 lines of 100 bytes (10 MB), then exit 3: the line budget ends it. */
    char *many = submit(&e, "tester", "flood-lines", "{\"mode\":\"flood\",\"lines\":100000,\"code\":3}");
    FailCase fc = {
        "flood", "agent_exit", {"exited with status 3", "tw-test-agent: flood of 100000 lines ends"}};
    check_failed(&e, many, &fc);
    /* 1,000 lines of 400 bytes, then success: the byte budget ends it, after 40 lines (16,000 bytes). */
    char *wide =
        submit(&e, "tester", "flood-bytes", "{\"mode\":\"flood\",\"lines\":1000,\"line_bytes\":400}");
    char *st = wait_ended(&e, wide, WAIT_MS * 3);
    ck_assert_str_eq(st, "done");
    free(st);

    static const struct {
        size_t logged;
        const char *dropped;
    } want[] = {
        /* 100,001 lines: 100 logged; 99,901 dropped = 99,900 x 100 bytes + the 41-byte last line. */
        {100, "stderr: 99901 more lines (9990041 bytes) dropped"},
        /* 1,001 lines: 40 logged; 961 dropped = 960 x 400 bytes + the 39-byte last line. */
        {40, "stderr: 961 more lines (384039 bytes) dropped"},
    };
    const char *turns[] = {many, wide};
    for (size_t i = 0; i < 2; i++) {
        char *line = NULL;
        /* The dropped line comes when the run ends, before its result is applied: it is there already. */
        size_t n = stderr_log_lines(&e, turns[i], want[i].dropped, &line);
        ck_assert_msg(line != NULL, "turn %s: no '%s' line in the worker log (%zu stderr lines)", turns[i],
                      want[i].dropped, n);
        ck_assert_msg(n == want[i].logged + 1,
                      "turn %s: %zu stderr lines logged, want %zu and the dropped line", turns[i], n,
                      want[i].logged);
        free(line);
    }
    free(many);
    free(wide);
    tw_fx_free(e.fx);
}
END_TEST

typedef struct PidArg {
    const char *turn;
    pid_t pid;
} PidArg;

static bool agent_found(void *arg)
{
    PidArg *p = arg;
    p->pid = tw_fx_turn_pid(p->turn);
    return p->pid > 0;
}

START_TEST(test_step_timeout_kills_hanging_program)
{
    TwFxStack e = tw_fx_stack_start("[agent.tester]\nstep_timeout_seconds = 1\nkill_grace_seconds = 2\n");
    char *turn = submit(&e, "tester", "hang", "{\"mode\":\"hang\"}");
    PidArg pa = {turn, 0};
    ck_assert_msg(tw_fx_wait_until(agent_found, &pa, WAIT_MS), "the hanging agent program never showed up");
    /* It ignores SIGTERM, so it is still there after the step limit, until the grace period ends. */
    char st0 = tw_fx_pid_state(pa.pid);
    ck_assert_msg(st0 != '?' && st0 != 'Z', "agent pid %d state %c", (int)pa.pid, st0);

    FailCase fc = {"{\"mode\":\"hang\"}", "step_timeout", {"1 second limit", "SIGKILL after SIGTERM"}};
    check_failed(&e, turn, &fc);
    int64_t ran = turn_ms(&e, "ended_at", turn) - turn_ms(&e, "started_at", turn);
    ck_assert_msg(ran >= 2900 && ran < 15000,
                  "hanging step ended after %lld ms, want >= 1 s limit + 2 s grace", (long long)ran);
    /* Gone: not running, not a zombie, and no process of this turn is left. */
    char st = tw_fx_pid_state(pa.pid);
    ck_assert_msg(st == '?' || tw_fx_turn_pid(turn) == 0, "agent pid %d still exists (state %c)", (int)pa.pid,
                  st);
    ck_assert_int_eq(tw_fx_turn_pid(turn), 0);
    char *log = tw_fx_proc_log(e.worker);
    ck_assert_ptr_nonnull(strstr(log, "sending SIGKILL"));
    free(log);
    free(turn);
    tw_fx_free(e.fx);
}
END_TEST

/* More agents than worker slots: a slot freed by one agent's turn is not kept for that agent while another
 * agent's dispatched turn waits, so agents take turns on the slot instead of one agent running its whole
 * queue first (which would leave the other dispatched until 2.5 reaped it). */
START_TEST(test_slots_are_shared_fairly)
{
    char *agent_exec = tw_fx_build_path("examples/agents/tw-test-agent");
    char overrides[1024];
    snprintf(overrides, sizeof overrides,
             "[worker]\nconcurrency = 1\n[agent.tester]\nstep_timeout_seconds = 120\n[agent.tester2]\nexec = "
             "%s\nstep_timeout_seconds = 10\n",
             agent_exec);
    free(agent_exec);
    TwFxStack e = tw_fx_stack_start(overrides);
    const char *input = "{\"mode\":\"sleep\",\"seconds\":0.5}";
    char *first[4], *second[2], gate[1024], held[1200];
    /* tester's first step holds the slot until everything is submitted (submitting takes a while on a slow
     * machine: the order below must not depend on it). */
    snprintf(gate, sizeof gate, "%s/gate", tw_fx_dir(e.fx));
    snprintf(held, sizeof held, "{\"mode\":\"sleep\",\"seconds\":110,\"gate\":\"%s\"}", gate);
    for (int i = 0; i < 4; i++)
        first[i] = submit(&e, "tester", "fair", i == 0 ? held : input);
    for (int i = 0; i < 2; i++)
        second[i] = submit(&e, "tester2", "fair", input);
    ck_assert(tw_fx_sql_wait(e.fx, WAIT_MS, "running", "SELECT status FROM state.turns WHERE turn_id = $1", 1,
                             first[0]));
    FILE *g = fopen(gate, "w");
    ck_assert_ptr_nonnull(g);
    fclose(g);
    for (int i = 0; i < 4; i++) {
        char *st = wait_ended(&e, first[i], 30000);
        ck_assert_str_eq(st, "done");
        free(st);
    }
    for (int i = 0; i < 2; i++) {
        char *st = wait_ended(&e, second[i], 30000);
        ck_assert_str_eq(st, "done");
        free(st);
    }
    /* Ready turns start in submit order across agents (contract section 14): tester's queued turns, submitted
     * first, each ready when the one before ends, go before tester2's, and tester2's in their own order. */
    char *order =
        tw_fx_sql_str(e.fx, "SELECT string_agg(seq::text, ',' ORDER BY started_at) FROM state.turns", 0);
    char *want = tw_fx_sql_str(e.fx, "SELECT string_agg(seq::text, ',' ORDER BY seq) FROM state.turns", 0);
    ck_assert_str_eq(order, want);
    free(order);
    free(want);
    /* And one slot means one step at a time across both agents. */
    ck_assert_int_eq(
        tw_fx_sql_int(e.fx,
                      "SELECT count(*) FROM state.turns a JOIN state.turns b ON a.turn_id < b.turn_id"
                      " WHERE a.started_at < b.ended_at AND b.started_at < a.ended_at",
                      0),
        0);
    for (int i = 0; i < 4; i++)
        free(first[i]);
    for (int i = 0; i < 2; i++)
        free(second[i]);
    tw_fx_free(e.fx);
}
END_TEST

/* [log] format = json (contract section 12): every line either daemon writes is one JSON object with ts,
 * level, daemon and msg, and a turn's lines carry its agent and turn_id as fields. */
static void check_json_log(TwFxProc *p, const char *daemon, const char *turn, int *with_turn)
{
    char *log = tw_fx_proc_log(p);
    int lines = 0;
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t err;
        json_t *o = json_loads(line, 0, &err);
        ck_assert_msg(json_is_object(o), "%s: not a JSON object (%s): %s", daemon, err.text, line);
        ck_assert_msg(json_is_string(json_object_get(o, "ts")) &&
                          json_is_string(json_object_get(o, "level")) &&
                          json_is_string(json_object_get(o, "msg")),
                      "%s: a line without ts, level or msg: %s", daemon, line);
        ck_assert_str_eq(json_string_value(json_object_get(o, "daemon")), daemon);
        const char *t = json_string_value(json_object_get(o, "turn_id"));
        if (t && strcmp(t, turn) == 0)
            (*with_turn)++;
        json_decref(o);
        lines++;
    }
    ck_assert_int_gt(lines, 2);
    free(log);
}

START_TEST(test_json_logs)
{
    TwFxStack e = tw_fx_stack_start("[log]\nformat = json\nlevel = info\n");
    char *turn = submit(&e, "echo", "json-logs", "{\"q\":\"a \\\"quoted\\\" word\"}");
    char *st = wait_ended(&e, turn, 30000);
    ck_assert_str_eq(st, "done");
    free(st);
    stop_daemon(e.worker);
    stop_daemon(e.pmo);
    int with_turn = 0;
    check_json_log(e.worker, "turnwatch-worker", turn, &with_turn);
    check_json_log(e.pmo, "turnwatch-pmo", turn, &with_turn);
    /* The worker's "claimed" and "step applied" lines at least. */
    ck_assert_int_ge(with_turn, 2);
    free(turn);
    tw_fx_free(e.fx);
}
END_TEST

TW_SUITE_DEFINE(turns, {
                           {"happy_path", test_turn_completes, 60},
                           {"ordering", test_fifo_per_agent_parallel_across_agents, 90},
                           {"ordering", test_slots_are_shared_fairly, 90},
                           {"failures", test_failures, 90},
                           {"failures", test_step_timeout_kills_hanging_program, 90},
                           {"failures", test_fail_code_and_step_document, 120},
                           {"stderr", test_stderr_flood_is_capped, 120},
                           {"logs", test_json_logs, 60},
                       })
