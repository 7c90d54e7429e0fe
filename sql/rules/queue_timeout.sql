-- Queue budgets (PMO): a turn not running queue_timeout_seconds after it was queued ends queue_timeout.

-- A turn not yet running queue_timeout_seconds after it was queued (submitted, or its retry_at) ends
-- timeout/queue_timeout (or is retried, if queue_timeout is in retry_on). Checked again under the locks, in
-- lock order (agent, then turn), like 2.5.
CREATE OR REPLACE FUNCTION tw.wd_queue_timeouts(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r     record;
    t     state.turns;
    v_got text;
    v_res jsonb;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    FOR r IN
        SELECT u.turn_id, u.agent, u.status, x.due_at FROM state.turn_timers x JOIN state.turns u ON u.turn_id = x.turn_id
         WHERE x.kind = 'queue' AND x.due_at < now()
         ORDER BY x.due_at LIMIT p_limit
    LOOP
        IF r.status NOT IN ('pending', 'dispatched') THEN
            PERFORM tw.turn_places_gone('queue', ARRAY[r.turn_id], ARRAY[r.due_at]);
            CONTINUE;  -- left behind: the turn runs or has ended
        END IF;
        v_got := NULL;
        -- A child's end is its parent's call result: the parent's turn row first (lock order of a tree).
        CONTINUE WHEN NOT tw.lock_parent(r.turn_id, false);
        IF r.status = 'dispatched' THEN
            SELECT agent INTO v_got FROM state.agents
             WHERE agent = r.agent AND active_agent_turn_id = r.turn_id FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN v_got IS NULL;
        END IF;
        SELECT * INTO t FROM state.turns WHERE turn_id = r.turn_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND OR t.status IS DISTINCT FROM r.status OR t.queue_deadline_at >= now();
        v_res := tw.force_finish(t.turn_id, 'queue_timeout', 'timeout',
                     format('the turn was not running %s seconds after it was queued (it was %s)',
                            round(extract(epoch FROM t.queue_deadline_at - coalesce(t.retry_at, tw.turn_start_at(t)))),
                            t.status));
        IF v_res IS NOT NULL THEN
            v_pub := v_pub || v_res;
            v_log := v_log || jsonb_build_array(jsonb_build_object(
                'agent', t.agent, 'turn_id', t.turn_id, 'attempt', t.attempt, 'status_before', t.status,
                'due', t.queue_deadline_at, 'lateness_ms', tw.lateness_ms(t.queue_deadline_at)));
        END IF;
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- Due: the earliest queue deadline of a turn not yet running (turn_timers_due_idx).
CREATE OR REPLACE FUNCTION tw.due_queue_timeouts()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT min(due_at) FROM state.turn_timers WHERE kind = 'queue'
$$;
