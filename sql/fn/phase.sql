-- How a turn's status moves (docs/hacking.md, "How a turn's status moves"): through tw.turns_move, and nowhere
-- else. No index of state.turns keys on its due times, so that its row changes in place (HOT); the dispatch and
-- the rules find turns through narrow tables (schema/0015_hot_path.sql) that tw.turns_move keeps in step with the
-- status, in the same call as the move. tests/check-moves fails when any other file of sql/ sets
-- state.turns.status or writes a narrow table's rows in or out.
--
-- Why one set-based function given the new rows (and not a trigger, nor one function per path):
--   - set-based: force_finish_set, complete_set and next_turns move many turns at once, and a one-row path
--     passes ARRAY[t] (one turn takes a shorter way through the same rules: see below);
--   - given the rows as they are to be (the caller changes its copy: `t.status := ...` in plpgsql,
--     jsonb_populate_record(t, patch) in a statement), so each path says what it changes and this function
--     alone writes status and the columns a move sets, then the narrow tables;
--   - a statement-level trigger with transition tables would do the narrow tables too, but every UPDATE of
--     state.turns (heartbeats included) would then pay for capturing its rows, and moves would stay written
--     in eleven files.
-- The history row of a move that changes a turn's status or attempt is written here too, its reason by
-- tw.history_row_reason (fn/history.sql, which also has the trigger for a turn's creation), and a move into an
-- end tells that turn's waiters (tw.turns_ended). A row trigger did it before: a PL/pgSQL call a row (the set
-- path of 1,000 later turns 6 % fewer instructions without it, the lone turn 1.5 %).
-- The events stay the caller's, built by fn/events.sql: each move says something different (idle with a
-- reason, dispatched, running, a retry), and set-based callers put them in the same statement as the move.
--
-- A turn's place: its agent's queue while pending, turn_dispatched while dispatched, turn_running while
-- running; none while suspended (its waiting calls are its place) or once ended. Its timers as its columns and
-- status say (tw.turn_timer_dues below; a timer that fired was cleared in its column by the rule that fired it).
--
-- A turn's timers, one definition: kinds in this order (the CHECK of state.turn_timers' kind lists them) ...
CREATE OR REPLACE FUNCTION tw.turn_timer_kinds()
RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY['deadline', 'deadline_warn', 'queue', 'queue_warn', 'retry', 'not_before']
$$;

-- ... and when each is due for turn t as its columns and status say (NULL: it has none): the deadline and its
-- warning while it has not ended, the queue budget and its warning until it runs, the retry time while it is
-- pending, a later turn's not_before until then (fn/later.sql). Inlined where it is called.
CREATE OR REPLACE FUNCTION tw.turn_timer_dues(t state.turns)
RETURNS timestamptz[] LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN t.status IN ('pending', 'dispatched', 'running', 'suspended') THEN
               ARRAY[t.deadline_at, t.deadline_warn_at,
                     CASE WHEN t.status IN ('pending', 'dispatched') THEN t.queue_deadline_at END,
                     CASE WHEN t.status IN ('pending', 'dispatched') THEN t.queue_warn_at END,
                     CASE WHEN t.status = 'pending' THEN t.retry_due_at END,
                     CASE WHEN t.status = 'pending' AND t.not_before > now() THEN t.not_before END]
           ELSE ARRAY[NULL, NULL, NULL, NULL, NULL, NULL]::timestamptz[] END
$$;

-- p_rows: the turns as they are to be (their status and the columns a move sets: the SET of its row update
-- in tw.turns_move_set, and tw.turn_move's for one turn); the caller holds their rows and checked the
-- compare-and-set. The deadline, its warning and not_before are no move's: a submit, a delegation or a policy
-- change writes them and passes p_written. With p_written, the rows are already in state.turns as
-- given (a turn just inserted, or a column other than status changed): only their place and timers are written.
-- Returns the rows as written. One turn (most moves) is tw.turn_move's; many, tw.turns_move_set's.
CREATE OR REPLACE FUNCTION tw.turns_move(p_rows state.turns[], p_written boolean DEFAULT false)
RETURNS SETOF state.turns LANGUAGE plpgsql AS $$
DECLARE
    v_one state.turns;
BEGIN
    IF cardinality(p_rows) = 1 THEN
        v_one := tw.turn_move(p_rows[1], p_written);
        IF v_one.turn_id IS NOT NULL THEN
            RETURN NEXT v_one;
        END IF;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM tw.turns_move_set(p_rows, p_written);
END $$;

-- Many turns, as tw.turns_move (which gives them to this function).
--
-- Its statements are planned once per session (plan_cache_mode = force_generic_plan): given the rows as a
-- value, the planner would find a plan for exactly those rows cheaper than the generic one every time, and plan this
-- statement again at each call, which cost more than the whole move (docs/performance.md). The generic plan
-- knows only that the rows are "some" (ten, it guesses) and would join them to the narrow tables by scanning
-- those whole and hashing (a queue of 3,000 pending turns read for every move); a move touches a handful of
-- rows, each by its primary key, so scans and hash or merge joins are off for this function's statements.
CREATE OR REPLACE FUNCTION tw.turns_move_set(p_rows state.turns[], p_written boolean DEFAULT false)
RETURNS SETOF state.turns LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_hashjoin = off
SET enable_mergejoin = off AS $$
DECLARE
    v_rows  state.turns[];
    v_ended uuid[];
BEGIN
    -- The row update: a statement of its own (inside the narrow tables' statement, as a function scan, it
    -- cost 3.5 ms a call in the 3,000-turn bench), and in this function rather than one it calls (that call
    -- and its tuplestore cost ~50k instructions a one-turn move, callgrind).
    IF p_written THEN
        v_rows := p_rows;
    ELSE
        IF EXISTS (SELECT 1 FROM unnest(p_rows) r WHERE r.flow_limits IS NOT NULL) THEN
            PERFORM tw.flow_moves_release(p_rows);  -- limited turns leaving their run: their limits back
        END IF;
        WITH w AS (
            UPDATE state.turns t
               SET status = r.status, turn_epoch = r.turn_epoch, attempt = r.attempt, step = r.step,
                   step_base = r.step_base, agent_state = r.agent_state, wait_mode = r.wait_mode,
                   wait_count = r.wait_count, resume_deadline = r.resume_deadline, error = r.error,
                   error_message = r.error_message, timeout_detail = r.timeout_detail,
                   deliverable_card_id = r.deliverable_card_id, dispatched_at = r.dispatched_at,
                   started_at = r.started_at, suspended_at = r.suspended_at, ended_at = r.ended_at,
                   rerung_at = r.rerung_at, retry_at = r.retry_at, retry_due_at = r.retry_due_at,
                   queue_deadline_at = r.queue_deadline_at, queue_warn_at = r.queue_warn_at, updated_at = r.updated_at
              FROM unnest(p_rows) r JOIN state.turns o ON o.turn_id = r.turn_id
             WHERE t.turn_id = r.turn_id
            RETURNING t, o.status AS o_status, o.attempt AS o_attempt  -- o: the row as it was, for its history
        ), h AS (
            INSERT INTO state.turn_history (turn_id, from_status, to_status, turn_epoch, attempt, actor, reason,
                                            profile)
            SELECT (w.t).turn_id, w.o_status, (w.t).status, (w.t).turn_epoch, (w.t).attempt, tw.actor(),
                   tw.history_row_reason(w.o_status, w.t), (w.t).profile
              FROM w
             WHERE w.o_status IS DISTINCT FROM (w.t).status OR w.o_attempt IS DISTINCT FROM (w.t).attempt
        )
        SELECT coalesce(array_agg(w.t), '{}'),
               array_agg((w.t).turn_id) FILTER (WHERE (w.t).status IN ('done', 'failed', 'timeout', 'cancelled')
                                                  AND w.o_status IS DISTINCT FROM (w.t).status)
          INTO v_rows, v_ended FROM w;
        IF v_ended IS NOT NULL THEN
            PERFORM tw.turns_ended(v_ended);
        END IF;
    END IF;
    RETURN QUERY
    WITH u AS (
        SELECT * FROM unnest(v_rows)
    ), qd AS (
        DELETE FROM state.turn_queue x USING u WHERE u.status <> 'pending' AND x.agent = u.agent AND x.seq = u.seq
    ), qi AS (
        INSERT INTO state.turn_queue (agent, seq, turn_id, profile, ready_at)
        SELECT u.agent, u.seq, u.turn_id, u.profile, tw.turn_ready_at(ROW(u.*)::state.turns) FROM u WHERE u.status = 'pending'
        ON CONFLICT (agent, seq) DO UPDATE SET ready_at = EXCLUDED.ready_at
            WHERE state.turn_queue.ready_at IS DISTINCT FROM EXCLUDED.ready_at
    ), dd AS (
        DELETE FROM state.turn_dispatched x USING u WHERE u.status <> 'dispatched' AND x.turn_id = u.turn_id
    ), di AS (
        INSERT INTO state.turn_dispatched (turn_id, agent, profile)
        SELECT u.turn_id, u.agent, u.profile FROM u WHERE u.status = 'dispatched'
        ON CONFLICT (turn_id) DO NOTHING
    ), rd AS (
        DELETE FROM state.turn_running x USING u WHERE u.status <> 'running' AND x.turn_id = u.turn_id
    ), ri AS (
        INSERT INTO state.turn_running (turn_id, agent, profile)
        SELECT u.turn_id, u.agent, u.profile FROM u WHERE u.status = 'running'
        ON CONFLICT (turn_id) DO UPDATE SET beat_at = now() WHERE NOT p_written  -- a move is a sign of life
    ), k AS (
        SELECT u.turn_id, k.kind, k.due_at
          FROM u CROSS JOIN LATERAL unnest(tw.turn_timer_kinds(), tw.turn_timer_dues(ROW(u.*)::state.turns)) k (kind, due_at)
         WHERE k.due_at IS NOT NULL
    ), kd AS (
        -- A timer the row no longer has, or has for another time. (Deleted and inserted in one statement: a
        -- row this statement deletes is no conflict for its insert, and one it updated is skipped here.)
        DELETE FROM state.turn_timers x USING u
         WHERE x.turn_id = u.turn_id
           AND NOT EXISTS (SELECT 1 FROM k WHERE k.turn_id = x.turn_id AND k.kind = x.kind AND k.due_at = x.due_at)
    ), ki AS (
        -- Only the timers not there already: an upsert of an unchanged one would still lock and log its row.
        INSERT INTO state.turn_timers (turn_id, kind, due_at)
        SELECT k.turn_id, k.kind, k.due_at FROM k
         WHERE NOT EXISTS (SELECT 1 FROM state.turn_timers x
                            WHERE x.turn_id = k.turn_id AND x.kind = k.kind AND x.due_at = k.due_at)
        ON CONFLICT (turn_id, kind) DO UPDATE SET due_at = EXCLUDED.due_at
    )
    SELECT u.* FROM u;
END $$;

-- One turn, as tw.turns_move: the turn t as it is to be; returns it as written (NULL: no such turn). Most
-- moves are of one turn (a submit, a dispatch, a claim, a step applied), and tw.turns_move gives a one-turn
-- call to this function: the set-based statements start up their eleven parts whatever they have to do, which
-- cost more than the few small statements a one-turn move needs (docs/performance.md). So one turn takes
-- those, by the same rules: its row update sets the same columns, its place leaves the table of the status it
-- had for that of its new one, and its timers are those tw.turn_timer_dues says. No SET clause (a function's
-- SET costs its every call more than its statements here: they find one row each by its key). The `moves` case
-- of test_sqlapi moves one turn and two at once through every status and compares what each left.
CREATE OR REPLACE FUNCTION tw.turn_move(t state.turns, p_written boolean DEFAULT false)
RETURNS state.turns LANGUAGE plpgsql AS $$
DECLARE
    v_from text;
    v_att  integer;
    v_had  boolean := true;
    v_dues timestamptz[];
BEGIN
    IF p_written THEN
        v_from := t.status;  -- a turn just inserted, or another column changed: no place to leave
    ELSE
        IF t.flow_limits IS NOT NULL THEN
            PERFORM tw.flow_moves_release(ARRAY[t]);  -- a limited turn leaving its run: its limits back
        END IF;
        -- The SET of tw.turns_move_set's row update. Its old row (o) says the status it leaves and whether it
        -- may have timers: none while none of their columns is set (a rule that fires a timer deletes its row,
        -- then clears the column; a move clears one only here). The row as written is t, the columns its place
        -- and timers depend on and the move does not set read back (the others are as the caller read them,
        -- holding the row): one statement less, and the row not read back whole (~100k instructions a lone turn).
        UPDATE state.turns x
           SET status = t.status, turn_epoch = t.turn_epoch, attempt = t.attempt, step = t.step,
               step_base = t.step_base, agent_state = t.agent_state, wait_mode = t.wait_mode,
               wait_count = t.wait_count, resume_deadline = t.resume_deadline, error = t.error,
               error_message = t.error_message, timeout_detail = t.timeout_detail,
               deliverable_card_id = t.deliverable_card_id, dispatched_at = t.dispatched_at,
               started_at = t.started_at, suspended_at = t.suspended_at, ended_at = t.ended_at,
               rerung_at = t.rerung_at, retry_at = t.retry_at, retry_due_at = t.retry_due_at,
               queue_deadline_at = t.queue_deadline_at, queue_warn_at = t.queue_warn_at, updated_at = t.updated_at
          FROM state.turns o
         WHERE x.turn_id = t.turn_id AND o.turn_id = t.turn_id
        RETURNING o.status, o.attempt, num_nonnulls(o.deadline_at, o.deadline_warn_at, o.queue_deadline_at, o.queue_warn_at,
                                         o.retry_due_at, o.not_before) > 0, x.deadline_at, x.deadline_warn_at,
                  x.not_before
             INTO v_from, v_att, v_had, t.deadline_at, t.deadline_warn_at, t.not_before;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        -- Its history row (the set-based one's in tw.turns_move_set), and its waiters told of an end.
        IF v_from IS DISTINCT FROM t.status OR v_att IS DISTINCT FROM t.attempt THEN
            INSERT INTO state.turn_history (turn_id, from_status, to_status, turn_epoch, attempt, actor, reason,
                                            profile)
            VALUES (t.turn_id, v_from, t.status, t.turn_epoch, t.attempt, tw.actor(),
                    tw.history_row_reason(v_from, t), t.profile);
            IF t.status IN ('done', 'failed', 'timeout', 'cancelled') AND v_from IS DISTINCT FROM t.status THEN
                PERFORM tw.turns_ended(ARRAY[t.turn_id]);
            END IF;
        END IF;
    END IF;
    IF v_from IS DISTINCT FROM t.status THEN
        CASE v_from
            WHEN 'pending' THEN DELETE FROM state.turn_queue x WHERE x.agent = t.agent AND x.seq = t.seq;
            WHEN 'dispatched' THEN DELETE FROM state.turn_dispatched x WHERE x.turn_id = t.turn_id;
            WHEN 'running' THEN DELETE FROM state.turn_running x WHERE x.turn_id = t.turn_id;
            ELSE NULL;
        END CASE;
    END IF;
    CASE t.status
        WHEN 'pending' THEN
            INSERT INTO state.turn_queue (agent, seq, turn_id, profile, ready_at)
            VALUES (t.agent, t.seq, t.turn_id, t.profile, tw.turn_ready_at(t))
            ON CONFLICT (agent, seq) DO UPDATE SET ready_at = EXCLUDED.ready_at
                WHERE state.turn_queue.ready_at IS DISTINCT FROM EXCLUDED.ready_at;
        WHEN 'dispatched' THEN
            INSERT INTO state.turn_dispatched (turn_id, agent, profile) VALUES (t.turn_id, t.agent, t.profile)
            ON CONFLICT (turn_id) DO NOTHING;
        WHEN 'running' THEN
            INSERT INTO state.turn_running (turn_id, agent, profile) VALUES (t.turn_id, t.agent, t.profile)
            ON CONFLICT (turn_id) DO UPDATE SET beat_at = now() WHERE NOT p_written;  -- a move is a sign of life
        ELSE NULL;
    END CASE;
    -- Its timers (tw.turn_timer_dues): one that it no longer has, or has for another time, goes; one it has
    -- and the table lacks comes (most turns have none, and a move changes none or one or two of theirs).
    v_dues := tw.turn_timer_dues(t);
    IF v_had THEN
        DELETE FROM state.turn_timers x
         WHERE x.turn_id = t.turn_id AND x.due_at IS DISTINCT FROM v_dues[array_position(tw.turn_timer_kinds(), x.kind)];
    END IF;
    IF cardinality(array_remove(v_dues, NULL)) > 0 THEN
        INSERT INTO state.turn_timers (turn_id, kind, due_at)
        SELECT t.turn_id, k.kind, k.due_at FROM unnest(tw.turn_timer_kinds(), v_dues) k (kind, due_at)
         WHERE k.due_at IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM state.turn_timers x
                            WHERE x.turn_id = t.turn_id AND x.kind = k.kind AND x.due_at = k.due_at)
        ON CONFLICT (turn_id, kind) DO UPDATE SET due_at = EXCLUDED.due_at;
    END IF;
    RETURN t;
END $$;

-- Pending turn t's place in its agent's queue parked (p_parked: a turn of a profile with limits waits for them,
-- fn/turn_limits.sql: no dispatch takes it until its grant) or ready again at the time its columns say. The
-- caller holds the turn's row. Returns whether the turn has a place in its queue.
CREATE OR REPLACE FUNCTION tw.turn_place_park(t state.turns, p_parked boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_ready timestamptz := CASE WHEN p_parked THEN tw.flow_parked() ELSE tw.turn_ready_at(t) END;
BEGIN
    UPDATE state.turn_queue SET ready_at = v_ready
     WHERE agent = t.agent AND seq = t.seq AND turn_id = t.turn_id AND ready_at IS DISTINCT FROM v_ready;
    RETURN FOUND OR EXISTS (SELECT 1 FROM state.turn_queue WHERE agent = t.agent AND seq = t.seq);
END $$;

-- Rows of the narrow tables that no longer say where a turn is, and no move of it is due: a timer that fired
-- (its rule cleared or acted on it), or a place left behind by a turn that moved on. p_what is 'dispatched',
-- 'running' (the row with beat_at p_dues[i]) or a timer kind (the timer due at p_dues[i]); a row that changed
-- since its caller read it stays.
CREATE OR REPLACE FUNCTION tw.turn_places_gone(p_what text, p_turns uuid[], p_dues timestamptz[] DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_what = 'dispatched' THEN
        DELETE FROM state.turn_dispatched WHERE turn_id = ANY (p_turns);
    ELSIF p_what = 'running' THEN
        DELETE FROM state.turn_running x USING unnest(p_turns, p_dues) g (turn_id, due)
         WHERE x.turn_id = g.turn_id AND x.beat_at = g.due;
    ELSE
        DELETE FROM state.turn_timers x USING unnest(p_turns, p_dues) g (turn_id, due)
         WHERE x.turn_id = g.turn_id AND x.kind = p_what AND x.due_at = g.due;
    END IF;
END $$;
