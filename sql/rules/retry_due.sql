-- Retries (PMO): a retried turn is dispatched at its retry_at, and a turn that runs later at its not_before.

-- The PMO's rule for a pending turn that becomes ready at a time: at that time an idle agent takes it (a busy agent
-- takes it when its current turn ends). Its timers: 'not_before' (a turn submitted to run later, sql/fn/later.sql:
-- the timer is its only trace), all due at once taken together (tw.next_turns for their idle agents), and 'retry'
-- (a retried turn's retry_at: once per retry, retry_due_at is cleared), one by one (dispatch_next). Lock order:
-- the agents in name order, then the turns. Runs at once (common/watchdogs.c, parallel) share the later turns due
-- by their agents: each takes up to p_limit idle agents of the first 2 * p_limit timers that no other run holds
-- (SKIP LOCKED); the rest (timers of busy agents, retries) is the work of one run at a time (the first to take
-- the rule's advisory lock), so that runs never wait for each other.
CREATE OR REPLACE FUNCTION tw.wd_retry_due(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r        record;
    v_pub    jsonb := '[]'::jsonb;
    v_log    jsonb := '[]'::jsonb;
    v_res    jsonb;
    v_due    record;
    v_gone   record;
    v_agents text[];
    v_first  boolean := pg_try_advisory_xact_lock(hashtextextended('tw.retry_due', 0));
BEGIN
    -- Turns that run later: the due timers, and their agents that are idle, locked (one another transaction holds
    -- is left with its timer for the next run).
    SELECT array_agg(x.turn_id ORDER BY x.due_at) AS turns, array_agg(x.due_at ORDER BY x.due_at) AS dues,
           array_agg(DISTINCT t.agent) AS agents
      INTO v_due
      FROM (SELECT turn_id, due_at FROM state.turn_timers
             WHERE kind = 'not_before' AND due_at <= now() ORDER BY due_at LIMIT 2 * p_limit) x
      JOIN state.turns t ON t.turn_id = x.turn_id;
    IF v_due.turns IS NOT NULL THEN
        SELECT array_agg(s.agent) INTO v_agents
          FROM (SELECT a.agent FROM state.agents a WHERE a.agent = ANY (v_due.agents) AND a.status = 'idle'
                 ORDER BY a.agent LIMIT p_limit FOR UPDATE SKIP LOCKED) s;
        SELECT array_agg(d.turn_id) AS turns, array_agg(d.due_at) AS dues,
               coalesce(jsonb_agg(jsonb_build_object(
                            'agent', t.agent, 'turn_id', d.turn_id, 'attempt', t.attempt, 'timer', 'not_before',
                            'due', d.due_at) ORDER BY d.due_at)
                        FILTER (WHERE t.status = 'pending'), '[]'::jsonb) AS log
          INTO v_gone
          FROM unnest(v_due.turns, v_due.dues) d (turn_id, due_at) JOIN state.turns t ON t.turn_id = d.turn_id
          LEFT JOIN unnest(v_agents) g (agent) ON g.agent = t.agent  -- a join: = ANY of a variable is a linear scan
         WHERE g.agent IS NOT NULL OR (v_first AND NOT EXISTS (SELECT 1 FROM state.agents a
                                                                WHERE a.agent = t.agent AND a.status = 'idle'));
        IF v_gone.turns IS NOT NULL THEN
            PERFORM tw.turn_places_gone('not_before', v_gone.turns, v_gone.dues);
        END IF;
        v_log := v_gone.log;
        IF v_agents IS NOT NULL THEN
            v_pub := tw.next_turns(v_agents, array_fill(NULL::uuid, ARRAY[cardinality(v_agents)]), NULL, NULL)
                     -> 'publish';
        END IF;
        -- Lateness once the work is done (its commit follows at once).
        SELECT coalesce(jsonb_agg(a || jsonb_build_object('lateness_ms', tw.lateness_ms((a ->> 'due')::timestamptz))),
                        '[]'::jsonb)
          INTO v_log FROM jsonb_array_elements(v_log) a;
    END IF;
    FOR r IN
        SELECT t.turn_id, t.agent, t.attempt, t.turn_epoch, t.status, x.due_at AS retry_due_at
          FROM state.turn_timers x JOIN state.turns t ON t.turn_id = x.turn_id
         WHERE v_first AND x.kind = 'retry' AND x.due_at <= now()
         ORDER BY x.due_at LIMIT greatest(p_limit / 5, 1)  -- one by one: a fifth of the batch (common/watchdogs.c)
    LOOP
        PERFORM tw.turn_places_gone('retry', ARRAY[r.turn_id], ARRAY[r.retry_due_at]);
        CONTINUE WHEN r.status <> 'pending';  -- left behind: it was dispatched meanwhile, or has ended
        v_res := tw.dispatch_next(r.agent);
        UPDATE state.turns SET retry_due_at = NULL WHERE turn_id = r.turn_id AND retry_due_at = r.retry_due_at;
        CONTINUE WHEN NOT FOUND;
        v_pub := v_pub || v_res;
        v_log := v_log || jsonb_build_array(jsonb_build_object(
            'agent', r.agent, 'turn_id', r.turn_id, 'attempt', r.attempt, 'epoch', r.turn_epoch,
            'dispatched', jsonb_array_length(v_res) > 0, 'due', r.retry_due_at,
            'lateness_ms', tw.lateness_ms(r.retry_due_at)));
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- Due: the earliest retry_at of a retried turn still pending, or not_before of a turn that runs later
-- (turn_timers_due_idx).
CREATE OR REPLACE FUNCTION tw.due_retries()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT least((SELECT min(due_at) FROM state.turn_timers WHERE kind = 'retry'),
                 (SELECT min(due_at) FROM state.turn_timers WHERE kind = 'not_before'))
$$;
