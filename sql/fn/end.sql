-- Forced ends with the output contract (fallback card, force record, final event), and cancel.

-- The output contract of a forced end (2.5, 2.6, turn deadline, cancel), in the caller's transaction:
-- finish_turn_idle (+epoch), record_force_termination, a fallback task.deliverable, the state event,
-- the final task event with deliverable_card_id, then dispatch_next. The caller holds the parent's turn row
-- (if any), then the agent row lock (when the turn is active), and has checked status and epoch. A child's end
-- becomes its call's result in the parent; the turn's own children are cancelled.
CREATE OR REPLACE FUNCTION tw.force_finish(p_turn uuid, p_reason text, p_final text, p_message text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    t      state.turns;
    v_card uuid;
    v_pub  jsonb := '[]'::jsonb;
    v_was  text;
BEGIN
    SELECT * INTO t FROM state.turns WHERE turn_id = p_turn FOR UPDATE;
    IF NOT FOUND OR t.status NOT IN ('pending', 'dispatched', 'running', 'suspended') THEN
        RETURN NULL;
    END IF;
    v_was := t.status;
    PERFORM tw.close_turn_work(ARRAY[t.turn_id], p_reason);
    INSERT INTO state.force_terminations (turn_id, agent, turn_epoch, reason, detail)
    VALUES (t.turn_id, t.agent, t.turn_epoch, p_reason,
            jsonb_build_object('status_before', v_was, 'step', t.step, 'message', p_message));
    -- Contract 11: another attempt instead of an end, when the agent's policy says so (0007_policies_fn.sql).
    v_pub := tw.retry_turn(t, p_reason, p_message, true);
    IF v_pub IS NOT NULL THEN
        -- The children of the attempt that failed go with it (contract section 14).
        RETURN v_pub || tw.cancel_children(t.turn_id, NULL, format('the parent turn %s is retried after %s',
                                                                   t.turn_id, p_reason));
    END IF;
    v_pub := '[]'::jsonb;
    INSERT INTO state.cards (card_type, turn_id, agent, turn_epoch, step, output_box_id, content)
    VALUES ('task.deliverable', t.turn_id, t.agent, t.turn_epoch, t.step, t.output_box_id,
            jsonb_build_object('partial', true, 'fallback', true, 'status', p_final, 'reason', p_reason,
                               'message', p_message, 'status_before', v_was, 'step', t.step,
                               'last_state', t.agent_state,
                               'tool_results', tw.tool_results(t.turn_id, t.step)))
    ON CONFLICT DO NOTHING
    RETURNING card_id INTO v_card;
    UPDATE state.turns
       SET status = p_final, error = p_reason, error_message = p_message, ended_at = now(), updated_at = now(),
           resume_deadline = NULL, deliverable_card_id = coalesce(v_card, deliverable_card_id),
           timeout_detail = tw.timeout_detail(t, p_reason, NULL, NULL)
     WHERE turn_id = t.turn_id
    RETURNING * INTO t;
    PERFORM tw.turn_moved(t);
    IF v_was <> 'pending' THEN
        v_pub := v_pub || tw.finish_turn_idle(t.agent, t.profile, t.turn_id, true, p_reason);
    END IF;
    v_pub := v_pub || tw.task_event(t)
             || tw.cancel_children(t.turn_id, NULL, format('the parent turn %s ended %s (%s)', t.turn_id,
                                                           p_final, p_reason))
             || tw.child_ended(t);
    IF v_was <> 'pending' THEN
        v_pub := v_pub || tw.dispatch_next(t.agent);
    END IF;
    RETURN v_pub;
END $$;

-- tw.force_finish for many turns at once, in a few set-based statements over the set (the turn deadline rule:
-- 200 turns due at one instant used to end one after the other, 0.3-0.5 ms each). p_turns and p_messages are
-- parallel arrays. The caller holds every turn's row and, for a turn an agent has, that agent's row (agents in
-- agent order, then the turns, as tw.end_turn takes them), and has checked that each turn has not ended, is no
-- child (a child's end is its parent's call result: tw.end_turn one by one) and is not retried on p_reason
-- (tw.end_policy: a turn deadline and a cancel never are). The same rows as force_finish: the work closed,
-- the force record, the fallback deliverable, the turn ended, its agent idle (epoch + 1) with the idle event,
-- the final task event, the agents on to their next turns (tw.next_turns), the turns' children cancelled.
CREATE OR REPLACE FUNCTION tw.force_finish_set(p_turns uuid[], p_messages text[], p_reason text, p_final text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_pub    jsonb;
    v_agents text[];
    v_ended  uuid[];
    v_took   jsonb;
    v_turn   uuid;
BEGIN
    IF coalesce(cardinality(p_turns), 0) = 0 THEN
        RETURN '[]'::jsonb;
    END IF;
    PERFORM tw.close_turn_work(p_turns, p_reason);
    WITH s AS (
        SELECT t.turn_id, t.agent, t.profile, t.turn_epoch, t.step, t.status, t.output_box_id, t.agent_state,
               m.message, tw.timeout_detail(t, p_reason, 'fail', NULL) AS detail
          FROM unnest(p_turns, p_messages) m (turn_id, message) JOIN state.turns t ON t.turn_id = m.turn_id
    ), ft AS (
        INSERT INTO state.force_terminations (turn_id, agent, turn_epoch, reason, detail)
        SELECT turn_id, agent, turn_epoch, p_reason,
               jsonb_build_object('status_before', status, 'step', step, 'message', message)
          FROM s
    ), cd AS (
        INSERT INTO state.cards (card_type, turn_id, agent, turn_epoch, step, output_box_id, content)
        SELECT 'task.deliverable', s.turn_id, s.agent, s.turn_epoch, s.step, s.output_box_id,
               jsonb_build_object('partial', true, 'fallback', true, 'status', p_final, 'reason', p_reason,
                                  'message', s.message, 'status_before', s.status, 'step', s.step,
                                  'last_state', s.agent_state, 'tool_results', r.results)
          FROM s CROSS JOIN LATERAL tw.tool_results_of(s.turn_id, s.step) r
        ON CONFLICT DO NOTHING
        RETURNING card_id, turn_id
    ), d AS (
        UPDATE state.turns t
           SET status = p_final, error = p_reason, error_message = s.message, ended_at = now(), updated_at = now(),
               resume_deadline = NULL, deliverable_card_id = coalesce(cd.card_id, t.deliverable_card_id),
               timeout_detail = s.detail
          FROM s LEFT JOIN cd ON cd.turn_id = s.turn_id
         WHERE t.turn_id = s.turn_id
        RETURNING t.*, s.status AS was
    ), q AS (
        DELETE FROM state.turn_queue x USING d WHERE x.agent = d.agent AND x.seq = d.seq
    ), dp AS (
        DELETE FROM state.turn_dispatched x USING d WHERE x.turn_id = d.turn_id
    ), rn AS (
        DELETE FROM state.turn_running x USING d WHERE x.turn_id = d.turn_id
    ), tm AS (
        DELETE FROM state.turn_timers x USING d WHERE x.turn_id = d.turn_id
    ), ag AS (
        -- The epoch moves now; tw.next_turns below makes each agent idle or gives it its next turn.
        UPDATE state.agents a SET turn_epoch = a.turn_epoch + 1, updated_at = now()
          FROM d
         WHERE d.was <> 'pending' AND a.agent = d.agent AND a.active_agent_turn_id = d.turn_id
        RETURNING a.agent, a.turn_epoch, d.turn_id, d.profile, d.timeout_detail
    ), evs AS MATERIALIZED (
        -- Each row's id drawn once (see tw.apply_steps).
        SELECT gen_random_uuid() AS id, 'state' AS kind, 'evt.agent.' || ag.agent || '.state' AS subject,
               jsonb_build_object('agent', ag.agent, 'profile', ag.profile, 'status', 'idle', 'turn_id', ag.turn_id,
                                  'turn_epoch', ag.turn_epoch, 'error', p_reason, 'timeout', ag.timeout_detail) AS body,
               ag.turn_id, ag.turn_epoch
          FROM ag
        UNION ALL
        SELECT gen_random_uuid(), 'task', 'evt.agent.' || d.agent || '.task',
               jsonb_build_object('agent', d.agent, 'profile', d.profile, 'turn_id', d.turn_id,
                                  'channel_id', d.channel_id, 'turn_epoch', d.turn_epoch, 'status', d.status,
                                  'error', d.error, 'error_message', d.error_message,
                                  'deliverable_card_id', d.deliverable_card_id, 'attempt', d.attempt,
                                  'timeout', d.timeout_detail),
               d.turn_id, d.turn_epoch
          FROM d
    ), ev AS (
        INSERT INTO state.outbox (event_id, kind, subject, payload, turn_id, turn_epoch)
        SELECT id, kind, subject, jsonb_strip_nulls(body || jsonb_build_object('event_id', id, 'at', now())),
               turn_id, turn_epoch
          FROM evs
        RETURNING event_id, subject, payload, turn_id, kind
    )
    SELECT coalesce((SELECT jsonb_agg(jsonb_build_object('event_id', ev.event_id, 'subject', ev.subject,
                                                         'text', ev.payload::text)
                                      ORDER BY ev.turn_id, ev.kind) FROM ev), '[]'::jsonb),
           (SELECT array_agg(ag.agent ORDER BY ag.agent) FROM ag), (SELECT array_agg(ag.turn_id ORDER BY ag.agent) FROM ag)
      INTO v_pub, v_agents, v_ended;
    IF v_agents IS NOT NULL THEN
        v_took := tw.next_turns(v_agents, v_ended, NULL, NULL);
        v_pub := v_pub || (v_took -> 'publish');
    END IF;
    -- Their children, where they have some still going (turns_parent_idx).
    FOR v_turn IN
        SELECT p.turn_id FROM unnest(p_turns) p (turn_id)
         WHERE EXISTS (SELECT 1 FROM state.turns k WHERE k.parent_turn_id = p.turn_id
                          AND k.status IN ('pending', 'dispatched', 'running', 'suspended'))
    LOOP
        v_pub := v_pub || tw.cancel_children(v_turn, NULL, format('the parent turn %s ended %s (%s)', v_turn,
                                                                  p_final, p_reason));
    END LOOP;
    RETURN v_pub;
END $$;

-- End one turn by force with the output contract, taking the agent lock first (lock order). Returns
-- NULL when the turn had already ended, or the agent row is busy (p_wait false: try again next tick).
CREATE OR REPLACE FUNCTION tw.end_turn(p_turn uuid, p_reason text, p_final text, p_message text, p_wait boolean)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_agent  text;
    v_got    text;
    v_status text;
BEGIN
    SELECT agent, status INTO v_agent, v_status FROM state.turns WHERE turn_id = p_turn;
    IF v_agent IS NULL THEN
        RETURN NULL;
    END IF;
    -- A child's end is its parent's call result: the parent's turn row before anything of the child's.
    IF NOT tw.lock_parent(p_turn, p_wait) THEN
        RETURN NULL;
    END IF;
    -- A pending turn touches no agent row: the deadline rule (p_wait false) locks the turn alone, so that a busy
    -- agent does not delay its deadline. If a dispatch took the turn meanwhile, it holds the agent and we must
    -- not ask for it while holding the turn (lock order): try again later.
    IF v_status = 'pending' AND NOT p_wait THEN
        SELECT status INTO v_status FROM state.turns WHERE turn_id = p_turn FOR UPDATE SKIP LOCKED;
        IF v_status IS DISTINCT FROM 'pending' THEN
            RETURN NULL;
        END IF;
        RETURN tw.force_finish(p_turn, p_reason, p_final, p_message);
    END IF;
    IF p_wait THEN
        SELECT agent INTO v_got FROM state.agents WHERE agent = v_agent FOR UPDATE;
    ELSE
        -- A watchdog's end: not postponed by a client's submit in flight (FOR KEY SHARE), whose turn is
        -- dispatched at its commit (tw.queued_at_commit).
        SELECT agent INTO v_got FROM state.agents WHERE agent = v_agent FOR NO KEY UPDATE SKIP LOCKED;
    END IF;
    IF v_got IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN tw.force_finish(p_turn, p_reason, p_final, p_message);
END $$;

-- The CLI's cancel: the result and what to publish ({"result","status"?,"publish"}).
CREATE OR REPLACE FUNCTION tw.cancel_turn_ex(p_turn uuid)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_res    jsonb;
    v_status text;
BEGIN
    v_res := tw.end_turn(p_turn, 'cancelled', 'cancelled', 'cancelled by request', true);
    SELECT status INTO v_status FROM state.turns WHERE turn_id = p_turn;
    IF v_status IS NULL THEN
        RETURN jsonb_build_object('result', 'unknown_turn', 'publish', '[]'::jsonb);
    ELSIF v_res IS NULL THEN
        RETURN jsonb_build_object('result', 'already_ended', 'status', v_status, 'publish', '[]'::jsonb);
    END IF;
    RETURN jsonb_build_object('result', 'cancelled', 'status', v_status, 'publish', v_res);
END $$;

CREATE OR REPLACE FUNCTION tw.cancel_turn(turn uuid)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_res jsonb;
BEGIN
    IF turn IS NULL THEN
        RAISE EXCEPTION 'a turn id is required' USING ERRCODE = '22023';
    END IF;
    v_res := tw.cancel_turn_ex(turn);
    PERFORM tw.api_publish(v_res -> 'publish');
    RETURN v_res ->> 'result';
END $$;
