-- Dead letters and replay (docs/timeouts.md).

-- The turns whose last attempt ended failed or timeout, newest first, with how often each was replayed.
-- One agent's: its turns newest first (turns_agent_idx). All: the history rows of final failed or timeout
-- ends, newest first (turn_history_dead_idx); state.turns has no index on its status.
CREATE OR REPLACE FUNCTION tw.dead_letters(p_agent text DEFAULT NULL, p_limit integer DEFAULT 100)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_ids uuid[];
BEGIN
    PERFORM tw.check_limit(p_limit, 100000);
    IF p_agent IS NULL THEN
        v_ids := ARRAY(SELECT h.turn_id FROM state.turn_history h WHERE h.to_status IN ('failed', 'timeout')
                        ORDER BY h.at DESC LIMIT p_limit);
    ELSE
        v_ids := ARRAY(SELECT t.turn_id FROM state.turns t
                        WHERE t.agent = p_agent AND t.status IN ('failed', 'timeout')
                        ORDER BY t.ended_at DESC LIMIT p_limit);
    END IF;
    RETURN (
    SELECT coalesce(jsonb_agg(to_jsonb(x) ORDER BY x.ended_at DESC, x.turn_id), '[]'::jsonb)
      FROM (SELECT t.turn_id, t.agent, t.channel_id, t.status, t.error, t.error_message, t.attempt,
                   (tw.policy(t.profile)).max_attempts, t.created_at, t.ended_at, t.replay_of, t.timeout_detail,
                   (SELECT count(*) FROM state.turns r WHERE r.replay_of = t.turn_id) AS replays
              FROM state.turns t
             WHERE t.turn_id = ANY (v_ids) AND t.status IN ('failed', 'timeout')
             ORDER BY t.ended_at DESC LIMIT p_limit) x);
END $$;

-- Replay a dead letter: a new turn with the same agent, channel, box, input and --timeout, replay_of = the old
-- one. Without p_again a turn that was replayed already gives its first replay back (created false), so a
-- repeated command does not run it twice.
CREATE OR REPLACE FUNCTION tw.replay_turn(p_turn uuid, p_again boolean DEFAULT false)
RETURNS TABLE (turn_id uuid, created boolean) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    o    state.turns;
    v_id uuid;
BEGIN
    -- Replays of one turn one at a time (not its row lock: lock order wants the agent first).
    PERFORM pg_advisory_xact_lock(hashtextextended('tw.replay:' || p_turn::text, 0));
    SELECT * INTO o FROM state.turns t WHERE t.turn_id = p_turn;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no turn %', p_turn USING ERRCODE = '22023';
    END IF;
    IF o.status NOT IN ('failed', 'timeout') THEN
        RAISE EXCEPTION 'turn % is not a dead letter: it is %', p_turn, o.status USING ERRCODE = '22023';
    END IF;
    IF NOT p_again THEN
        SELECT r.turn_id INTO v_id FROM state.turns r WHERE r.replay_of = p_turn ORDER BY r.seq LIMIT 1;
        IF v_id IS NOT NULL THEN
            PERFORM tw.durable_answer();
            RETURN QUERY SELECT v_id, false;
            RETURN;
        END IF;
    END IF;
    -- The same agent and profile (a retired agent cannot be replayed: submit refuses it).
    SELECT s.turn_id INTO v_id
      FROM tw.submit_turn_ex(o.agent, o.channel_id, o.input, o.timeout_seconds, NULL, o.output_box_id, o.profile) s;
    PERFORM tw.history_reason(v_id, (SELECT r.attempt FROM state.turns r WHERE r.turn_id = v_id), true,
                              'replay of ' || p_turn);
    UPDATE state.turns u SET replay_of = p_turn WHERE u.turn_id = v_id;
    RETURN QUERY SELECT v_id, true;
END $$;
