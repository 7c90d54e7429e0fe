-- Each turn's history (docs/timeouts.md): every transition, in the transaction that makes it.

-- The history row of a move of turn t from status p_from (NULL: its creation), one definition for the move
-- functions (fn/phase.sql) and the creation trigger below. The reason is what the change was, from the row
-- alone; a change that has more to say (a retry, a replay) rewrites the reason of the row it made
-- (tw.history_reason), so that no session setting, which a client could set too, writes it. The actor is
-- tw.actor() (a daemon's id only from a daemon's session). Inlined where it is called.
CREATE OR REPLACE FUNCTION tw.history_row_reason(p_from text, t state.turns)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_from IS NULL THEN 'submitted'
        WHEN t.status IN ('failed', 'timeout', 'cancelled')
            THEN coalesce(t.error, t.status) || coalesce(': ' || t.error_message, '')
        WHEN t.status = 'done' THEN 'completed'
        WHEN t.status = 'dispatched' THEN 'dispatched'
        WHEN t.status = 'suspended' THEN 'waiting for tool calls'
        WHEN t.status = 'running' AND p_from = 'suspended' THEN 'resumed'
        WHEN t.status = 'running' AND p_from = 'pending' THEN 'dispatched and claimed'
        WHEN t.status = 'running' THEN 'claimed'
    END
$$;

-- Turns p_turns have just moved into an end (done, failed, timeout, cancelled), by whatever path (the move
-- functions call this): when someone waits for one (tw.turn_wait), its waiters' rows go and NOTIFY tw_turn_end
-- carries the turn id, delivered when the move commits. A statement of its own, so with a snapshot of its own:
-- a waiter that registered while the move waited for the turn's row (tw.turn_wait holds it FOR SHARE) is seen.
-- PL/pgSQL, not SQL: its statement planned once a session, not at every call (see tw.actor).
CREATE OR REPLACE FUNCTION tw.turns_ended(p_turns uuid[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_waited uuid[];
BEGIN
    WITH w AS (DELETE FROM state.turn_waiters WHERE turn_id = ANY (p_turns) RETURNING turn_id)
    SELECT array_agg(DISTINCT w.turn_id) INTO v_waited FROM w;
    IF v_waited IS NOT NULL THEN
        PERFORM pg_notify('tw_turn_end', x::text) FROM unnest(v_waited) x;
    END IF;
END $$;

-- Trigger: a turn's first history row, at its creation (its moves write theirs: fn/phase.sql).
CREATE OR REPLACE FUNCTION tw.turns_history()
RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO state.turn_history (turn_id, from_status, to_status, turn_epoch, attempt, actor, reason, profile)
    VALUES (NEW.turn_id, NULL, NEW.status, NEW.turn_epoch, NEW.attempt, tw.actor(), tw.history_row_reason(NULL, NEW),
            NEW.profile);
    RETURN NULL;
END $$;

-- The reason of the history row that the caller's own change of turn p_turn has just written: with p_created
-- the turn's first row (a replay's new turn), else the row that made attempt p_attempt (a retry's, back to
-- pending). The caller holds the turn row, or has just created it.
CREATE OR REPLACE FUNCTION tw.history_reason(p_turn uuid, p_attempt integer, p_created boolean, p_reason text)
RETURNS void LANGUAGE sql AS $$
    UPDATE state.turn_history h SET reason = p_reason
     WHERE h.turn_id = p_turn AND h.attempt = p_attempt
       AND CASE WHEN p_created THEN h.from_status IS NULL
                ELSE h.from_status IS NOT NULL AND h.to_status = 'pending' END
$$;

CREATE OR REPLACE TRIGGER turns_history_insert AFTER INSERT ON state.turns
    FOR EACH ROW EXECUTE FUNCTION tw.turns_history();

-- A move's row is written by the move (release 3 had a trigger for it, a PL/pgSQL call a row).
DROP TRIGGER IF EXISTS turns_history_update ON state.turns;

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
                                                 'actor', h.actor, 'reason', h.reason)
                              -- A wait for limits (sql/fn/turn_limits.sql): from when, for which limit, which call.
                              || jsonb_strip_nulls(jsonb_build_object('waited_from', h.waited_from,
                                                                      'limit', h.wait_limit,
                                                                      'tool_call_id', h.tool_call_id))
                              ORDER BY h.id),
                    '[]'::jsonb)
      FROM state.turn_history h
     WHERE h.turn_id = p_turn
$$;
