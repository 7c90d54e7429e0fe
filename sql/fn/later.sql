-- Turns that run later (docs/schedules.md, "Later"): a turn given a not_before waits pending (reason "scheduled")
-- in its agent's queue, ready at that time (state.turn_queue.ready_at, as a retried turn waits for its retry_at),
-- and a 'not_before' timer of state.turn_timers has rule retry_due (sql/rules/retry_due.sql) dispatch it then.
-- The agent's other turns are not held behind it: the dispatch takes the first ready turn of the queue.

-- A not_before as the submit functions take it: any finite time (one in the past is "now"); NULL for none.
CREATE OR REPLACE FUNCTION tw.check_not_before(p_at timestamptz)
RETURNS timestamptz LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_at IS NOT NULL AND NOT isfinite(p_at) THEN
        RAISE EXCEPTION 'not_before must be a finite time, not %', p_at USING ERRCODE = '22023';
    END IF;
    RETURN p_at;
END $$;

-- When a turn's clocks start: its deadline (timeout_seconds) and its queue budget count from its not_before
-- when it has one later than its submit.
CREATE OR REPLACE FUNCTION tw.turn_start_at(t state.turns)
RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(t.created_at, t.not_before)
$$;

-- When a pending turn may be dispatched: its retry_at (a retried turn) or its not_before, whichever is later;
-- NULL: at once.
CREATE OR REPLACE FUNCTION tw.turn_ready_at(t state.turns)
RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(t.retry_at, t.not_before)
$$;

-- Why a pending turn waits, for its readers (the one definition: turn show, turn_outcome): 'waiting_limit:NAME'
-- while it waits for its profile's limits (docs/flow-control.md), 'scheduled' while its not_before is ahead,
-- 'retry' while its retry_at is; NULL otherwise (it waits for its agent, or is not pending).
CREATE OR REPLACE FUNCTION tw.pending_reason(t state.turns)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN t.status <> 'pending' THEN NULL
                WHEN t.not_before > now() AND t.not_before >= coalesce(t.retry_at, '-infinity') THEN 'scheduled'
                WHEN t.retry_at > now() THEN 'retry'
                ELSE tw.flow_turn_reason(t.turn_id)
           END
$$;
