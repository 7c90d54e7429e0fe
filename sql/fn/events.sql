-- Events and doorbells: what every state change writes to the outbox and rings after commit.

-- One builder per event kind: the body of evt.agent.<agent>.<kind> is made here and nowhere else. Each is a SQL
-- function that a set-based statement inlines into its own plan; the one-row paths call it through tw.emit. A
-- field added to an event is one change in its builder (and its test); docs/events.md lists the fields.

-- The subject of an agent's event of one kind.
CREATE OR REPLACE FUNCTION tw.ev_subject(p_agent text, p_kind text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT 'evt.agent.' || p_agent || '.' || p_kind
$$;

-- evt.agent.<agent>.state: the agent's status moved (dispatched, running, suspended, idle). An idle after an
-- error names it, with the timeout object when a clock ended it.
CREATE OR REPLACE FUNCTION tw.ev_state(p_agent text, p_profile text, p_status text, p_turn uuid, p_epoch bigint,
                                       p_error text, p_timeout jsonb)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('agent', p_agent, 'profile', p_profile, 'status', p_status, 'turn_id', p_turn,
                              'turn_epoch', p_epoch, 'error', p_error,
                              'timeout', CASE WHEN p_error IS NOT NULL THEN p_timeout END)
$$;

-- evt.agent.<agent>.task: the turn's final event, from its ended row.
CREATE OR REPLACE FUNCTION tw.ev_task(t state.turns)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('agent', t.agent, 'profile', t.profile, 'turn_id', t.turn_id,
                              'channel_id', t.channel_id, 'turn_epoch', t.turn_epoch, 'status', t.status,
                              'error', t.error, 'error_message', t.error_message,
                              'deliverable_card_id', t.deliverable_card_id, 'attempt', t.attempt,
                              'timeout', t.timeout_detail,
                              'parent_turn_id', t.parent_turn_id,
                              'parent_tool_call_id', t.parent_tool_call_id)
$$;

-- evt.agent.<agent>.retry: the turn (t: as it is after the move back to pending) is tried again at p_retry_at.
CREATE OR REPLACE FUNCTION tw.ev_retry(t state.turns, p_max_attempts integer, p_code text, p_message text,
                                       p_retry_at timestamptz, p_timeout jsonb)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('agent', t.agent, 'profile', t.profile, 'turn_id', t.turn_id,
                              'turn_epoch', t.turn_epoch, 'attempt', t.attempt, 'max_attempts', p_max_attempts,
                              'error', p_code, 'error_message', p_message, 'retry_at', p_retry_at,
                              'timeout', p_timeout)
$$;

-- evt.agent.<agent>.warning: p_kind's deadline is warn_at_percent gone.
CREATE OR REPLACE FUNCTION tw.ev_warning(t state.turns, p_kind text, p_call text, p_limit numeric,
                                         p_elapsed numeric, p_due timestamptz)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('agent', t.agent, 'profile', t.profile, 'turn_id', t.turn_id,
                              'turn_epoch', t.turn_epoch, 'attempt', t.attempt, 'kind', p_kind,
                              'tool_call_id', p_call, 'limit_seconds', round(p_limit, 3),
                              'elapsed_seconds', round(p_elapsed, 3), 'due_at', p_due)
$$;

-- evt.schedule.<name>.tick: a schedule's tick at p_tick fired p_turn, or was skipped (overlap, catchup, error:
-- p_error says why). Not an agent's event: its subject is its own (tw.ev_schedule_subject).
CREATE OR REPLACE FUNCTION tw.ev_schedule_tick(p_schedule text, p_tick timestamptz, p_turn uuid, p_skipped text,
                                               p_error text)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('schedule', p_schedule, 'tick_at', p_tick, 'turn_id', p_turn, 'skipped', p_skipped,
                              'error', p_error)
$$;

CREATE OR REPLACE FUNCTION tw.ev_schedule_subject(p_schedule text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT 'evt.schedule.' || p_schedule || '.tick'
$$;

-- What the outbox holds for a body: its id and the time added, nulls left out. Every writer of state.outbox
-- makes the payload with it.
CREATE OR REPLACE FUNCTION tw.ev_payload(p_body jsonb, p_id uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_strip_nulls(p_body || jsonb_build_object('event_id', p_id, 'at', now()))
$$;

-- The entry of a function's "publish" array for an outbox row. The payload goes out as the text the outbox
-- holds ("text"), not as a JSON value ("data"): a daemon that parsed and re-encoded it would publish
-- 11.997999999999999 for the 11.998 of record, or fail on an integer wider than 64 bits, and an event on NATS
-- must be the outbox's, byte for byte in meaning.
CREATE OR REPLACE FUNCTION tw.ev_publish(p_id uuid, p_subject text, p_payload jsonb)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('event_id', p_id, 'subject', p_subject, 'text', p_payload::text)
$$;

-- One event to the outbox, for the one-row paths; returns what to publish.
CREATE OR REPLACE FUNCTION tw.emit(p_kind text, p_subject text, p_payload jsonb, p_turn uuid, p_epoch bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_id      uuid := gen_random_uuid();
    v_payload jsonb := tw.ev_payload(p_payload, v_id);
BEGIN
    INSERT INTO state.outbox (event_id, kind, subject, payload, turn_id, turn_epoch)
    VALUES (v_id, p_kind, p_subject, v_payload, p_turn, p_epoch);
    RETURN jsonb_build_array(tw.ev_publish(v_id, p_subject, v_payload));
END $$;

-- The two event helpers below call tw.emit, which writes: a LANGUAGE sql function doing that is not inlined
-- but planned again on every call (66 us a call, measured with tools/bench --statements), where a plpgsql one
-- plans its statements once per session.
CREATE OR REPLACE FUNCTION tw.agent_state_event(p_agent text, p_profile text, p_status text, p_turn uuid,
                                                p_epoch bigint, p_error text DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN tw.emit('state', tw.ev_subject(p_agent, 'state'),
                   tw.ev_state(p_agent, p_profile, p_status, p_turn, p_epoch, p_error,
                               CASE WHEN p_error IS NOT NULL THEN
                                   (SELECT timeout_detail FROM state.turns WHERE turn_id = p_turn) END),
                   p_turn, p_epoch);
END $$;

CREATE OR REPLACE FUNCTION tw.task_event(t state.turns)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN tw.emit('task', tw.ev_subject(t.agent, 'task'), tw.ev_task(t), t.turn_id, t.turn_epoch);
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
