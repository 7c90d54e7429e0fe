-- Flow control (PMO): a waiter that waits for a token or for the end of a pause is granted then.

-- The limits whose next_grant_at has come (limits_next_grant_idx), each in a row lock taken without waiting (a
-- limit another transaction holds grants its own waiters when it ends): next_grant_at is cleared and
-- tw.flow_grant runs for them, which sets it again for a waiter that must wait longer.
CREATE OR REPLACE FUNCTION tw.wd_limit_grants(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r     record;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
    v_res jsonb;
    t     state.turns;
BEGIN
    -- Turns that waited for their limits past their max_wait_seconds end timeout/limit_timeout (their own
    -- rows first, as any end of a turn: the parent's, then the turn's, without waiting; the end gives back).
    FOR r IN
        SELECT w.turn_id, w.due FROM tw.flow_turn_waits() w WHERE w.due <= now() ORDER BY w.due LIMIT p_limit
    LOOP
        CONTINUE WHEN NOT tw.lock_parent(r.turn_id, false);
        SELECT * INTO t FROM state.turns WHERE turn_id = r.turn_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND OR NOT EXISTS (SELECT 1 FROM state.limit_calls c WHERE c.turn_id = t.turn_id
                                                  AND c.step = -1 AND c.tool_call_id = '' AND c.status = 'waiting');
        v_res := tw.force_finish(t.turn_id, 'limit_timeout', 'timeout',
                                 format('the turn waited %s s for its limits (%s), longer than max_wait_seconds',
                                        round(extract(epoch FROM now() - (SELECT c.since FROM state.limit_calls c
                                                                            WHERE c.turn_id = t.turn_id AND c.step = -1
                                                                              AND c.tool_call_id = ''))),
                                        tw.flow_turn_reason(t.turn_id)));
        CONTINUE WHEN v_res IS NULL;
        v_pub := v_pub || v_res;
        v_log := v_log || jsonb_build_array(jsonb_build_object(
            'action', 'limit_timeout', 'turn_id', t.turn_id, 'agent', t.agent, 'due', r.due,
            'lateness_ms', tw.lateness_ms(r.due)));
    END LOOP;
    FOR r IN
        SELECT name, next_grant_at AS due FROM state.limits
         WHERE next_grant_at <= now() ORDER BY name LIMIT p_limit FOR UPDATE SKIP LOCKED
    LOOP
        UPDATE state.limits SET next_grant_at = NULL WHERE name = r.name;
        v_res := tw.flow_grant(ARRAY[r.name::text]);
        v_pub := v_pub || v_res;
        v_log := v_log || jsonb_build_array(jsonb_build_object(
            'action', 'limit_grant', 'limit', r.name, 'granted', jsonb_array_length(v_res) > 0, 'due', r.due,
            'lateness_ms', tw.lateness_ms(r.due)));
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- The turns waiting for their limits (sql/fn/turn_limits.sql) that have a max_wait_seconds, and when it ends.
CREATE OR REPLACE FUNCTION tw.flow_turn_waits()
RETURNS TABLE (turn_id uuid, due timestamptz) LANGUAGE sql STABLE AS $$
    SELECT c.turn_id, c.since + make_interval(secs => m.w)
      FROM state.limit_calls c
     CROSS JOIN LATERAL (SELECT min(l.max_wait_seconds) FILTER (WHERE l.max_wait_seconds > 0) AS w
                           FROM state.limits l WHERE l.name = ANY (c.limits)) m
     WHERE c.status = 'waiting' AND c.agent IS NOT NULL AND m.w IS NOT NULL
$$;

-- Due: the earliest next_grant_at (limits_next_grant_idx), or the end of a waiting turn's max wait.
CREATE OR REPLACE FUNCTION tw.due_limit_grants()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT least((SELECT min(next_grant_at) FROM state.limits WHERE next_grant_at IS NOT NULL),
                 (SELECT min(due) FROM tw.flow_turn_waits()))
$$;
