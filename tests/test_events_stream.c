/* test_events_stream.c — durable observers (issue 15 item 6, contract section 12): with [nats] events_stream
 * the daemons keep every evt.agent.> event in a JetStream stream, and `turnwatch events --since SECONDS`
 * replays what happened while no observer ran (including events relayed from the outbox after a NATS outage),
 * then follows the live ones; an event counts as published only once the stream kept it. tw_stream_ensure
 * creates, keeps and amends the stream. Real PostgreSQL,
 * nats-server (with JetStream) and daemons. */
#include "turn_helpers.h"

#include <nats/nats.h>
#include <unistd.h>

#include "stream.h"
#include "suite.h"

#define ES_STREAM "twevents"

static const char es_overrides[] = "[nats]\nevents_stream = " ES_STREAM "\nevents_max_age_seconds = 3600\n";

/* `turnwatch events --since SINCE` running in the background, its stdout and stderr in <dir>/<name>.log. */
static TwFxProc *es_observer(TwFx *fx, const char *name, const char *since)
{
    const char *argv[] = {tw_fx_cli_path(), "-c", tw_fx_config_path(fx), "events", "--since", since, NULL};
    return tw_fx_spawn(fx, name, argv);
}

/* The same with -v: it says on stderr when it follows. */
static TwFxProc *es_observer_verbose(TwFx *fx, const char *name, const char *since)
{
    const char *argv[] = {tw_fx_cli_path(), "-v",      "-c",  tw_fx_config_path(fx),
                          "events",         "--since", since, NULL};
    return tw_fx_spawn(fx, name, argv);
}

/* What an observer printed about one turn: its final (task) events by event_id, and how many state events. */
typedef struct EsSeen {
    TwFxProc *proc;
    const char *turn;
    json_t *finals; /* event_id -> event */
    int states;
    int idles; /* state events with status idle: the turn's last event */
} EsSeen;

static void es_read(EsSeen *s)
{
    char *log = tw_fx_proc_log(s->proc), *save = NULL;

    json_decref(s->finals);
    s->finals = json_object();
    s->states = 0;
    s->idles = 0;
    for (char *line = strtok_r(log, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        json_t *e = line[0] == '{' ? json_loads(line, 0, NULL) : NULL;
        const char *subject = json_string_value(json_object_get(e, "subject"));
        const char *turn = json_string_value(json_object_get(e, "turn_id"));
        const char *id = json_string_value(json_object_get(e, "event_id"));
        if (subject && turn && id && strcmp(turn, s->turn) == 0) {
            size_t n = strlen(subject);
            if (n > 5 && strcmp(subject + n - 5, ".task") == 0)
                json_object_set(s->finals, id, e);
            else if (n > 6 && strcmp(subject + n - 6, ".state") == 0) {
                const char *status = json_string_value(json_object_get(e, "status"));
                s->states++;
                s->idles += status && strcmp(status, "idle") == 0;
            }
        }
        json_decref(e);
    }
    free(log);
}

static bool es_has_final(void *arg)
{
    EsSeen *s = arg;
    es_read(s);
    return json_object_size(s->finals) > 0;
}

/* Waits until the observer printed the final event of `turn`, then checks it is the outbox's one event for
 * the turn, with `status`, and that the turn's state events came too. */
static void es_expect(TwFx *fx, TwFxProc *obs, const char *turn, const char *status)
{
    EsSeen s = {obs, turn, NULL, 0, 0};
    char *outbox_id;

    ck_assert_msg(tw_fx_wait_until(es_has_final, &s, WD_WAIT_MS),
                  "the observer never printed the final event of %s", turn);
    ck_assert_msg(json_object_size(s.finals) == 1, "%zu distinct final events for %s",
                  json_object_size(s.finals), turn);
    outbox_id = tw_fx_sql_str(
        fx, "SELECT event_id::text FROM state.outbox WHERE turn_id = $1 AND kind = 'task'", 1, turn);
    ck_assert_ptr_nonnull(outbox_id);
    json_t *e = json_object_get(s.finals, outbox_id);
    ck_assert_msg(e != NULL, "the final event printed for %s is not the outbox's %s", turn, outbox_id);
    ck_assert_str_eq(json_string_value(json_object_get(e, "status")), status);
    ck_assert_int_gt(s.states, 0);
    free(outbox_id);
    json_decref(s.finals);
}

static bool es_has_idle(void *arg)
{
    EsSeen *s = arg;
    es_read(s);
    return s->idles > 0;
}

/* Waits until the observer printed the idle state event that follows the end of `turn`: the last event of
 * the turn, published after its final one. */
static void es_expect_idle(TwFxProc *obs, const char *turn)
{
    EsSeen s = {obs, turn, NULL, 0, 0};

    ck_assert_msg(tw_fx_wait_until(es_has_idle, &s, WD_WAIT_MS),
                  "the observer never printed the idle state event after %s", turn);
    json_decref(s.finals);
}

static bool es_seen_nothing_of(TwFxProc *obs, const char *turn)
{
    EsSeen s = {obs, turn, NULL, 0, 0};
    es_read(&s);
    bool none = json_object_size(s.finals) == 0 && s.states == 0;
    json_decref(s.finals);
    return none;
}

/* ---- turns that ended while no observer ran are replayed, then live ones follow
 * ---------------------------- */

START_TEST(test_events_replayed_after_the_observer_was_away)
{
    TwFxStack st = tw_fx_stack_start_events(es_overrides, NULL);

    /* Each daemon makes sure of the stream when it connects; one of them creates it. */
    ck_assert(tw_fx_wait_until(wd_log_line_has, &(WdLogHas){st.pmo, "events stream " ES_STREAM " (", NULL},
                               WD_WAIT_MS));
    ck_assert(tw_fx_wait_until(wd_log_line_has, &(WdLogHas){st.worker, "events stream " ES_STREAM " (", NULL},
                               WD_WAIT_MS));

    /* No observer runs while these end. */
    char *t1 = wd_submit(st.fx, "echo", "{\"n\":1}");
    char *t2 = wd_submit(st.fx, "failer", "{\"n\":2}");
    WD_STATUS_IS(st.fx, t1, "done");
    WD_STATUS_IS(st.fx, t2, "failed");

    /* One more ends while NATS is down: its events wait in the outbox, and the relay publishes them into the
     * stream once the server is back (its JetStream store survives the restart). */
    tw_fx_nats_stop(st.fx);
    char *t3 = wd_submit(st.fx, "echo", "{\"n\":3}");
    WD_STATUS_IS(st.fx, t3, "done");
    ck_assert_int_gt(
        tw_fx_sql_int(st.fx, "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND published_at IS NULL",
                      1, t3),
        0);
    tw_fx_nats_start(st.fx);
    ck_assert_msg(tw_fx_sql_wait(st.fx, WD_WAIT_MS, "0",
                                 "SELECT count(*) FROM state.outbox WHERE published_at IS NULL", 0),
                  "the outbox relay did not publish the events of the outage");

    /* The observer arrives: everything of the last ten minutes first, once each. */
    TwFxProc *obs = es_observer(st.fx, "events-since", "600");
    es_expect(st.fx, obs, t1, "done");
    es_expect(st.fx, obs, t2, "failed");
    es_expect(st.fx, obs, t3, "done");

    /* Then it follows: a turn submitted now shows up in the same output. */
    char *t4 = wd_submit(st.fx, "echo", "{\"n\":4}");
    WD_STATUS_IS(st.fx, t4, "done");
    es_expect(st.fx, obs, t4, "done");

    /* --since 0 starts at the present: nothing of the turns before, the new one after. The observer starts
     * once t4's last event (its agent's idle state) is in the stream, and t5 is submitted once the observer
     * says it follows: no wait that a slow machine could outlast. */
    es_expect_idle(obs, t4);
    TwFxProc *now = es_observer_verbose(st.fx, "events-since-0", "0");
    ck_assert_msg(tw_fx_wait_until(wd_log_line_has,
                                   &(WdLogHas){now, "replaying evt.agent.> from the last 0 s", NULL},
                                   WD_WAIT_MS),
                  "the observer with --since 0 never said it follows");
    char *t5 = wd_submit(st.fx, "echo", "{\"n\":5}");
    WD_STATUS_IS(st.fx, t5, "done");
    es_expect(st.fx, now, t5, "done");
    ck_assert(es_seen_nothing_of(now, t1));
    ck_assert(es_seen_nothing_of(now, t4));

    ck_assert_int_eq(tw_fx_proc_terminate(obs, 5000), 0);
    ck_assert_int_eq(tw_fx_proc_terminate(now, 5000), 0);
    free(t1);
    free(t2);
    free(t3);
    free(t4);
    free(t5);
    tw_fx_free(st.fx);
}
END_TEST

/* ---- an event counts as published only once the stream kept it
 * ----------------------------------------------- */

/* The stream disappears under running daemons (deleted; in life, a server that lost its store, or one
 * shutting down that still answers a flush but keeps nothing): the events of a turn that ends then are not
 * marked published until a daemon made the stream again and the relay published them into it. */
START_TEST(test_events_kept_when_the_stream_was_lost)
{
    TwFxStack st = tw_fx_stack_start_events(es_overrides, NULL);
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    jsErrCode jerr = 0;

    ck_assert(tw_fx_wait_until(wd_log_line_has, &(WdLogHas){st.pmo, "events stream " ES_STREAM " (", NULL},
                               WD_WAIT_MS));
    ck_assert(tw_fx_wait_until(wd_log_line_has, &(WdLogHas){st.worker, "events stream " ES_STREAM " (", NULL},
                               WD_WAIT_MS));
    ck_assert_int_eq(natsConnection_ConnectTo(&nc, tw_fx_nats_url(st.fx)), NATS_OK);
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    ck_assert_int_eq(js_DeleteStream(js, ES_STREAM, NULL, &jerr), NATS_OK);

    char *t1 = wd_submit(st.fx, "echo", "{\"n\":1}");
    WD_STATUS_IS(st.fx, t1, "done");
    ck_assert_msg(tw_fx_sql_wait(st.fx, WD_WAIT_MS, "0",
                                 "SELECT count(*) FROM state.outbox WHERE published_at IS NULL", 0),
                  "the events of the turn were never published into the stream made again");
    TwFxProc *obs = es_observer(st.fx, "events-since", "600");
    es_expect(st.fx, obs, t1, "done");
    ck_assert_int_eq(tw_fx_proc_terminate(obs, 5000), 0);

    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    free(t1);
    tw_fx_free(st.fx);
}
END_TEST

/* ---- until the stream is made sure of, events stay in the outbox
 * --------------------------------------------- */

/* Another stream holds evt.agent.>, so the daemons cannot make theirs (JetStream refuses overlapping
 * subjects): the check fails as it does while a cluster elects a leader. The events of a turn that ends
 * meanwhile are delivered live, but they count as published only on the stream's acknowledgment: they stay in
 * the outbox, and once the other stream is gone the daemons make theirs and the relay publishes them into it
 * (issue 27: they were counted as published through core NATS and never reached the stream). */
START_TEST(test_events_held_until_the_stream_is_ready)
{
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    jsErrCode jerr = 0;
    jsStreamConfig sc;
    jsStreamInfo *si = NULL;
    const char *subjects[] = {"evt.agent.>"};
    TwFx *fx = tw_fx_new();

    tw_fx_pg_init(fx);
    tw_fx_nats_start(fx);
    ck_assert_int_eq(natsConnection_ConnectTo(&nc, tw_fx_nats_url(fx)), NATS_OK);
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    jsStreamConfig_Init(&sc);
    sc.Name = "blocker";
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    sc.Storage = js_MemoryStorage;
    ck_assert_int_eq(js_AddStream(&si, js, &sc, NULL, &jerr), NATS_OK);
    jsStreamInfo_Destroy(si);
    tw_fx_write_config(fx, NULL, es_overrides);
    tw_fx_migrate(fx);
    TwFxEvents *ev = tw_fx_events_new(fx, "evt.agent.*.task");
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    TwFxProc *worker = tw_fx_start_worker(fx, NULL);
    ck_assert(tw_fx_wait_until(wd_log_line_has, &(WdLogHas){pmo, "events stream " ES_STREAM ": ", NULL},
                               WD_WAIT_MS));

    char *t1 = wd_submit(fx, "echo", "{\"n\":1}");
    WD_STATUS_IS(fx, t1, "done");
    /* Delivered live to whoever listens ... */
    ck_assert(tw_fx_events_wait(ev, "evt.agent.*.task", t1, 1, WD_WAIT_MS));
    /* ... but not published as far as the outbox goes: nothing acknowledged it. */
    tw_fx_sleep_ms(1500);
    ck_assert_msg(tw_fx_sql_int(fx,
                                "SELECT count(*) FROM state.outbox WHERE turn_id = $1 AND kind = 'task' "
                                "AND published_at IS NULL",
                                1, t1) == 1,
                  "the final event was marked published though no stream kept it");

    /* The way is free: the daemons make their stream, the relay publishes the held events into it. */
    ck_assert_int_eq(js_DeleteStream(js, "blocker", NULL, &jerr), NATS_OK);
    ck_assert_msg(tw_fx_sql_wait(fx, WD_WAIT_MS, "0",
                                 "SELECT count(*) FROM state.outbox WHERE published_at IS NULL", 0),
                  "the held events were never published into the stream");
    TwFxProc *obs = es_observer(fx, "events-since", "600");
    es_expect(fx, obs, t1, "done");
    ck_assert_int_eq(tw_fx_proc_terminate(obs, 5000), 0);
    ck_assert_int_eq(tw_fx_proc_terminate(worker, 10000), 0);
    ck_assert_int_eq(tw_fx_proc_terminate(pmo, 10000), 0);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    free(t1);
    tw_fx_free(fx);
}
END_TEST

/* A server without JetStream at all has no stream to keep events in: with events_stream set, events count as
 * published once the server took them (as without the key), the daemons say so in one WARN every 10 s, and
 * the relay does not publish the same events again and again. */
START_TEST(test_events_without_jetstream)
{
    TwFxStack st = tw_fx_stack_start_events(es_overrides, "evt.agent.*.task");
    char port[16];

    ck_assert(tw_fx_wait_until(wd_log_line_has, &(WdLogHas){st.pmo, "events stream " ES_STREAM " (", NULL},
                               WD_WAIT_MS));
    /* The same port, now a server without JetStream. */
    snprintf(port, sizeof port, "%d", tw_fx_nats_port(st.fx));
    tw_fx_nats_stop(st.fx);
    const char *bin = getenv("TW_NATS_SERVER");
    if (!bin)
        bin = access("/usr/sbin/nats-server", X_OK) == 0 ? "/usr/sbin/nats-server" : "/usr/bin/nats-server";
    const char *argv[] = {bin, "-a", "127.0.0.1", "-p", port, NULL};
    TwFxProc *plain = tw_fx_spawn(st.fx, "nats-plain", argv);
    ck_assert(tw_fx_wait_until(
        wd_log_line_has, &(WdLogHas){st.pmo, "events stream " ES_STREAM ": no JetStream", NULL}, WD_WAIT_MS));

    char *turns[5];
    for (int i = 0; i < 5; i++) {
        turns[i] = wd_submit(st.fx, "echo", "{\"n\":1}");
        WD_STATUS_IS(st.fx, turns[i], "done");
        ck_assert(tw_fx_events_wait(st.ev, "evt.agent.*.task", turns[i], 1, WD_WAIT_MS));
    }
    ck_assert_msg(tw_fx_sql_wait(st.fx, WD_WAIT_MS, "0",
                                 "SELECT count(*) FROM state.outbox WHERE published_at IS NULL", 0),
                  "events on a server without JetStream were never counted as published");
    /* Twelve seconds more: no relay round publishing them again, at most two WARN lines per daemon. */
    tw_fx_sleep_ms(12000);
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(tw_fx_events_count(st.ev, "evt.agent.*.task", turns[i]), 1);
        free(turns[i]);
    }
    char *log = tw_fx_proc_log(st.pmo);
    int warns = 0;
    for (const char *p = log; (p = strstr(p, "no JetStream on the server")); p++)
        warns++;
    ck_assert_msg(warns >= 1 && warns <= 3, "%d WARN lines about the missing JetStream in ~15 s", warns);
    ck_assert_msg(strstr(log, "outbox relay: publishing") == NULL, "the relay published events again");
    free(log);
    ck_assert_int_eq(tw_fx_proc_terminate(st.worker, 10000), 0);
    ck_assert_int_eq(tw_fx_proc_terminate(st.pmo, 10000), 0);
    tw_fx_proc_terminate(plain, 10000);
    tw_fx_free(st.fx);
}
END_TEST

/* ---- without a stream, --since says what to configure
 * ------------------------------------------------------ */

START_TEST(test_events_since_needs_a_stream)
{
    TwFx *fx = tw_fx_new_all();
    char *out = NULL, *err = NULL;

    int rc = tw_fx_cli(fx, &out, &err, "events", "--since", "60", NULL);
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(err, "[nats] events_stream"), "stderr: %s", err);
    free(out);
    free(err);
    rc = tw_fx_cli(fx, &out, &err, "events", "--since", "-1", NULL);
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(err, "--since"), "stderr: %s", err);
    free(out);
    free(err);

    /* A name JetStream would refuse is a configuration error, with the key and line. */
    const char *bad = tw_fx_write_config(fx, "bad.ini", "[nats]\nevents_stream = evt.agent\n");
    const char *argv[] = {tw_fx_pmo_path(), "-c", bad, "--check-config", NULL};
    rc = tw_fx_run(argv, &out, &err);
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(strstr(err, "events_stream") && strstr(err, "bad.ini:"), "stderr: %s", err);
    free(out);
    free(err);
    tw_fx_free(fx);
}
END_TEST

/* ---- tw_stream_ensure: created, left alone, amended
 * ----------------------------------------------------------- */

static jsStreamInfo *es_info(natsConnection *nc, const char *name)
{
    jsCtx *js = NULL;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;

    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    ck_assert_int_eq(js_GetStreamInfo(&si, js, name, NULL, &jerr), NATS_OK);
    jsCtx_Destroy(js);
    return si;
}

static bool es_has_subject(const jsStreamInfo *si, const char *subject)
{
    for (int i = 0; i < si->Config->SubjectsLen; i++)
        if (strcmp(si->Config->Subjects[i], subject) == 0)
            return true;
    return false;
}

START_TEST(test_stream_ensure)
{
    TwFx *fx = tw_fx_new_all();
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    jsStreamInfo *si = NULL;
    jsStreamConfig sc;
    jsErrCode jerr = 0;
    const char *other[] = {"other.>"};
    char what[64], why[512];

    ck_assert_int_eq(natsConnection_ConnectTo(&nc, tw_fx_nats_url(fx)), NATS_OK);

    /* Missing: created with our subjects and age. */
    ck_assert_msg(tw_stream_ensure(nc, "fresh", 120, 1, what, sizeof what, why, sizeof why) == 0, "%s", why);
    ck_assert_str_eq(what, "created");
    si = es_info(nc, "fresh");
    ck_assert(es_has_subject(si, TW_STREAM_SUBJECTS));
    ck_assert_int_eq(si->Config->MaxAge, 120LL * 1000000000LL);
    jsStreamInfo_Destroy(si);

    /* Already right: left alone. */
    ck_assert_msg(tw_stream_ensure(nc, "fresh", 120, 1, what, sizeof what, why, sizeof why) == 0, "%s", why);
    ck_assert_str_eq(what, "as configured");

    /* Someone else's stream: ours are added to its subjects, the age set, its own subjects kept. */
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    jsStreamConfig_Init(&sc);
    sc.Name = "theirs";
    sc.Subjects = other;
    sc.SubjectsLen = 1;
    sc.MaxAge = 60LL * 1000000000LL;
    ck_assert_int_eq(js_AddStream(NULL, js, &sc, NULL, &jerr), NATS_OK);
    /* Its subjects may not overlap another stream's: "fresh" holds ours, so it goes first. */
    ck_assert_int_eq(js_DeleteStream(js, "fresh", NULL, &jerr), NATS_OK);
    ck_assert_msg(tw_stream_ensure(nc, "theirs", 3600, 1, what, sizeof what, why, sizeof why) == 0, "%s",
                  why);
    ck_assert_str_eq(what, "updated");
    si = es_info(nc, "theirs");
    ck_assert(es_has_subject(si, TW_STREAM_SUBJECTS));
    ck_assert(es_has_subject(si, "other.>"));
    ck_assert_int_eq(si->Config->MaxAge, 3600LL * 1000000000LL);
    jsStreamInfo_Destroy(si);

    /* A second stream cannot hold the same subjects: the error says why. */
    ck_assert_int_eq(tw_stream_ensure(nc, "second", 3600, 1, what, sizeof what, why, sizeof why), -1);
    ck_assert_msg(strstr(why, "cannot create the stream"), "why: %s", why);

    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    tw_fx_free(fx);
}
END_TEST

TW_SUITE_DEFINE(events_stream, {
                                   {"replay", test_events_replayed_after_the_observer_was_away, 180},
                                   {"replay", test_events_kept_when_the_stream_was_lost, 180},
                                   {"held", test_events_held_until_the_stream_is_ready, 120},
                                   {"no_jetstream", test_events_without_jetstream, 120},
                                   {"cli", test_events_since_needs_a_stream, 60},
                                   {"ensure", test_stream_ensure, 60},
                               })
