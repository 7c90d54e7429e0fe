/* test_sqlapi.c — the SQL API (issue 15 item 5, contract sections 12 and 14): tw.submit_turn in the caller's
 * own transaction (the Python example, rolled back and committed), heard by the PMO through LISTEN/NOTIFY
 * with NATS down; tw.post_tool_result and tw.cancel_turn with their answers, their events relayed, bad input
 * as SQLSTATE 22023. Real PostgreSQL, nats-server and daemons. */
#include "turn_helpers.h"
#include "suite.h"
#include <libpq-fe.h>

/* The PMO's scan runs once a minute here: a turn dispatched at once was heard of through NOTIFY. */
static const char sa_overrides[] = "[pmo]\nwatchdog_interval_seconds = 60\ndispatched_retry_seconds = 30\n"
                                   "dispatched_timeout_seconds = 60\npending_wakeup_seconds = 30\n"
                                   "pending_wakeup_skip_seconds = 120\nactive_reap_seconds = 60\n";

static int sa_python(TwFx *fx, char **out, char **err, const char *a1, const char *a2)
{
    char *script = wd_fmt("%s/examples/sql/submit_in_transaction.py", tw_fx_source_dir());
    /* Debian's interpreter, where python3-psycopg is installed (a python3 earlier in PATH may be another). */
    const char *argv[] = {"/usr/bin/python3", script, "--dsn", tw_fx_pg_dsn(fx), a1, a2, NULL};
    int rc = tw_fx_run(argv, out, err);
    free(script);
    return rc;
}

START_TEST(test_sqlapi_submit_in_transaction)
{
    TwFxStack st = tw_fx_stack_start_events(sa_overrides, NULL);
    char *out = NULL, *err = NULL;

    /* Rolled back: neither the application's row nor the turn exists. */
    int rc = sa_python(st.fx, &out, &err, "--rollback", "never");
    ck_assert_msg(rc == 0, "python example exited %d: %s", rc, err);
    free(out);
    free(err);
    /* (The example creates its table in the same transaction: rolled back, the table is gone too.) */
    ck_assert_int_eq(
        tw_fx_sql_int(st.fx, "SELECT count(*) FROM pg_class WHERE relname = 'example_tickets'", 0), 0);
    ck_assert_int_eq(tw_fx_sql_int(st.fx, "SELECT count(*) FROM state.turns", 0), 0);

    /* Committed with NATS down: the PMO hears of it through NOTIFY (its scan would take a minute). */
    tw_fx_nats_stop(st.fx);
    rc = sa_python(st.fx, &out, &err, "hello", NULL);
    ck_assert_msg(rc == 0, "python example exited %d: %s", rc, err);
    char turn[37] = "";
    ck_assert_int_eq(sscanf(out, "%36s", turn), 1);
    free(out);
    free(err);
    ck_assert_int_eq(
        tw_fx_sql_int(st.fx, "SELECT count(*) FROM example_tickets WHERE turn_id = $1 AND text = 'hello'", 1,
                      turn),
        1);
    WD_STATUS_IS(st.fx, turn, "done");
    int64_t ms = tw_fx_sql_int(st.fx,
                               "SELECT (extract(epoch FROM dispatched_at - created_at) * 1000)::bigint FROM "
                               "state.turns WHERE turn_id = $1",
                               1, turn);
    fprintf(stderr,
            "sqlapi: a turn submitted through SQL with NATS down was dispatched %lld ms after its submit\n",
            (long long)ms);
    ck_assert_int_lt(ms, 30000); /* far below the one-minute scan: NOTIFY, not the scan */
    tw_fx_nats_start(st.fx);

    /* Bad input is SQLSTATE 22023, in words. */
    rc = sa_python(st.fx, &out, &err, "--agent", "no such agent");
    ck_assert_int_eq(rc, 2);
    free(out);
    free(err);
    tw_fx_free(st.fx);
}
END_TEST

START_TEST(test_sqlapi_tool_result_and_cancel)
{
    TwFxStack st = tw_fx_stack_start_events(sa_overrides, "evt.agent.*.task");
    char *t = wd_submit(st.fx, "tester",
                        "{\"mode\":\"tools\",\"calls\":[{\"id\":\"ask\",\"tool\":\"ext\",\"args\":{}}]}");
    WD_STATUS_IS(st.fx, t, "suspended");
    char *err = NULL;
    ck_assert(!tw_fx_sql_try(st.fx, &err, "SELECT tw.post_tool_result($1, 'ask', 'maybe', '{}')", 1, t));
    ck_assert_msg(strstr(err, "status must be ok or error"), "%s", err);
    free(err);
    char *r = tw_fx_sql_str(st.fx, "SELECT tw.post_tool_result($1, 'nope', 'ok', '{}')", 1, t);
    ck_assert_str_eq(r, "unknown_call");
    free(r);
    r = tw_fx_sql_str(
        st.fx, "SELECT tw.post_tool_result(turn => $1, call => 'ask', status => 'ok', output => '{\"a\":1}')",
        1, t);
    ck_assert_str_eq(r, "accepted");
    free(r);
    WD_STATUS_IS(st.fx, t, "done");
    r = tw_fx_sql_str(st.fx, "SELECT tw.post_tool_result($1, 'ask', 'ok', '{}')", 1, t);
    ck_assert_str_eq(r, "ended");
    free(r);

    /* cancel: its final event is relayed at once (NOTIFY tw_outbox), though nobody published it. */
    char *t2 = wd_submit(st.fx, "tester", "{\"mode\":\"sleep\",\"seconds\":30}");
    WD_STATUS_IS(st.fx, t2, "running");
    r = tw_fx_sql_str(st.fx, "SELECT tw.cancel_turn($1)", 1, t2);
    ck_assert_str_eq(r, "cancelled");
    free(r);
    ck_assert(tw_fx_events_wait(st.ev, "evt.agent.*.task", t2, 1, WD_WAIT_MS));
    r = tw_fx_sql_str(st.fx, "SELECT tw.cancel_turn($1)", 1, t2);
    ck_assert_str_eq(r, "already_ended");
    free(r);
    r = tw_fx_sql_str(st.fx, "SELECT tw.cancel_turn('00000000-0000-4000-8000-000000000000')", 0);
    ck_assert_str_eq(r, "unknown_turn");
    free(r);
    free(t);
    free(t2);
    tw_fx_free(st.fx);
}
END_TEST

/* ---- numbers as written (found by the soak): a document reaches the program as the database holds it ----
 */

START_TEST(test_sqlapi_numbers_verbatim)
{
    TwFx *fx = wd_fixture(sa_overrides);
    char *seen = wd_fmt("%s/step.json", tw_fx_dir(fx));
    char *body = wd_fmt("cat > %s\necho '{\"complete\":{\"output\":{\"tenth\":0.1}}}'\n", seen);
    char *rec = wd_script(fx, "rec.sh", body);
    char *ovr = wd_fmt("%s[agent.rec]\nexec = %s\nstep_timeout_seconds = 10\nkill_grace_seconds = 1\n",
                       sa_overrides, rec);
    const char *cfg = tw_fx_write_config(fx, "rec.ini", ovr);
    tw_fx_start_pmo(fx, cfg);
    tw_fx_start_worker(fx, cfg);
    ck_assert(
        tw_fx_sql_wait(fx, WD_WAIT_MS, "1", "SELECT count(*) FROM state.agents WHERE agent = 'rec'", 0));

    /* Wider than 64 bits (jansson cannot hold it: parsing the claim would have failed it, again and again)
     * and a decimal that a double re-encodes as 0.10000000000000001: both must reach the program as
     * submitted. */
    char *t = tw_fx_sql_str(fx,
                            "SELECT tw.submit_turn('rec', 'c1', "
                            "'{\"big\": 123456789012345678901234567890, \"tenth\": 0.1}')",
                            0);
    WD_STATUS_IS(fx, t, "done");
    FILE *f = fopen(seen, "r");
    ck_assert_ptr_nonnull(f);
    char doc[8192];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[n] = '\0';
    ck_assert_msg(strstr(doc, "\"big\": 123456789012345678901234567890"), "the agent saw: %s", doc);
    ck_assert_msg(strstr(doc, "\"tenth\": 0.1}") || strstr(doc, "\"tenth\": 0.1,"), "the agent saw: %s", doc);
    /* And the agent's own 0.1 is stored as 0.1, not as the 17 digits of its double (0.10000000000000001). */
    char *card = tw_fx_sql_str(fx, "SELECT content::text FROM state.cards WHERE turn_id = $1", 1, t);
    ck_assert_msg(strstr(card, "\"tenth\": 0.1}"), "the deliverable: %s", card);
    free(card);
    free(t);
    free(ovr);
    free(rec);
    free(body);
    free(seen);
    tw_fx_free(fx);
}
END_TEST

/* ---- NOTIFY tw_ring is untrusted input (issue 23 defect 1)
 * ------------------------------------------------------ */

/* What a role that can only connect to the database may send the PMO: pg_notify('tw_ring', payload). */
static void sa_ring(TwFx *fx, const char *payload)
{
    tw_fx_sql_exec(fx, "SELECT pg_notify('tw_ring', $1)", 1, payload);
}

/* [{"subject": subject, "data": data}] as NOTIFY text; data is JSON text, NULL for no "data" key. */
static void sa_ring_one(TwFx *fx, const char *subject, const char *data)
{
    json_t *item = json_pack("{s:s}", "subject", subject);
    if (data)
        json_object_set_new(item, "data", json_loads(data, JSON_DECODE_ANY, NULL));
    json_t *arr = json_pack("[o]", item);
    char *text = json_dumps(arr, JSON_COMPACT);
    ck_assert_ptr_nonnull(text);
    sa_ring(fx, text);
    free(text);
    json_decref(arr);
}

/* Only what the daemons themselves publish in this test: the sentinels rung through tw_ring, the hints
 * between daemons and the echo agent's doorbells and events. */
static bool sa_not_ours(const char *subject, const json_t *data, void *arg)
{
    static const char *const ours[] = {"cmd.tool.sentinel", "cmd.pmo.wakeup", "cmd.worker.wakeup",
                                       "cmd.agent.echo.", "evt.agent.echo."};
    for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++)
        if (strncmp(subject, ours[i], strlen(ours[i])) == 0)
            return false;
    return true;
}

/* Nothing forged reached NATS: no message on the victim's subjects, none that no daemon publishes. */
static void sa_no_forgery(TwFxEvents *victim, TwFxEvents *all)
{
    ck_assert_msg(tw_fx_events_count(victim, NULL, NULL) == 0,
                  "a subscriber of evt.agent.victim.> received %zu forged messages",
                  tw_fx_events_count(victim, NULL, NULL));
    if (tw_fx_events_count_if(all, sa_not_ours, NULL) != 0) {
        tw_fx_events_dump(all);
        ck_abort_msg("%zu messages on NATS that no daemon should have published",
                     tw_fx_events_count_if(all, sa_not_ours, NULL));
    }
}

/* A legitimate doorbell rung through tw_ring reaches NATS: everything the PMO was handed before it has been
 * published by then (one PMO connection, notifications handled in order), so it is a barrier. Rung again
 * until it is seen (the first one may come before the PMO listens). */
static void sa_sentinel(TwFxStack *st, TwFxEvents *all, int n)
{
    char *subject = wd_fmt("cmd.tool.sentinel%d.wakeup", n);
    int64_t deadline = tw_fx_now_ms() + WD_WAIT_MS;
    do
        sa_ring_one(st->fx, subject, "{\"target\": \"sentinel\", \"reason\": \"test\"}");
    while (!tw_fx_events_wait(all, subject, NULL, 1, 500) && tw_fx_now_ms() < deadline);
    if (tw_fx_events_count(all, subject, NULL) == 0) {
        tw_fx_events_dump(all);
        tw_fx_proc_dump(st->pmo);
        ck_abort_msg("a legitimate doorbell rung through tw_ring (%s) never reached NATS", subject);
    }
    free(subject);
}

static bool sa_log_has(void *arg)
{
    void **a = arg;
    char *log = tw_fx_proc_log(a[0]);
    bool has = strstr(log, a[1]) != NULL;
    free(log);
    return has;
}

START_TEST(test_sqlapi_ring_is_untrusted)
{
    int port = tw_fx_free_port();
    char *ovr = wd_fmt("%s[pmo]\nmetrics_listen = 127.0.0.1:%d\n", sa_overrides, port);
    TwFxStack st = tw_fx_stack_start_events(ovr, NULL);
    TwFxEvents *victim = tw_fx_events_new(st.fx, "evt.agent.victim.>");
    TwFxEvents *all = tw_fx_events_new(st.fx, ">");
    char *body = NULL;
    sa_sentinel(&st, all, 0);

    /* The probe's payload, as it was sent: the subject carries two more PUB lines with their byte counts. */
    tw_fx_sql_exec(
        st.fx,
        "SELECT pg_notify('tw_ring', json_build_array(json_build_object('subject', "
        "E'cmd.x 2\\r\\n{}\\r\\nPUB evt.agent.victim.task 16\\r\\n{\"forged\": true}\\r\\nPUB cmd.y', "
        "'data', '{}'::json))::text)",
        0);
    sa_sentinel(&st, all, 1);
    sa_no_forgery(victim, all);

    /* Variants: white space, control bytes, empty tokens, wildcards, other bytes, no doorbell, a huge
     * subject (a NOTIFY payload ends below 8,000 bytes), data that is no object or too big, payloads that are
     * no array of items. */
    char huge[7800];
    memset(huge, 'x', sizeof huge - 1);
    huge[sizeof huge - 1] = '\0';
    memcpy(huge, "cmd.agent.", 10);
    memcpy(huge + sizeof huge - 8, ".wakeup", 7);
    char *big_data = wd_fmt("{\"target\": \"victim\", \"pad\": \"%0*d\"}", 5000, 0);
    static const char *const subjects[] = {
        "cmd.agent.a b.wakeup",
        "cmd.agent.a\tb.wakeup",
        "cmd.agent.victim.wakeup\r\nPUB evt.agent.victim.state 2",
        "cmd.agent.victim\r.wakeup",
        "cmd.agent.victim\n.wakeup",
        "cmd..x",
        "cmd.agent..wakeup",
        "cmd.agent.victim.wakeup.",
        ".cmd.agent.victim.wakeup",
        "cmd.agent.*.wakeup",
        "cmd.>",
        "cmd.agent.victim.>",
        "cmd.agent.vict\x01m.wakeup",
        "cmd.agent.vict\xc3\xa9m.wakeup",
        "cmd.agent.victim",
        "cmd.agent.victim.task",
        "cmd.pmo.wakeup.victim",
        "evt.agent.victim.task",
    };
    for (size_t i = 0; i < sizeof subjects / sizeof subjects[0]; i++)
        sa_ring_one(st.fx, subjects[i], "{\"target\": \"victim\"}");
    sa_ring_one(st.fx, huge, "{}");
    sa_ring_one(st.fx, "cmd.agent.victim.wakeup", "\"x\"");
    sa_ring_one(st.fx, "cmd.agent.victim.wakeup", "[1]");
    sa_ring_one(st.fx, "cmd.agent.victim.wakeup", "null");
    sa_ring_one(st.fx, "cmd.agent.victim.wakeup", NULL);
    sa_ring_one(st.fx, "cmd.agent.victim.wakeup", big_data);
    sa_ring(st.fx, "PUB evt.agent.victim.task 16\r\n{\"forged\": true}\r\n");
    sa_ring(st.fx, "{\"subject\": \"cmd.agent.victim.wakeup\", \"data\": {}}");
    sa_ring(st.fx, "[\"cmd.agent.victim.wakeup\", 7, null, []]");
    sa_ring(st.fx, "[{\"subject\": 7, \"data\": {}}]");

    sa_sentinel(&st, all, 2);
    sa_no_forgery(victim, all);

    /* The same with the byte count off by one: nats-server would close the connection for a protocol
     * error. The PMO's connection stays up and a turn submitted through SQL runs. */
    tw_fx_sql_exec(
        st.fx,
        "SELECT pg_notify('tw_ring', json_build_array(json_build_object('subject', "
        "E'cmd.x 2\\r\\n{}\\r\\nPUB evt.agent.victim.task 17\\r\\n{\"forged\": true}\\r\\nPUB cmd.y', "
        "'data', '{}'::json))::text)",
        0);
    sa_sentinel(&st, all, 3);

    /* Below the doorbells, the bus itself: an event whose subject is no subject (only a role that may write
     * state.outbox could make one) is refused when the relay hands it over, never written into a PUB line.
     * Once the relay has claimed it, its answer reaches the PMO before a later notification. */
    tw_fx_sql_exec(st.fx,
                   "INSERT INTO state.outbox (event_id, kind, subject, payload) VALUES ("
                   "'00000000-0000-4000-8000-00000000f0f0', 'state', "
                   "E'evt.agent.victim.state 2\\r\\n{}\\r\\nPUB evt.agent.victim.task', '{}')",
                   0);
    tw_fx_sql_exec(st.fx, "SELECT pg_notify('tw_outbox', '')", 0);
    ck_assert(tw_fx_sql_wait(st.fx, WD_WAIT_MS, "1",
                             "SELECT count(*) FROM state.outbox WHERE event_id = "
                             "'00000000-0000-4000-8000-00000000f0f0' AND relay_lease_until IS NOT NULL",
                             0));
    sa_sentinel(&st, all, 4);
    ck_assert_msg(tw_fx_events_count(victim, NULL, NULL) == 0,
                  "a subscriber of evt.agent.victim.> received %zu forged messages from the outbox",
                  tw_fx_events_count(victim, NULL, NULL));
    ck_assert(sa_log_has((void *[]){st.pmo, "not publishing on an invalid subject"}));
    ck_assert_int_eq(tw_fx_http_get(port, "/healthz", &body), 200);
    free(body);
    body = NULL;
    ck_assert_int_eq(tw_fx_http_get(port, "/metrics", &body), 200);
    ck_assert_msg(strstr(body, "\nturnwatch_nats_up 1\n"), "the PMO's metrics: %s", body);
    free(body);
    char *t = wd_submit_sql(st.fx, "echo", "{}", NULL);
    WD_STATUS_IS(st.fx, t, "done");
    ck_assert(tw_fx_events_wait(all, "evt.agent.echo.task", t, 1, WD_WAIT_MS));
    ck_assert_int_eq(tw_fx_events_count(victim, NULL, NULL), 0);
    ck_assert_int_eq(tw_fx_events_count_if(all, sa_not_ours, NULL), 0);

    /* What was dropped is said, once in a while, without a raw control byte from the payload. */
    char *log = tw_fx_proc_log(st.pmo);
    ck_assert_msg(strstr(log, "tw_ring") && strstr(log, "dropped"), "no warning for the forged doorbells");
    ck_assert_msg(!strchr(log, '\r') && !strstr(log, "\nPUB ") && !strstr(log, "\n{\"forged"),
                  "a raw control byte of a NOTIFY payload reached the PMO's log");
    free(log);
    free(t);
    free(big_data);
    free(ovr);
    tw_fx_free(st.fx);
}
END_TEST

/* ---- credentials never in a log line or CLI output (contract section 12)
 * ------------------------------------ */

/* Appends to *all what a CLI run printed (both streams), and returns its exit code. */
static int sa_cli_into(TwFx *fx, char **all, const char *a1, const char *a2, const char *a3)
{
    char *out = NULL, *err = NULL;
    int rc = tw_fx_cli(fx, &out, &err, a1, a2, a3, NULL);
    wd_append(all, "%s%s", out ? out : "", err ? err : "");
    free(out);
    free(err);
    return rc;
}

START_TEST(test_no_credentials_in_output)
{
    /* PostgreSQL here trusts local connections and nats-server has no authorization: both ignore these
     * secrets, so the daemons connect and every place that might print a DSN or a URL is exercised. */
    TwFx *fx = tw_fx_new();
    tw_fx_pg_init(fx);
    tw_fx_nats_start(fx);
    /* A [nats] token file too (issue 26): its content must not appear either. Each of the other ways to
     * authenticate, against a server that requires it, is in test_security, with the same search. */
    char *tokfile = wd_fmt("%s/nats.token", tw_fx_dir(fx));
    FILE *tf = fopen(tokfile, "w");
    ck_assert_ptr_nonnull(tf);
    fputs("Tok5ecretXyz\n", tf);
    ck_assert_int_eq(fclose(tf), 0);
    char *ov = wd_fmt("[postgres]\ndsn = postgresql://postgres:Pg5ecretXyz@127.0.0.1:%d/turnwatch\n"
                      "[nats]\nurl = nats://bob:Nat5ecretXyz@127.0.0.1:%d\ntoken_file = %s\n",
                      tw_fx_pg_port(fx), tw_fx_nats_port(fx), tokfile);
    tw_fx_write_config(fx, NULL, ov);
    tw_fx_migrate(fx);
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL), *w = tw_fx_start_worker(fx, NULL);
    char *all = NULL;
    char *t = wd_submit(fx, "echo", "{\"x\":1}");
    WD_STATUS_IS(fx, t, "done");
    sa_cli_into(fx, &all, "turn", "show", t);
    sa_cli_into(fx, &all, "--json", "daemons", NULL);
    sa_cli_into(fx, &all, "--check-config", NULL, NULL);
    sa_cli_into(fx, &all, "-v", "profiles", NULL);
    /* Connection failures are where a DSN or a URL is most likely to be quoted. */
    tw_fx_nats_stop(fx);
    tw_fx_pg_stop(fx);
    ck_assert_int_ne(sa_cli_into(fx, &all, "turn", "show", t), 0);
    ck_assert_int_ne(sa_cli_into(fx, &all, "-v", "events", "--since"), 0);
    tw_fx_sleep_ms(1500);
    tw_fx_pg_start(fx);
    tw_fx_nats_start(fx);
    char *t2 = wd_submit(fx, "echo", "{\"x\":2}");
    WD_STATUS_IS(fx, t2, "done");
    char *lp = tw_fx_proc_log(pmo), *lw = tw_fx_proc_log(w);
    wd_append(&all, "%s%s", lp, lw);
    ck_assert_msg(strstr(all, "127.0.0.1") != NULL, "the outputs say nothing of where they connect: %s", all);
    ck_assert_msg(!strstr(all, "Pg5ecretXyz"), "a DSN password was printed");
    ck_assert_msg(!strstr(all, "Nat5ecretXyz"), "a NATS password was printed");
    ck_assert_msg(!strstr(all, "Tok5ecretXyz"), "a NATS token was printed");
    free(lp);
    free(lw);
    free(all);
    free(t);
    free(t2);
    free(ov);
    free(tokfile);
    tw_fx_free(fx);
}
END_TEST

/* SQL text as JSON (the first column of the first row), or the test fails. */
static json_t *sa_sql_json(TwFx *fx, const char *sql, int nparams, const char *p1, const char *p2)
{
    char *text = nparams == 0   ? tw_fx_sql_str(fx, sql, 0)
                 : nparams == 1 ? tw_fx_sql_str(fx, sql, 1, p1)
                                : tw_fx_sql_str(fx, sql, 2, p1, p2);
    json_t *j = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
    ck_assert_msg(j != NULL, "expected JSON from %s, got %s", sql, text ? text : "(null)");
    free(text);
    return j;
}

static char *sa_submit_as(TwFx *fx, const char *agent, const char *input)
{
    return tw_fx_sql_str(fx, "SELECT tw.submit_turn($1, 'c', $2::jsonb, NULL, NULL, NULL, 'echo')::text", 2,
                         agent, input);
}

/* A batch item {"fence": FENCE, "reply": {"complete": {"output": {"n": N}}}}. */
static json_t *sa_item(json_t *fence, int n)
{
    return json_pack("{s:o,s:{s:{s:{s:i}}}}", "fence", fence, "reply", "complete", "output", "n", n);
}

/* The claimed job of `agent` in a claim's answer. */
static json_t *sa_job_of(json_t *claim, const char *agent)
{
    json_t *job;
    size_t i;

    json_array_foreach(json_object_get(claim, "jobs"), i,
                       job) if (strcmp(json_string_value(json_object_get(job, "agent")), agent) ==
                                0) return job;
    ck_abort_msg("no job of %s in the claim", agent);
    return NULL;
}

/* Group commit (worker/applier.c): the outcomes of several agents' steps in one tw.apply_steps. A batch
 * mixing fresh items, stale ones (a claim token not held, an old epoch), an invalid one and one whose turn
 * already ended applies exactly the fresh ones and says so for each item; every event has its own id (a plan
 * that cached one id for many rows once refused whole batches); each agent goes on to the next turn of its
 * own queue in submit order (claimed for the worker); every status change has its history row; the same batch
 * again changes nothing. Driven by hand in SQL: no daemon runs. */
START_TEST(test_sqlapi_apply_steps_batch)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    char *first[4], *second[4], *third;
    const char *agents[4] = {"b0", "b1", "b2", "b3"};

    for (int i = 0; i < 4; i++)
        first[i] = sa_submit_as(fx, agents[i], "{\"n\":1}");
    for (int i = 0; i < 4; i++)
        second[i] = sa_submit_as(fx, agents[i], "{\"n\":2}");
    third = sa_submit_as(fx, "b0", "{\"n\":3}");
    json_t *claim = sa_sql_json(fx, "SELECT tw.claim('w1', '{echo}', '{}', 10, 30)::text", 0, NULL, NULL);
    ck_assert_uint_eq(json_array_size(json_object_get(claim, "jobs")), 4);

    /* b3's turn ends first, in a batch of its own. */
    json_t *ended = json_pack("[o]", sa_item(json_deep_copy(sa_job_of(claim, "b3")), 3));
    char *ended_s = json_dumps(ended, JSON_COMPACT);
    json_t *out = sa_sql_json(fx, "SELECT tw.apply_steps($1::jsonb, 'w1', '{echo}')::text", 1, ended_s, NULL);
    ck_assert(json_is_true(json_object_get(json_array_get(json_object_get(out, "results"), 0), "applied")));
    json_decref(out);
    WD_STATUS_IS(fx, first[3], "done");
    /* b3's next turn is running now; its job is not part of the mixed batch. */
    WD_STATUS_IS(fx, second[3], "running");

    /* The mixed batch: b0 and b1 fresh; b2 with a claim token it does not hold and with an old epoch; an item
     * no one could have claimed; b3's ended turn again. */
    json_t *stale_token = json_deep_copy(sa_job_of(claim, "b2")), *stale_epoch = json_deep_copy(stale_token);
    json_object_set_new(stale_token, "token",
                        json_integer(json_integer_value(json_object_get(stale_token, "token")) + 1000));
    json_object_set_new(stale_epoch, "epoch",
                        json_integer(json_integer_value(json_object_get(stale_epoch, "epoch")) - 1));
    json_t *items =
        json_pack("[o,o,o,o,{s:{s:s},s:{s:{}}},o]", sa_item(json_deep_copy(sa_job_of(claim, "b0")), 0),
                  sa_item(json_deep_copy(sa_job_of(claim, "b1")), 1), sa_item(stale_token, 2),
                  sa_item(stale_epoch, 3), "fence", "turn_id", "not a uuid", "reply", "complete",
                  sa_item(json_deep_copy(sa_job_of(claim, "b3")), 5));
    const bool want[6] = {true, true, false, false, false, false};
    char *items_s = json_dumps(items, JSON_COMPACT);
    out = sa_sql_json(fx, "SELECT tw.apply_steps($1::jsonb, 'w1', '{echo}')::text", 1, items_s, NULL);
    char *out_s = json_dumps(out, JSON_COMPACT);
    json_t *results = json_object_get(out, "results");
    ck_assert_msg(json_array_size(results) == 6, "answer: %s", out_s);
    for (size_t i = 0; i < 6; i++) {
        json_t *r = json_array_get(results, i);
        ck_assert_msg(json_is_true(json_object_get(r, "applied")) == want[i], "item %zu: %s", i, out_s);
        ck_assert_msg(json_is_true(json_object_get(r, "invalid")) == (i == 4), "item %zu: %s", i, out_s);
    }

    /* b0 and b1: done, with one final event each; b2's turn still runs; b3's ended once. */
    for (int i = 0; i < 4; i++) {
        WD_STATUS_IS(fx, first[i], i == 2 ? "running" : "done");
        ck_assert_int_eq(
            tw_fx_sql_int(fx, "SELECT count(*) FROM state.outbox WHERE turn_id = $1::uuid AND kind = 'task'",
                          1, first[i]),
            i == 2 ? 0 : 1);
    }
    /* The events to publish, each id once. */
    json_t *pub = json_object_get(out, "publish"), *ev;
    size_t i;
    ck_assert_uint_ge(json_array_size(pub), 4);
    json_array_foreach(pub, i, ev)
    {
        for (size_t k = 0; k < i; k++)
            ck_assert_str_ne(json_string_value(json_object_get(json_array_get(pub, k), "event_id")),
                             json_string_value(json_object_get(ev, "event_id")));
    }
    /* The next turns: b0's and b1's second (not b0's third), claimed for w1 and running. */
    json_t *next = json_object_get(out, "next"), *job;
    ck_assert_msg(json_array_size(next) == 2, "answer: %s", out_s);
    json_array_foreach(next, i, job)
    {
        const char *agent = json_string_value(json_object_get(job, "agent"));
        const char *turn = json_string_value(json_object_get(job, "turn_id"));
        ck_assert_ptr_nonnull(agent);
        ck_assert_str_eq(turn, second[strcmp(agent, "b0") == 0 ? 0 : 1]);
        WD_STATUS_IS(fx, turn, "running");
    }
    WD_STATUS_IS(fx, second[2], "pending");
    WD_STATUS_IS(fx, third, "pending");
    /* Every turn's status is the last of its history, and every change of it is there. */
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.turns t WHERE t.status IS DISTINCT FROM"
                      " (SELECT h.to_status FROM state.turn_history h WHERE h.turn_id = t.turn_id"
                      " ORDER BY h.id DESC LIMIT 1)",
                      0),
        0);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turn_history WHERE turn_id = $1::uuid"
                                   " AND to_status IN ('dispatched', 'running', 'done')",
                                   1, first[0]),
                     3);

    /* The same batch again: nothing is applied twice. */
    json_t *again =
        sa_sql_json(fx, "SELECT tw.apply_steps($1::jsonb, 'w1', '{echo}')::text", 1, items_s, NULL);
    json_array_foreach(json_object_get(again, "results"), i, job)
        ck_assert(json_is_false(json_object_get(job, "applied")));
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.outbox WHERE kind = 'task'", 0), 3);

    json_decref(again);
    free(out_s);
    json_decref(out);
    free(items_s);
    json_decref(items);
    free(ended_s);
    json_decref(ended);
    json_decref(claim);
    for (int k = 0; k < 4; k++) {
        free(first[k]);
        free(second[k]);
    }
    free(third);
    tw_fx_free(fx);
}
END_TEST

/* A statement on one of the test's own sessions; its result (the caller clears it). */
static PGresult *sa_exec(PGconn *c, const char *sql, const char *p1)
{
    const char *params[] = {p1};
    return PQexecParams(c, sql, p1 ? 1 : 0, NULL, p1 ? params : NULL, NULL, NULL, 0);
}

/* The same statement, which must succeed (a command or rows). */
static void sa_exec_ok(PGconn *c, const char *sql, const char *p1)
{
    PGresult *r = sa_exec(c, sql, p1);
    ck_assert_msg(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK, "%s: %s",
                  sql, PQerrorMessage(c));
    PQclear(r);
}

/* A batch whose agent row another transaction holds (issue 24): tw.apply_steps takes the agents of a batch of
 * several items with SKIP LOCKED, applies the items whose agent it got and reports the others busy, untouched
 * (the worker then sends each of those alone), instead of waiting for the holder while holding the other
 * agents' rows. Session A holds x0's row; session B's batch of x0's and y0's completions must succeed while A
 * still holds it (with a lock_timeout of 20 s, before the fix it failed with a lock timeout), apply y0's, say
 * x0's is busy and leave x0's turn (running, same epoch) and its row unlocked; a batch of x0's step alone
 * still waits for the row, and applies once A commits. Driven by hand in SQL: no daemon runs. */
START_TEST(test_sqlapi_apply_steps_busy_agent)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    char *tx = sa_submit_as(fx, "x0", "{\"n\":1}"), *ty = sa_submit_as(fx, "y0", "{\"n\":1}");
    json_t *claim = sa_sql_json(fx, "SELECT tw.claim('w1', '{echo}', '{}', 10, 30)::text", 0, NULL, NULL);
    ck_assert_uint_eq(json_array_size(json_object_get(claim, "jobs")), 2);
    int64_t epoch = tw_fx_sql_int(fx, "SELECT turn_epoch FROM state.turns WHERE turn_id = $1::uuid", 1, tx);
    json_t *jx = json_deep_copy(sa_job_of(claim, "x0"));
    json_t *items =
        json_pack("[o,o]", sa_item(json_incref(jx), 1), sa_item(json_deep_copy(sa_job_of(claim, "y0")), 2));
    json_t *alone = json_pack("[o]", sa_item(jx, 1));
    char *items_s = json_dumps(items, JSON_COMPACT), *alone_s = json_dumps(alone, JSON_COMPACT);

    PGconn *a = PQconnectdb(tw_fx_pg_dsn(fx)), *b = PQconnectdb(tw_fx_pg_dsn(fx));
    ck_assert_msg(PQstatus(a) == CONNECTION_OK && PQstatus(b) == CONNECTION_OK, "%s%s", PQerrorMessage(a),
                  PQerrorMessage(b));
    sa_exec_ok(a, "BEGIN", NULL);
    sa_exec_ok(a, "SELECT 1 FROM state.agents WHERE agent = 'x0' FOR UPDATE", NULL);

    /* The batch, in a transaction of B left open to see which rows it holds. */
    sa_exec_ok(b, "SET lock_timeout = '20s'", NULL);
    sa_exec_ok(b, "BEGIN", NULL);
    PGresult *r = sa_exec(b, "SELECT tw.apply_steps($1::jsonb, 'w1', '{echo}')::text", items_s);
    ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK,
                  "a batch waited for the agent row another transaction holds: %s",
                  PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY));
    json_t *out = json_loads(PQgetvalue(r, 0, 0), 0, NULL);
    char *out_s = strdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    json_t *rx = json_array_get(json_object_get(out, "results"), 0),
           *ry = json_array_get(json_object_get(out, "results"), 1);
    ck_assert_msg(json_is_false(json_object_get(rx, "applied")) && json_is_true(json_object_get(rx, "busy")),
                  "x0's item: %s", out_s);
    ck_assert_msg(json_is_true(json_object_get(ry, "applied")) && !json_object_get(ry, "busy"),
                  "y0's item: %s", out_s);
    /* B holds y0's turn row, not x0's (nor x0's row, which A has). */
    const char *locked = "SELECT count(*) FROM (SELECT 1 FROM state.turns WHERE turn_id = $1::uuid"
                         " FOR UPDATE SKIP LOCKED) x";
    ck_assert_int_eq(tw_fx_sql_int(fx, locked, 1, ty), 0);
    ck_assert_int_eq(tw_fx_sql_int(fx, locked, 1, tx), 1);
    sa_exec_ok(b, "COMMIT", NULL);
    WD_STATUS_IS(fx, ty, "done");
    WD_STATUS_IS(fx, tx, "running");
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT turn_epoch FROM state.turns WHERE turn_id = $1::uuid", 1, tx),
                     epoch);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.outbox WHERE turn_id = $1::uuid AND kind = "
                                   "'task'",
                                   1, tx),
                     0);

    /* Alone, x0's step waits for the row (here until B's lock_timeout), and applies once A has committed. */
    sa_exec_ok(b, "SET lock_timeout = '200ms'", NULL);
    r = sa_exec(b, "SELECT tw.apply_steps($1::jsonb, 'w1', '{echo}')::text", alone_s);
    ck_assert_msg(PQresultStatus(r) == PGRES_FATAL_ERROR &&
                      strcmp(PQresultErrorField(r, PG_DIAG_SQLSTATE), "55P03") == 0,
                  "a step alone did not wait for its agent's row: %s",
                  PQresultStatus(r) == PGRES_TUPLES_OK ? PQgetvalue(r, 0, 0)
                                                       : PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY));
    PQclear(r);
    sa_exec_ok(a, "COMMIT", NULL);
    r = sa_exec(b, "SELECT tw.apply_steps($1::jsonb, 'w1', '{echo}')::text", alone_s);
    ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK, "%s", PQerrorMessage(b));
    json_t *again = json_loads(PQgetvalue(r, 0, 0), 0, NULL);
    ck_assert_msg(
        json_is_true(json_object_get(json_array_get(json_object_get(again, "results"), 0), "applied")),
        "x0's step alone: %s", PQgetvalue(r, 0, 0));
    PQclear(r);
    WD_STATUS_IS(fx, tx, "done");

    json_decref(again);
    free(out_s);
    json_decref(out);
    PQfinish(a);
    PQfinish(b);
    free(items_s);
    free(alone_s);
    json_decref(items);
    json_decref(alone);
    json_decref(claim);
    free(tx);
    free(ty);
    tw_fx_free(fx);
}
END_TEST

/* A claim whose commit could be lost in a crash of PostgreSQL (synchronous_commit off) must not hand out
 * events to publish: an event seen on NATS is in the outbox for good. A claim that starts a turn (its agent
 * becomes running, with a state event) waits for its flush; one that wrote no event does not. The 10,000-turn
 * soak found two state events seen on NATS and missing from the outbox after "postgres crash (immediate)"
 * when every claim committed without waiting. The setting is read in the claim's own transaction, through a
 * function of the test. */
START_TEST(test_sqlapi_claim_with_events_is_durable)
{
    TwFx *fx = tw_fx_new_migrated(NULL);

    tw_fx_sql_exec(
        fx,
        "CREATE FUNCTION public.claim_and_sync(p_worker text) RETURNS text LANGUAGE plpgsql AS $$"
        " DECLARE j jsonb; BEGIN"
        " j := tw.claim(p_worker, '{echo}', '{}', 10, 30);"
        " RETURN jsonb_array_length(j -> 'jobs') || ' '"
        " || jsonb_array_length(jsonb_path_query_array(j -> 'publish', '$[*] ? (exists(@.event_id))'))"
        " || ' ' || current_setting('synchronous_commit'); END $$",
        0);
    char *turn = sa_submit_as(fx, "d0", "{\"n\":1}");
    WD_STATUS_IS(fx, turn, "dispatched");
    /* The turn starts: one job, the agent's state event, and the commit waits for the disk. */
    char *got = tw_fx_sql_str(fx, "SELECT public.claim_and_sync('w1')", 0);
    ck_assert_str_eq(got, "1 1 on");
    free(got);
    WD_STATUS_IS(fx, turn, "running");
    /* Nothing left to claim: no event, no flush to wait for. */
    got = tw_fx_sql_str(fx, "SELECT public.claim_and_sync('w1')", 0);
    ck_assert_str_eq(got, "0 0 off");
    free(got);
    free(turn);
    tw_fx_free(fx);
}
END_TEST

/* A dispatch that read its agent's next turn while a watchdog ended that turn (still pending: its deadline)
 * does not dispatch it once the watchdog commits: tw.next_turns locks the heads it read and keeps those still
 * pending. Before, the cancel of the agent's turn went on with the head it had read, and the ended turn ran
 * (the chaos soak saw one, and its agent's 128 later turns stuck behind it). Driven by hand in SQL: no daemon
 * runs. */
START_TEST(test_sqlapi_dispatch_skips_a_turn_ended_meanwhile)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    char *t1 = sa_submit_as(fx, "z0", "{\"n\":1}"), *t2 = sa_submit_as(fx, "z0", "{\"n\":2}");
    WD_STATUS_IS(fx, t1, "dispatched");
    WD_STATUS_IS(fx, t2, "pending");

    PGconn *a = PQconnectdb(tw_fx_pg_dsn(fx)), *b = PQconnectdb(tw_fx_pg_dsn(fx));
    ck_assert_msg(PQstatus(a) == CONNECTION_OK && PQstatus(b) == CONNECTION_OK, "%s%s", PQerrorMessage(a),
                  PQerrorMessage(b));
    /* A: the deadline rule's end of t2, not committed yet. */
    sa_exec_ok(a, "BEGIN", NULL);
    sa_exec_ok(a, "SELECT tw.force_finish($1::uuid, 'turn_deadline_exceeded', 'timeout', 'the test')", t2);
    /* B: t1 is cancelled, and its agent goes on to the head of its queue, which is t2 in B's snapshot. */
    const char *params[1] = {t1};
    ck_assert_int_eq(
        PQsendQueryParams(b, "SELECT tw.cancel_turn($1::uuid)::text", 1, NULL, params, NULL, NULL, 0), 1);
    ck_assert_msg(tw_fx_sql_wait(fx, WD_WAIT_MS, "1",
                                 "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                 "AND query LIKE 'SELECT tw.cancel_turn%'",
                                 0),
                  "the cancel never waited for the deadline's transaction");
    sa_exec_ok(a, "COMMIT", NULL);
    PGresult *r;
    while ((r = PQgetResult(b)) != NULL) {
        ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK, "cancel: %s", PQresultErrorMessage(r));
        PQclear(r);
    }

    WD_STATUS_IS(fx, t1, "cancelled");
    char *got = tw_fx_sql_str(
        fx,
        "SELECT concat_ws(' ', t.status, t.error, (SELECT count(*) FROM state.agent_inbox i "
        "WHERE i.turn_id = t.turn_id), a.status, a.active_agent_turn_id IS NULL) "
        "FROM state.turns t JOIN state.agents a ON a.agent = t.agent WHERE t.turn_id = $1::uuid",
        1, t2);
    ck_assert_msg(strcmp(got, "timeout turn_deadline_exceeded 0 idle t") == 0,
                  "the turn the deadline ended was dispatched after all: %s", got);
    free(got);
    PQfinish(a);
    PQfinish(b);
    free(t1);
    free(t2);
    tw_fx_free(fx);
}
END_TEST

/* The comma-separated fields of s (modified in place) into f, at most n - 1 of them, NULL after the last. */
static void sa_fields(char *s, char **f, int n)
{
    char *save = NULL;
    int i = 0;
    for (char *t = strtok_r(s, ",", &save); t && i < n - 1; t = strtok_r(NULL, ",", &save))
        f[i++] = t;
    f[i] = NULL;
}

/* tw.submit_turns with idempotency keys, set-based (tw.submit_set): a new key makes a turn, the same keys
 * again answer the same turns (created false), two elements with one key are one turn, and a key given for
 * another channel or already naming another agent's turn is refused, naming it. */
START_TEST(test_sqlapi_submit_turns_keys)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    char *err = NULL;
    const char *call = "SELECT string_agg(turn_id::text || ':' || created, ',' ORDER BY n) FROM"
                       " tw.submit_turns(ARRAY['k0', 'k1', 'k0', 'k0'], ARRAY['c', 'c', 'c', 'c'],"
                       " array_fill('{}'::jsonb, ARRAY[4]), NULL, ARRAY['a', NULL, 'a', 'b'])"
                       " WITH ORDINALITY x (turn_id, created, n)";

    tw_fx_sql_exec(fx, "SELECT tw.add_agent('k0', 'echo'), tw.add_agent('k1', 'echo')", 0);
    char *first = tw_fx_sql_str(fx, call, 0), *f[6], *g[6];
    sa_fields(first, f, 6);
    ck_assert_msg(f[0] && f[1] && f[2] && f[3] && !f[4], "four answers, not: %s", f[0] ? f[0] : "");
    ck_assert_msg(strstr(f[0], ":true") && strstr(f[1], ":true") && strstr(f[2], ":false") &&
                      strstr(f[3], ":true"),
                  "%s %s %s %s", f[0], f[1], f[2], f[3]);
    ck_assert_int_eq(strncmp(f[0], f[2], 36), 0); /* one key, one turn */
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns", 0), 3);
    char *again = tw_fx_sql_str(fx, call, 0);
    sa_fields(again, g, 6);
    ck_assert_msg(g[0] && g[1] && g[2] && g[3], "four answers again, not: %s", g[0] ? g[0] : "");
    ck_assert_msg(strncmp(g[0], f[0], 36) == 0 && strstr(g[0], ":false") && strncmp(g[3], f[3], 36) == 0 &&
                      strstr(g[3], ":false") && strstr(g[1], ":true"),
                  "again: %s %s %s, first: %s %s", g[0], g[1], g[3], f[0], f[3]);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns", 0), 4); /* k1's unkeyed one */
    ck_assert(!tw_fx_sql_try(fx, &err,
                             "SELECT count(*) FROM tw.submit_turns(ARRAY['k0', 'k0'], ARRAY['c', 'd'],"
                             " array_fill('{}'::jsonb, ARRAY[2]), NULL, ARRAY['z', 'z'])",
                             0));
    ck_assert_msg(err && strstr(err, "idempotency key z"), "%s", err ? err : "");
    free(err);
    err = NULL;
    ck_assert(!tw_fx_sql_try(fx, &err,
                             "SELECT count(*) FROM tw.submit_turns(ARRAY['k1'], ARRAY['c'],"
                             " array_fill('{}'::jsonb, ARRAY[1]), NULL, ARRAY['a'])",
                             0));
    ck_assert_msg(err && strstr(err, "element 1") && strstr(err, "idempotency key a"), "%s", err ? err : "");
    free(err);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns", 0), 4);
    free(first);
    free(again);
    tw_fx_free(fx);
}
END_TEST

/* tw.turns_move takes a shorter way for one turn than for many (sql/fn/phase.sql): the same moves, one turn
 * alone (x) and two at once (y with z), must leave the same places and timers. Three turns go through every
 * status with timers of every kind (fixed times far ahead, so that not_before is still ahead), and a timer
 * changed in place (p_written); each step's signature of x (its place, with the queue's ready_at, and its
 * timers as kind=epoch) must equal y's, and the trail must show what each status keeps. */
static const char sa_moves_fn[] =
    "CREATE FUNCTION public.sa_sig(p uuid) RETURNS text LANGUAGE sql AS $$"
    " SELECT concat_ws(' ',"
    "  (SELECT 'q:' || coalesce(extract(epoch FROM q.ready_at)::bigint::text, '-') FROM state.turn_queue q"
    "    WHERE q.turn_id = p),"
    "  (SELECT 'd' FROM state.turn_dispatched d WHERE d.turn_id = p),"
    "  (SELECT 'r' FROM state.turn_running r WHERE r.turn_id = p),"
    "  (SELECT string_agg(x.kind || '=' || extract(epoch FROM x.due_at)::bigint, ',' ORDER BY x.kind)"
    "     FROM state.turn_timers x WHERE x.turn_id = p)) $$;"
    "CREATE FUNCTION public.sa_moves(px uuid, py uuid, pz uuid) RETURNS text LANGUAGE plpgsql AS $$"
    "DECLARE x state.turns; y state.turns; z state.turns; v_trail text := ''; v_bad text := '';"
    " v_step text; v_written boolean;"
    " s text[] := ARRAY['pending', 'dispatched', 'running', 'running!', 'suspended', 'running', 'pending+',"
    "                   'dispatched', 'running', 'done'];"
    " t0 timestamptz := '2100-01-01 00:00:00+00';"
    "BEGIN"
    " UPDATE state.turns SET deadline_at = t0 + interval '50 s', deadline_warn_at = t0 + interval '40 s',"
    "        not_before = t0 + interval '5 s' WHERE turn_id IN (px, py, pz);"
    " FOREACH v_step IN ARRAY s LOOP"
    "  v_written := v_step = 'running!';"
    "  IF v_written THEN"
    "   UPDATE state.turns SET deadline_at = t0 + interval '60 s' WHERE turn_id IN (px, py, pz);"
    "  END IF;"
    "  SELECT * INTO x FROM state.turns WHERE turn_id = px;"
    "  SELECT * INTO y FROM state.turns WHERE turn_id = py;"
    "  SELECT * INTO z FROM state.turns WHERE turn_id = pz;"
    "  IF NOT v_written THEN"
    "   x.status := rtrim(v_step, '+'); y.status := x.status; z.status := x.status;"
    "   IF v_step = 'pending' THEN"
    "    x.queue_deadline_at := t0 + interval '30 s'; x.queue_warn_at := t0 + interval '20 s';"
    "    x.retry_due_at := t0 + interval '3 s'; x.retry_at := x.retry_due_at;"
    "   ELSIF v_step = 'pending+' THEN"
    "    x.retry_due_at := t0 + interval '7 s'; x.retry_at := x.retry_due_at;"
    "   ELSIF v_step = 'done' THEN"
    "    x.ended_at := now();"
    "   END IF;"
    "   y.queue_deadline_at := x.queue_deadline_at; y.queue_warn_at := x.queue_warn_at;"
    "   y.retry_due_at := x.retry_due_at; y.retry_at := x.retry_at; y.ended_at := x.ended_at;"
    "   z.queue_deadline_at := x.queue_deadline_at; z.queue_warn_at := x.queue_warn_at;"
    "   z.retry_due_at := x.retry_due_at; z.retry_at := x.retry_at; z.ended_at := x.ended_at;"
    "  END IF;"
    "  PERFORM count(*) FROM tw.turns_move(ARRAY[x], v_written);"
    "  PERFORM count(*) FROM tw.turns_move(ARRAY[y, z], v_written);"
    "  IF public.sa_sig(px) IS DISTINCT FROM public.sa_sig(py)"
    "     OR public.sa_sig(py) IS DISTINCT FROM public.sa_sig(pz) THEN"
    "   v_bad := v_bad || format(' after %s: one %s, two %s and %s;', v_step, public.sa_sig(px),"
    "                            public.sa_sig(py), public.sa_sig(pz));"
    "  END IF;"
    "  v_trail := v_trail || '|' || coalesce(public.sa_sig(px), '');"
    " END LOOP;"
    " RETURN CASE WHEN v_bad = '' THEN v_trail ELSE 'DIFFER' || v_bad END;"
    "END $$;";

START_TEST(test_sqlapi_moves_one_and_many)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    tw_fx_sql_exec(
        fx, "SELECT tw.add_agent('m1', 'echo'), tw.add_agent('m2', 'echo'), tw.add_agent('m3', 'echo')", 0);
    tw_fx_sql_exec(fx, sa_moves_fn, 0);
    char *got =
        tw_fx_sql_str(fx,
                      "SELECT public.sa_moves(tw.submit_turn('m1', 'c', '{}'), tw.submit_turn('m2', 'c', "
                      "'{}'), tw.submit_turn('m3', 'c', '{}'))",
                      0);
    ck_assert_msg(got && strncmp(got, "DIFFER", 6) != 0, "one turn and two moved differently:%s",
                  got ? got + 6 : "(null)");
    /* 4102444800 is t0: not_before +5, retry +3 then +7, queue budget +30 and its warning +20, deadline +50
     * then +60 (changed in place) and its warning +40. */
    const char *want =
        "|q:4102444805 deadline=4102444850,deadline_warn=4102444840,not_before=4102444805,"
        "queue=4102444830,queue_warn=4102444820,retry=4102444803"
        "|d deadline=4102444850,deadline_warn=4102444840,queue=4102444830,queue_warn=4102444820"
        "|r deadline=4102444850,deadline_warn=4102444840"
        "|r deadline=4102444860,deadline_warn=4102444840"
        "|deadline=4102444860,deadline_warn=4102444840"
        "|r deadline=4102444860,deadline_warn=4102444840"
        "|q:4102444807 deadline=4102444860,deadline_warn=4102444840,not_before=4102444805,"
        "queue=4102444830,queue_warn=4102444820,retry=4102444807"
        "|d deadline=4102444860,deadline_warn=4102444840,queue=4102444830,queue_warn=4102444820"
        "|r deadline=4102444860,deadline_warn=4102444840"
        "|";
    ck_assert_msg(strcmp(got, want) == 0, "the trail of moves:\n got %s\nwant %s", got, want);
    free(got);
    tw_fx_free(fx);
}
END_TEST

/* Agent `agent`'s turn (profile echo), its step claimed by w1 and applied as two calls c1 and c2 of tool rec
 * (each naming limit `limit` when given): the turn is suspended on them. Returns its id. */
static char *sa_two_calls(TwFx *fx, const char *agent, const char *limit)
{
    char *t = sa_submit_as(fx, agent, "{\"n\":1}");
    json_t *claim = sa_sql_json(fx, "SELECT tw.claim('w1', '{echo}', '{}', 10, 30)::text", 0, NULL, NULL);
    json_t *calls = json_array();
    for (int i = 1; i <= 2; i++) {
        json_t *c = json_pack("{s:s,s:s,s:{},s:i,s:i}", "id", i == 1 ? "c1" : "c2", "tool", "rec", "args",
                              "timeout_seconds", 30, "wait_seconds", 30);
        if (limit)
            json_object_set_new(c, "limits", json_pack("[s]", limit));
        json_array_append_new(calls, c);
    }
    json_t *items =
        json_pack("[{s:O,s:{s:o}}]", "fence", sa_job_of(claim, agent), "reply", "tool_calls", calls);
    char *items_s = json_dumps(items, JSON_COMPACT);
    json_t *out = sa_sql_json(fx, "SELECT tw.apply_steps($1::jsonb, 'w1', '{echo}')::text", 1, items_s, NULL);
    ck_assert(json_is_true(json_object_get(json_array_get(json_object_get(out, "results"), 0), "applied")));
    json_decref(out);
    free(items_s);
    json_decref(items);
    json_decref(claim);
    return t;
}

/* Flow control's hand-over reads the next few waiters of each key, not every waiter (tw.flow_grant): it must
 * still grant in the documented order when the first of each key are not enough. A cap of 3, five waiters of
 * key k1 and then one of k2: the grant takes k1's first and k2's (each key's first waiter before any key's
 * second), then k1's second, and no more. And the waiters of two priorities: the higher first, whatever its
 * place. Rows of state.limit_calls written by hand: no daemon runs. */
START_TEST(test_sqlapi_grant_order)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    tw_fx_sql_exec(fx, "SELECT tw.set_limit('g', 3)", 0);
    tw_fx_sql_exec(
        fx,
        "INSERT INTO state.limit_calls (turn_id, step, tool_call_id, tool, limits, limit_key, since)"
        " SELECT gen_random_uuid(), 1, 'c' || i, 'x', '{g}', CASE WHEN i <= 5 THEN 'k1' ELSE 'k2' END,"
        "        now() - interval '1 minute'"
        "   FROM generate_series(1, 6) i",
        0);
    tw_fx_sql_exec(fx, "SELECT tw.flow_grant(tw.flow_lock('{g}'))", 0);
    char *got = tw_fx_sql_str(
        fx,
        "SELECT string_agg(tool_call_id, ',' ORDER BY seq) FROM state.limit_calls WHERE status = 'holding'",
        0);
    ck_assert_msg(got && strcmp(got, "c1,c2,c6") == 0, "granted %s, not c1,c2,c6", got ? got : "(none)");
    free(got);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT (tw.limit_show('g') ->> 'in_use')::int", 0), 3);
    /* Priority: a waiter of priority 5 that came last is granted before k1's third. */
    tw_fx_sql_exec(
        fx,
        "INSERT INTO state.limit_calls (turn_id, step, tool_call_id, tool, limits, limit_key, priority)"
        " VALUES (gen_random_uuid(), 1, 'p5', 'x', '{g}', 'k3', 5)",
        0);
    tw_fx_sql_exec(fx,
                   "SELECT tw.flow_release(turn_id, step, tool_call_id) FROM state.limit_calls"
                   " WHERE tool_call_id = 'c1'",
                   0);
    got = tw_fx_sql_str(
        fx,
        "SELECT string_agg(tool_call_id, ',' ORDER BY seq) FROM state.limit_calls WHERE status = 'holding'",
        0);
    ck_assert_msg(got && strcmp(got, "c2,c6,p5") == 0, "holding %s, not c2,c6,p5", got ? got : "(none)");
    free(got);
    tw_fx_free(fx);
}
END_TEST

/* The results of one turn's calls, delivered by two workers at once, do not wait for each other: each takes
 * the turn's row in share mode (in share mode, not for update: a fan-out's results each waited out the
 * others' commits, docs/performance.md). Both settle and the turn resumes. A claim meanwhile says the turn
 * was busy; one result consumed takes the other with it. Driven by hand in SQL. */
START_TEST(test_sqlapi_results_side_by_side)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    char *t = sa_two_calls(fx, "r0", NULL);
    WD_STATUS_IS(fx, t, "suspended");
    json_t *tools = sa_sql_json(fx, "SELECT tw.claim('w2', '{}', '{rec}', 10, 30)::text", 0, NULL, NULL);
    ck_assert_uint_eq(json_array_size(json_object_get(tools, "jobs")), 2);

    PGconn *c[2] = {PQconnectdb(tw_fx_pg_dsn(fx)), PQconnectdb(tw_fx_pg_dsn(fx))};
    ck_assert_msg(PQstatus(c[0]) == CONNECTION_OK && PQstatus(c[1]) == CONNECTION_OK, "%s%s",
                  PQerrorMessage(c[0]), PQerrorMessage(c[1]));
    sa_exec_ok(c[0], "BEGIN", NULL);
    sa_exec_ok(c[1], "SET lock_timeout = '5s'", NULL);
    for (int i = 0; i < 2; i++) {
        json_t *job = json_array_get(json_object_get(tools, "jobs"), (size_t)i);
        char *fence = json_dumps(job, JSON_COMPACT);
        const char *params[] = {t, json_string_value(json_object_get(job, "tool_call_id")), fence};
        /* The first in a transaction left open; the second while it is. */
        PGresult *r =
            PQexecParams(c[i],
                         "SELECT tw.deliver_result($1::uuid, $2, 'ok', '{\"ok\":true}', NULL, $3::jsonb,"
                         " 'tool.result') ->> 'result'",
                         3, NULL, params, NULL, NULL, 0);
        ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK && strcmp(PQgetvalue(r, 0, 0), "accepted") == 0,
                      "result %d: %s%s", i, PQresultErrorMessage(r),
                      PQresultStatus(r) == PGRES_TUPLES_OK ? PQgetvalue(r, 0, 0) : "");
        PQclear(r);
        free(fence);
    }
    /* While the first is open, a claim finds the second's result with its turn busy: it says so ("busy", the
     * worker looks again a moment later), not "more" (which claimed again at once, a spin). */
    json_t *busy = sa_sql_json(fx, "SELECT tw.claim('w1', '{echo}', '{}', 10, 30)::text", 0, NULL, NULL);
    char *busy_s = json_dumps(busy, JSON_COMPACT);
    ck_assert_msg(json_is_true(json_object_get(busy, "busy")) &&
                      json_is_false(json_object_get(busy, "more")) &&
                      json_array_size(json_object_get(busy, "jobs")) == 0,
                  "a claim of a busy turn's result: %s", busy_s);
    free(busy_s);
    json_decref(busy);
    sa_exec_ok(c[0], "COMMIT", NULL);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.turn_waiting_tools"
                                   " WHERE turn_id = $1::uuid AND wait_status = 'received'",
                                   1, t),
                     2);
    /* Consuming one result consumes its step's others that wait (those that found the turn busy): the turn
     * resumes (its ledger entry) and no result is left for another claim. */
    tw_fx_sql_exec(fx,
                   "SELECT tw.consume_result(m) FROM state.agent_inbox m WHERE m.turn_id = $1::uuid"
                   " AND m.message_type = 'tool.result' AND m.tool_call_id = 'c1'",
                   1, t);
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.turn_resume_ledger WHERE turn_id = $1::uuid", 1, t), 1);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.agent_inbox WHERE turn_id = $1::uuid"
                                   " AND message_type = 'tool.result' AND status = 'pending'",
                                   1, t),
                     0);
    /* Their results consumed, the turn resumes: its next step is claimed. */
    json_t *resumed = sa_sql_json(fx, "SELECT tw.claim('w1', '{echo}', '{}', 10, 30)::text", 0, NULL, NULL);
    ck_assert_uint_eq(json_array_size(json_object_get(resumed, "jobs")), 1);
    WD_STATUS_IS(fx, t, "running");
    json_decref(resumed);
    PQfinish(c[0]);
    PQfinish(c[1]);
    json_decref(tools);
    free(t);
    tw_fx_free(fx);
}
END_TEST

/* Hand-over in the releasing transaction: a cap of 1, a turn's two calls of a limited tool, the second
 * waiting. The first call's result, delivered with its worker's id and tools, gives the slot back and takes
 * the second call for that worker in the same statement (its job in "jobs", claimed by it, started): no
 * doorbell for the tool rings, as no call of it waits for a worker. Without a worker id, the grant leaves the
 * call to a claim and rings; so it does when the granted call's turn is busy (another transaction holds its
 * row: the call is not taken, nothing of it is written but its message). A worker that serves the agent's
 * profile consumes the last result in the same statement. Driven by hand in SQL. */
START_TEST(test_sqlapi_result_takes_granted_call)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    tw_fx_sql_exec(fx, "SELECT tw.set_limit('one', 1)", 0);
    const char *turns[3] = {"h0", "h1", "h2"};
    for (int round = 0; round < 3; round++) {
        char *t = sa_two_calls(fx, turns[round], "one");
        ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT (tw.limit_show('one') ->> 'waiting')::int", 0), 1);
        json_t *tools = sa_sql_json(fx, "SELECT tw.claim('w2', '{}', '{rec}', 10, 30)::text", 0, NULL, NULL);
        ck_assert_uint_eq(json_array_size(json_object_get(tools, "jobs")), 1);
        json_t *job = json_array_get(json_object_get(tools, "jobs"), 0);
        ck_assert_str_eq(json_string_value(json_object_get(job, "tool_call_id")), "c1");
        char *fence = json_dumps(job, JSON_COMPACT);
        /* Round 2: another transaction holds the turn's row (in share mode, as a sibling's result would). */
        PGconn *holder = NULL;
        if (round == 2) {
            holder = PQconnectdb(tw_fx_pg_dsn(fx));
            ck_assert_msg(PQstatus(holder) == CONNECTION_OK, "%s", PQerrorMessage(holder));
            sa_exec_ok(holder, "BEGIN", NULL);
            const char *hp[] = {t};
            PGresult *hr =
                PQexecParams(holder, "SELECT 1 FROM state.turns WHERE turn_id = $1::uuid FOR SHARE", 1, NULL,
                             hp, NULL, NULL, 0);
            ck_assert_msg(PQresultStatus(hr) == PGRES_TUPLES_OK && PQntuples(hr) == 1, "%s",
                          PQresultErrorMessage(hr));
            PQclear(hr);
        }
        json_t *res =
            sa_sql_json(fx,
                        round != 1 ? "SELECT tw.deliver_result($1::uuid, 'c1', 'ok', '{}', NULL, $2::jsonb,"
                                     " 'tool.result', 'w2', '{rec}')::text"
                                   : "SELECT tw.deliver_result($1::uuid, 'c1', 'ok', '{}', NULL, $2::jsonb,"
                                     " 'tool.result')::text",
                        2, t, fence);
        if (holder) {
            sa_exec_ok(holder, "COMMIT", NULL);
            PQfinish(holder);
        }
        char *res_s = json_dumps(res, JSON_COMPACT);
        ck_assert_msg(strcmp(json_string_value(json_object_get(res, "result")), "accepted") == 0, "%s",
                      res_s);
        json_t *jobs = json_object_get(res, "jobs");
        bool rang = strstr(res_s, "cmd.tool.rec.wakeup") != NULL;
        if (round == 0) {
            ck_assert_msg(json_array_size(jobs) == 1 && strcmp(json_string_value(json_object_get(
                                                                   json_array_get(jobs, 0), "tool_call_id")),
                                                               "c2") == 0,
                          "the granted call was not taken for its worker: %s", res_s);
            ck_assert_msg(!rang, "the tool's doorbell rang for a call already taken: %s", res_s);
            ck_assert_int_eq(
                tw_fx_sql_int(fx,
                              "SELECT count(*) FROM state.agent_inbox WHERE turn_id = $1::uuid"
                              " AND tool_call_id = 'c2' AND status = 'processing' AND claimed_by = 'w2'",
                              1, t),
                1);
            ck_assert_int_eq(
                tw_fx_sql_int(fx,
                              "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1::uuid"
                              " AND tool_call_id = 'c2' AND started_at IS NOT NULL",
                              1, t),
                1);
        } else {
            ck_assert_msg(!jobs && rang, "round %d: the grant is left to a claim, rung: %s", round, res_s);
            ck_assert_int_eq(tw_fx_sql_int(fx,
                                           "SELECT count(*) FROM state.agent_inbox WHERE turn_id = $1::uuid"
                                           " AND tool_call_id = 'c2' AND status = 'pending'",
                                           1, t),
                             1);
            ck_assert_int_eq(
                tw_fx_sql_int(fx,
                              "SELECT count(*) FROM state.turn_waiting_tools WHERE turn_id = $1::uuid"
                              " AND tool_call_id = 'c2' AND started_at IS NULL",
                              1, t),
                1);
        }
        ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT (tw.limit_show('one') ->> 'in_use')::int", 0), 1);
        /* The second call ends too: the limit is free, the turn resumes. */
        if (round != 0) {
            json_decref(tools);
            tools = sa_sql_json(fx, "SELECT tw.claim('w2', '{}', '{rec}', 10, 30)::text", 0, NULL, NULL);
            jobs = json_object_get(tools, "jobs");
        }
        char *fence2 = json_dumps(json_array_get(jobs, 0), JSON_COMPACT);
        /* In round 0 the worker also serves the agent's profile: the last result is consumed in its own
         * statement (the turn resumes, its resume rung, no result doorbell); in rounds 1 and 2 a claim
         * consumes it. */
        char *last =
            tw_fx_sql_str(fx,
                          round == 0 ? "SELECT tw.deliver_result($1::uuid, 'c2', 'ok', '{}', NULL, $2::jsonb,"
                                       " 'tool.result', 'w2', '{rec}', '{echo}') ->> 'publish'"
                                     : "SELECT tw.deliver_result($1::uuid, 'c2', 'ok', '{}', NULL, $2::jsonb,"
                                       " 'tool.result', 'w2', '{rec}') ->> 'publish'",
                          2, t, fence2);
        ck_assert_msg(last && (strstr(last, "\"resume\"") != NULL) == (round == 0) &&
                          (strstr(last, "\"tool.result\"") != NULL) == (round != 0),
                      "round %d, the last result's publish: %s", round, last ? last : "(null)");
        ck_assert_int_eq(
            tw_fx_sql_int(fx, "SELECT count(*) FROM state.turn_resume_ledger WHERE turn_id = $1::uuid", 1, t),
            round == 0 ? 1 : 0);
        free(last);
        ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT (tw.limit_show('one') ->> 'in_use')::int", 0), 0);
        json_t *resumed =
            sa_sql_json(fx, "SELECT tw.claim('w1', '{echo}', '{}', 10, 30)::text", 0, NULL, NULL);
        ck_assert_uint_eq(json_array_size(json_object_get(resumed, "jobs")), 1);
        json_decref(resumed);
        free(fence2);
        free(res_s);
        json_decref(res);
        free(fence);
        json_decref(tools);
        free(t);
    }
    tw_fx_free(fx);
}
END_TEST

/* Rule retry_due runs twice at once on the PMO's two watchdog connections (common/watchdogs.c, parallel): the
 * runs share the later turns due at one instant by their agents. Four turns of four idle agents due now, a
 * batch of 2: session A's run dispatches two and stays open; session B's run, meanwhile, dispatches the other
 * two without waiting for A (before, both runs read the same first two timers: B found their agents held and
 * dispatched none). Driven by hand in SQL. */
START_TEST(test_sqlapi_later_runs_share)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    for (int i = 1; i <= 4; i++) {
        char agent[8];
        snprintf(agent, sizeof agent, "s%d", i);
        char *t = tw_fx_sql_str(fx,
                                "SELECT tw.submit_turn($1, 'c', '{}', NULL, NULL, NULL, 'echo', NULL, 0,"
                                " now() + interval '300 ms')::text",
                                1, agent);
        free(t);
    }
    tw_fx_sql_exec(fx, "SELECT pg_sleep(0.4)", 0);
    PGconn *c[2] = {PQconnectdb(tw_fx_pg_dsn(fx)), PQconnectdb(tw_fx_pg_dsn(fx))};
    ck_assert_msg(PQstatus(c[0]) == CONNECTION_OK && PQstatus(c[1]) == CONNECTION_OK, "%s%s",
                  PQerrorMessage(c[0]), PQerrorMessage(c[1]));
    sa_exec_ok(c[0], "BEGIN", NULL);
    sa_exec_ok(c[1], "SET lock_timeout = '5s'", NULL);
    int n[2];
    for (int i = 0; i < 2; i++) {
        PGresult *r = sa_exec(c[i], "SELECT jsonb_array_length(tw.wd_retry_due(2) -> 'actions')", NULL);
        ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK, "run %d: %s", i, PQresultErrorMessage(r));
        n[i] = atoi(PQgetvalue(r, 0, 0));
        PQclear(r);
    }
    ck_assert_msg(n[0] == 2 && n[1] == 2, "the two runs dispatched %d and %d, not 2 and 2", n[0], n[1]);
    sa_exec_ok(c[0], "COMMIT", NULL);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns WHERE status = 'dispatched'", 0), 4);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turn_timers", 0), 0);
    PQfinish(c[0]);
    PQfinish(c[1]);
    tw_fx_free(fx);
}
END_TEST

TW_SUITE_DEFINE(sqlapi, {
                            {"submit_in_transaction", test_sqlapi_submit_in_transaction, 90},
                            {"tool_result_and_cancel", test_sqlapi_tool_result_and_cancel, 90},
                            {"numbers_verbatim", test_sqlapi_numbers_verbatim, 90},
                            {"ring_is_untrusted", test_sqlapi_ring_is_untrusted, 120},
                            {"no_credentials_in_output", test_no_credentials_in_output, 120},
                            {"apply_steps_batch", test_sqlapi_apply_steps_batch, 60},
                            {"apply_steps_busy_agent", test_sqlapi_apply_steps_busy_agent, 90},
                            {"claim_durable", test_sqlapi_claim_with_events_is_durable, 60},
                            {"dispatch_skips_ended", test_sqlapi_dispatch_skips_a_turn_ended_meanwhile, 60},
                            {"submit_turns_keys", test_sqlapi_submit_turns_keys, 60},
                            {"moves", test_sqlapi_moves_one_and_many, 60},
                            {"grant_order", test_sqlapi_grant_order, 60},
                            {"results_side_by_side", test_sqlapi_results_side_by_side, 60},
                            {"result_takes_granted_call", test_sqlapi_result_takes_granted_call, 60},
                            {"later_runs_share", test_sqlapi_later_runs_share, 60},
                        })
