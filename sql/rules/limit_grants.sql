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
BEGIN
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

-- Due: the earliest next_grant_at (limits_next_grant_idx).
CREATE OR REPLACE FUNCTION tw.due_limit_grants()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT min(next_grant_at) FROM state.limits WHERE next_grant_at IS NOT NULL
$$;
