-- Warnings (docs/timeouts.md): one event when warn_at_percent of a deadline has passed.

-- One warning, once per deadline (the key of state.turn_warnings): evt.agent.<agent>.warning with kind, the
-- deadline's length, how much of it has passed and when it falls due. Returns what to publish ([] when this
-- deadline was warned of already).
CREATE OR REPLACE FUNCTION tw.warn(t state.turns, p_kind text, p_attempt integer, p_step integer, p_call text,
                                   p_limit numeric, p_elapsed numeric, p_due timestamptz)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO state.turn_warnings (turn_id, kind, attempt, step, tool_call_id, turn_epoch, limit_seconds,
                                     elapsed_seconds, due_at)
    VALUES (t.turn_id, p_kind, p_attempt, p_step, coalesce(p_call, ''), t.turn_epoch, round(p_limit, 3),
            round(p_elapsed, 3), p_due)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN tw.emit('warning', tw.ev_subject(t.agent, 'warning'),
                   tw.ev_warning(t, p_kind, p_call, p_limit, p_elapsed, p_due), t.turn_id, t.turn_epoch);
END $$;

-- A step's warning, from the worker that runs it (the step timeout is its timer): p_fence is the step's job
-- ({"fence","id","token","turn_id","epoch","step"}); nothing when the step is no longer this worker's.
CREATE OR REPLACE FUNCTION tw.warn_step(p_fence jsonb, p_limit numeric, p_elapsed numeric)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    t state.turns;
BEGIN
    SELECT * INTO t FROM state.turns WHERE turn_id = (p_fence ->> 'turn_id')::uuid;
    IF NOT FOUND OR t.status <> 'running' OR t.turn_epoch <> (p_fence ->> 'epoch')::bigint
       OR t.step <> (p_fence ->> 'step')::integer
       OR NOT (CASE WHEN p_fence ->> 'fence' = 'ledger'
                    THEN EXISTS (SELECT 1 FROM state.turn_resume_ledger
                                  WHERE ledger_id = (p_fence ->> 'id')::bigint AND status = 'processing'
                                    AND lease_token = (p_fence ->> 'token')::bigint)
                    ELSE EXISTS (SELECT 1 FROM state.agent_inbox
                                  WHERE inbox_id = (p_fence ->> 'id')::bigint AND status = 'processing'
                                    AND claim_token = (p_fence ->> 'token')::bigint) END) THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN tw.warn(t, 'step_timeout', t.attempt, t.step, NULL, p_limit, p_elapsed,
                   now() + make_interval(secs => greatest(p_limit - p_elapsed, 0)));
END $$;
