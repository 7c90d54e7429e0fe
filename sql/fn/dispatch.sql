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

-- dispatch: if the agent is idle, hand it its oldest pending turn under a new epoch: tw.next_turns for one
-- agent (one definition of a dispatch; One active turn per agent, FIFO per agent). Without p_worker the turn is
-- announced (a pending `turn` message and a doorbell) for whichever worker claims it; with p_worker (the
-- worker whose slot the agent's last turn just freed) it is taken at once: the agent and turn go straight to
-- running and the message is inserted already claimed, with the same state events. Returns
-- {"publish":[...],"job"?}. The freed slot's other uses (the oldest turn waiting for one) are the caller's.
--
-- With p_ended, the caller (apply_step) holds the agent row and the agent's turn p_ended has just ended: the
-- agent goes idle here, or straight on to its next turn, in one row update instead of two (the caller emits
-- the idle state event either way). With p_locked, the caller (a submit) holds the agent row, which it found
-- idle. Otherwise the agent row is taken here and nothing happens unless the agent is idle.
CREATE OR REPLACE FUNCTION tw.dispatch(p_agent text, p_worker text, p_ended uuid DEFAULT NULL,
                                       p_locked boolean DEFAULT false)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
    v_took   jsonb;
BEGIN
    IF p_ended IS NULL AND NOT p_locked THEN
        SELECT a.status INTO v_status FROM state.agents a WHERE a.agent = p_agent FOR UPDATE;
        IF v_status IS DISTINCT FROM 'idle' THEN
            RETURN jsonb_build_object('publish', '[]'::jsonb);
        END IF;
    END IF;
    v_took := tw.next_turns(ARRAY[p_agent], ARRAY[p_ended], p_worker, NULL);
    IF jsonb_array_length(v_took -> 'jobs') > 0 THEN
        RETURN jsonb_build_object('publish', v_took -> 'publish', 'job', v_took -> 'jobs' -> 0);
    END IF;
    RETURN jsonb_build_object('publish', v_took -> 'publish');
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
           -- one with a ready turn: a queue of turns that run later (or retries) waits for its timers
           AND EXISTS (SELECT 1 FROM state.turn_queue q
                        WHERE q.agent = a.agent AND (q.ready_at IS NULL OR q.ready_at <= now()))
         ORDER BY a.agent LIMIT p_limit
    LOOP
        v_pub := v_pub || tw.dispatch_next(v_agent);
    END LOOP;
    RETURN v_pub;
END $$;
