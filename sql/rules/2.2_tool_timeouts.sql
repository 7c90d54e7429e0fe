-- Rule 2.2 (worker): a timeout report for every waiting tool call past its deadline.

-- 2.2: for suspended turns past resume_deadline, a timeout report per waiting call whose own deadline
-- passed (none when its tool.call card is missing); resume_deadline moves to the next deadline. The reports of
-- every call due now are written at once, in a few set-based statements (200 calls due at one instant used to
-- be reported one after the other, 0.3-0.5 ms each): for each call what tw.deliver_result writes for a timeout
-- report (the tool.result card, the call settled `timeout`, a `timeout` message in the agent's inbox) and one
-- doorbell per agent. A delegating call goes through tw.deliver_result alone, which also cancels its child.
-- Lateness is read once the work is done.
CREATE OR REPLACE FUNCTION tw.wd_tool_timeouts(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    dc    record;
    v_ids uuid[];
    v_res jsonb;
    v_pub jsonb;
    v_log jsonb;
    v_one jsonb := '[]'::jsonb;
    v_del jsonb;
    v_lim jsonb;
BEGIN
    -- The turns of the waiting calls past their deadline (turn_waiting_tools_waiting_idx), earliest first.
    v_ids := ARRAY(SELECT turn_id FROM state.turns
                    WHERE turn_id IN (SELECT w2.turn_id FROM state.turn_waiting_tools w2
                                       WHERE w2.wait_status = 'waiting' AND w2.deadline_at < now()
                                       ORDER BY w2.deadline_at LIMIT p_limit)
                      AND status = 'suspended' AND resume_deadline < now()
                    ORDER BY resume_deadline FOR UPDATE SKIP LOCKED);
    IF cardinality(v_ids) = 0 THEN
        RETURN jsonb_build_object('actions', '[]'::jsonb, 'publish', '[]'::jsonb);
    END IF;
    -- Their calls past deadline, of the turn's step and epoch (`card`: the tool.call card is there), and the
    -- reports of those that delegate to no child, all at once.
    WITH d AS MATERIALIZED (
        SELECT t.turn_id, w.step, w.tool_call_id, w.tool, t.agent, t.profile, t.turn_epoch, t.output_box_id,
               t.channel_id, w.child_turn_id, w.deadline_at AS due, w.call_index, w.limits,
               -- A limited call that never started waited its limits' max_wait_seconds: error limit_timeout.
               w.limits IS NOT NULL AND w.started_at IS NULL AS lim,
               CASE WHEN w.limits IS NOT NULL AND w.started_at IS NULL
                    THEN format('call %s of tool %s waited %s seconds for its limits (%s) and did not start',
                                w.tool_call_id, w.tool, round(extract(epoch FROM now() - w.created_at)),
                                array_to_string(w.limits, ', '))
                    WHEN w.limits IS NOT NULL
                    THEN format('tool %s did not answer call %s within %s seconds of its start', w.tool,
                                w.tool_call_id, round(extract(epoch FROM w.deadline_at - w.started_at)))
                    ELSE format('tool %s did not answer call %s within %s seconds', w.tool, w.tool_call_id,
                                round(extract(epoch FROM w.deadline_at - t.suspended_at))) END AS message,
               w.call_card_id IS NOT NULL
               AND EXISTS (SELECT 1 FROM state.cards c WHERE c.card_id = w.call_card_id) AS card,
               gen_random_uuid() AS card_id  -- drawn once per row: the CTE is materialized
          -- A join with the locked turns, not "= ANY (v_ids)" as a filter: that reads the whole array for each row.
          FROM unnest(v_ids) v (turn_id) JOIN state.turns t ON t.turn_id = v.turn_id
          JOIN state.turn_waiting_tools w ON w.turn_id = t.turn_id AND w.step = t.step
         WHERE w.wait_status = 'waiting' AND w.deadline_at < now() AND w.turn_epoch = t.turn_epoch
    ), r AS (
        SELECT * FROM d WHERE d.card AND d.child_turn_id IS NULL
    ), c AS (
        INSERT INTO state.cards (card_id, card_type, turn_id, agent, turn_epoch, step, tool_call_id, output_box_id,
                                 content)
        SELECT r.card_id, 'tool.result', r.turn_id, r.agent, r.turn_epoch, r.step, r.tool_call_id, r.output_box_id,
               jsonb_build_object('tool', r.tool, 'status', CASE WHEN r.lim THEN 'error' ELSE 'timeout' END,
                                  'error', jsonb_build_object('code', CASE WHEN r.lim THEN 'limit_timeout'
                                                                           ELSE 'tool_timeout' END,
                                                              'message', r.message))
          FROM r
    ), u AS (
        UPDATE state.turn_waiting_tools w
           SET wait_status = 'timeout', result_status = CASE WHEN r.lim THEN 'error' ELSE 'timeout' END, output = NULL,
               error = jsonb_build_object('code', CASE WHEN r.lim THEN 'limit_timeout' ELSE 'tool_timeout' END,
                                          'message', r.message),
               result_card_id = r.card_id, settled_at = now()
          FROM r
         WHERE w.turn_id = r.turn_id AND w.step = r.step AND w.tool_call_id = r.tool_call_id
    ), ib AS (
        INSERT INTO state.agent_inbox (target_kind, target, profile, message_type, turn_id, turn_epoch, step,
                                       tool_call_id, channel_id, payload)
        SELECT 'agent', r.agent, r.profile, 'timeout', r.turn_id, r.turn_epoch, r.step, r.tool_call_id, r.channel_id,
               jsonb_build_object('card_id', r.card_id, 'status', CASE WHEN r.lim THEN 'error' ELSE 'timeout' END)
          FROM r ORDER BY r.due, r.turn_id, r.call_index
    ), rl AS (
        -- Limited calls give their limits back (docs/flow-control.md), after the rows above are written.
        SELECT jsonb_agg(jsonb_build_object('turn_id', r.turn_id, 'step', r.step, 'tool_call_id', r.tool_call_id)
                         ORDER BY r.turn_id, r.step, r.tool_call_id) AS calls
          FROM r WHERE r.limits IS NOT NULL
    )
    SELECT coalesce((SELECT jsonb_agg(tw.doorbell('agent', b.agent, 'timeout', b.profile) -> 0 ORDER BY b.agent)
                       FROM (SELECT DISTINCT agent, profile FROM r) b), '[]'::jsonb),
           coalesce((SELECT jsonb_agg(jsonb_build_object('action', 'timeout_report', 'turn_id', r.turn_id,
                                                         'tool_call_id', r.tool_call_id, 'epoch', r.turn_epoch,
                                                         'due', r.due) ORDER BY r.due, r.turn_id, r.call_index)
                       FROM r), '[]'::jsonb)
           || coalesce((SELECT jsonb_agg(jsonb_build_object('action', 'skipped_missing_card', 'turn_id', d.turn_id,
                                                            'tool_call_id', d.tool_call_id, 'epoch', d.turn_epoch,
                                                            'due', d.due) ORDER BY d.due, d.turn_id, d.call_index)
                          FROM d WHERE NOT d.card), '[]'::jsonb),
           (SELECT jsonb_agg(jsonb_build_object('turn_id', d.turn_id, 'tool_call_id', d.tool_call_id,
                                                'turn_epoch', d.turn_epoch, 'due', d.due, 'message', d.message,
                                                'call_index', d.call_index))
              FROM d WHERE d.card AND d.child_turn_id IS NOT NULL),
           (SELECT calls FROM rl)
      INTO v_pub, v_log, v_del, v_lim;
    FOR dc IN SELECT * FROM jsonb_to_recordset(coalesce(v_lim, '[]'::jsonb)) AS x (turn_id uuid, step integer,
                                                                                    tool_call_id text) LOOP
        v_pub := v_pub || tw.flow_release(dc.turn_id, dc.step, dc.tool_call_id);
    END LOOP;
    -- Delegating calls one by one: deliver_result also cancels the child.
    FOR dc IN
        SELECT * FROM jsonb_to_recordset(coalesce(v_del, '[]'::jsonb))
                          AS x (turn_id uuid, tool_call_id text, turn_epoch bigint, due timestamptz, message text,
                                call_index integer)
         ORDER BY x.due, x.call_index
    LOOP
        v_res := tw.deliver_result(dc.turn_id, dc.tool_call_id, 'timeout', NULL,
                                   jsonb_build_object('code', 'tool_timeout', 'message', dc.message), NULL, 'timeout');
        IF v_res ->> 'result' = 'accepted' THEN
            v_pub := v_pub || (v_res -> 'publish');
            v_one := v_one || jsonb_build_array(jsonb_build_object(
                'action', 'timeout_report', 'turn_id', dc.turn_id, 'tool_call_id', dc.tool_call_id,
                'epoch', dc.turn_epoch, 'due', dc.due));
        END IF;
    END LOOP;
    -- Each turn waits on until its next deadline that can still be reported.
    UPDATE state.turns t
       SET resume_deadline = (SELECT min(deadline_at) FROM state.turn_waiting_tools x
                               WHERE x.turn_id = t.turn_id AND x.step = t.step AND x.wait_status = 'waiting'
                                 AND (x.deadline_at >= now()
                                      OR EXISTS (SELECT 1 FROM state.cards c WHERE c.card_id = x.call_card_id)))
     WHERE t.turn_id = ANY (v_ids);
    -- Lateness once the work is done.
    SELECT coalesce(jsonb_agg(CASE WHEN a ->> 'action' = 'timeout_report'
                                   THEN a || jsonb_build_object('lateness_ms', tw.lateness_ms((a ->> 'due')::timestamptz))
                                   ELSE a END), '[]'::jsonb)
      INTO v_log FROM jsonb_array_elements(v_log || v_one) a;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- Due: the earliest resume deadline among the turns of the 100 waiting calls due first
-- (turn_waiting_tools_waiting_idx): a suspended turn's resume_deadline is the earliest deadline of its calls
-- that can still be reported (a call whose tool.call card is missing is skipped and no longer counts).
CREATE OR REPLACE FUNCTION tw.due_tool_timeouts()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT min(t.resume_deadline) FROM state.turns t
     WHERE t.turn_id IN (SELECT w.turn_id FROM state.turn_waiting_tools w WHERE w.wait_status = 'waiting'
                          ORDER BY w.deadline_at LIMIT 100)
       AND t.status = 'suspended'
$$;
