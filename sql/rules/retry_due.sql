-- Retries (PMO): a retried turn is dispatched at its retry_at.

-- The PMO's retry rule: at retry_at an idle agent takes its retried turn (dispatch_next; a busy agent takes it
-- when its current turn ends). Once per retry: retry_due_at is cleared. Lock order: the agent (in
-- dispatch_next), then the turn.
CREATE OR REPLACE FUNCTION tw.wd_retry_due(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r     record;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
    v_res jsonb;
BEGIN
    FOR r IN
        SELECT t.turn_id, t.agent, t.attempt, t.turn_epoch, t.status, x.due_at AS retry_due_at
          FROM state.turn_timers x JOIN state.turns t ON t.turn_id = x.turn_id
         WHERE x.kind = 'retry' AND x.due_at <= now()
         ORDER BY x.due_at LIMIT p_limit
    LOOP
        PERFORM tw.turn_places_gone('retry', ARRAY[r.turn_id], ARRAY[r.retry_due_at]);
        CONTINUE WHEN r.status <> 'pending';  -- left behind: it was dispatched meanwhile, or has ended
        v_res := tw.dispatch_next(r.agent);
        UPDATE state.turns SET retry_due_at = NULL WHERE turn_id = r.turn_id AND retry_due_at = r.retry_due_at;
        CONTINUE WHEN NOT FOUND;
        v_pub := v_pub || v_res;
        v_log := v_log || jsonb_build_array(jsonb_build_object(
            'agent', r.agent, 'turn_id', r.turn_id, 'attempt', r.attempt, 'epoch', r.turn_epoch,
            'dispatched', jsonb_array_length(v_res) > 0, 'due', r.retry_due_at,
            'lateness_ms', tw.lateness_ms(r.retry_due_at)));
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- Due: the earliest retry_at of a retried turn still pending (turn_timers_due_idx).
CREATE OR REPLACE FUNCTION tw.due_retries()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT min(due_at) FROM state.turn_timers WHERE kind = 'retry'
$$;
