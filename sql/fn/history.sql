-- Each turn's history (contract section 11): every transition, in the transaction that makes it.

-- Trigger: one history row per status (or attempt) change of a turn and at its creation. The reason is the
-- transaction setting tw.reason when the change set one (a retry, a replay), else what the change was.
-- Every move of a turn into an end (done, failed, timeout, cancelled), by whatever path, passes here: it sends
-- NOTIFY tw_turn_end with the turn id, delivered when the move commits (the Python Client's wait listens).
CREATE OR REPLACE FUNCTION tw.turns_history()
RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_from   text;
    v_reason text := nullif(current_setting('tw.reason', true), '');
BEGIN
    IF TG_OP = 'UPDATE' THEN
        v_from := OLD.status;
    END IF;
    IF v_reason IS NULL THEN
        v_reason := CASE
            WHEN v_from IS NULL THEN 'submitted'
            WHEN NEW.status IN ('failed', 'timeout', 'cancelled')
                THEN coalesce(NEW.error, NEW.status) || coalesce(': ' || NEW.error_message, '')
            WHEN NEW.status = 'done' THEN 'completed'
            WHEN NEW.status = 'dispatched' THEN 'dispatched'
            WHEN NEW.status = 'suspended' THEN 'waiting for tool calls'
            WHEN NEW.status = 'running' AND v_from = 'suspended' THEN 'resumed'
            WHEN NEW.status = 'running' AND v_from = 'pending' THEN 'dispatched and claimed'
            WHEN NEW.status = 'running' THEN 'claimed'
        END;
    END IF;
    INSERT INTO state.turn_history (turn_id, from_status, to_status, turn_epoch, attempt, actor, reason, profile)
    VALUES (NEW.turn_id, v_from, NEW.status, NEW.turn_epoch, NEW.attempt,
            coalesce(nullif(current_setting('tw.actor', true), ''), 'sql'), v_reason,  -- tw.actor(), inlined
            NEW.profile);
    IF NEW.status IN ('done', 'failed', 'timeout', 'cancelled') AND v_from IS DISTINCT FROM NEW.status THEN
        PERFORM pg_notify('tw_turn_end', NEW.turn_id::text);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER turns_history_insert AFTER INSERT ON state.turns
    FOR EACH ROW EXECUTE FUNCTION tw.turns_history();

CREATE OR REPLACE TRIGGER turns_history_update AFTER UPDATE OF status, attempt ON state.turns
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.attempt IS DISTINCT FROM NEW.attempt)
    EXECUTE FUNCTION tw.turns_history();

-- A reclaim hands a turn's step to another worker without changing its status: it is written to the history
-- here (agent steps only; p_item is the reclaimed inbox item or ledger entry as the reclaim logs it).
CREATE OR REPLACE FUNCTION tw.note_reclaim(p_item jsonb, p_why text)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO state.turn_history (turn_id, from_status, to_status, turn_epoch, attempt, actor, reason, profile)
    SELECT t.turn_id, t.status, t.status, t.turn_epoch, t.attempt, tw.actor(),
           format('reclaimed: %s; step %s goes to another worker', p_why, (p_item ->> 'step')::integer - t.step_base),
           t.profile
      FROM state.turns t
     WHERE t.turn_id = (p_item ->> 'turn_id')::uuid AND coalesce(p_item ->> 'target_kind', 'agent') = 'agent'
$$;

-- `turnwatch turn history ID`: every transition in order.
CREATE OR REPLACE FUNCTION tw.turn_history(p_turn uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('at', h.at, 'from', h.from_status, 'to', h.to_status,
                                                 'turn_epoch', h.turn_epoch, 'attempt', h.attempt,
                                                 'actor', h.actor, 'reason', h.reason) ORDER BY h.id),
                    '[]'::jsonb)
      FROM state.turn_history h
     WHERE h.turn_id = p_turn
$$;
