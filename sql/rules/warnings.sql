-- Warnings (PMO): turn deadlines and queue budgets at warn_at_percent.

-- The PMO's warnings: turn deadlines (--timeout) and queue budgets at warn_at_percent. The turn row alone is
-- locked (never the agent after it), and its warning time cleared: once each.
CREATE OR REPLACE FUNCTION tw.wd_pmo_warnings(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r     record;
    t     state.turns;
    v_due timestamptz;
    v_res jsonb;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    FOR r IN
        (SELECT turn_id, 'turn_deadline' AS kind, due_at AS warn_at FROM state.turn_timers
          WHERE kind = 'deadline_warn' AND due_at <= now() ORDER BY due_at LIMIT p_limit)
        UNION ALL
        (SELECT turn_id, 'queue', due_at FROM state.turn_timers
          WHERE kind = 'queue_warn' AND due_at <= now() ORDER BY due_at LIMIT p_limit)
    LOOP
        SELECT * INTO t FROM state.turns WHERE turn_id = r.turn_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        -- Once each, whatever comes of it: a warning that cannot be given any more (the turn moved on) is gone.
        PERFORM tw.turn_places_gone(CASE r.kind WHEN 'queue' THEN 'queue_warn' ELSE 'deadline_warn' END,
                                    ARRAY[r.turn_id], ARRAY[r.warn_at]);
        IF r.kind = 'turn_deadline' THEN
            CONTINUE WHEN t.deadline_warn_at IS NULL OR t.deadline_warn_at > now()
                       OR t.status NOT IN ('pending', 'dispatched', 'running', 'suspended');
            v_due := t.deadline_warn_at;
            UPDATE state.turns SET deadline_warn_at = NULL WHERE turn_id = t.turn_id;
            -- Once per turn (its deadline spans every attempt): attempt 0 in the key.
            v_res := tw.warn(t, 'turn_deadline', 0, -1, NULL, tw.turn_deadline_seconds(t),
                             extract(epoch FROM now() - t.created_at), t.deadline_at);
        ELSE
            CONTINUE WHEN t.queue_warn_at IS NULL OR t.queue_warn_at > now()
                       OR t.status NOT IN ('pending', 'dispatched');
            v_due := t.queue_warn_at;
            UPDATE state.turns SET queue_warn_at = NULL WHERE turn_id = t.turn_id;
            v_res := tw.warn(t, 'queue', t.attempt, -1, NULL,
                             extract(epoch FROM t.queue_deadline_at - coalesce(t.retry_at, t.created_at)),
                             extract(epoch FROM now() - coalesce(t.retry_at, t.created_at)), t.queue_deadline_at);
        END IF;
        v_pub := v_pub || v_res;
        v_log := v_log || jsonb_build_array(jsonb_build_object(
            'action', 'warning', 'kind', r.kind, 'agent', t.agent, 'turn_id', t.turn_id, 'attempt', t.attempt,
            'due', v_due, 'lateness_ms', tw.lateness_ms(v_due)));
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- Due: the earliest warning time of a turn deadline or a queue budget (turn_timers_due_idx).
CREATE OR REPLACE FUNCTION tw.due_pmo_warnings()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT least((SELECT min(due_at) FROM state.turn_timers WHERE kind = 'deadline_warn'),
                 (SELECT min(due_at) FROM state.turn_timers WHERE kind = 'queue_warn'))
$$;
