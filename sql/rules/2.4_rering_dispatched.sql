-- Rule 2.4 (PMO): a dispatched turn nobody took is re-announced, on its profile's clock.

-- The turns that rules 2.4-2.6 act on are read through narrow tables (turn_dispatched, turn_running); the agent row is then
-- locked (lock order: a parent's turn, the agent, the turn) and the condition checked again under the lock,
-- since a heartbeat or another PMO may have moved it meanwhile.
--
-- A backlog is not a failure (docs/roster.md). A dispatched turn waits for a worker slot; 2.4 and 2.5 are
-- for a dispatch that was lost (a doorbell nobody heard, a worker that does not claim) and for a profile no live
-- worker serves, never for a turn that waits only because every serving worker is busy. So their clocks run
-- per profile from tw.profile_clock: from the dispatch when no live worker serves the profile (as in section
-- 7); from when a serving worker last had a free slot, if one has (a free worker takes a dispatched turn within
-- milliseconds, so one still waiting a whole timeout later was lost); not at all while every serving worker is
-- busy. We chose this over dispatching by capacity because it keeps the PMO's dispatch free of any knowledge
-- of workers, costs one small-table read per profile, and leaves 2.4/2.5 exactly as they were when the profile
-- has no live worker. queue_timeout_seconds (section 11) is the opt-in limit on how long a backlog may wait.

-- Since when dispatched work of p_profile counts as waiting for nothing: '-infinity' when no live worker serves
-- it, the earliest free_since of a live serving worker, or 'infinity' while every live serving worker is busy.
-- Live: its liveness lock is held (gone_at NULL) and it was seen within p_stale_s (a frozen one is not).
CREATE OR REPLACE FUNCTION tw.profile_clock(p_profile text, p_stale_s integer)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN count(*) = 0 THEN '-infinity'::timestamptz ELSE coalesce(min(free_since), 'infinity') END
      FROM state.daemons
     WHERE kind = 'worker' AND gone_at IS NULL AND last_seen_at > now() - make_interval(secs => p_stale_s)
       AND info -> 'profiles' ? p_profile
$$;

-- The profiles that have dispatched turns: a loose index scan of turn_dispatched_profile_idx, one probe per
-- profile however many turns wait.
CREATE OR REPLACE FUNCTION tw.dispatched_profiles()
RETURNS SETOF text LANGUAGE sql STABLE AS $$
    WITH RECURSIVE pp(profile) AS (
        (SELECT d.profile FROM state.turn_dispatched d ORDER BY d.profile LIMIT 1)
        UNION ALL
        SELECT (SELECT d.profile FROM state.turn_dispatched d WHERE d.profile > pp.profile
                 ORDER BY d.profile LIMIT 1)
          FROM pp WHERE pp.profile IS NOT NULL)
    SELECT profile FROM pp WHERE profile IS NOT NULL
$$;

-- Per profile with dispatched turns: its clock, its oldest dispatch and its oldest (re)ring.
CREATE OR REPLACE FUNCTION tw.dispatched_clocks(p_stale_s integer)
RETURNS TABLE (profile text, clock timestamptz, oldest timestamptz, ring timestamptz) LANGUAGE sql STABLE AS $$
    SELECT p.p, tw.profile_clock(p.p, p_stale_s),
           (SELECT min(d.since) FROM state.turn_dispatched d WHERE d.profile = p.p),
           (SELECT min(coalesce(d.rerung_at, d.since)) FROM state.turn_dispatched d WHERE d.profile = p.p)
      FROM tw.dispatched_profiles() p(p)
$$;

-- 2.4: dispatched for longer than p_retry_s (by its profile's clock): enqueue the envelope again unless a live
-- copy exists, ring the doorbell; at most once per p_retry_s per turn; updated_at is left alone so 2.5 still
-- fires.
CREATE OR REPLACE FUNCTION tw.wd_rering_dispatched(p_retry_s integer, p_stale_s integer, p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_prof  text;
    v_clock timestamptz;
    r       record;
    a       state.agents;
    t       state.turns;
    v_pub   jsonb := '[]'::jsonb;
    v_log   jsonb := '[]'::jsonb;
    v_enq   boolean;
    v_due   timestamptz;
    v_n     integer := 0;
BEGIN
    FOR v_prof IN SELECT tw.dispatched_profiles() LOOP
        v_clock := tw.profile_clock(v_prof, p_stale_s);
        CONTINUE WHEN v_clock >= now() - make_interval(secs => p_retry_s);
        FOR r IN
            SELECT d.turn_id, d.agent, d.since, d.rerung_at FROM state.turn_dispatched d
             WHERE d.profile = v_prof AND coalesce(d.rerung_at, d.since) < now() - make_interval(secs => p_retry_s)
             ORDER BY coalesce(d.rerung_at, d.since) LIMIT p_limit - v_n
        LOOP
            SELECT * INTO a FROM state.agents WHERE agent = r.agent FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
            SELECT * INTO t FROM state.turns WHERE turn_id = r.turn_id FOR UPDATE;
            IF t.status IS DISTINCT FROM 'dispatched' THEN
                PERFORM tw.turn_places_gone('dispatched', ARRAY[r.turn_id]);  -- left behind: it moved on
                CONTINUE;
            END IF;
            CONTINUE WHEN a.status <> 'dispatched' OR a.active_agent_turn_id IS DISTINCT FROM r.turn_id
                       OR t.turn_epoch <> a.turn_epoch;
            -- The spacing again, on the row as it is now: another PMO may have re-rung the turn after this loop
            -- read it, holding the agent until it committed (this statement sees that commit; without it, two
            -- PMOs rang the same turn 1 ms apart).
            PERFORM 1 FROM state.turn_dispatched d
             WHERE d.turn_id = r.turn_id
               AND coalesce(d.rerung_at, d.since) < now() - make_interval(secs => p_retry_s);
            CONTINUE WHEN NOT FOUND;
            v_due := greatest(coalesce(r.rerung_at, r.since), v_clock) + make_interval(secs => p_retry_s);
            v_enq := false;
            IF NOT EXISTS (SELECT 1 FROM state.agent_inbox
                            WHERE turn_id = t.turn_id AND turn_epoch = t.turn_epoch
                              AND message_type = 'turn' AND status IN ('pending', 'processing')) THEN
                INSERT INTO state.agent_inbox (target_kind, target, profile, turn_seq, message_type, turn_id, turn_epoch,
                                               step, channel_id, payload)
                VALUES ('agent', a.agent, t.profile, t.seq, 'turn', t.turn_id, t.turn_epoch, t.step, t.channel_id,
                        jsonb_build_object('turn_id', t.turn_id, 'epoch', t.turn_epoch, 'rering', true));
                v_enq := true;
            END IF;
            UPDATE state.turn_dispatched SET rerung_at = now() WHERE turn_id = t.turn_id;
            UPDATE state.turns SET rerung_at = now() WHERE turn_id = t.turn_id;
            v_pub := v_pub || tw.doorbell('agent', a.agent, 'dispatched_retry', t.profile);
            v_log := v_log || jsonb_build_array(jsonb_build_object(
                'agent', a.agent, 'profile', t.profile, 'turn_id', t.turn_id, 'epoch', t.turn_epoch,
                'enqueued', v_enq, 'due', v_due, 'lateness_ms', tw.lateness_ms(v_due)));
            v_n := v_n + 1;
        END LOOP;
        EXIT WHEN v_n >= p_limit;
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- Due: per profile with dispatched turns, its last ring or its clock if that started later, plus the spacing;
-- none while its clock stands still (every serving worker busy).
CREATE OR REPLACE FUNCTION tw.due_rering_dispatched(p_retry_s integer, p_stale_s integer)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT min(CASE WHEN c.clock < 'infinity' THEN greatest(c.ring, c.clock) END) + make_interval(secs => p_retry_s)
      FROM tw.dispatched_clocks(p_stale_s) c
$$;
