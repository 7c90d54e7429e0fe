-- Dispatch: an idle agent takes its oldest pending turn under a new epoch (dispatch_next in docs/watchdogs.md).

-- A dispatch starts the clocks of rules 2.4, 2.5 and 2.7 (a take, of 2.6): the PMOs must ask again when they
-- are next due, or a clock shorter than their sweep is found a sweep late. The daemons wake each other for
-- their own dispatches (cmd.pmo.wakeup on NATS, or the PMO asks itself), so their sessions say so
-- (tw.wakes = 'nats', set on every daemon session); any other transaction that dispatches (a submit, a cancel,
-- a SQL API call) tells the PMOs at its commit: NOTIFY tw_due, transactional and without NATS. Every dispatch,
-- one by one (tw.dispatch) or many at once (tw.next_turns), calls this. A NOTIFY serialises the commits of the
-- transactions that send one, so the daemons' hot path sends none.
CREATE OR REPLACE FUNCTION tw.dispatch_arms()
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('tw.wakes', true) IS DISTINCT FROM 'nats' THEN
        PERFORM pg_notify('tw_due', 'dispatch');
    END IF;
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
-- the idle state event either way). With p_locked, the caller (a submit) holds the agent row, which it found
-- idle.
CREATE OR REPLACE FUNCTION tw.dispatch(p_agent text, p_worker text, p_ended uuid DEFAULT NULL,
                                       p_locked boolean DEFAULT false)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    a       state.agents;
    t       state.turns;
    v_epoch bigint;
    v_token bigint;
    v_inbox bigint;
    v_take  boolean := p_worker IS NOT NULL;
    v_pub   jsonb;
    v_next  uuid;
BEGIN
    IF p_ended IS NULL AND NOT p_locked THEN
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
    -- The head of its queue (a retried turn waits for its retry_at); the agent row we hold is what makes it
    -- ours: every dispatch of this agent holds it.
    -- (tw.turns_move takes it out of the queue.)
    SELECT q.turn_id INTO v_next FROM state.turn_queue q
     WHERE q.agent = p_agent AND (q.ready_at IS NULL OR q.ready_at <= now())
     ORDER BY q.seq LIMIT 1;
    IF v_next IS NOT NULL THEN
        SELECT * INTO t FROM state.turns WHERE turn_id = v_next FOR UPDATE;
    END IF;
    IF v_next IS NULL OR t.status <> 'pending' THEN
        IF v_next IS NOT NULL THEN
            PERFORM tw.turns_move(ARRAY[t], true);  -- left in the queue: put it where its status says
        END IF;
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
    t.status := CASE WHEN v_take THEN 'running' ELSE 'dispatched' END;
    t.turn_epoch := v_epoch;
    t.dispatched_at := now();
    t.started_at := CASE WHEN v_take THEN now() END;
    t.updated_at := now();
    t := tw.turn_move(t);
    IF v_take THEN
        v_token := nextval('state.claim_token_seq');
    END IF;
    INSERT INTO state.agent_inbox (target_kind, target, profile, turn_seq, message_type, turn_id, turn_epoch, step,
                                   channel_id, payload, status, processed_at, claim_token, claimed_by, attempts)
    VALUES ('agent', p_agent, t.profile, t.seq, 'turn', t.turn_id, v_epoch, t.step, t.channel_id,
            jsonb_build_object('turn_id', t.turn_id, 'epoch', v_epoch),
            CASE WHEN v_take THEN 'processing' ELSE 'pending' END, CASE WHEN v_take THEN now() END, v_token,
            p_worker, CASE WHEN v_take THEN 1 ELSE 0 END)
    RETURNING inbox_id INTO v_inbox;
    PERFORM tw.dispatch_arms();
    v_pub := tw.agent_state_event(p_agent, t.profile, 'dispatched', t.turn_id, v_epoch);
    IF NOT v_take THEN
        RETURN jsonb_build_object('publish', v_pub || tw.doorbell('agent', p_agent, 'dispatch', t.profile));
    END IF;
    RETURN jsonb_build_object(
        'publish', v_pub || tw.agent_state_event(p_agent, t.profile, 'running', t.turn_id, v_epoch),
        'job', tw.step_job('inbox', v_inbox, v_token, t));
END $$;

-- dispatch_next: announce the agent's next turn, if it is idle and has one.
CREATE OR REPLACE FUNCTION tw.dispatch_next(p_agent text)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN tw.dispatch(p_agent, NULL) -> 'publish';
END $$;

-- The PMO's scan: dispatch for every idle agent that has pending turns. The agents with pending turns are
-- found by skipping through the queue's primary key one agent at a time (a loose index scan), so the scan costs one
-- index probe per such agent, however many agents are registered and however many turns wait.
CREATE OR REPLACE FUNCTION tw.dispatch_pending(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_agent text;
    v_pub   jsonb := '[]'::jsonb;
BEGIN
    FOR v_agent IN
        WITH RECURSIVE pa(agent) AS (
            (SELECT q.agent FROM state.turn_queue q ORDER BY q.agent, q.seq LIMIT 1)
            UNION ALL
            SELECT (SELECT q.agent FROM state.turn_queue q WHERE q.agent > pa.agent ORDER BY q.agent, q.seq LIMIT 1)
              FROM pa WHERE pa.agent IS NOT NULL)
        SELECT a.agent FROM pa JOIN state.agents a ON a.agent = pa.agent
         WHERE a.status = 'idle'
         ORDER BY a.agent LIMIT p_limit
    LOOP
        v_pub := v_pub || tw.dispatch_next(v_agent);
    END LOOP;
    RETURN v_pub;
END $$;
