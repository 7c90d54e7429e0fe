/* test_schedules.c — issue 37, recurring schedules (docs/schedules.md) against a real PostgreSQL,
 * nats-server, turnwatch-pmo and turnwatch-worker: every tick fires exactly one turn with two PMOs racing for
 * it, at its time and not at the sweep; overlap skip records a skipped tick while the last turn is going and
 * cancel_previous cancels it; ticks missed while no PMO ran are caught up as catchup none, last and all say;
 * a removed schedule fires no more; the INI's schedules are applied at start and on reload (a cron changed
 * takes effect, a section removed is a schedule removed, an INI name refused at run time); every tick is
 * published as evt.schedule.<name>.tick. Only what the stubbed cron engine handles is used (every minute, M *
 * * * *). Two tests wait for a minute boundary; the catch-up ones put next_fire_at in the past instead of
 * waiting. */
#include "fixture.h"
#include "suite.h"
#include "turn_helpers.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

/* A boundary is at most a minute away; the daemons and the machine may be slow. */
#define SC_BOUNDARY_MS 120000
#define SC_WAIT_MS 30000

/* Wait until the database clock is between :05 and :40 of its minute, so that a test which puts ticks in the
 * past knows which minute its "now" is in while the PMO catches up (at most ~25 s). */
static void sc_mid_minute(TwFx *fx)
{
    ck_assert(
        tw_fx_sql_wait(fx, 70000, "t", "SELECT extract(second FROM clock_timestamp()) BETWEEN 5 AND 40", 0));
}

/* Put a schedule's next tick `minutes` minutes before the current minute (as if no PMO had run since), and
 * ring tw_due as a change of a schedule does. */
static void sc_behind(TwFx *fx, const char *name, const char *minutes)
{
    tw_fx_sql_exec(fx,
                   "WITH u AS (UPDATE state.schedules SET next_fire_at = date_trunc('minute', now())"
                   "            - make_interval(mins => $2::int) WHERE name = $1 RETURNING 1)"
                   " SELECT pg_notify('tw_due', 'schedule_ticks') FROM u",
                   2, name, minutes);
}

static int64_t sc_count(TwFx *fx, const char *sql, const char *name)
{
    return tw_fx_sql_int(fx, sql, 1, name);
}

/* Ticks of schedule $1 that fired, skipped for a reason, and its turns (by its channel). */
#define SC_FIRED "SELECT count(*) FROM state.schedule_ticks WHERE schedule = $1 AND turn_id IS NOT NULL"
#define SC_OVERLAP "SELECT count(*) FROM state.schedule_ticks WHERE schedule = $1 AND skipped = 'overlap'"
#define SC_CATCHUP "SELECT count(*) FROM state.schedule_ticks WHERE schedule = $1 AND skipped = 'catchup'"
#define SC_TURNS "SELECT count(*) FROM state.turns WHERE channel_id = 'schedule:' || $1"

/* A statement that must fail with SQLSTATE 22023: true when it did. */
static bool sc_refused(TwFx *fx, const char *call)
{
    char *sql = wd_fmt("DO $$ BEGIN PERFORM %s; RAISE EXCEPTION 'accepted' USING ERRCODE = 'P0001';"
                       " EXCEPTION WHEN invalid_parameter_value THEN NULL; END $$",
                       call);
    bool ok = tw_fx_sql_try(fx, NULL, sql, 0);
    free(sql);
    return ok;
}

/* Two PMOs, 20 schedules every minute, one of them removed before its tick, one five minutes behind with
 * catchup all: at the boundary each tick fires exactly one turn (its idempotency key names the tick), within
 * 20 s of its time although the sweep is 300 s, and is published on NATS. */
START_TEST(test_two_pmos_once_per_tick)
{
    TwFxStack st = tw_fx_stack_start("[pmo]\nwatchdog_interval_seconds = 300\n");
    TwFx *fx = st.fx;
    TwFxProc *pmo2 = tw_fx_start_pmo(fx, NULL);

    ck_assert(tw_fx_sql_wait_count(
        fx, "SELECT count(*) FROM state.daemons WHERE kind = 'pmo' AND gone_at IS NULL", 2, SC_WAIT_MS));
    sc_mid_minute(fx);
    tw_fx_sql_exec(fx,
                   "SELECT tw.add_schedule('every' || i, 'echo', '* * * * *', p_overlap => 'queue')"
                   "  FROM generate_series(1, 20) i",
                   0);
    tw_fx_sql_exec(fx, "SELECT tw.add_schedule('gone', 'echo', '* * * * *')", 0);
    ck_assert_str_eq(tw_fx_keep(fx, tw_fx_sql_str(fx, "SELECT tw.remove_schedule('gone')", 0)), "t");
    tw_fx_sql_exec(
        fx, "SELECT tw.add_schedule('behind', 'echo', '* * * * *', p_overlap => 'queue', p_catchup => 'all')",
        0);
    sc_behind(fx, "behind", "5");

    /* The boundary: every schedule ticks once. */
    if (!tw_fx_sql_wait_count(
            fx, "SELECT count(DISTINCT schedule) FROM state.schedule_ticks WHERE schedule LIKE 'every%'", 20,
            SC_BOUNDARY_MS)) {
        tw_fx_stack_dump(&st);
        ck_abort_msg("the 20 schedules did not all tick at the minute boundary");
    }
    /* Both PMOs had their chance at every tick (a second fire would have come with the first). */
    ck_assert(tw_fx_proc_alive(st.pmo));
    ck_assert(tw_fx_proc_alive(pmo2));
    ck_assert(tw_fx_sql_wait_count(fx, "SELECT count(*) FROM state.schedule_ticks WHERE schedule = 'behind'",
                                   7, SC_WAIT_MS));

    /* Exactly one turn per tick, named by its key, and no turn without a tick. */
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.schedule_ticks WHERE turn_id IS NULL", 0),
                     0);
    int64_t ticks = tw_fx_sql_int(fx, "SELECT count(*) FROM state.schedule_ticks", 0);
    ck_assert_int_ge(ticks, 27);
    ck_assert_int_eq(
        tw_fx_sql_int(
            fx,
            "SELECT count(*) FROM state.schedule_ticks k JOIN state.turns t"
            "    ON t.turn_id = k.turn_id AND t.idempotency_key = 'schedule:' || k.schedule"
            "       || ':' || to_char(k.tick_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"
            "   AND t.channel_id = 'schedule:' || k.schedule",
            0),
        ticks);
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns WHERE idempotency_key LIKE 'schedule:%'", 0),
        ticks);
    for (int i = 1; i <= 20; i++) {
        char name[16];
        snprintf(name, sizeof name, "every%d", i);
        ck_assert_int_eq(sc_count(fx, SC_TURNS, name), sc_count(fx, SC_FIRED, name));
    }
    /* On a minute, and fired at it: not at the 300 s sweep. */
    ck_assert_int_eq(
        tw_fx_sql_int(fx,
                      "SELECT count(*) FROM state.schedule_ticks k JOIN state.turns t USING (turn_id)"
                      " WHERE k.schedule LIKE 'every%' AND (k.tick_at <> date_trunc('minute', k.tick_at)"
                      "       OR t.created_at < k.tick_at OR t.created_at > k.tick_at + interval '20 s')",
                      0),
        0);
    /* The one behind fired each missed tick (catchup all, within the hour) and the one on time. */
    ck_assert_int_eq(sc_count(fx, SC_TURNS, "behind"), sc_count(fx, SC_FIRED, "behind"));
    ck_assert_int_ge(sc_count(fx, SC_FIRED, "behind"), 7);
    /* The removed one fired nothing. */
    ck_assert_int_eq(sc_count(fx, "SELECT count(*) FROM state.turns WHERE channel_id = $1", "schedule:gone"),
                     0);

    /* The tick event, from the outbox. */
    if (!tw_fx_events_wait(st.ev, "evt.schedule.every1.tick", "turn_id", 1, SC_WAIT_MS)) {
        tw_fx_stack_dump(&st);
        ck_abort_msg("no evt.schedule.every1.tick");
    }
    json_t *e = tw_fx_events_get(st.ev, "evt.schedule.every1.tick", "turn_id", 0, NULL, NULL);
    ck_assert_ptr_nonnull(e);
    ck_assert_str_eq(json_string_value(json_object_get(e, "schedule")), "every1");
    ck_assert_ptr_nonnull(json_string_value(json_object_get(e, "event_id")));
    ck_assert_ptr_nonnull(json_string_value(json_object_get(e, "at")));
    ck_assert_ptr_null(json_object_get(e, "skipped"));
    char *want =
        tw_fx_sql_str(fx, "SELECT turn_id::text FROM state.schedule_ticks WHERE schedule = 'every1'", 0);
    ck_assert_str_eq(json_string_value(json_object_get(e, "turn_id")), want);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.schedule_ticks WHERE schedule = 'every1'"
                                   " AND tick_at = $1::timestamptz",
                                   1, json_string_value(json_object_get(e, "tick_at"))),
                     1);
    ck_assert_uint_eq(tw_fx_events_count(st.ev, "evt.schedule.every1.tick", NULL), 1);
    free(want);
    json_decref(e);
    tw_fx_free(fx);
}
END_TEST

/* No PMO ran over some ticks; then one starts (no worker: the turns never end). overlap skip: the first
 * caught-up tick fires, the next ones are skipped "overlap"; cancel_previous: each tick cancels the turn
 * before; catchup none: the missed ticks are skipped "catchup" and the one on time fires; catchup last: only
 * the latest missed one fires, with the one on time. */
START_TEST(test_overlap_and_catchup)
{
    /* The turns stay dispatched while the PMO catches up (no 2.5 reap in between). */
    TwFx *fx = tw_fx_new_migrated("[pmo]\ndispatched_timeout_seconds = 600\n");
    TwFxEvents *ev = tw_fx_events_new(fx, "evt.schedule.>");

    sc_mid_minute(fx);
    tw_fx_sql_exec(
        fx, "SELECT tw.add_schedule('ov', 'echo', '* * * * *', p_overlap => 'skip', p_catchup => 'all')", 0);
    tw_fx_sql_exec(fx,
                   "SELECT tw.add_schedule('cp', 'echo', '* * * * *', p_overlap => 'cancel_previous',"
                   "                       p_catchup => 'all')",
                   0);
    tw_fx_sql_exec(
        fx, "SELECT tw.add_schedule('cnone', 'echo', '* * * * *', p_overlap => 'queue', p_catchup => 'none')",
        0);
    tw_fx_sql_exec(
        fx, "SELECT tw.add_schedule('clast', 'echo', '* * * * *', p_overlap => 'queue', p_catchup => 'last')",
        0);
    sc_behind(fx, "ov", "2");
    sc_behind(fx, "cp", "2");
    sc_behind(fx, "cnone", "3");
    sc_behind(fx, "clast", "3");

    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    if (!tw_fx_sql_wait_count(fx, "SELECT count(*) FROM state.schedules WHERE next_fire_at > now()", 4,
                              SC_WAIT_MS)) {
        tw_fx_proc_dump(pmo);
        ck_abort_msg("the PMO did not catch up");
    }
    /* overlap skip: m-2 fires; m-1 and m find its turn going. */
    ck_assert_int_eq(sc_count(fx, SC_FIRED, "ov"), 1);
    ck_assert_int_eq(sc_count(fx, SC_OVERLAP, "ov"), 2);
    ck_assert_int_eq(sc_count(fx, SC_TURNS, "ov"), 1);
    ck_assert_int_eq(
        sc_count(fx,
                 "SELECT count(*) FROM state.schedule_ticks WHERE schedule = $1 AND turn_id IS NOT NULL"
                 "   AND tick_at = date_trunc('minute', now()) - interval '2 minutes'",
                 "ov"),
        1);
    /* cancel_previous: three turns, the first two cancelled by the next tick. */
    ck_assert_int_eq(sc_count(fx, SC_FIRED, "cp"), 3);
    ck_assert_int_eq(sc_count(fx, SC_TURNS, "cp"), 3);
    ck_assert_int_eq(sc_count(fx,
                              "SELECT count(*) FROM state.turns WHERE channel_id = 'schedule:' || $1"
                              "   AND status = 'cancelled'",
                              "cp"),
                     2);
    /* catchup none: m-3, m-2, m-1 skipped; m fires. */
    ck_assert_int_eq(sc_count(fx, SC_CATCHUP, "cnone"), 3);
    ck_assert_int_eq(sc_count(fx, SC_FIRED, "cnone"), 1);
    ck_assert_int_eq(
        sc_count(fx,
                 "SELECT count(*) FROM state.schedule_ticks WHERE schedule = $1 AND turn_id IS NOT NULL"
                 "   AND tick_at = date_trunc('minute', now())",
                 "cnone"),
        1);
    /* catchup last: m-3, m-2 skipped; m-1 (the latest missed) and m fire. */
    ck_assert_int_eq(sc_count(fx, SC_CATCHUP, "clast"), 2);
    ck_assert_int_eq(sc_count(fx, SC_FIRED, "clast"), 2);
    ck_assert_int_eq(sc_count(fx, SC_TURNS, "clast"), 2);
    ck_assert_int_eq(
        sc_count(fx,
                 "SELECT count(*) FROM state.schedule_ticks WHERE schedule = $1 AND turn_id IS NOT NULL"
                 "   AND tick_at >= date_trunc('minute', now()) - interval '1 minute'",
                 "clast"),
        2);
    /* Every tick published, skipped ones with why. */
    if (!tw_fx_events_wait(ev, "evt.schedule.ov.tick", "\"skipped\": \"overlap\"", 2, SC_WAIT_MS) ||
        !tw_fx_events_wait(ev, "evt.schedule.cnone.tick", "\"skipped\": \"catchup\"", 3, SC_WAIT_MS) ||
        !tw_fx_events_wait(ev, "evt.schedule.clast.tick", NULL, 4, SC_WAIT_MS)) {
        tw_fx_events_dump(ev);
        tw_fx_proc_dump(pmo);
        ck_abort_msg("the tick events did not all come");
    }
    /* What `schedules show` reads. */
    char *show = tw_fx_sql_str(fx, "SELECT tw.schedule_show('ov')", 0);
    json_t *doc = json_loads(show, 0, NULL);
    ck_assert_ptr_nonnull(doc);
    ck_assert_uint_eq(json_array_size(json_object_get(doc, "next_fires")), 5);
    ck_assert_uint_eq(json_array_size(json_object_get(doc, "last_turns")), 1);
    ck_assert_uint_eq(json_array_size(json_object_get(doc, "skipped")), 2);
    json_decref(doc);
    free(show);
    tw_fx_free(fx);
}
END_TEST

/* The INI's schedules: written by the PMO at start, the file's own (refused at run time); a reload that
 * changes a cron makes it fire at the new time, and a section removed is a schedule removed; a run-time
 * schedule stays. */
START_TEST(test_ini_and_reload)
{
    TwFx *fx = tw_fx_new_migrated("[schedule.hourly]\nagent = echo\ncron = 0 * * * *\n"
                                  "[schedule.dropme]\nagent = echo\ncron = */5 * * * *\n");
    TwFxProc *pmo = tw_fx_start_pmo(fx, NULL);
    TwFxProc *worker = tw_fx_start_worker(fx, NULL);

    if (!tw_fx_sql_wait_count(fx, "SELECT count(*) FROM state.schedules WHERE owner = 'ini'", 2,
                              SC_WAIT_MS)) {
        tw_fx_proc_dump(pmo);
        ck_abort_msg("the PMO did not write the INI's schedules");
    }
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.schedules WHERE name = 'hourly'"
                                   "   AND next_fire_at = date_trunc('hour', updated_at) + interval '1 hour'",
                                   0),
                     1);
    ck_assert(sc_refused(fx, "tw.add_schedule('hourly', 'echo', '* * * * *')"));
    ck_assert(sc_refused(fx, "tw.remove_schedule('hourly')"));
    tw_fx_sql_exec(fx, "SELECT tw.add_schedule('runtime', 'echo', '0 * * * *')", 0);

    tw_fx_write_config(fx, NULL, "[schedule.hourly]\nagent = echo\ncron = * * * * *\n");
    ck_assert(tw_fx_proc_signal(pmo, SIGHUP));
    if (!tw_fx_sql_wait_count(
            fx,
            "SELECT count(*) FROM state.schedules WHERE name = 'hourly' AND cron = '* * * * *'"
            "   AND next_fire_at <= date_trunc('minute', now()) + interval '1 minute'",
            1, SC_WAIT_MS)) {
        tw_fx_proc_dump(pmo);
        ck_abort_msg("the reload did not change the cron");
    }
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.schedules WHERE name = 'dropme'", 0), 0);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.schedules WHERE name = 'runtime'", 0), 1);
    /* It fires at the next minute, and its turn runs. */
    if (!tw_fx_sql_wait(fx, SC_BOUNDARY_MS, "done",
                        "SELECT t.status FROM state.schedule_ticks k JOIN state.turns t USING (turn_id)"
                        " WHERE k.schedule = 'hourly'",
                        0)) {
        tw_fx_proc_dump(pmo);
        tw_fx_proc_dump(worker);
        ck_abort_msg("the reloaded schedule did not fire at the minute");
    }
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.schedule_ticks WHERE schedule = 'hourly'"
                                   "   AND tick_at = date_trunc('minute', tick_at)",
                                   0),
                     1);
    tw_fx_free(fx);
}
END_TEST

/* The SQL API refuses what is wrong with 22023 and a clear message; --check-config the same in the INI. */
/* Runs of the rule over a batch (no daemons: tw.wd_schedule_ticks called as the PMO calls it): 30 schedules
 * due at once fire 30 turns in one set-based submit, each with its tick's idempotency key, its channel and
 * its schedule's last_turn_id. The same ticks again (as a second PMO that read them before the first
 * committed would), now with a schedule whose agent was retired in the batch: that tick is recorded as an
 * error (the batch goes tick by tick then), the keys of the others name the turns made, and nothing new is
 * made. */
START_TEST(test_batch_of_ticks)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    const char *made = "SELECT count(*) FROM state.schedule_ticks k JOIN state.turns t USING (turn_id)"
                       " JOIN state.schedules s ON s.name = k.schedule"
                       " WHERE t.idempotency_key = 'schedule:' || k.schedule || ':'"
                       "       || to_char(k.tick_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"
                       "   AND t.channel_id = 'schedule:' || k.schedule AND t.agent = 'echo'"
                       "   AND s.last_turn_id = t.turn_id AND k.skipped IS NULL";

    tw_fx_sql_exec(fx, "SELECT tw.add_agent('echo', 'echo')", 0); /* in the roster: the set-based path */
    tw_fx_sql_exec(fx,
                   "SELECT count(tw.add_schedule('b' || i, 'echo', '* * * * *', p_overlap => 'queue'))"
                   "  FROM generate_series(1, 30) i",
                   0);
    tw_fx_sql_exec(fx, "UPDATE state.schedules SET next_fire_at = date_trunc('minute', now())", 0);
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT jsonb_array_length(tw.wd_schedule_ticks(500) -> 'actions')", 0), 30);
    ck_assert_int_eq(tw_fx_sql_int(fx, made, 0), 30);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns", 0), 30);

    tw_fx_sql_exec(fx, "SELECT tw.add_agent('gone', 'echo')", 0);
    tw_fx_sql_exec(fx, "SELECT tw.add_schedule('lost', 'gone', '* * * * *')", 0);
    tw_fx_sql_exec(fx, "SELECT tw.retire_agent('gone')", 0);
    tw_fx_sql_exec(fx, "DELETE FROM state.schedule_ticks", 0);
    tw_fx_sql_exec(fx, "UPDATE state.schedules SET next_fire_at = date_trunc('minute', now())", 0);
    ck_assert_int_eq(
        tw_fx_sql_int(fx, "SELECT jsonb_array_length(tw.wd_schedule_ticks(500) -> 'actions')", 0), 31);
    ck_assert_int_eq(tw_fx_sql_int(fx, made, 0), 30);
    ck_assert_int_eq(tw_fx_sql_int(fx,
                                   "SELECT count(*) FROM state.schedule_ticks WHERE schedule = 'lost'"
                                   " AND turn_id IS NULL AND skipped = 'error' AND error LIKE '%retired%'",
                                   0),
                     1);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.turns", 0), 30);
    tw_fx_free(fx);
}
END_TEST

START_TEST(test_refusals)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    char *err = NULL;

    ck_assert(sc_refused(fx, "tw.add_schedule('s', 'echo', 'every minute')"));
    ck_assert(sc_refused(fx, "tw.add_schedule('s', 'echo', '* * * * *', 'Mars/Olympus_Mons')"));
    ck_assert(sc_refused(fx, "tw.add_schedule('bad/name', 'echo', '* * * * *')"));
    ck_assert(sc_refused(fx, "tw.add_schedule('s', 'bad agent', '* * * * *')"));
    ck_assert(sc_refused(fx, "tw.add_schedule('s', 'echo', '* * * * *', p_input => '[1]')"));
    ck_assert(sc_refused(fx, "tw.add_schedule('s', 'echo', '* * * * *', p_overlap => 'sometimes')"));
    ck_assert(sc_refused(fx, "tw.add_schedule('s', 'echo', '* * * * *', p_catchup => 'some')"));
    ck_assert(sc_refused(fx, "tw.add_schedule('s', 'echo', '* * * * *', p_timeout_seconds => 0)"));
    ck_assert(
        !tw_fx_sql_try(fx, &err, "SELECT tw.add_schedule('s', 'echo', '* * * * *', 'Mars/Olympus_Mons')", 0));
    ck_assert_msg(err && strstr(err, "time zone"), "%s", err ? err : "");
    free(err);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.schedules", 0), 0);
    /* A good one: its document, in the list; removed, gone. */
    char *doc = tw_fx_sql_str(fx, "SELECT tw.add_schedule('s', 'echo', '7 * * * *') ->> 'owner'", 0);
    ck_assert_str_eq(doc, "sql");
    free(doc);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT jsonb_array_length(tw.schedules_list())", 0), 1);
    ck_assert_int_eq(
        tw_fx_sql_int(
            fx, "SELECT extract(minute FROM (tw.schedule_show('s') ->> 'next_fire_at')::timestamptz)", 0),
        7);
    ck_assert_str_eq(tw_fx_keep(fx, tw_fx_sql_str(fx, "SELECT tw.remove_schedule('s')", 0)), "t");
    ck_assert_str_eq(tw_fx_keep(fx, tw_fx_sql_str(fx, "SELECT tw.remove_schedule('s')", 0)), "f");
    tw_fx_free(fx);

    TwConfig cfg;
    ck_assert_int_eq(
        tw_config_load_string(&cfg, "s.ini",
                              "[schedule.a]\nagent = echo\ncron = every minute\n"
                              "[schedule.b]\nagent = echo\ncron = * * * * *\ntimezone = Mars/Olympus\n"
                              "[schedule.c]\ncron = * * * * *\ninput = [1]\n"),
        -1);
    ck_assert_msg(strstr(cfg.errors, "s.ini:3: [schedule.a] cron: "), "%s", cfg.errors);
    ck_assert_msg(strstr(cfg.errors, "s.ini:7: [schedule.b] timezone: "), "%s", cfg.errors);
    ck_assert_msg(strstr(cfg.errors, "[schedule.c] agent: required"), "%s", cfg.errors);
    ck_assert_msg(strstr(cfg.errors, "s.ini:10: [schedule.c] input: must be a JSON object"), "%s",
                  cfg.errors);
    tw_config_free(&cfg);
}
END_TEST

/* The CLI: schedules add, list, show and remove, each with --json; a bad cron exits 2 with the engine's
 * message. */
START_TEST(test_cli)
{
    TwFx *fx = tw_fx_new_migrated(NULL);
    char *out = NULL, *err = NULL;
    json_t *doc;

    ck_assert_int_eq(tw_fx_cli(fx, &out, &err, "schedules", "add", "nightly", "--agent", "echo", "--cron",
                               "30 * * * *", "--input", "{\"x\":1}", "--overlap", "queue", "--catchup", "all",
                               "--timeout", "60", "--json", NULL),
                     0);
    ck_assert_ptr_nonnull(doc = json_loads(out, 0, NULL));
    ck_assert_str_eq(json_string_value(json_object_get(doc, "cron")), "30 * * * *");
    ck_assert_str_eq(json_string_value(json_object_get(doc, "overlap")), "queue");
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "timeout_seconds")), 60);
    ck_assert_uint_eq(json_array_size(json_object_get(doc, "next_fires")), 5);
    ck_assert_msg(strstr(json_string_value(json_array_get(json_object_get(doc, "next_fires"), 0)), ":30:00Z"),
                  "%s", out);
    json_decref(doc);
    free(out);
    free(err);
    ck_assert_int_eq(tw_fx_cli(fx, &out, &err, "schedules", "list", "--json", NULL), 0);
    ck_assert_ptr_nonnull(doc = json_loads(out, 0, NULL));
    ck_assert_uint_eq(json_array_size(doc), 1);
    json_decref(doc);
    free(out);
    free(err);
    ck_assert_int_eq(tw_fx_cli(fx, &out, &err, "schedules", "show", "nightly", NULL), 0);
    ck_assert_msg(strstr(out, "next fires (UTC):") && strstr(out, "nightly"), "%s", out);
    free(out);
    free(err);
    ck_assert_int_eq(
        tw_fx_cli(fx, &out, &err, "schedules", "add", "bad", "--agent", "echo", "--cron", "soon", NULL), 2);
    ck_assert_msg(err && strstr(err, "cron"), "%s", err ? err : "");
    free(out);
    free(err);
    ck_assert_int_eq(tw_fx_cli(fx, &out, &err, "schedules", "remove", "nightly", "--json", NULL), 0);
    ck_assert_msg(strstr(out, "\"removed\": true") || strstr(out, "\"removed\":true"), "%s", out);
    free(out);
    free(err);
    ck_assert_int_eq(tw_fx_sql_int(fx, "SELECT count(*) FROM state.schedules", 0), 0);
    tw_fx_free(fx);
}
END_TEST

TW_SUITE_DEFINE(schedules, {
                               {"refusals", test_refusals, 60},
                               {"batch of ticks", test_batch_of_ticks, 60},
                               {"cli", test_cli, 60},
                               {"overlap and catch-up", test_overlap_and_catchup, 180},
                               {"two PMOs", test_two_pmos_once_per_tick, 300},
                               {"INI and reload", test_ini_and_reload, 300},
                           })
