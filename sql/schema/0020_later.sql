-- Turns that run later (docs/schedules.md, "Later"): a turn submitted with a not_before waits pending (reason
-- "scheduled") in its agent's queue with ready_at = not_before, and a 'not_before' timer has rule retry_due
-- dispatch it then; its deadline and queue budget count from then.
ALTER TABLE state.turns ADD COLUMN IF NOT EXISTS not_before timestamptz;   -- NULL: as soon as its agent is free

ALTER TABLE state.turn_timers DROP CONSTRAINT IF EXISTS turn_timers_kind_check;
ALTER TABLE state.turn_timers ADD CONSTRAINT turn_timers_kind_check
    CHECK (kind IN ('deadline', 'deadline_warn', 'queue', 'queue_warn', 'retry', 'not_before'));
