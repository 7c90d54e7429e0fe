-- Where a turn is found, kept in step with its status (schema/0015_hot_path.sql): no index of state.turns keys on
-- its status or its due times, so that its row changes in place (HOT); the dispatch and the rules find turns
-- through narrow tables inserted and deleted as the turn moves. The hot paths (submit, dispatch, claim, apply)
-- keep them in step with set-based statements of their own; every other path that changes a turn's status calls
-- tw.turn_moved with the turn as it is now.

-- The turn's place: its agent's queue while pending, turn_dispatched while dispatched, turn_running while running;
-- none while suspended (its waiting calls are its place) or once ended; and its timers as its columns say.
CREATE OR REPLACE FUNCTION tw.turn_moved(t state.turns)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF t.status <> 'pending' THEN
        DELETE FROM state.turn_queue WHERE agent = t.agent AND seq = t.seq;
    END IF;
    IF t.status <> 'dispatched' THEN
        DELETE FROM state.turn_dispatched WHERE turn_id = t.turn_id;
    END IF;
    IF t.status <> 'running' THEN
        DELETE FROM state.turn_running WHERE turn_id = t.turn_id;
    END IF;
    CASE t.status
    WHEN 'pending' THEN
        INSERT INTO state.turn_queue (agent, seq, turn_id, profile, ready_at)
        VALUES (t.agent, t.seq, t.turn_id, t.profile, tw.turn_ready_at(t))
        ON CONFLICT (agent, seq) DO UPDATE SET ready_at = EXCLUDED.ready_at;
    WHEN 'dispatched' THEN
        INSERT INTO state.turn_dispatched (turn_id, agent, profile, since)
        VALUES (t.turn_id, t.agent, t.profile, now())
        ON CONFLICT (turn_id) DO NOTHING;
    WHEN 'running' THEN
        INSERT INTO state.turn_running (turn_id, agent, profile, beat_at)
        VALUES (t.turn_id, t.agent, t.profile, now())
        ON CONFLICT (turn_id) DO UPDATE SET beat_at = EXCLUDED.beat_at;
    ELSE
        NULL;
    END CASE;
    PERFORM tw.turn_timers_set(t);
END $$;

-- A turn's timers as its columns and status say: the deadline and its warning while it has not ended, the queue
-- budget and its warning until it runs, the retry time while it is pending. A timer that fired was cleared in
-- its column by the rule that fired it.
CREATE OR REPLACE FUNCTION tw.turn_timers_set(t state.turns)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_open   boolean := t.status IN ('pending', 'dispatched', 'running', 'suspended');
    v_queued boolean := t.status IN ('pending', 'dispatched');
BEGIN
    DELETE FROM state.turn_timers WHERE turn_id = t.turn_id;
    IF NOT v_open THEN
        RETURN;
    END IF;
    INSERT INTO state.turn_timers (turn_id, kind, due_at)
    SELECT t.turn_id, k.kind, k.due_at
      FROM (VALUES ('deadline', t.deadline_at), ('deadline_warn', t.deadline_warn_at),
                   ('queue', CASE WHEN v_queued THEN t.queue_deadline_at END),
                   ('queue_warn', CASE WHEN v_queued THEN t.queue_warn_at END),
                   ('retry', CASE WHEN t.status = 'pending' THEN t.retry_due_at END),
                   -- A turn that runs later (sql/fn/later.sql), until its time.
                   ('not_before', CASE WHEN t.status = 'pending' AND t.not_before > now() THEN t.not_before END))
           k (kind, due_at)
     WHERE k.due_at IS NOT NULL;
END $$;
