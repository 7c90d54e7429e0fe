-- Tool results: delivered by a tool program, a 2.2 timeout report, or posted from outside.

-- Deliver a result (from a tool program, the CLI, or a 2.2 timeout report) for the newest call with
-- that id in the turn. p_fence is the tool job's claim ({"id","token"}) or NULL. With p_worker (the worker whose
-- program gave the result, serving the tools p_tools and the profiles p_profiles), a call that the limits given
-- back grant to one of those tools is taken for it here, in the slot the result frees: it starts when this
-- commits, with no doorbell and claim between (docs/flow-control.md, "Hand-over"); and the result is consumed
-- for its turn here as a claim would (tw.consume_result) when the turn's row is free: no doorbell calls every
-- worker of the profile to do it. Returns {"result": accepted|unknown_turn|unknown_call|ended|duplicate|stale|
-- lost, "card_id", "publish", "jobs"?: [that call's job]}.
CREATE OR REPLACE FUNCTION tw.deliver_result(p_turn uuid, p_call text, p_status text, p_output jsonb,
                                             p_error jsonb, p_fence jsonb, p_message_type text,
                                             p_worker text DEFAULT NULL, p_tools text[] DEFAULT NULL,
                                             p_profiles text[] DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    t      state.turns;
    w      state.turn_waiting_tools;
    v_card uuid;
    v_ok   boolean;
    v_res  text;
    v_pub  jsonb := '[]'::jsonb;
    v_jobs jsonb;
    v_locked text[];
    m      state.agent_inbox;
    v_ring jsonb;
BEGIN
    -- Lock order: the turn before its inbox rows (as force_finish does). A tool program's result (p_fence) only
    -- reads the turn and settles its own call (whose row is locked below): it takes the turn's row in share mode,
    -- so that the results of one turn's calls do not wait for each other (each would wait out the others'
    -- commits, and with a limit, their wait for the limit's row: docs/performance.md); anything that moves the
    -- turn still waits for them. A pushback (tw.flow_pushback) writes the turn: it takes the row for update.
    IF p_fence IS NOT NULL AND NOT (p_status = 'error' AND p_error ->> 'code' = 'rate_limited') THEN
        SELECT * INTO t FROM state.turns WHERE turn_id = p_turn FOR SHARE;
    ELSE
        SELECT * INTO t FROM state.turns WHERE turn_id = p_turn FOR UPDATE;
    END IF;
    IF p_fence IS NOT NULL THEN
        UPDATE state.agent_inbox SET status = 'archived', archived_at = now(), outcome = 'applied'
         WHERE inbox_id = (p_fence ->> 'id')::bigint AND status = 'processing'
           AND claim_token = (p_fence ->> 'token')::bigint
        RETURNING true INTO v_ok;
        IF v_ok IS NULL THEN
            RETURN jsonb_build_object('result', 'lost', 'publish', '[]'::jsonb);
        END IF;
    END IF;
    IF t.turn_id IS NULL THEN
        RETURN jsonb_build_object('result', 'unknown_turn', 'publish', '[]'::jsonb);
    END IF;
    SELECT * INTO w FROM state.turn_waiting_tools
     WHERE turn_id = p_turn AND tool_call_id = p_call ORDER BY step DESC LIMIT 1 FOR UPDATE;
    IF NOT FOUND THEN
        v_res := 'unknown_call';
    ELSIF t.status NOT IN ('pending', 'dispatched', 'running', 'suspended') THEN
        v_res := 'ended';
    ELSIF w.wait_status <> 'waiting' THEN
        v_res := CASE w.wait_status WHEN 'cancelled' THEN 'cancelled' WHEN 'timeout' THEN 'timed_out'
                                    ELSE 'duplicate' END;
    ELSIF w.turn_epoch <> t.turn_epoch THEN
        v_res := 'stale';
    END IF;
    -- Pushback (docs/flow-control.md): a tool program's rate_limited runs the call again after its
    -- retry_after_seconds, its limits paused meanwhile, while it has tries left and the turn has time.
    IF v_res IS NULL AND p_fence IS NOT NULL AND p_status = 'error' AND p_error ->> 'code' = 'rate_limited'
       AND w.child_turn_id IS NULL THEN
        v_pub := tw.flow_pushback(t, w, p_error);
        IF v_pub IS NOT NULL THEN
            RETURN jsonb_build_object('result', 'accepted', 'publish', v_pub);
        END IF;
        v_pub := '[]'::jsonb;
    END IF;
    IF v_res IS NOT NULL THEN
        IF p_fence IS NOT NULL THEN
            UPDATE state.agent_inbox SET outcome = v_res WHERE inbox_id = (p_fence ->> 'id')::bigint;
        END IF;
        RETURN jsonb_build_object('result', v_res, 'publish', '[]'::jsonb);
    END IF;
    INSERT INTO state.cards (card_type, turn_id, agent, turn_epoch, step, tool_call_id, output_box_id, content)
    VALUES ('tool.result', t.turn_id, t.agent, t.turn_epoch, w.step, w.tool_call_id, t.output_box_id,
            jsonb_strip_nulls(jsonb_build_object('tool', w.tool, 'status', p_status, 'output', p_output,
                                                 'error', p_error)))
    RETURNING card_id INTO v_card;
    UPDATE state.turn_waiting_tools
       SET wait_status = CASE WHEN p_status = 'timeout' THEN 'timeout' ELSE 'received' END,
           result_status = p_status, output = p_output, error = p_error, result_card_id = v_card, settled_at = now()
     WHERE turn_id = w.turn_id AND step = w.step AND tool_call_id = w.tool_call_id;
    INSERT INTO state.agent_inbox (target_kind, target, profile, message_type, turn_id, turn_epoch, step,
                                   tool_call_id, channel_id, payload)
    VALUES ('agent', t.agent, t.profile, p_message_type, t.turn_id, t.turn_epoch, w.step, w.tool_call_id,
            t.channel_id, jsonb_build_object('card_id', v_card, 'status', p_status))
    RETURNING * INTO m;
    -- A limited call gives its limits back: the next waiters start (docs/flow-control.md), the first one of this
    -- worker's tools taken for it here (its job in the answer: no doorbell, no claim).
    IF w.limits IS NOT NULL THEN
        v_locked := tw.flow_release_slots(w.turn_id, w.step, w.tool_call_id);
        IF v_locked IS NOT NULL THEN
            SELECT g.publish, CASE WHEN g.job IS NOT NULL THEN jsonb_build_array(g.job) END INTO v_pub, v_jobs
              FROM tw.flow_grant_take(v_locked, p_worker, p_tools) g;
        END IF;
    END IF;
    -- A delegating call settled other than by its child (its timeout report, a result posted from outside):
    -- the child and its subtree are cancelled in this transaction. A child that has ended changes nothing.
    IF w.child_turn_id IS NOT NULL THEN
        v_pub := v_pub || coalesce(tw.end_turn(w.child_turn_id, 'cancelled', 'cancelled',
                                      format('its call %s in turn %s settled first (%s)', w.tool_call_id, t.turn_id,
                                             p_status), true), '[]'::jsonb);
    END IF;
    -- Consumed here (last: its turn's row in update mode, taken without waiting; a sibling's result in flight
    -- holds it, and then a claim consumes this one), its doorbell is what consuming it rings (a resume's), if
    -- anything.
    v_ring := tw.doorbell('agent', t.agent, p_message_type, t.profile);
    IF p_worker IS NOT NULL AND p_fence IS NOT NULL AND t.profile = ANY (p_profiles) THEN
        v_ring := coalesce(tw.consume_result(m), v_ring);
    END IF;
    RETURN jsonb_build_object('result', 'accepted', 'card_id', v_card, 'publish', v_ring || v_pub)
           || CASE WHEN jsonb_array_length(v_jobs) > 0 THEN jsonb_build_object('jobs', v_jobs) ELSE '{}' END;
END $$;

-- A result posted from outside (tw.post_tool_result_ex, which checked it): deliver_result for the calls of
-- external tools only. A call whose tool runs a program gets its result from the worker, a delegating call
-- from its child turn: a result posted for either, where deliver_result would have taken it, is refused
-- (not_external, with the tool and the child turn) and changes nothing (issue 23: it replaced a running tool's
-- result). A call that no longer waits keeps its answer (ended, duplicate, timed_out, cancelled, stale). The
-- turn's row first, as deliver_result takes it, so the call read is the one it would settle.
CREATE OR REPLACE FUNCTION tw.deliver_posted_result(p_turn uuid, p_call text, p_status text, p_output jsonb,
                                                    p_error jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    t state.turns;
    w state.turn_waiting_tools;
BEGIN
    SELECT * INTO t FROM state.turns WHERE turn_id = p_turn FOR UPDATE;
    SELECT * INTO w FROM state.turn_waiting_tools
     WHERE turn_id = p_turn AND tool_call_id = p_call ORDER BY step DESC LIMIT 1;
    IF FOUND AND (NOT w.external OR w.child_turn_id IS NOT NULL) AND w.wait_status = 'waiting'
       AND w.turn_epoch = t.turn_epoch AND t.status IN ('pending', 'dispatched', 'running', 'suspended') THEN
        RETURN jsonb_strip_nulls(jsonb_build_object('result', 'not_external', 'tool', w.tool,
                                                    'child_turn_id', w.child_turn_id, 'publish', '[]'::jsonb));
    END IF;
    RETURN tw.deliver_result(p_turn, p_call, p_status, p_output, p_error, NULL, 'tool.result');
END $$;

-- A result for an external tool call, as a client posts it (`turnwatch tool-result` and tw.post_tool_result):
-- status ok with output as the tool's output, or error with output {"code","message"} (a string is the
-- message), checked here (section 8's limits; no other status). Returns {"result": accepted or why not:
-- unknown_turn, unknown_call, not_external (with "tool" and "child_turn_id"), ended, duplicate, timed_out,
-- cancelled, stale; "card_id"; "publish": what to publish, left to the caller}.
CREATE OR REPLACE FUNCTION tw.post_tool_result_ex(turn uuid, call text, status text, output jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_err jsonb;
    v_res jsonb;
BEGIN
    IF turn IS NULL THEN
        RAISE EXCEPTION 'a turn id is required' USING ERRCODE = '22023';
    END IF;
    IF call IS NULL THEN
        RAISE EXCEPTION 'a tool call id is required' USING ERRCODE = '22023';
    END IF;
    PERFORM tw.check_ident('tool call id', call);
    IF status IS NULL OR status NOT IN ('ok', 'error') THEN
        RAISE EXCEPTION 'status must be ok or error, not %', coalesce(quote_literal(left(status, 40)), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF output IS NULL THEN
        RAISE EXCEPTION 'an output document is required' USING ERRCODE = '22023';
    END IF;
    -- 1 MiB of compact JSON, as the CLI measures it (a text form over doc_max_text may still be within it).
    IF octet_length(output::text) > tw.doc_max_text() AND tw.json_compact_length(output) > tw.limit_doc_max() THEN
        RAISE EXCEPTION 'the output document is % bytes of compact JSON; at most % (1 MiB)',
            tw.json_compact_length(output), tw.limit_doc_max() USING ERRCODE = '22023';
    END IF;
    IF status = 'error' THEN
        v_err := CASE WHEN jsonb_typeof(output -> 'code') = 'string' THEN output
                      WHEN jsonb_typeof(output) = 'string' THEN jsonb_build_object('code', 'tool_error', 'message', output)
                      ELSE jsonb_build_object('code', 'tool_error', 'detail', output) END;
        v_res := tw.deliver_posted_result(turn, call, 'error', NULL, v_err);
    ELSE
        v_res := tw.deliver_posted_result(turn, call, 'ok', output, NULL);
    END IF;
    -- accepted or duplicate: deliver_result locks the turn FOR UPDATE (a WAL record) today; said here so that a
    -- rewrite that answers from a read alone keeps the answer durable.
    PERFORM tw.durable_answer();
    RETURN v_res;
END $$;

-- The SQL API's form: the answer in a word; the events are relayed by a PMO at commit (tw.api_publish).
CREATE OR REPLACE FUNCTION tw.post_tool_result(turn uuid, call text, status text, output jsonb)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_res jsonb := tw.post_tool_result_ex(turn, call, status, output);
BEGIN
    PERFORM tw.api_publish(coalesce(v_res -> 'publish', '[]'::jsonb));
    RETURN v_res ->> 'result';
END $$;
