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
        SELECT t.turn_id, t.agent, t.turn_epoch, t.status, x.due_at AS deadline_at,
               tw.turn_deadline_seconds(t) AS seconds
          FROM state.turn_timers x JOIN state.turns t ON t.turn_id = x.turn_id
         WHERE x.kind = 'deadline' AND x.due_at < now()
         ORDER BY x.due_at LIMIT p_limit
    LOOP
        IF r.status NOT IN ('pending', 'dispatched', 'running', 'suspended') THEN
            DELETE FROM state.turn_timers WHERE turn_id = r.turn_id AND kind = 'deadline' AND due_at = r.deadline_at;
            CONTINUE;  -- left behind: the turn has ended
        END IF;
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

-- Due: the earliest deadline of a turn that has not ended (turn_timers_due_idx).
CREATE OR REPLACE FUNCTION tw.due_turn_deadlines()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT min(due_at) FROM state.turn_timers WHERE kind = 'deadline'
$$;
