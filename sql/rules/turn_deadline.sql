-- Turn deadlines (PMO): a turn past its submit --timeout ends turn_deadline_exceeded.

-- Turn deadlines (submit --timeout): whatever the state, past deadline_at the turn ends `timeout`.
CREATE OR REPLACE FUNCTION tw.wd_turn_deadlines(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r     record;
    v_res jsonb;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    FOR r IN
        SELECT turn_id, agent, turn_epoch, status, deadline_at, tw.turn_deadline_seconds(t) AS seconds
          FROM state.turns t
         WHERE deadline_at < now() AND status IN ('pending', 'dispatched', 'running', 'suspended')
         ORDER BY deadline_at LIMIT p_limit
    LOOP
        v_res := tw.end_turn(r.turn_id, 'turn_deadline_exceeded', 'timeout',
                     format('the turn did not end within its %s second deadline (it was %s)',
                            tw.seconds_text(r.seconds), r.status), false);
        IF v_res IS NOT NULL THEN
            v_pub := v_pub || v_res;
            v_log := v_log || jsonb_build_array(jsonb_build_object(
                'agent', r.agent, 'turn_id', r.turn_id, 'epoch', r.turn_epoch, 'status_before', r.status,
                'due', r.deadline_at, 'lateness_ms', tw.lateness_ms(r.deadline_at)));
        END IF;
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- Due: the earliest deadline of a turn that has not ended (turns_deadline_idx).
CREATE OR REPLACE FUNCTION tw.due_turn_deadlines()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT min(deadline_at) FROM state.turns
     WHERE deadline_at IS NOT NULL AND status IN ('pending', 'dispatched', 'running', 'suspended')
$$;
