/* The soak's schedule (docs/schedules.md): one run-time schedule every minute on soak0, added at set-up,
 * fired by the two PMOs through every fault. When everything is up again (the drain), the driver takes its
 * tick records (soak_ticks) and removes it in one transaction, holding the schedule's row so that no tick is
 * in flight; the checker then asks that no tick fired twice and none was lost while a PMO ran. */
#include "chaos.h"

#include <stdio.h>

static bool exec_ok(PGconn *db, const char *sql)
{
    PGresult *res = PQexec(db, sql);
    bool ok = PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK;
    if (!ok)
        fprintf(stderr, "turnwatch-soak: schedule: %s", PQerrorMessage(db));
    PQclear(res);
    return ok;
}

int chaos_schedule_start(ChaosRun *run)
{
    PGconn *db = chaos_db(run);

    if (!db)
        return fprintf(stderr, "turnwatch-soak: no database to add the schedule to\n"), -1;
    return exec_ok(db, "CREATE TABLE IF NOT EXISTS public.soak_ticks (tick_at timestamptz, turn_id uuid, "
                       "skipped text, error text, created_at timestamptz, taken_at timestamptz);"
                       "SELECT tw.add_schedule('" CHAOS_SCHEDULE "', 'soak0', '* * * * *', "
                       "p_input => '{\"kind\": \"done\"}', p_overlap => 'queue')")
               ? 0
               : -1;
}

/* True when the PMOs have fired every tick due (the schedule's next tick is ahead): a tick missed while the
 * database was away is theirs to record once it is back, not a loss to report. */
static bool caught_up(PGconn *db)
{
    PGresult *res = PQexec(db, "SELECT 1 FROM state.schedules WHERE name = '" CHAOS_SCHEDULE "'"
                               " AND next_fire_at > now()");
    bool yes = PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1;
    PQclear(res);
    return yes;
}

bool chaos_schedule_take(ChaosRun *run)
{
    PGconn *db = chaos_db(run);

    if (run->ticks_taken)
        return true;
    if (!db || !caught_up(db))
        return false;
    /* Each statement its own snapshot (read committed): the copy sees the tick the row lock waited for. */
    run->ticks_taken = exec_ok(
        db, "BEGIN;"
            "DO $$ BEGIN PERFORM 1 FROM state.schedules WHERE name = '" CHAOS_SCHEDULE "'"
            " AND next_fire_at > now() FOR UPDATE; IF NOT FOUND THEN RAISE EXCEPTION 'a tick is due';"
            " END IF; END $$;"
            "INSERT INTO public.soak_ticks SELECT k.tick_at, k.turn_id, k.skipped, k.error, s.created_at, "
            "now() FROM state.schedule_ticks k JOIN state.schedules s ON s.name = k.schedule "
            "WHERE k.schedule = '" CHAOS_SCHEDULE "';"
            "SELECT tw.remove_schedule('" CHAOS_SCHEDULE "');"
            "COMMIT");
    if (!run->ticks_taken)
        exec_ok(db, "ROLLBACK");
    else
        chaos_note(run, "schedule " CHAOS_SCHEDULE " removed, its ticks taken");
    return run->ticks_taken;
}
