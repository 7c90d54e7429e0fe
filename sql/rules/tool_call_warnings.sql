-- Warnings (worker): a tool call's 2.2 wait at warn_at_percent.

-- The worker's warnings: waiting tool calls at warn_at_percent of their 2.2 deadline. The waiting row is
-- locked (SKIP LOCKED), the turn only read: nothing here ever waits for a lock.
CREATE OR REPLACE FUNCTION tw.wd_tool_warnings(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    w     state.turn_waiting_tools;
    t     state.turns;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    FOR w IN
        SELECT * FROM state.turn_waiting_tools
         WHERE warn_at <= now() AND wait_status = 'waiting'
         ORDER BY warn_at LIMIT p_limit FOR UPDATE SKIP LOCKED
    LOOP
        UPDATE state.turn_waiting_tools SET warn_at = NULL
         WHERE turn_id = w.turn_id AND step = w.step AND tool_call_id = w.tool_call_id;
        SELECT * INTO t FROM state.turns WHERE turn_id = w.turn_id;
        CONTINUE WHEN t.status <> 'suspended' OR t.turn_epoch IS DISTINCT FROM w.turn_epoch;
        v_pub := v_pub || tw.warn(t, 'tool_call', t.attempt, w.step, w.tool_call_id,
                                  extract(epoch FROM w.deadline_at - w.created_at),
                                  extract(epoch FROM now() - w.created_at), w.deadline_at);
        v_log := v_log || jsonb_build_array(jsonb_build_object(
            'action', 'warning', 'kind', 'tool_call', 'turn_id', w.turn_id, 'tool_call_id', w.tool_call_id,
            'epoch', w.turn_epoch, 'due', w.warn_at, 'lateness_ms', tw.lateness_ms(w.warn_at)));
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- Due: the earliest warning time of a waiting tool call (turn_waiting_tools_warn_idx).
CREATE OR REPLACE FUNCTION tw.due_tool_warnings()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT min(warn_at) FROM state.turn_waiting_tools WHERE warn_at IS NOT NULL AND wait_status = 'waiting'
$$;
