-- Events and doorbells: what every state change writes to the outbox and rings after commit.

CREATE OR REPLACE FUNCTION tw.emit(p_kind text, p_subject text, p_payload jsonb, p_turn uuid, p_epoch bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_id      uuid := gen_random_uuid();
    v_payload jsonb := jsonb_strip_nulls(p_payload || jsonb_build_object('event_id', v_id, 'at', now()));
BEGIN
    INSERT INTO state.outbox (event_id, kind, subject, payload, turn_id, turn_epoch)
    VALUES (v_id, p_kind, p_subject, v_payload, p_turn, p_epoch);
    -- The payload goes out as the text the outbox holds ("text"), not as a JSON value ("data"): a daemon that
    -- parsed and re-encoded it would publish 11.997999999999999 for the 11.998 of record, or fail on an integer
    -- wider than 64 bits, and an event on NATS must be the outbox's, byte for byte in meaning.
    RETURN jsonb_build_array(jsonb_build_object('event_id', v_id, 'subject', p_subject, 'text', v_payload::text));
END $$;

-- The two event helpers below call tw.emit, which writes: a LANGUAGE sql function doing that is not inlined
-- but planned again on every call (66 us a call, measured with tools/bench --statements), where a plpgsql one
-- plans its statements once per session.
CREATE OR REPLACE FUNCTION tw.agent_state_event(p_agent text, p_profile text, p_status text, p_turn uuid,
                                                p_epoch bigint, p_error text DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN tw.emit('state', 'evt.agent.' || p_agent || '.state',
                   jsonb_build_object('agent', p_agent, 'profile', p_profile, 'status', p_status, 'turn_id', p_turn,
                                      'turn_epoch', p_epoch, 'error', p_error,
                                      'timeout', CASE WHEN p_error IS NOT NULL THEN
                                          (SELECT timeout_detail FROM state.turns WHERE turn_id = p_turn) END),
                   p_turn, p_epoch);
END $$;

CREATE OR REPLACE FUNCTION tw.task_event(t state.turns)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN tw.emit('task', 'evt.agent.' || t.agent || '.task',
                   jsonb_build_object('agent', t.agent, 'profile', t.profile, 'turn_id', t.turn_id,
                                      'channel_id', t.channel_id, 'turn_epoch', t.turn_epoch, 'status', t.status,
                                      'error', t.error, 'error_message', t.error_message,
                                      'deliverable_card_id', t.deliverable_card_id, 'attempt', t.attempt,
                                      'timeout', t.timeout_detail,
                                      'parent_turn_id', t.parent_turn_id,
                                      'parent_tool_call_id', t.parent_tool_call_id),
                   t.turn_id, t.turn_epoch);
END $$;

-- A doorbell: cmd.<kind>.<target>.wakeup. Agent doorbells also name the agent's profile, so that a worker,
-- subscribed to every agent's doorbell, looks at its inbox only for the profiles it serves. STABLE, as the
-- jsonb constructors are: a SQL function is inlined into the statement that calls it only when it is declared
-- no less volatile than its body; declared IMMUTABLE it was planned and run apart for every row (31 us each,
-- 6 ms for the 200 doorbells of a 2.2 batch).
CREATE OR REPLACE FUNCTION tw.doorbell(p_kind text, p_target text, p_reason text, p_profile text DEFAULT NULL)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_array(jsonb_build_object(
        'subject', 'cmd.' || p_kind || '.' || p_target || '.wakeup',
        'data', jsonb_strip_nulls(jsonb_build_object('target', p_target, 'reason', p_reason,
                                                     'profile', p_profile))))
$$;

--
-- Callable by any client in its own transaction; what they change exists only if that transaction commits.
-- Such a client publishes nothing itself: at commit, NOTIFY tw_outbox has a PMO relay the events they wrote
-- at once, and NOTIFY tw_ring hands it the doorbells to ring (contract: doorbells are hints; the watchdogs
-- ring again anyway). Neither needs NATS on the client's side.
CREATE OR REPLACE FUNCTION tw.api_publish(p_publish jsonb)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_bells jsonb;
BEGIN
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_publish) e WHERE e ? 'event_id') THEN
        PERFORM pg_notify('tw_outbox', '');
    END IF;
    SELECT jsonb_agg(e) INTO v_bells FROM jsonb_array_elements(p_publish) e WHERE NOT e ? 'event_id';
    IF v_bells IS NOT NULL AND octet_length(v_bells::text) < 7900 THEN
        PERFORM pg_notify('tw_ring', v_bells::text);
    END IF;
END $$;
