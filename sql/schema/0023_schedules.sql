-- Recurring schedules (docs/schedules.md): turns submitted on a calendar, exactly once per tick whatever the
-- number of PMOs. The functions are in sql/fn/schedules.sql; the ticks are fired by the PMO's rule
-- schedule_ticks (sql/rules/schedule_ticks.sql) at the earliest next_fire_at.

-- The schedules: from the INI ([schedule.NAME], owner 'ini', written by the PMOs at start and reload) or added at
-- run time (tw.add_schedule, owner 'sql'). A name in the INI belongs to the INI.
CREATE TABLE IF NOT EXISTS state.schedules (
    name                   state.name PRIMARY KEY,
    agent                  state.name NOT NULL,
    profile                state.name,
    cron                   text NOT NULL,
    timezone               text NOT NULL DEFAULT 'UTC',
    channel                text,
    input                  jsonb NOT NULL DEFAULT '{}',
    timeout_seconds        integer CHECK (timeout_seconds > 0),
    limit_key              text,
    overlap                text NOT NULL DEFAULT 'skip' CHECK (overlap IN ('skip', 'queue', 'cancel_previous')),
    catchup                text NOT NULL DEFAULT 'last' CHECK (catchup IN ('none', 'last', 'all')),
    catchup_window_seconds integer NOT NULL DEFAULT 3600 CHECK (catchup_window_seconds >= 0),
    owner                  text NOT NULL DEFAULT 'sql' CHECK (owner IN ('ini', 'sql')),
    next_fire_at           timestamptz,     -- the next tick; the rule fires it, then moves it on (compare-and-set)
    last_turn_id           uuid,            -- the turn of the last tick that fired (overlap)
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS schedules_next_fire_idx ON state.schedules (next_fire_at) WHERE next_fire_at IS NOT NULL;

-- Every tick, fired or skipped: its primary key makes a tick once-only. A fired tick names its turn; a skipped
-- one says why (overlap: the last turn had not ended; catchup: missed while no PMO ran and not caught up;
-- error: the turn could not be submitted, the message in error).
CREATE TABLE IF NOT EXISTS state.schedule_ticks (
    schedule state.name NOT NULL REFERENCES state.schedules (name) ON DELETE CASCADE,
    tick_at  timestamptz NOT NULL,
    turn_id  uuid,
    skipped  text CHECK (skipped IN ('overlap', 'catchup', 'error')),
    error    text,
    at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, tick_at),
    CHECK ((turn_id IS NULL) <> (skipped IS NULL))
);

-- The tick event goes through the outbox like the others.
ALTER DOMAIN state.event_kind DROP CONSTRAINT IF EXISTS event_kind_check;
ALTER DOMAIN state.event_kind ADD CONSTRAINT event_kind_check
    CHECK (VALUE IN ('state', 'task', 'retry', 'warning', 'schedule_tick'));
