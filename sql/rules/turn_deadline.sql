-- Turn deadlines (PMO): a turn past its submit --timeout ends turn_deadline_exceeded.

-- Turn deadlines (submit --timeout): whatever the state, past deadline_at the turn ends `timeout`.
-- Every turn due now that can be ended without waiting is ended at once (tw.force_finish_set): a pending turn
-- (its row alone, SKIP LOCKED, as tw.end_turn takes it) and a turn its agent has (the agent's row SKIP LOCKED,
-- agents in agent order, then the turn), neither of them a child. The others (a child, whose end is its
-- parent's call result; a turn whose row or agent another transaction holds) go one by one through
-- tw.end_turn, which leaves a busy one for the next run. Lateness is read once the work is done.
CREATE OR REPLACE FUNCTION tw.wd_turn_deadlines(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r        record;
    v_res    jsonb;
    v_pub    jsonb := '[]'::jsonb;
    v_log    jsonb := '[]'::jsonb;
    v_due    jsonb;
    v_agents text[];
    v_set    uuid[];
    v_msgs   text[];
BEGIN
    -- The deadlines due, earliest first (turn_timers_due_idx), with their turns as they were read.
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'turn_id', t.turn_id, 'agent', t.agent, 'epoch', t.turn_epoch, 'status', t.status,
               'parent', t.parent_turn_id IS NOT NULL, 'due', x.due_at,
               'message', format('the turn did not end within its %s second deadline (it was %s)',
                                 tw.seconds_text(tw.turn_deadline_seconds(t)), t.status))
               ORDER BY x.due_at), '[]'::jsonb)
      INTO v_due
      FROM (SELECT x.turn_id, x.due_at FROM state.turn_timers x
             WHERE x.kind = 'deadline' AND x.due_at < now() ORDER BY x.due_at LIMIT p_limit) x
      JOIN state.turns t ON t.turn_id = x.turn_id;
    -- Left behind: the turn has ended.
    PERFORM tw.turn_places_gone('deadline', array_agg((e ->> 'turn_id')::uuid), array_agg((e ->> 'due')::timestamptz))
       FROM jsonb_array_elements(v_due) e
      WHERE e ->> 'status' NOT IN ('pending', 'dispatched', 'running', 'suspended');
    -- The agents of the active turns that are no child, in agent order, those no other transaction holds.
    -- FOR NO KEY UPDATE: a client's submit in flight (FOR KEY SHARE) does not postpone the deadline; its turn
    -- is dispatched at its commit (tw.queued_at_commit).
    v_agents := ARRAY(SELECT a.agent FROM state.agents a
                       WHERE a.agent IN (SELECT e ->> 'agent' FROM jsonb_array_elements(v_due) e
                                          WHERE e ->> 'status' IN ('dispatched', 'running', 'suspended')
                                            AND NOT (e ->> 'parent')::boolean)
                       ORDER BY a.agent FOR NO KEY UPDATE SKIP LOCKED);
    -- Then the turns, each as it is now (a pending turn may have been dispatched meanwhile).
    SELECT array_agg(turn_id ORDER BY turn_id), array_agg(message ORDER BY turn_id) INTO v_set, v_msgs
      FROM (SELECT t.turn_id, e ->> 'message' AS message
              FROM jsonb_array_elements(v_due) e JOIN state.turns t ON t.turn_id = (e ->> 'turn_id')::uuid
             WHERE NOT (e ->> 'parent')::boolean
               AND (t.status = 'pending'
                    OR (t.status IN ('dispatched', 'running', 'suspended') AND t.agent IN (SELECT unnest(v_agents))
                        AND EXISTS (SELECT 1 FROM state.agents a WHERE a.agent = t.agent
                                       AND a.active_agent_turn_id = t.turn_id)))
             ORDER BY t.turn_id FOR UPDATE OF t SKIP LOCKED) s;
    v_pub := tw.force_finish_set(v_set, v_msgs, 'turn_deadline_exceeded', 'timeout');
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'agent', e -> 'agent', 'turn_id', e -> 'turn_id', 'epoch', e -> 'epoch', 'status_before', e -> 'status',
               'due', e -> 'due', 'lateness_ms', tw.lateness_ms((e ->> 'due')::timestamptz)) ORDER BY e ->> 'due'),
           '[]'::jsonb)
      INTO v_log FROM jsonb_array_elements(v_due) e JOIN unnest(v_set) v (turn_id) ON v.turn_id = (e ->> 'turn_id')::uuid;
    -- The rest one by one; a busy one is left for the next run.
    FOR r IN
        SELECT e ->> 'agent' AS agent, (e ->> 'turn_id')::uuid AS turn_id, e -> 'epoch' AS epoch,
               e ->> 'status' AS status, (e ->> 'due')::timestamptz AS due, e ->> 'message' AS message
          FROM jsonb_array_elements(v_due) e
         WHERE e ->> 'status' IN ('pending', 'dispatched', 'running', 'suspended')
           AND (e ->> 'turn_id')::uuid NOT IN (SELECT unnest(v_set))
         ORDER BY e ->> 'due'
    LOOP
        v_res := tw.end_turn(r.turn_id, 'turn_deadline_exceeded', 'timeout', r.message, false);
        IF v_res IS NOT NULL THEN
            v_pub := v_pub || v_res;
            v_log := v_log || jsonb_build_array(jsonb_build_object(
                'agent', r.agent, 'turn_id', r.turn_id, 'epoch', r.epoch, 'status_before', r.status,
                'due', r.due, 'lateness_ms', tw.lateness_ms(r.due)));
        END IF;
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- Due: the earliest deadline of a turn that has not ended (turn_timers_due_idx).
CREATE OR REPLACE FUNCTION tw.due_turn_deadlines()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT min(due_at) FROM state.turn_timers WHERE kind = 'deadline'
$$;
