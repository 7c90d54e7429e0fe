-- migrate: repeatable (re-applied by `turnwatch migrate` whenever this text changes: CREATE OR REPLACE only;
-- a function whose signature or return type changes is dropped explicitly first).
-- turnwatch state machine: every state change that others react to is one of these functions, run as
-- one transaction with a compare-and-set on status and turn_epoch. They return the events they wrote to
-- the outbox and the doorbells to ring as a jsonb array of {"subject","data"[,"event_id"]} that the
-- caller publishes after commit. "Now" is always the database clock.
--
-- Lock order, everywhere: agent row, then turn row, then inbox / ledger / waiting rows. Paths that
-- already hold an inbox or ledger row lock take the agent row with SKIP LOCKED and retry later.

CREATE SCHEMA IF NOT EXISTS tw;

-- Events and doorbells ----------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION tw.emit(p_kind text, p_subject text, p_payload jsonb, p_turn uuid, p_epoch bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_id      uuid := gen_random_uuid();
    v_payload jsonb := jsonb_strip_nulls(p_payload || jsonb_build_object('event_id', v_id, 'at', now()));
BEGIN
    INSERT INTO state.outbox (event_id, kind, subject, payload, turn_id, turn_epoch)
    VALUES (v_id, p_kind, p_subject, v_payload, p_turn, p_epoch);
    RETURN jsonb_build_array(jsonb_build_object('event_id', v_id, 'subject', p_subject, 'data', v_payload));
END $$;

-- The helpers below that are a single expression are LANGUAGE sql: the planner inlines them into the
-- calling expression, which costs nothing per call (a plpgsql call sets up a frame every time).
CREATE OR REPLACE FUNCTION tw.agent_state_event(p_agent text, p_status text, p_turn uuid, p_epoch bigint,
                                                p_error text DEFAULT NULL)
RETURNS jsonb LANGUAGE sql AS $$
    SELECT tw.emit('state', 'evt.agent.' || p_agent || '.state',
                   jsonb_build_object('agent', p_agent, 'status', p_status, 'turn_id', p_turn,
                                      'turn_epoch', p_epoch, 'error', p_error,
                                      'timeout', CASE WHEN p_error IS NOT NULL THEN
                                          (SELECT timeout_detail FROM state.turns WHERE turn_id = p_turn) END),
                   p_turn, p_epoch)
$$;

CREATE OR REPLACE FUNCTION tw.task_event(t state.turns)
RETURNS jsonb LANGUAGE sql AS $$
    SELECT tw.emit('task', 'evt.agent.' || t.agent || '.task',
                   jsonb_build_object('agent', t.agent, 'turn_id', t.turn_id, 'channel_id', t.channel_id,
                                      'turn_epoch', t.turn_epoch, 'status', t.status, 'error', t.error,
                                      'error_message', t.error_message,
                                      'deliverable_card_id', t.deliverable_card_id, 'attempt', t.attempt,
                                      'timeout', t.timeout_detail),
                   t.turn_id, t.turn_epoch)
$$;

CREATE OR REPLACE FUNCTION tw.doorbell(p_kind text, p_target text, p_reason text)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_array(jsonb_build_object(
        'subject', 'cmd.' || p_kind || '.' || p_target || '.wakeup',
        'data', jsonb_build_object('target', p_target, 'reason', p_reason)))
$$;

-- Submit and dispatch -----------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION tw.submit_turn(p_agent text, p_channel text, p_box text, p_input jsonb,
                                          p_timeout_s integer, p_idem text)
RETURNS TABLE (turn_id uuid, created boolean) LANGUAGE plpgsql AS $$
DECLARE
    v_id      uuid;
    v_agent   text;
    v_channel text;
    v_status  text;
BEGIN
    IF p_idem IS NOT NULL THEN
        SELECT t.turn_id, t.agent, t.channel_id INTO v_id, v_agent, v_channel
          FROM state.turns t WHERE t.idempotency_key = p_idem;
        IF FOUND THEN
            IF v_agent <> p_agent OR v_channel <> p_channel THEN
                RAISE EXCEPTION 'idempotency key % already names turn % for agent % on channel %',
                    p_idem, v_id, v_agent, v_channel USING ERRCODE = '22023';
            END IF;
            RETURN QUERY SELECT v_id, false;
            RETURN;
        END IF;
    END IF;
    -- The agent row exists after its first turn (a lookup is far cheaper than an upsert every time). Held FOR
    -- SHARE until commit, its status stays as read: an idle agent needs the PMO now; a busy one takes this turn
    -- when its current turn ends, for that apply_step needs the row FOR UPDATE, so it waits for this commit
    -- and then sees the turn.
    SELECT status INTO v_status FROM state.agents WHERE agent = p_agent FOR SHARE;
    IF NOT FOUND THEN
        INSERT INTO state.agents (agent) VALUES (p_agent) ON CONFLICT DO NOTHING;
        SELECT status INTO v_status FROM state.agents WHERE agent = p_agent FOR SHARE;
    END IF;
    INSERT INTO state.turns AS t (agent, channel_id, output_box_id, input, idempotency_key, timeout_seconds,
                                  deadline_at)
    VALUES (p_agent, p_channel, p_box, p_input, p_idem, p_timeout_s,
            CASE WHEN p_timeout_s IS NOT NULL THEN now() + make_interval(secs => p_timeout_s) END)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING t.turn_id INTO v_id;
    IF v_id IS NULL THEN
        -- A concurrent submit with the same key won; answer with its turn.
        SELECT t.turn_id INTO v_id FROM state.turns t WHERE t.idempotency_key = p_idem;
        RETURN QUERY SELECT v_id, false;
        RETURN;
    END IF;
    IF v_status = 'idle' THEN
        PERFORM pg_notify('tw_turn', p_agent);
    END IF;
    -- A deadline may now be due sooner than any the PMOs sleep for (contract section 9). Transactional, and
    -- the CLI or an application submitting through SQL need no NATS for it; only turns with a deadline pay
    -- for a notification.
    IF p_timeout_s IS NOT NULL THEN
        PERFORM pg_notify('tw_due', 'turn_deadline');
    END IF;
    RETURN QUERY SELECT v_id, true;
END $$;

-- dispatch_next: if the agent is idle, hand its oldest pending turn to it (new epoch, a `turn` inbox
-- message, a doorbell). One active turn per agent, FIFO per agent.
-- dispatch: if the agent is idle, hand it its oldest pending turn under a new epoch. Without p_worker the
-- turn is announced (a pending `turn` message and a doorbell) for whichever worker claims it; with p_worker
-- (the worker whose slot the agent's last turn just freed) it is taken at once: the agent and turn go
-- straight to running and the message is inserted already claimed, with the same state events. Returns
-- {"publish":[...],"job"?}.
--
-- With p_ended, the caller (apply_step) holds the agent row and the agent's turn p_ended has just ended: the
-- agent goes idle here, or straight on to its next turn, in one row update instead of two (the caller emits
-- the idle state event either way).
DROP FUNCTION IF EXISTS tw.dispatch(text, text);
CREATE OR REPLACE FUNCTION tw.dispatch(p_agent text, p_worker text, p_ended uuid DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    a       state.agents;
    t       state.turns;
    v_epoch bigint;
    v_token bigint;
    v_inbox bigint;
    v_take  boolean := p_worker IS NOT NULL;
    v_pub   jsonb;
BEGIN
    IF p_ended IS NULL THEN
        SELECT * INTO a FROM state.agents WHERE agent = p_agent FOR UPDATE;
        IF NOT FOUND OR a.status <> 'idle' THEN
            RETURN jsonb_build_object('publish', '[]'::jsonb);
        END IF;
    END IF;
    -- Fairness: while any dispatched turn still waits for a worker slot, the freed slot is not kept for
    -- this agent; its turn is announced, and claims serve the oldest waiting turn first. Otherwise an
    -- agent with a long queue would hold the slot and starve the others into 2.5 dispatch timeouts.
    IF v_take AND EXISTS (SELECT 1 FROM state.agent_inbox
                           WHERE status = 'pending' AND target_kind = 'agent' AND message_type = 'turn') THEN
        v_take := false;
    END IF;
    SELECT * INTO t FROM state.turns
     WHERE agent = p_agent AND status = 'pending' AND (retry_at IS NULL OR retry_at <= now())  -- a retry waits
     ORDER BY seq LIMIT 1 FOR UPDATE;
    IF NOT FOUND THEN
        IF p_ended IS NOT NULL THEN
            PERFORM tw.agent_idle(p_agent, p_ended, false);
        END IF;
        RETURN jsonb_build_object('publish', '[]'::jsonb);
    END IF;
    UPDATE state.agents
       SET status = CASE WHEN v_take THEN 'running' ELSE 'dispatched' END, active_agent_turn_id = t.turn_id,
           active_channel_id = t.channel_id, turn_epoch = turn_epoch + 1, updated_at = now(), rerung_at = NULL
     WHERE agent = p_agent
    RETURNING turn_epoch INTO v_epoch;
    UPDATE state.turns
       SET status = CASE WHEN v_take THEN 'running' ELSE 'dispatched' END, turn_epoch = v_epoch,
           dispatched_at = now(), started_at = CASE WHEN v_take THEN now() END, updated_at = now()
     WHERE turn_id = t.turn_id
    RETURNING * INTO t;
    IF v_take THEN
        v_token := nextval('state.claim_token_seq');
    END IF;
    INSERT INTO state.agent_inbox (target_kind, target, message_type, turn_id, turn_epoch, step, channel_id, payload,
                                   status, processed_at, claim_token, claimed_by, attempts)
    VALUES ('agent', p_agent, 'turn', t.turn_id, v_epoch, t.step, t.channel_id,
            jsonb_build_object('turn_id', t.turn_id, 'epoch', v_epoch),
            CASE WHEN v_take THEN 'processing' ELSE 'pending' END, CASE WHEN v_take THEN now() END, v_token,
            p_worker, CASE WHEN v_take THEN 1 ELSE 0 END)
    RETURNING inbox_id INTO v_inbox;
    v_pub := tw.agent_state_event(p_agent, 'dispatched', t.turn_id, v_epoch);
    IF NOT v_take THEN
        RETURN jsonb_build_object('publish', v_pub || tw.doorbell('agent', p_agent, 'dispatch'));
    END IF;
    RETURN jsonb_build_object(
        'publish', v_pub || tw.agent_state_event(p_agent, 'running', t.turn_id, v_epoch),
        'job', tw.step_job('inbox', v_inbox, v_token, t));
END $$;

-- dispatch_next (seed 002): announce the agent's next turn, if it is idle and has one.
CREATE OR REPLACE FUNCTION tw.dispatch_next(p_agent text)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN tw.dispatch(p_agent, NULL) -> 'publish';
END $$;

-- The PMO's scan: dispatch for every idle agent that has pending turns. The agents with pending turns are
-- found by skipping through turns_pending_idx one agent at a time (a loose index scan), so the scan costs one
-- index probe per such agent, however many agents are registered and however many turns wait.
CREATE OR REPLACE FUNCTION tw.dispatch_pending(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_agent text;
    v_pub   jsonb := '[]'::jsonb;
BEGIN
    FOR v_agent IN
        WITH RECURSIVE pa(agent) AS (
            (SELECT t.agent::text FROM state.turns t WHERE t.status = 'pending' ORDER BY t.agent, t.seq LIMIT 1)
            UNION ALL
            SELECT (SELECT t.agent::text FROM state.turns t WHERE t.status = 'pending' AND t.agent > pa.agent
                     ORDER BY t.agent, t.seq LIMIT 1)
              FROM pa WHERE pa.agent IS NOT NULL)
        SELECT a.agent FROM pa JOIN state.agents a ON a.agent = pa.agent
         WHERE a.status = 'idle'
         ORDER BY a.agent LIMIT p_limit
    LOOP
        v_pub := v_pub || tw.dispatch_next(v_agent);
    END LOOP;
    RETURN v_pub;
END $$;

-- The step document (contract section 5) --------------------------------------------------------

CREATE OR REPLACE FUNCTION tw.tool_results(p_turn uuid, p_step integer)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT coalesce(jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
               'tool_call_id', w.tool_call_id, 'tool', w.tool,
               'status', coalesce(w.result_status, CASE w.wait_status WHEN 'cancelled' THEN 'cancelled' END),
               'output', w.output, 'error', w.error)) ORDER BY w.call_index), '[]'::jsonb)
      FROM state.turn_waiting_tools w
     WHERE w.turn_id = p_turn AND w.step = p_step
    );
END
$$;

CREATE OR REPLACE FUNCTION tw.step_document(t state.turns, p_step integer)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'turn_id', t.turn_id, 'agent', t.agent, 'channel_id', t.channel_id, 'epoch', t.turn_epoch,
        'step', p_step - t.step_base, 'attempt', t.attempt, 'input', t.input,  -- steps count from 0 per attempt
        'state', CASE WHEN p_step = t.step_base THEN NULL ELSE t.agent_state END,
        'tool_results', CASE WHEN p_step = t.step_base THEN '[]'::jsonb
                             ELSE tw.tool_results(t.turn_id, p_step - 1) END)
$$;

-- The job a worker runs for an agent step: its fence (inbox claim or ledger lease) and the step document.
CREATE OR REPLACE FUNCTION tw.step_job(p_fence text, p_id bigint, p_token bigint, t state.turns)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('kind', 'step', 'fence', p_fence, 'id', p_id, 'token', p_token,
                              'turn_id', t.turn_id, 'agent', t.agent, 'epoch', t.turn_epoch, 'step', t.step,
                              'doc', tw.step_document(t, t.step))
$$;

-- Inbox rows ----------------------------------------------------------------------------------------

-- Archive an inbox row, saying why (applied, stale, cancelled, ...).
CREATE OR REPLACE FUNCTION tw.inbox_archive(p_id bigint, p_outcome text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
        UPDATE state.agent_inbox
           SET status = 'archived', processed_at = coalesce(processed_at, now()), archived_at = now(), outcome = p_outcome
         WHERE inbox_id = p_id;
END
$$;

-- Take an inbox row for a worker under a fresh claim token; returns the token.
CREATE OR REPLACE FUNCTION tw.inbox_take(p_id bigint, p_worker text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_token bigint;
BEGIN
    UPDATE state.agent_inbox
       SET status = 'processing', processed_at = now(), archived_at = NULL,
           claim_token = nextval('state.claim_token_seq'), claimed_by = p_worker, attempts = attempts + 1
     WHERE inbox_id = p_id
    RETURNING claim_token INTO v_token;
    RETURN v_token;
END
$$;

-- Consuming results -------------------------------------------------------------------------------

-- A tool.result or timeout message for an agent: when the turn's wait condition now holds, write the
-- resume ledger entry (once per suspended step) and cancel the calls still waiting.
CREATE OR REPLACE FUNCTION tw.consume_result(m state.agent_inbox)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    t        state.turns;
    v_total  integer;
    v_done   integer;
    v_need   integer;
    v_ledger bigint;
    v_pub    jsonb := '[]'::jsonb;
BEGIN
    -- Compare-and-set on the message: a replay for a message already consumed changes nothing.
    PERFORM 1 FROM state.agent_inbox WHERE inbox_id = m.inbox_id AND status = 'pending' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN v_pub;
    END IF;
    -- The claim holds this inbox row: never wait for the turn here (force_finish holds the turn and
    -- updates the turn's inbox rows). A busy turn is retried on the next claim.
    SELECT * INTO t FROM state.turns WHERE turn_id = m.turn_id FOR UPDATE SKIP LOCKED;
    IF NOT FOUND AND EXISTS (SELECT 1 FROM state.turns WHERE turn_id = m.turn_id) THEN
        RETURN NULL;
    END IF;
    IF NOT FOUND OR t.status <> 'suspended' OR t.turn_epoch IS DISTINCT FROM m.turn_epoch OR t.step <> m.step THEN
        PERFORM tw.inbox_archive(m.inbox_id, 'stale');
        RETURN v_pub;
    END IF;
    SELECT count(*), count(*) FILTER (WHERE wait_status <> 'waiting') INTO v_total, v_done
      FROM state.turn_waiting_tools WHERE turn_id = t.turn_id AND step = t.step;
    v_need := CASE t.wait_mode WHEN 'any' THEN 1 WHEN 'n' THEN least(t.wait_count, v_total) ELSE v_total END;
    IF v_done >= v_need THEN
        INSERT INTO state.turn_resume_ledger (turn_id, agent, turn_epoch, step)
        VALUES (t.turn_id, t.agent, t.turn_epoch, t.step)
        ON CONFLICT (turn_id, step) DO NOTHING
        RETURNING ledger_id INTO v_ledger;
        IF v_ledger IS NOT NULL THEN
            UPDATE state.turn_waiting_tools
               SET wait_status = 'cancelled', result_status = 'cancelled', settled_at = now(),
                   error = jsonb_build_object('code', 'cancelled',
                                              'message', 'the turn resumed before this call settled')
             WHERE turn_id = t.turn_id AND step = t.step AND wait_status = 'waiting';
            UPDATE state.agent_inbox SET status = 'archived', processed_at = coalesce(processed_at, now()),
                   archived_at = now(), outcome = 'cancelled'
             WHERE turn_id = t.turn_id AND step = t.step AND message_type = 'tool.call'
               AND status IN ('pending', 'processing');
            UPDATE state.turns SET resume_deadline = NULL, updated_at = now() WHERE turn_id = t.turn_id;
            v_pub := tw.doorbell('agent', t.agent, 'resume');
        END IF;
    END IF;
    PERFORM tw.inbox_archive(m.inbox_id, 'applied');
    RETURN v_pub;
END $$;

-- Take a `turn` message for p_worker: the turn becomes running, the message processing under a fresh claim
-- token. The caller holds the message row and the agent row. Returns {"job"?, "publish"}; a message that no
-- longer matches its turn (stale epoch, ended turn) is archived with no effect.
CREATE OR REPLACE FUNCTION tw.take_turn_message(m state.agent_inbox, a state.agents, p_worker text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    t       state.turns;
    v_token bigint;
    v_pub   jsonb := '[]'::jsonb;
BEGIN
    SELECT * INTO t FROM state.turns WHERE turn_id = m.turn_id FOR UPDATE;
    IF NOT FOUND OR t.status NOT IN ('dispatched', 'running') OR t.step <> m.step
       OR t.turn_epoch IS DISTINCT FROM m.turn_epoch OR a.turn_epoch <> m.turn_epoch
       OR a.active_agent_turn_id IS DISTINCT FROM t.turn_id THEN
        PERFORM tw.inbox_archive(m.inbox_id, 'stale');
        RETURN jsonb_build_object('publish', v_pub);
    END IF;
    v_token := tw.inbox_take(m.inbox_id, p_worker);
    UPDATE state.turns SET status = 'running', started_at = coalesce(started_at, now()), updated_at = now()
     WHERE turn_id = t.turn_id
    RETURNING * INTO t;
    IF a.status <> 'running' THEN
        UPDATE state.agents SET status = 'running', updated_at = now() WHERE agent = a.agent;
        v_pub := tw.agent_state_event(a.agent, 'running', t.turn_id, t.turn_epoch);
    ELSE
        UPDATE state.agents SET updated_at = now() WHERE agent = a.agent;
    END IF;
    RETURN jsonb_build_object('publish', v_pub, 'job', tw.step_job('inbox', m.inbox_id, v_token, t));
END $$;

-- Take up to p_max waiting `turn` messages among p_agents for p_worker, oldest first. A message whose agent
-- row is busy is left for the next claim ("more"). Returns {"jobs","publish","more"}.
CREATE OR REPLACE FUNCTION tw.claim_turns(p_worker text, p_agents text[], p_max integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    m      state.agent_inbox;
    a      state.agents;
    v_res  jsonb;
    v_jobs jsonb := '[]'::jsonb;
    v_pub  jsonb := '[]'::jsonb;
    v_more boolean := false;
BEGIN
    FOR m IN
        SELECT * FROM state.agent_inbox
         WHERE status = 'pending' AND target_kind = 'agent' AND target = ANY (p_agents) AND message_type = 'turn'
         ORDER BY inbox_id LIMIT p_max FOR UPDATE SKIP LOCKED
    LOOP
        SELECT * INTO a FROM state.agents WHERE agent = m.target FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            v_more := true;
            CONTINUE;
        END IF;
        v_res := tw.take_turn_message(m, a, p_worker);
        v_pub := v_pub || (v_res -> 'publish');
        IF v_res ? 'job' THEN
            v_jobs := v_jobs || jsonb_build_array(v_res -> 'job');
        END IF;
    END LOOP;
    RETURN jsonb_build_object('jobs', v_jobs, 'publish', v_pub, 'more', v_more);
END $$;

-- Claim -------------------------------------------------------------------------------------------

-- Claim up to p_max pieces of work for a worker serving p_agents and p_tools: agent steps from resume
-- ledger entries and `turn` messages, tool runs from `tool.call` messages. Result messages for served
-- agents are consumed on the way (they need no program). Returns {"jobs":[...],"publish":[...],"more":b}.
CREATE OR REPLACE FUNCTION tw.claim(p_worker text, p_agents text[], p_tools text[], p_max integer,
                                    p_lease_s integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    m       state.agent_inbox;
    l       state.turn_resume_ledger;
    t       state.turns;
    w       state.turn_waiting_tools;
    a       state.agents;
    v_jobs  jsonb := '[]'::jsonb;
    v_pub   jsonb := '[]'::jsonb;
    v_n     integer := 0;
    v_more  boolean := false;
    v_token bigint;
    v_res   jsonb;
BEGIN
    -- Results first: they are cheap and may turn into ledger entries claimed just below.
    FOR m IN
        SELECT * FROM state.agent_inbox
         WHERE status = 'pending' AND target_kind = 'agent' AND target = ANY (p_agents)
           AND message_type IN ('tool.result', 'timeout')
         ORDER BY inbox_id LIMIT 200 FOR UPDATE SKIP LOCKED
    LOOP
        v_res := tw.consume_result(m);
        IF v_res IS NULL THEN
            v_more := true;
        ELSE
            v_pub := v_pub || v_res;
        END IF;
    END LOOP;

    FOR l IN
        SELECT * FROM state.turn_resume_ledger
         WHERE status = 'pending' AND agent = ANY (p_agents)
         ORDER BY ledger_id LIMIT p_max FOR UPDATE SKIP LOCKED
    LOOP
        SELECT * INTO a FROM state.agents WHERE agent = l.agent FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN v_more := true; CONTINUE; END IF;
        SELECT * INTO t FROM state.turns WHERE turn_id = l.turn_id FOR UPDATE;
        IF t.status NOT IN ('suspended', 'running') OR t.turn_epoch <> l.turn_epoch
           OR a.turn_epoch <> l.turn_epoch OR a.active_agent_turn_id IS DISTINCT FROM t.turn_id
           OR t.step NOT IN (l.step, l.step + 1) THEN
            UPDATE state.turn_resume_ledger SET status = 'done', outcome = 'stale', updated_at = now()
             WHERE ledger_id = l.ledger_id;
            CONTINUE;
        END IF;
        v_token := nextval('state.claim_token_seq');
        UPDATE state.turn_resume_ledger
           SET status = 'processing', lease_token = v_token, claimed_by = p_worker, attempts = attempts + 1,
               lease_expires_at = now() + make_interval(secs => p_lease_s), updated_at = now()
         WHERE ledger_id = l.ledger_id;
        UPDATE state.turns SET status = 'running', step = l.step + 1, resume_deadline = NULL, updated_at = now()
         WHERE turn_id = t.turn_id
        RETURNING * INTO t;
        IF a.status <> 'running' THEN
            UPDATE state.agents SET status = 'running', updated_at = now() WHERE agent = a.agent;
            v_pub := v_pub || tw.agent_state_event(a.agent, 'running', t.turn_id, t.turn_epoch);
        ELSE
            UPDATE state.agents SET updated_at = now() WHERE agent = a.agent;
        END IF;
        v_jobs := v_jobs || jsonb_build_array(tw.step_job('ledger', l.ledger_id, v_token, t));
        v_n := v_n + 1;
    END LOOP;

    IF v_n < p_max THEN
        v_res := tw.claim_turns(p_worker, p_agents, p_max - v_n);
        v_jobs := v_jobs || (v_res -> 'jobs');
        v_pub := v_pub || (v_res -> 'publish');
        v_n := v_n + jsonb_array_length(v_res -> 'jobs');
        v_more := v_more OR (v_res ->> 'more')::boolean;
    END IF;

    IF v_n < p_max AND cardinality(p_tools) > 0 THEN
        FOR m IN
            SELECT * FROM state.agent_inbox
             WHERE status = 'pending' AND target_kind = 'tool' AND target = ANY (p_tools)
               AND message_type = 'tool.call'
             ORDER BY inbox_id LIMIT p_max - v_n FOR UPDATE SKIP LOCKED
        LOOP
            -- We hold the message; force_finish holds the turn, then updates its waiting rows and messages.
            -- Take the turn first, without waiting: a busy turn is retried on the next claim.
            PERFORM 1 FROM state.turns WHERE turn_id = m.turn_id FOR UPDATE SKIP LOCKED;
            IF NOT FOUND AND EXISTS (SELECT 1 FROM state.turns WHERE turn_id = m.turn_id) THEN
                v_more := true;
                CONTINUE;
            END IF;
            SELECT * INTO w FROM state.turn_waiting_tools
             WHERE turn_id = m.turn_id AND step = m.step AND tool_call_id = m.tool_call_id;
            IF NOT FOUND OR w.wait_status <> 'waiting' OR w.turn_epoch IS DISTINCT FROM m.turn_epoch THEN
                PERFORM tw.inbox_archive(m.inbox_id, 'stale');
                CONTINUE;
            END IF;
            v_token := tw.inbox_take(m.inbox_id, p_worker);
            UPDATE state.turn_waiting_tools SET started_at = coalesce(started_at, now())
             WHERE turn_id = w.turn_id AND step = w.step AND tool_call_id = w.tool_call_id;
            v_jobs := v_jobs || jsonb_build_array(jsonb_build_object(
                'kind', 'tool', 'fence', 'inbox', 'id', m.inbox_id, 'token', v_token,
                'turn_id', w.turn_id, 'agent', w.agent, 'epoch', w.turn_epoch, 'step', w.step,
                'tool', w.tool, 'tool_call_id', w.tool_call_id, 'timeout_seconds', w.timeout_seconds,
                'doc', jsonb_build_object('tool_call_id', w.tool_call_id, 'tool', w.tool, 'args', w.args,
                                          'turn_id', w.turn_id)));
            v_n := v_n + 1;
        END LOOP;
    END IF;

    RETURN jsonb_build_object('jobs', v_jobs, 'publish', v_pub, 'more', v_more OR v_n >= p_max);
END $$;

-- Give claimed work back (graceful shutdown): another worker can take it at once.
CREATE OR REPLACE FUNCTION tw.release(p_fence text, p_id bigint, p_token bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_kind   text;
    v_target text;
BEGIN
    IF p_fence = 'ledger' THEN
        UPDATE state.turn_resume_ledger SET status = 'pending', lease_token = NULL, lease_expires_at = NULL,
               updated_at = now()
         WHERE ledger_id = p_id AND status = 'processing' AND lease_token = p_token
        RETURNING 'agent', agent INTO v_kind, v_target;
    ELSE
        UPDATE state.agent_inbox SET status = 'pending', processed_at = NULL, archived_at = NULL, claim_token = NULL
         WHERE inbox_id = p_id AND status = 'processing' AND claim_token = p_token
        RETURNING target_kind, target INTO v_kind, v_target;
    END IF;
    IF v_target IS NULL THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN tw.doorbell(v_kind, v_target, 'released');
END $$;

-- Ending turns ------------------------------------------------------------------------------------

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

CREATE OR REPLACE FUNCTION tw.finish_turn_idle(p_agent text, p_turn uuid, p_bump boolean, p_error text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint := tw.agent_idle(p_agent, p_turn, p_bump);
BEGIN
    IF v_epoch IS NULL THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN tw.agent_state_event(p_agent, 'idle', p_turn, v_epoch, p_error);
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

-- The output contract of a forced end (2.5, 2.6, turn deadline, cancel), in the caller's transaction:
-- finish_turn_idle (+epoch), record_force_termination, a fallback task.deliverable, the state event,
-- the final task event with deliverable_card_id, then dispatch_next. The caller holds the agent row
-- lock (when the turn is active) and has checked status and epoch.
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
    PERFORM tw.close_turn_work(t.turn_id, p_reason);
    INSERT INTO state.force_terminations (turn_id, agent, turn_epoch, reason, detail)
    VALUES (t.turn_id, t.agent, t.turn_epoch, p_reason,
            jsonb_build_object('status_before', v_was, 'step', t.step, 'message', p_message));
    -- Contract 11: another attempt instead of an end, when the agent's policy says so (0007_policies_fn.sql).
    v_pub := tw.retry_turn(t, p_reason, p_message, true);
    IF v_pub IS NOT NULL THEN
        RETURN v_pub;
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
    IF v_was <> 'pending' THEN
        v_pub := v_pub || tw.finish_turn_idle(t.agent, t.turn_id, true, p_reason);
    END IF;
    v_pub := v_pub || tw.task_event(t);
    IF v_was <> 'pending' THEN
        v_pub := v_pub || tw.dispatch_next(t.agent);
    END IF;
    RETURN v_pub;
END $$;

-- Apply the outcome of an agent step. p_fence is the claim job ({"fence","id","token","turn_id",
-- "epoch","step"}); p_reply is the validated reply: {"complete":{"output"}} | {"fail":{"error","message"}}
-- | {"tool_calls":[{"id","tool","args","timeout_seconds","wait_seconds","external"}],"wait":"all"|"any"|n,
-- "state"}. Returns json {"applied":bool,"publish":[...],"next"?}; a lost fence applies nothing. When the turn
-- ends and p_worker is given, the agent's next turn (if dispatch_next found one) is taken for p_worker in
-- the same transaction and returned as "next": the worker whose slot just freed runs it without another
-- claim round trip. While other turns wait for a slot, the slot goes to the oldest of them among p_agents
-- (the worker's agents) instead, so that slots are shared fairly.
DROP FUNCTION IF EXISTS tw.apply_step(jsonb, jsonb, text, text[]);
CREATE OR REPLACE FUNCTION tw.apply_step(p_fence jsonb, p_reply jsonb, p_worker text DEFAULT NULL,
                                         p_agents text[] DEFAULT NULL)
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
BEGIN
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
        v_pub := tw.agent_state_event(t.agent, 'idle', t.turn_id, t.turn_epoch) || tw.task_event(t);
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
            INSERT INTO state.turn_waiting_tools (turn_id, step, tool_call_id, call_index, agent, tool, args,
                                                  timeout_seconds, external, turn_epoch, deadline_at, call_card_id,
                                                  timeout_source, warn_at)
            VALUES (t.turn_id, t.step, v_call ->> 'id', v_i, t.agent, v_call ->> 'tool', v_call -> 'args',
                    (v_call ->> 'timeout_seconds')::integer, coalesce((v_call ->> 'external')::boolean, false),
                    t.turn_epoch, now() + make_interval(secs => (v_call ->> 'wait_seconds')::integer), v_card,
                    v_call ->> 'timeout_source',
                    now() + make_interval(secs => (v_call ->> 'warn_seconds')::double precision));
            IF NOT coalesce((v_call ->> 'external')::boolean, false) THEN
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
        v_pub := tw.agent_state_event(t.agent, 'suspended', t.turn_id, t.turn_epoch);
        FOREACH v_tool IN ARRAY v_tools LOOP
            v_pub := v_pub || tw.doorbell('tool', v_tool, 'tool.call');
        END LOOP;
    ELSE
        RAISE EXCEPTION 'apply_step: reply has none of complete, fail, tool_calls' USING ERRCODE = '22023';
    END IF;
    IF t.status IN ('done', 'failed', 'pending') THEN  -- pending: retried (step_failed)
        -- The agent goes idle (the event above) and on to its next turn, if any, in one row update.
        v_took := tw.dispatch(t.agent, p_worker, t.turn_id);
        v_pub := v_pub || (v_took -> 'publish');
        -- Its own next turn waits behind older ones: the freed slot goes to the oldest waiting turn of the
        -- agents this worker serves, in this same transaction.
        IF p_worker IS NOT NULL AND p_agents IS NOT NULL AND NOT (v_took ? 'job') THEN
            v_took := tw.claim_turns(p_worker, p_agents, 1);
            v_pub := v_pub || (v_took -> 'publish');
            v_took := jsonb_build_object('job', v_took -> 'jobs' -> 0);
        END IF;
    END IF;
    -- json, not jsonb: the answer is written out once, where a jsonb one would be built and then written.
    RETURN json_build_object('applied', true, 'publish', v_pub, 'next', v_took -> 'job');
END $$;

-- Tool results ------------------------------------------------------------------------------------

-- Deliver a result (from a tool program, the CLI, or a 2.2 timeout report) for the newest call with
-- that id in the turn. p_fence is the tool job's claim ({"id","token"}) or NULL. Returns
-- {"result": accepted|unknown_turn|unknown_call|ended|duplicate|stale|lost, "card_id", "publish"}.
CREATE OR REPLACE FUNCTION tw.deliver_result(p_turn uuid, p_call text, p_status text, p_output jsonb,
                                             p_error jsonb, p_fence jsonb, p_message_type text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    t      state.turns;
    w      state.turn_waiting_tools;
    v_card uuid;
    v_ok   boolean;
    v_res  text;
BEGIN
    -- Lock order: the turn before its inbox rows (as force_finish does).
    SELECT * INTO t FROM state.turns WHERE turn_id = p_turn FOR UPDATE;
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
    INSERT INTO state.agent_inbox (target_kind, target, message_type, turn_id, turn_epoch, step, tool_call_id,
                                   channel_id, payload)
    VALUES ('agent', t.agent, p_message_type, t.turn_id, t.turn_epoch, w.step, w.tool_call_id, t.channel_id,
            jsonb_build_object('card_id', v_card, 'status', p_status));
    RETURN jsonb_build_object('result', 'accepted', 'card_id', v_card,
                              'publish', tw.doorbell('agent', t.agent, p_message_type));
END $$;

-- Heartbeat ---------------------------------------------------------------------------------------

-- Renew what a worker holds: p_holdings = [{"fence","id","token","kind","turn_id","epoch","step",
-- "tool_call_id"}]. Returns the indexes (0-based) of holdings that were lost: reclaimed, reaped,
-- cancelled, or (for tools) no longer waited for. The worker stops those programs.
CREATE OR REPLACE FUNCTION tw.heartbeat(p_worker text, p_holdings jsonb, p_lease_s integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    h      record;
    v_lost jsonb := '[]'::jsonb;
    v_ok   boolean;
BEGIN
    -- Lock order as everywhere: agent, turn, then the inbox row or ledger entry; agents in name order so
    -- that a heartbeat and the PMO's dispatch scan never wait on each other in a cycle.
    FOR h IN
        SELECT e.value AS v, e.ordinality - 1 AS i
          FROM jsonb_array_elements(p_holdings) WITH ORDINALITY e
         ORDER BY e.value ->> 'agent', e.ordinality
    LOOP
        v_ok := true;
        IF h.v ->> 'kind' = 'step' THEN
            UPDATE state.agents SET updated_at = now()
             WHERE agent = h.v ->> 'agent' AND turn_epoch = (h.v ->> 'epoch')::bigint AND status = 'running';
            v_ok := NULL;
            UPDATE state.turns SET updated_at = now()
             WHERE turn_id = (h.v ->> 'turn_id')::uuid AND turn_epoch = (h.v ->> 'epoch')::bigint
               AND status = 'running' AND step = (h.v ->> 'step')::integer
            RETURNING true INTO v_ok;
        ELSIF h.v ->> 'kind' = 'tool' THEN
            v_ok := NULL;
            SELECT true INTO v_ok FROM state.turn_waiting_tools
             WHERE turn_id = (h.v ->> 'turn_id')::uuid AND step = (h.v ->> 'step')::integer
               AND tool_call_id = h.v ->> 'tool_call_id' AND wait_status = 'waiting';
        END IF;
        IF v_ok THEN
            v_ok := NULL;
            IF h.v ->> 'fence' = 'ledger' THEN
                UPDATE state.turn_resume_ledger
                   SET lease_expires_at = now() + make_interval(secs => p_lease_s), updated_at = now()
                 WHERE ledger_id = (h.v ->> 'id')::bigint AND status = 'processing'
                   AND lease_token = (h.v ->> 'token')::bigint
                RETURNING true INTO v_ok;
            ELSE
                UPDATE state.agent_inbox SET processed_at = now()
                 WHERE inbox_id = (h.v ->> 'id')::bigint AND status = 'processing'
                   AND claim_token = (h.v ->> 'token')::bigint
                RETURNING true INTO v_ok;
            END IF;
        END IF;
        IF v_ok IS NULL THEN
            v_lost := v_lost || to_jsonb(h.i);
        END IF;
    END LOOP;
    RETURN v_lost;
END $$;

-- Cancel (and the turn deadline rule in 0005_watchdogs.sql) -----------------------------------------

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
        SELECT agent INTO v_got FROM state.agents WHERE agent = v_agent FOR UPDATE SKIP LOCKED;
    END IF;
    IF v_got IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN tw.force_finish(p_turn, p_reason, p_final, p_message);
END $$;

CREATE OR REPLACE FUNCTION tw.cancel_turn(p_turn uuid)
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

-- Outbox relay ------------------------------------------------------------------------------------

-- Events not yet published and older than p_min_age_ms (their writer is given that long to publish
-- them itself), leased for p_lease_s so that several relays rarely publish the same one twice. The scan
-- starts at state.outbox_cursor, which then moves up to the oldest event still unpublished, but never past
-- the oldest transaction still running: its events, once committed, will be at or above the cursor.
CREATE OR REPLACE FUNCTION tw.outbox_claim(p_min_age_ms integer, p_lease_s integer, p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_from    xid8;
    v_horizon xid8 := pg_snapshot_xmin(pg_current_snapshot());
    v_to      xid8;
    v_out     jsonb;
BEGIN
    SELECT xid INTO v_from FROM state.outbox_cursor;
    -- A data-modifying WITH must be the top-level statement, hence SELECT ... INTO.
    WITH c AS (
        UPDATE state.outbox o SET relay_lease_until = now() + make_interval(secs => p_lease_s)
         WHERE event_id IN (SELECT event_id FROM state.outbox
                             WHERE xid >= v_from AND published_at IS NULL
                               AND created_at < now() - make_interval(secs => p_min_age_ms / 1000.0)
                               AND (relay_lease_until IS NULL OR relay_lease_until < now())
                             ORDER BY xid, seq LIMIT p_limit FOR UPDATE SKIP LOCKED)
        RETURNING o.xid, o.seq, o.event_id, o.subject, o.payload)
    SELECT coalesce(jsonb_agg(jsonb_build_object('event_id', event_id, 'subject', subject, 'data', payload)
                              ORDER BY xid, seq), '[]'::jsonb)
      INTO v_out
      FROM c;
    -- Every transaction below v_horizon has ended, so nothing can still appear below the new cursor.
    SELECT least(min(xid), v_horizon) INTO v_to FROM state.outbox WHERE xid >= v_from AND published_at IS NULL;
    UPDATE state.outbox_cursor SET xid = v_to WHERE xid < v_to;
    RETURN v_out;
END
$$;

CREATE OR REPLACE FUNCTION tw.outbox_mark_published(p_ids uuid[])
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    UPDATE state.outbox SET published_at = now() WHERE event_id = ANY (p_ids) AND published_at IS NULL;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
