-- Rule 2.2 (worker): a timeout report for every waiting tool call past its deadline.

-- 2.2: for suspended turns past resume_deadline, a timeout report per waiting call whose own deadline
-- passed (none when its tool.call card is missing); resume_deadline moves to the next deadline.
CREATE OR REPLACE FUNCTION tw.wd_tool_timeouts(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    t     state.turns;
    w     state.turn_waiting_tools;
    v_res jsonb;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    -- The turns of the waiting calls past their deadline (turn_waiting_tools_waiting_idx), earliest first.
    FOR t IN
        SELECT * FROM state.turns
         WHERE turn_id IN (SELECT w2.turn_id FROM state.turn_waiting_tools w2
                            WHERE w2.wait_status = 'waiting' AND w2.deadline_at < now()
                            ORDER BY w2.deadline_at LIMIT p_limit)
           AND status = 'suspended' AND resume_deadline < now()
         ORDER BY resume_deadline FOR UPDATE SKIP LOCKED
    LOOP
        FOR w IN
            SELECT * FROM state.turn_waiting_tools
             WHERE turn_id = t.turn_id AND step = t.step AND wait_status = 'waiting' AND deadline_at < now()
             ORDER BY deadline_at, call_index
        LOOP
            IF w.call_card_id IS NULL
               OR NOT EXISTS (SELECT 1 FROM state.cards c WHERE c.card_id = w.call_card_id) THEN
                v_log := v_log || jsonb_build_array(jsonb_build_object(
                    'action', 'skipped_missing_card', 'turn_id', t.turn_id, 'tool_call_id', w.tool_call_id,
                    'epoch', t.turn_epoch, 'due', w.deadline_at));
                CONTINUE;
            END IF;
            v_res := tw.deliver_result(t.turn_id, w.tool_call_id, 'timeout', NULL,
                         jsonb_build_object('code', 'tool_timeout', 'message',
                             format('tool %s did not answer call %s within %s seconds', w.tool, w.tool_call_id,
                                    round(extract(epoch FROM w.deadline_at - t.suspended_at)))),
                         NULL, 'timeout');
            IF v_res ->> 'result' = 'accepted' THEN
                v_pub := v_pub || (v_res -> 'publish');
                v_log := v_log || jsonb_build_array(jsonb_build_object(
                    'action', 'timeout_report', 'turn_id', t.turn_id, 'tool_call_id', w.tool_call_id,
                    'epoch', t.turn_epoch, 'due', w.deadline_at, 'lateness_ms', tw.lateness_ms(w.deadline_at)));
            END IF;
        END LOOP;
        UPDATE state.turns
           SET resume_deadline = (SELECT min(deadline_at) FROM state.turn_waiting_tools x
                                   WHERE x.turn_id = t.turn_id AND x.step = t.step AND x.wait_status = 'waiting'
                                     AND (x.deadline_at >= now()
                                          OR EXISTS (SELECT 1 FROM state.cards c WHERE c.card_id = x.call_card_id)))
         WHERE turn_id = t.turn_id;
    END LOOP;
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
