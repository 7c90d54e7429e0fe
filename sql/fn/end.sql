-- Forced ends with the output contract (fallback card, force record, final event), and cancel.

-- The output contract of a forced end (2.5, 2.6, turn deadline, cancel), in the caller's transaction:
-- finish_turn_idle (+epoch), record_force_termination, a fallback task.deliverable, the state event,
-- the final task event with deliverable_card_id, then dispatch_next: tw.force_finish_set for one turn, or the
-- retry its policy asks for instead. The caller holds the parent's turn row (if any), then the agent row lock
-- (when the turn is active). A child's end becomes its call's result in the parent; the turn's own children are
-- cancelled.
CREATE OR REPLACE FUNCTION tw.force_finish(p_turn uuid, p_reason text, p_final text, p_message text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    t     state.turns;
    v_pub jsonb;
BEGIN
    SELECT * INTO t FROM state.turns WHERE turn_id = p_turn FOR UPDATE;
    IF NOT FOUND OR t.status NOT IN ('pending', 'dispatched', 'running', 'suspended') THEN
        RETURN NULL;
    END IF;
    IF tw.end_policy(t, p_reason) = 'retry' THEN
        -- Another attempt instead of an end, when the agent's policy says so (sql/fn/policy.sql); the children
        -- of the attempt that failed go with it.
        PERFORM tw.force_close_set(ARRAY[t.turn_id], ARRAY[p_message], p_reason);
        RETURN tw.retry_turn(t, p_reason, p_message, true)
               || tw.cancel_children(t.turn_id, NULL, format('the parent turn %s is retried after %s',
                                                             t.turn_id, p_reason));
    END IF;
    v_pub := tw.force_finish_set(ARRAY[t.turn_id], ARRAY[p_message], p_reason, p_final);
    IF t.parent_turn_id IS NOT NULL THEN
        SELECT * INTO t FROM state.turns WHERE turn_id = p_turn;
        v_pub := v_pub || tw.child_ended(t);
    END IF;
    RETURN v_pub;
END $$;

-- The first part of every forced end, retried or not: the turns' work closed and their force records written
-- (record_force_termination), with the status each had and its step.
CREATE OR REPLACE FUNCTION tw.force_close_set(p_turns uuid[], p_messages text[], p_reason text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tw.close_turn_work(p_turns, p_reason);
    INSERT INTO state.force_terminations (turn_id, agent, turn_epoch, reason, detail)
    SELECT t.turn_id, t.agent, t.turn_epoch, p_reason,
           jsonb_build_object('status_before', t.status, 'step', t.step, 'message', m.message)
      FROM unnest(p_turns, p_messages) m (turn_id, message) JOIN state.turns t ON t.turn_id = m.turn_id;
END $$;

-- tw.force_finish for many turns at once, in a few set-based statements over the set (the turn deadline rule:
-- 200 turns due at one instant used to end one after the other, 0.3-0.5 ms each). p_turns and p_messages are
-- parallel arrays. The caller holds every turn's row and, for a turn an agent has, that agent's row (agents in
-- agent order, then the turns, as tw.end_turn takes them), and has checked that each turn has not ended and is
-- not retried on p_reason (tw.end_policy: a turn deadline and a cancel never are); a child's end is also its
-- parent's call result, which tw.force_finish adds for one turn whose parent's row its caller holds (the set
-- path takes no children). What a forced end writes: the work closed, the force record, the fallback
-- deliverable, the turn ended, its agent idle (epoch + 1) with the idle event, the final task event, the
-- agents on to their next turns (tw.next_turns), the turns' children cancelled.
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
    PERFORM tw.force_close_set(p_turns, p_messages, p_reason);
    WITH s AS (
        SELECT t.turn_id, t.agent, t.profile, t.turn_epoch, t.step, t.status, t.output_box_id, t.agent_state,
               m.message,
               -- A turn deadline or a cancel is never retried: its policy is 'fail' without a look at the
               -- profile's; any other code ended here was not retried, so its policy says why (fail, dead_letter).
               tw.timeout_detail(t, p_reason, CASE WHEN p_reason IN ('cancelled', 'turn_deadline_exceeded')
                                                   THEN 'fail' END, NULL) AS detail
          FROM unnest(p_turns, p_messages) m (turn_id, message) JOIN state.turns t ON t.turn_id = m.turn_id
    ), cd AS (
        INSERT INTO state.cards (card_type, turn_id, agent, turn_epoch, step, output_box_id, content)
        SELECT 'task.deliverable', s.turn_id, s.agent, s.turn_epoch, s.step, s.output_box_id,
               tw.card_fallback(p_final, p_reason, s.message, s.status, s.step, s.agent_state, r.results)
          FROM s CROSS JOIN LATERAL tw.tool_results_of(s.turn_id, s.step) r
        ON CONFLICT DO NOTHING
        RETURNING card_id, turn_id
    ), d AS (
        SELECT * FROM tw.turns_move(ARRAY(
            SELECT jsonb_populate_record(t, jsonb_build_object(
                       'status', p_final, 'error', p_reason, 'error_message', s.message, 'ended_at', now(),
                       'updated_at', now(), 'resume_deadline', NULL,
                       'deliverable_card_id', coalesce(cd.card_id, t.deliverable_card_id), 'timeout_detail', s.detail))
              FROM s JOIN state.turns t ON t.turn_id = s.turn_id LEFT JOIN cd ON cd.turn_id = s.turn_id))
    ), ag AS (
        -- The epoch moves now; tw.next_turns below makes each agent idle or gives it its next turn.
        UPDATE state.agents a SET turn_epoch = a.turn_epoch + 1, updated_at = now()
          FROM d JOIN s ON s.turn_id = d.turn_id
         WHERE s.status <> 'pending' AND a.agent = d.agent AND a.active_agent_turn_id = d.turn_id
        RETURNING a.agent, a.turn_epoch, d.turn_id, d.profile, d.timeout_detail
    ), evs AS MATERIALIZED (
        -- Each row's id drawn once (see tw.apply_steps).
        SELECT gen_random_uuid() AS id, 'state' AS kind, tw.ev_subject(ag.agent, 'state') AS subject,
               tw.ev_state(ag.agent, ag.profile, 'idle', ag.turn_id, ag.turn_epoch, p_reason, ag.timeout_detail) AS body,
               ag.turn_id, ag.turn_epoch
          FROM ag
        UNION ALL
        SELECT gen_random_uuid(), 'task', tw.ev_subject(d.agent, 'task'), tw.ev_task(ROW(d.*)::state.turns),
               d.turn_id, d.turn_epoch
          FROM d
    ), ev AS (
        INSERT INTO state.outbox (event_id, kind, subject, payload, turn_id, turn_epoch)
        SELECT id, kind, subject, tw.ev_payload(body, id), turn_id, turn_epoch
          FROM evs
        RETURNING event_id, subject, payload, turn_id, kind
    )
    SELECT coalesce((SELECT jsonb_agg(tw.ev_publish(ev.event_id, ev.subject, ev.payload)
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
