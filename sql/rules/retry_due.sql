-- Retries (PMO): a retried turn is dispatched at its retry_at, and a turn that runs later at its not_before.

-- The PMO's rule for a pending turn that becomes ready at a time: at that time an idle agent takes it
-- (dispatch_next; a busy agent takes it when its current turn ends). Its timers: 'retry' (a retried turn's
-- retry_at: once per retry, retry_due_at is cleared) and 'not_before' (a turn submitted to run later,
-- sql/fn/later.sql: the timer is its only trace). Lock order: the agent (in dispatch_next), then the turn.
CREATE OR REPLACE FUNCTION tw.wd_retry_due(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r     record;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
    v_res jsonb;
BEGIN
    FOR r IN
        SELECT t.turn_id, t.agent, t.attempt, t.turn_epoch, t.status, x.kind, x.due_at AS retry_due_at
          FROM ((SELECT turn_id, kind, due_at FROM state.turn_timers
                  WHERE kind = 'retry' AND due_at <= now() ORDER BY due_at LIMIT p_limit)
                UNION ALL
                (SELECT turn_id, kind, due_at FROM state.turn_timers
                  WHERE kind = 'not_before' AND due_at <= now() ORDER BY due_at LIMIT p_limit)) x
          JOIN state.turns t ON t.turn_id = x.turn_id
         ORDER BY x.due_at LIMIT p_limit
    LOOP
        DELETE FROM state.turn_timers WHERE turn_id = r.turn_id AND kind = r.kind AND due_at = r.retry_due_at;
        CONTINUE WHEN NOT FOUND;      -- another PMO took it
        CONTINUE WHEN r.status <> 'pending';  -- left behind: it was dispatched meanwhile, or has ended
        v_res := tw.dispatch_next(r.agent);
        IF r.kind = 'retry' THEN
            UPDATE state.turns SET retry_due_at = NULL WHERE turn_id = r.turn_id AND retry_due_at = r.retry_due_at;
            CONTINUE WHEN NOT FOUND;
        END IF;
        v_pub := v_pub || v_res;
        v_log := v_log || jsonb_build_array(jsonb_build_object(
            'agent', r.agent, 'turn_id', r.turn_id, 'attempt', r.attempt, 'epoch', r.turn_epoch,
            'timer', r.kind, 'dispatched', jsonb_array_length(v_res) > 0, 'due', r.retry_due_at,
            'lateness_ms', tw.lateness_ms(r.retry_due_at)));
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- Due: the earliest retry_at of a retried turn still pending, or not_before of a turn that runs later
-- (turn_timers_due_idx).
CREATE OR REPLACE FUNCTION tw.due_retries()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT least((SELECT min(due_at) FROM state.turn_timers WHERE kind = 'retry'),
                 (SELECT min(due_at) FROM state.turn_timers WHERE kind = 'not_before'))
$$;
