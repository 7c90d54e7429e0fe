-- Applying a step's outcome, and the agent going idle or on to its next turn.

-- finish_turn_idle (seed 002): the agent goes idle, its active turn and channel are cleared, and with
-- p_bump the epoch moves so that anything stamped with the old one has no effect. agent_idle is the row
-- update alone; it returns the agent's epoch, or NULL when p_turn is not its active turn.
CREATE OR REPLACE FUNCTION tw.agent_idle(p_agent text, p_turn uuid, p_bump boolean)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint;
BEGIN
    UPDATE state.agents
       SET status = 'idle', active_agent_turn_id = NULL, active_channel_id = NULL, updated_at = now(),
           rerung_at = NULL, turn_epoch = turn_epoch + CASE WHEN p_bump THEN 1 ELSE 0 END
     WHERE agent = p_agent AND active_agent_turn_id = p_turn
    RETURNING turn_epoch INTO v_epoch;
    RETURN v_epoch;
END $$;

CREATE OR REPLACE FUNCTION tw.finish_turn_idle(p_agent text, p_profile text, p_turn uuid, p_bump boolean,
                                               p_error text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint := tw.agent_idle(p_agent, p_turn, p_bump);
BEGIN
    IF v_epoch IS NULL THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN tw.agent_state_event(p_agent, p_profile, 'idle', p_turn, v_epoch, p_error);
END $$;

-- Close everything a turn still holds: waiting calls, inbox messages, ledger entries.
CREATE OR REPLACE FUNCTION tw.close_turn_work(p_turn uuid, p_outcome text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE state.turn_waiting_tools
       SET wait_status = 'cancelled', result_status = 'cancelled', settled_at = now(),
           error = jsonb_build_object('code', 'cancelled', 'message', 'the turn ended: ' || p_outcome)
     WHERE turn_id = p_turn AND wait_status = 'waiting';
    UPDATE state.agent_inbox
       SET status = 'archived', processed_at = coalesce(processed_at, now()), archived_at = now(), outcome = p_outcome
     WHERE turn_id = p_turn AND status IN ('pending', 'processing');
    UPDATE state.turn_resume_ledger SET status = 'done', outcome = p_outcome, updated_at = now()
     WHERE turn_id = p_turn AND status IN ('pending', 'processing');
END
$$;

-- Apply the outcome of an agent step. p_fence is the claim job ({"fence","id","token","turn_id",
-- "epoch","step"}); p_reply is the validated reply: {"complete":{"output"}} | {"fail":{"error","message"}}
-- | {"tool_calls":[{"id","tool","args","timeout_seconds","wait_seconds","external"}],"wait":"all"|"any"|n,
-- "state"}. Returns json {"applied":bool,"publish":[...],"next"?}; a lost fence applies nothing. When the turn
-- ends and p_worker is given, the agent's next turn (if dispatch_next found one) is taken for p_worker in
-- the same transaction and returned as "next": the worker whose slot just freed runs it without another
-- claim round trip. While other turns wait for a slot, the slot goes to the oldest of them among p_profiles
-- (the worker's profiles) instead, so that slots are shared fairly. A call with "agent_profile" delegates
-- (tw.delegate); p_reply's "max_delegation_depth" and "max_tree_turns" bound the tree.
CREATE OR REPLACE FUNCTION tw.apply_step(p_fence jsonb, p_reply jsonb, p_worker text DEFAULT NULL,
                                         p_profiles text[] DEFAULT NULL)
RETURNS json LANGUAGE plpgsql AS $$
DECLARE
    t        state.turns;
    a        state.agents;
    v_turn   uuid := (p_fence ->> 'turn_id')::uuid;
    v_epoch  bigint := (p_fence ->> 'epoch')::bigint;
    v_step   integer := (p_fence ->> 'step')::integer;
    v_id     bigint := (p_fence ->> 'id')::bigint;
    v_token  bigint := (p_fence ->> 'token')::bigint;
    v_ok     boolean;
    v_card   uuid;
    v_pub    jsonb := '[]'::jsonb;
    v_call   jsonb;
    v_i      integer := 0;
    v_wait   jsonb;
    v_tools  text[] := '{}';
    v_tool   text;
    v_took   jsonb;
    v_deleg  boolean;
    v_deadline timestamptz;
    v_tree   integer;
BEGIN
    -- A step that delegates counts its children against its tree's bound: the tree's counter first.
    IF p_reply ? 'max_tree_turns' AND EXISTS (SELECT 1 FROM jsonb_array_elements(p_reply -> 'tool_calls') c
                                               WHERE c ? 'agent_profile') THEN
        PERFORM tw.tree_lock(v_turn);
        v_tree := (p_reply ->> 'max_tree_turns')::integer;
    END IF;
    -- A child's end is its parent's call result: the parent's turn row first (lock order of a tree).
    PERFORM tw.lock_parent(v_turn, true);
    SELECT * INTO a FROM state.agents WHERE agent = p_fence ->> 'agent' FOR UPDATE;
    SELECT * INTO t FROM state.turns WHERE turn_id = v_turn FOR UPDATE;
    IF NOT FOUND OR t.status <> 'running' OR t.turn_epoch <> v_epoch OR t.step <> v_step
       OR a.turn_epoch <> v_epoch OR a.active_agent_turn_id IS DISTINCT FROM v_turn THEN
        RETURN json_build_object('applied', false, 'publish', '[]'::json);
    END IF;
    IF p_fence ->> 'fence' = 'ledger' THEN
        UPDATE state.turn_resume_ledger SET status = 'done', outcome = 'applied', updated_at = now()
         WHERE ledger_id = v_id AND status = 'processing' AND lease_token = v_token
        RETURNING true INTO v_ok;
    ELSE
        UPDATE state.agent_inbox SET status = 'archived', archived_at = now(), outcome = 'applied'
         WHERE inbox_id = v_id AND status = 'processing' AND claim_token = v_token
        RETURNING true INTO v_ok;
    END IF;
    IF v_ok IS NULL THEN
        RETURN json_build_object('applied', false, 'publish', '[]'::json);
    END IF;

    IF p_reply ? 'complete' THEN
        INSERT INTO state.cards (card_type, turn_id, agent, turn_epoch, step, output_box_id, content)
        VALUES ('task.deliverable', t.turn_id, t.agent, t.turn_epoch, t.step, t.output_box_id,
                jsonb_build_object('partial', false, 'output', p_reply -> 'complete' -> 'output'))
        RETURNING card_id INTO v_card;
        UPDATE state.turns SET status = 'done', deliverable_card_id = v_card, ended_at = now(), updated_at = now()
         WHERE turn_id = v_turn RETURNING * INTO t;
        v_pub := tw.agent_state_event(t.agent, t.profile, 'idle', t.turn_id, t.turn_epoch) || tw.task_event(t);
    ELSIF p_reply ? 'fail' THEN
        -- Failed, or back to pending for another attempt (contract 11, 0007_policies_fn.sql).
        v_pub := tw.step_failed(t, p_reply -> 'fail');
        SELECT * INTO t FROM state.turns WHERE turn_id = v_turn;
    ELSIF p_reply ? 'tool_calls' THEN
        FOR v_call IN SELECT * FROM jsonb_array_elements(p_reply -> 'tool_calls') LOOP
            INSERT INTO state.cards (card_type, turn_id, agent, turn_epoch, step, tool_call_id, output_box_id, content)
            VALUES ('tool.call', t.turn_id, t.agent, t.turn_epoch, t.step, v_call ->> 'id', t.output_box_id,
                    jsonb_build_object('tool', v_call ->> 'tool', 'args', v_call -> 'args',
                                       'timeout_seconds', (v_call ->> 'timeout_seconds')::integer))
            RETURNING card_id INTO v_card;
            v_deleg := v_call ? 'agent_profile';
            INSERT INTO state.turn_waiting_tools (turn_id, step, tool_call_id, call_index, agent, tool, args,
                                                  timeout_seconds, external, turn_epoch, deadline_at, call_card_id,
                                                  timeout_source, warn_at)
            VALUES (t.turn_id, t.step, v_call ->> 'id', v_i, t.agent, v_call ->> 'tool', v_call -> 'args',
                    (v_call ->> 'timeout_seconds')::integer,
                    coalesce((v_call ->> 'external')::boolean, false) OR v_deleg,
                    t.turn_epoch, now() + make_interval(secs => (v_call ->> 'wait_seconds')::integer), v_card,
                    v_call ->> 'timeout_source',
                    now() + make_interval(secs => (v_call ->> 'warn_seconds')::double precision))
            RETURNING deadline_at INTO v_deadline;
            IF v_deleg THEN
                v_pub := v_pub || tw.delegate(t, v_call, v_deadline,
                                              coalesce((p_reply ->> 'max_delegation_depth')::integer, 8), v_tree);
            ELSIF NOT coalesce((v_call ->> 'external')::boolean, false) THEN
                INSERT INTO state.agent_inbox (target_kind, target, message_type, turn_id, turn_epoch, step,
                                               tool_call_id, channel_id, payload)
                VALUES ('tool', v_call ->> 'tool', 'tool.call', t.turn_id, t.turn_epoch, t.step, v_call ->> 'id',
                        t.channel_id, jsonb_build_object('tool_call_id', v_call ->> 'id', 'card_id', v_card));
                IF NOT (v_call ->> 'tool') = ANY (v_tools) THEN
                    v_tools := v_tools || (v_call ->> 'tool');
                END IF;
            END IF;
            v_i := v_i + 1;
        END LOOP;
        v_wait := coalesce(p_reply -> 'wait', '"all"'::jsonb);
        UPDATE state.turns
           SET status = 'suspended', suspended_at = now(), updated_at = now(), agent_state = p_reply -> 'state',
               wait_mode = CASE WHEN jsonb_typeof(v_wait) = 'number' THEN 'n' ELSE v_wait #>> '{}' END,
               wait_count = CASE WHEN jsonb_typeof(v_wait) = 'number' THEN (v_wait #>> '{}')::integer END,
               resume_deadline = (SELECT min(deadline_at) FROM state.turn_waiting_tools
                                   WHERE turn_id = v_turn AND step = t.step)
         WHERE turn_id = v_turn RETURNING * INTO t;
        UPDATE state.agents SET status = 'suspended', updated_at = now() WHERE agent = t.agent;
        v_pub := tw.agent_state_event(t.agent, t.profile, 'suspended', t.turn_id, t.turn_epoch) || v_pub;
        FOREACH v_tool IN ARRAY v_tools LOOP
            v_pub := v_pub || tw.doorbell('tool', v_tool, 'tool.call');
        END LOOP;
    ELSE
        RAISE EXCEPTION 'apply_step: reply has none of complete, fail, tool_calls' USING ERRCODE = '22023';
    END IF;
    IF t.status IN ('done', 'failed', 'pending') THEN  -- pending: retried (step_failed)
        -- A child's result goes to its parent's call; children of its own still open are cancelled (those of
        -- an attempt that is retried too: they belong to the attempt that failed).
        IF t.status <> 'pending' THEN
            v_pub := v_pub || tw.child_ended(t);
        END IF;
        v_pub := v_pub || tw.cancel_children(t.turn_id, NULL, format('the parent turn %s ended %s', t.turn_id,
                                                                     t.status));
        -- The agent goes idle (the event above) and on to its next turn, if any, in one row update.
        v_took := tw.dispatch(t.agent, p_worker, t.turn_id);
        v_pub := v_pub || (v_took -> 'publish');
        -- Its own next turn waits behind older ones: the freed slot goes to the oldest waiting turn of the
        -- agents this worker serves, in this same transaction.
        IF p_worker IS NOT NULL AND p_profiles IS NOT NULL AND NOT (v_took ? 'job') THEN
            v_took := tw.claim_turns(p_worker, p_profiles, 1);
            v_pub := v_pub || (v_took -> 'publish');
            v_took := jsonb_build_object('job', v_took -> 'jobs' -> 0);
        END IF;
    END IF;
    -- json, not jsonb: the answer is written out once, where a jsonb one would be built and then written.
    RETURN json_build_object('applied', true, 'publish', v_pub, 'next', v_took -> 'job');
END $$;
