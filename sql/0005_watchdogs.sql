-- migrate: repeatable (re-applied by `turnwatch migrate` whenever this text changes: CREATE OR REPLACE only;
-- a function whose signature or return type changes is dropped explicitly first).
-- The watchdogs (seed 002 section 2, contract sections 7 and 9): each rule is one function returning
-- {"actions":[...],"publish":[...]}; each action carries the time it was due ("due") and how late it came
-- ("lateness_ms": the database clock at the action minus the due time). Bounded batches, SKIP LOCKED and a
-- compare-and-set on status and epoch, so any number of daemons may run them at once. tw.worker_next_due
-- and tw.pmo_next_due say when each rule is next due, each from one index-backed min(), so that a daemon
-- sleeps until then instead of scanning on a fixed clock. Liveness (section 9) is at the end.

-- Milliseconds from now (the database clock) until p_due, rounded up; negative when it is overdue (the daemon
-- tells a rule that could not act on an old due time from one that came due just now); NULL when nothing is
-- due.
CREATE OR REPLACE FUNCTION tw.ms_until(p_due timestamptz)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT ceil(extract(epoch FROM p_due - clock_timestamp()) * 1000)::bigint
$$;

CREATE OR REPLACE FUNCTION tw.lateness_ms(p_due timestamptz)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT round(extract(epoch FROM clock_timestamp() - p_due) * 1000)::bigint
$$;

-- Worker watchdogs (2.1-2.3) ------------------------------------------------------------------------

-- 2.1: processing inbox items whose processed_at expired go back to pending.
CREATE OR REPLACE FUNCTION tw.wd_reclaim_inbox(p_timeout_s integer, p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r     record;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    -- The old processed_at comes along so that the log can say when the item was due and how late the
    -- reclaim came (RETURNING sees only the new, cleared value).
    FOR r IN
        -- The doorbell rung below counts as a ring: 2.7 rings again one interval later if nobody took it.
        UPDATE state.agent_inbox i
           SET status = 'pending', processed_at = NULL, archived_at = NULL, claim_token = NULL, rung_at = now()
          FROM (SELECT inbox_id, processed_at + make_interval(secs => p_timeout_s) AS due FROM state.agent_inbox
                 WHERE status = 'processing' AND processed_at < now() - make_interval(secs => p_timeout_s)
                 ORDER BY processed_at LIMIT p_limit FOR UPDATE SKIP LOCKED) x
         WHERE i.inbox_id = x.inbox_id
        RETURNING i.inbox_id, i.target_kind, i.target, i.profile, i.message_type, i.turn_id, i.turn_epoch, i.step,
                  i.tool_call_id, i.claimed_by, x.due, tw.lateness_ms(x.due) AS lateness_ms
    LOOP
        v_pub := v_pub || tw.doorbell(r.target_kind, r.target, 'reclaimed', r.profile);
        v_log := v_log || jsonb_build_array(to_jsonb(r));
        PERFORM tw.note_reclaim(to_jsonb(r), format('2.1, the lease of %s expired', r.claimed_by));
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- 2.2: for suspended turns past resume_deadline, a timeout report per waiting call whose own deadline
-- passed (none when its tool.call card is missing); resume_deadline moves to the next deadline.
CREATE OR REPLACE FUNCTION tw.wd_tool_timeouts(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    t     state.turns;
    w     state.turn_waiting_tools;
    v_res jsonb;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    FOR t IN
        SELECT * FROM state.turns
         WHERE status = 'suspended' AND resume_deadline < now()
         ORDER BY resume_deadline LIMIT p_limit FOR UPDATE SKIP LOCKED
    LOOP
        FOR w IN
            SELECT * FROM state.turn_waiting_tools
             WHERE turn_id = t.turn_id AND step = t.step AND wait_status = 'waiting' AND deadline_at < now()
             ORDER BY deadline_at, call_index
        LOOP
            IF w.call_card_id IS NULL
               OR NOT EXISTS (SELECT 1 FROM state.cards c WHERE c.card_id = w.call_card_id) THEN
                v_log := v_log || jsonb_build_array(jsonb_build_object(
                    'action', 'skipped_missing_card', 'turn_id', t.turn_id, 'tool_call_id', w.tool_call_id,
                    'epoch', t.turn_epoch, 'due', w.deadline_at));
                CONTINUE;
            END IF;
            v_res := tw.deliver_result(t.turn_id, w.tool_call_id, 'timeout', NULL,
                         jsonb_build_object('code', 'tool_timeout', 'message',
                             format('tool %s did not answer call %s within %s seconds', w.tool, w.tool_call_id,
                                    round(extract(epoch FROM w.deadline_at - t.suspended_at)))),
                         NULL, 'timeout');
            IF v_res ->> 'result' = 'accepted' THEN
                v_pub := v_pub || (v_res -> 'publish');
                v_log := v_log || jsonb_build_array(jsonb_build_object(
                    'action', 'timeout_report', 'turn_id', t.turn_id, 'tool_call_id', w.tool_call_id,
                    'epoch', t.turn_epoch, 'due', w.deadline_at, 'lateness_ms', tw.lateness_ms(w.deadline_at)));
            END IF;
        END LOOP;
        UPDATE state.turns
           SET resume_deadline = (SELECT min(deadline_at) FROM state.turn_waiting_tools x
                                   WHERE x.turn_id = t.turn_id AND x.step = t.step AND x.wait_status = 'waiting'
                                     AND (x.deadline_at >= now()
                                          OR EXISTS (SELECT 1 FROM state.cards c WHERE c.card_id = x.call_card_id)))
         WHERE turn_id = t.turn_id;
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- 2.3: requeue_expired_resume_ledgers.
CREATE OR REPLACE FUNCTION tw.requeue_expired_resume_ledgers(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r     record;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    FOR r IN
        UPDATE state.turn_resume_ledger l
           SET status = 'pending', lease_token = NULL, updated_at = now()
          FROM (SELECT ledger_id, lease_expires_at AS due FROM state.turn_resume_ledger
                 WHERE status = 'processing' AND lease_expires_at < now()
                 ORDER BY lease_expires_at LIMIT p_limit FOR UPDATE SKIP LOCKED) x
         WHERE l.ledger_id = x.ledger_id
        RETURNING l.ledger_id, l.agent, l.profile, l.turn_id, l.turn_epoch, l.step, l.claimed_by, x.due,
                  tw.lateness_ms(x.due) AS lateness_ms
    LOOP
        v_pub := v_pub || tw.doorbell('agent', r.agent, 'ledger_requeued', r.profile);
        v_log := v_log || jsonb_build_array(to_jsonb(r));
        PERFORM tw.note_reclaim(to_jsonb(r), format('2.3, the resume lease of %s expired', r.claimed_by));
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- When each worker rule is next due, in ms from now (null: nothing waits). Each is one min() over a partial
-- index, so a worker with nothing due, or 100,000 deadlines far away, pays one cheap query per wake-up.
CREATE OR REPLACE FUNCTION tw.worker_next_due(p_lease_s integer)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN jsonb_build_object(
        '2.1', tw.ms_until((SELECT min(processed_at) FROM state.agent_inbox WHERE status = 'processing')
                           + make_interval(secs => p_lease_s)),
        '2.2', tw.ms_until((SELECT min(resume_deadline) FROM state.turns WHERE status = 'suspended')),
        '2.3', tw.ms_until((SELECT min(lease_expires_at) FROM state.turn_resume_ledger
                             WHERE status = 'processing')))
        || tw.worker_policy_next_due();  -- tool call warnings (0007_policies_fn.sql)
END $$;

-- PMO watchdogs (2.4-2.7), turn deadlines ------------------------------------------------------------

-- The turns that rules 2.4-2.6 act on are read through partial indexes on state.turns; the agent row is then
-- locked (lock order: a parent's turn, the agent, the turn) and the condition checked again under the lock,
-- since a heartbeat or another PMO may have moved it meanwhile.
--
-- A backlog is not a failure (contract section 14). A dispatched turn waits for a worker slot; 2.4 and 2.5 are
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

-- The profiles that have dispatched turns: a loose index scan of turns_dispatched_profile_idx, one probe per
-- profile however many turns wait.
CREATE OR REPLACE FUNCTION tw.dispatched_profiles()
RETURNS SETOF text LANGUAGE sql STABLE AS $$
    WITH RECURSIVE pp(profile) AS (
        (SELECT t.profile FROM state.turns t WHERE t.status = 'dispatched' ORDER BY t.profile LIMIT 1)
        UNION ALL
        SELECT (SELECT t.profile FROM state.turns t WHERE t.status = 'dispatched' AND t.profile > pp.profile
                 ORDER BY t.profile LIMIT 1)
          FROM pp WHERE pp.profile IS NOT NULL)
    SELECT profile FROM pp WHERE profile IS NOT NULL
$$;

-- Per profile with dispatched turns: its clock, its oldest dispatch and its oldest (re)ring.
CREATE OR REPLACE FUNCTION tw.dispatched_clocks(p_stale_s integer)
RETURNS TABLE (profile text, clock timestamptz, oldest timestamptz, ring timestamptz) LANGUAGE sql STABLE AS $$
    SELECT p.p, tw.profile_clock(p.p, p_stale_s),
           (SELECT min(t.updated_at) FROM state.turns t WHERE t.status = 'dispatched' AND t.profile = p.p),
           (SELECT min(coalesce(t.rerung_at, t.updated_at)) FROM state.turns t
             WHERE t.status = 'dispatched' AND t.profile = p.p)
      FROM tw.dispatched_profiles() p(p)
$$;

-- 2.4: dispatched for longer than p_retry_s (by its profile's clock): enqueue the envelope again unless a live
-- copy exists, ring the doorbell; at most once per p_retry_s per turn; updated_at is left alone so 2.5 still
-- fires.
DROP FUNCTION IF EXISTS tw.wd_rering_dispatched(integer, integer);
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
            SELECT turn_id, agent FROM state.turns
             WHERE status = 'dispatched' AND profile = v_prof
               AND coalesce(rerung_at, updated_at) < now() - make_interval(secs => p_retry_s)
             ORDER BY coalesce(rerung_at, updated_at) LIMIT p_limit - v_n
        LOOP
            SELECT * INTO a FROM state.agents WHERE agent = r.agent FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND OR a.status <> 'dispatched' OR a.active_agent_turn_id IS DISTINCT FROM r.turn_id;
            SELECT * INTO t FROM state.turns WHERE turn_id = r.turn_id FOR UPDATE;
            CONTINUE WHEN t.status <> 'dispatched' OR t.turn_epoch <> a.turn_epoch
                       OR coalesce(t.rerung_at, t.updated_at) >= now() - make_interval(secs => p_retry_s);
            v_due := greatest(coalesce(t.rerung_at, t.updated_at), v_clock) + make_interval(secs => p_retry_s);
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

-- One reap of 2.5 or 2.6: the turn r (status p_status, last update before p_before) with its agent, under the
-- locks and checks above. Returns {"publish","action"} or NULL when it was not reaped (moved on, or busy).
CREATE OR REPLACE FUNCTION tw.wd_reap_one(p_turn uuid, p_agent text, p_status text, p_before timestamptz,
                                          p_after_s integer, p_clock timestamptz, p_reason text, p_final text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    a     state.agents;
    v_upd timestamptz;
    v_due timestamptz;
    v_res jsonb;
BEGIN
    IF NOT tw.lock_parent(p_turn, false) THEN
        RETURN NULL;
    END IF;
    SELECT * INTO a FROM state.agents WHERE agent = p_agent FOR UPDATE SKIP LOCKED;
    IF NOT FOUND OR a.status <> p_status OR a.active_agent_turn_id IS DISTINCT FROM p_turn THEN
        RETURN NULL;
    END IF;
    SELECT updated_at INTO v_upd FROM state.turns
     WHERE turn_id = p_turn AND status = p_status AND turn_epoch = a.turn_epoch FOR UPDATE;
    IF v_upd IS NULL OR v_upd >= p_before THEN
        RETURN NULL;
    END IF;
    v_due := greatest(v_upd, p_clock) + make_interval(secs => p_after_s);
    v_res := tw.force_finish(p_turn, p_reason, p_final,
                 format('agent %s stayed %s for more than %s seconds (last update %s)%s', a.agent, p_status,
                        p_after_s, v_upd,
                        CASE WHEN p_status <> 'dispatched' THEN ''
                             WHEN p_clock = '-infinity' THEN format('; no live worker serves profile %s', a.profile)
                             ELSE format('; a worker serving profile %s had a free slot since %s and did not take it',
                                         a.profile, p_clock) END));
    IF v_res IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN jsonb_build_object('publish', v_res, 'action', jsonb_build_object(
        'agent', a.agent, 'profile', a.profile, 'turn_id', p_turn, 'epoch', a.turn_epoch, 'due', v_due,
        'lateness_ms', tw.lateness_ms(v_due)));
END $$;

-- 2.6: reap running turns (and their agents) with no heartbeat for longer than p_after_s.
CREATE OR REPLACE FUNCTION tw.wd_reap(p_status text, p_after_s integer, p_reason text, p_final text,
                                      p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r     record;
    v_res jsonb;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    -- The limit, for the `timeout` details of the events (tw.timeout_detail).
    PERFORM set_config('tw.timeout_limit', p_after_s::text, true);
    FOR r IN
        SELECT turn_id, agent FROM state.turns
         WHERE status = p_status AND updated_at < now() - make_interval(secs => p_after_s)
         ORDER BY updated_at LIMIT p_limit
    LOOP
        v_res := tw.wd_reap_one(r.turn_id, r.agent, p_status, now() - make_interval(secs => p_after_s), p_after_s,
                                '-infinity', p_reason, p_final);
        CONTINUE WHEN v_res IS NULL;
        v_pub := v_pub || (v_res -> 'publish');
        v_log := v_log || jsonb_build_array(v_res -> 'action');
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- 2.5: reap dispatched turns whose profile's clock (above) has run for longer than p_after_s.
CREATE OR REPLACE FUNCTION tw.wd_reap_dispatched(p_after_s integer, p_stale_s integer, p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_prof  text;
    v_clock timestamptz;
    r       record;
    v_res   jsonb;
    v_pub   jsonb := '[]'::jsonb;
    v_log   jsonb := '[]'::jsonb;
    v_n     integer := 0;
BEGIN
    -- The limit, for the `timeout` details of the events (tw.timeout_detail).
    PERFORM set_config('tw.timeout_limit', p_after_s::text, true);
    FOR v_prof IN SELECT tw.dispatched_profiles() LOOP
        v_clock := tw.profile_clock(v_prof, p_stale_s);
        CONTINUE WHEN v_clock >= now() - make_interval(secs => p_after_s);
        FOR r IN
            SELECT turn_id, agent FROM state.turns
             WHERE status = 'dispatched' AND profile = v_prof AND updated_at < now() - make_interval(secs => p_after_s)
             ORDER BY updated_at LIMIT p_limit - v_n
        LOOP
            v_res := tw.wd_reap_one(r.turn_id, r.agent, 'dispatched', now() - make_interval(secs => p_after_s),
                                    p_after_s, v_clock, 'dispatch_timeout', 'timeout');
            CONTINUE WHEN v_res IS NULL;
            v_pub := v_pub || (v_res -> 'publish');
            v_log := v_log || jsonb_build_array(v_res -> 'action');
            v_n := v_n + 1;
        END LOOP;
        EXIT WHEN v_n >= p_limit;
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- 2.7: ring pending inbox items older than p_wakeup_s (once per p_wakeup_s each); skip those with no
-- determinable channel once older than p_skip_s.
CREATE OR REPLACE FUNCTION tw.wd_rering_pending(p_wakeup_s integer, p_skip_s integer, p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    m         record;
    v_pub     jsonb := '[]'::jsonb;
    v_log     jsonb := '[]'::jsonb;
    v_targets text[] := '{}';
    v_due     timestamptz;
BEGIN
    FOR m IN
        SELECT i.inbox_id, i.target_kind, i.target, i.profile, i.created_at, i.rung_at, i.turn_id, i.turn_epoch,
               coalesce(i.channel_id, CASE WHEN i.target_kind = 'agent' THEN ag.active_channel_id END) AS channel
          FROM (SELECT * FROM state.agent_inbox
                 WHERE status = 'pending' AND coalesce(rung_at, created_at) < now() - make_interval(secs => p_wakeup_s)
                 ORDER BY coalesce(rung_at, created_at) LIMIT p_limit FOR UPDATE SKIP LOCKED) i
          LEFT JOIN state.agents ag ON i.target_kind = 'agent' AND ag.agent = i.target
        UNION ALL
        -- A channel-less item is skipped as soon as it is old enough, not at its next re-ring.
        SELECT i.inbox_id, i.target_kind, i.target, i.profile, i.created_at, i.rung_at, i.turn_id, i.turn_epoch, NULL
          FROM (SELECT * FROM state.agent_inbox
                 WHERE status = 'pending' AND channel_id IS NULL
                   AND created_at < now() - make_interval(secs => p_skip_s)
                   AND coalesce(rung_at, created_at) >= now() - make_interval(secs => p_wakeup_s)
                 ORDER BY created_at LIMIT p_limit FOR UPDATE SKIP LOCKED) i
          LEFT JOIN state.agents ag ON i.target_kind = 'agent' AND ag.agent = i.target
         WHERE i.target_kind <> 'agent' OR ag.active_channel_id IS NULL
    LOOP
        IF m.channel IS NULL AND m.created_at < now() - make_interval(secs => p_skip_s) THEN
            v_due := m.created_at + make_interval(secs => p_skip_s);
            UPDATE state.agent_inbox
               SET status = 'skipped', watchdog_error = 'missing_channel', watchdog_at = now()
             WHERE inbox_id = m.inbox_id;
            v_log := v_log || jsonb_build_array(jsonb_build_object(
                'action', 'skipped', 'inbox_id', m.inbox_id, 'target', m.target, 'turn_id', m.turn_id,
                'epoch', m.turn_epoch, 'watchdog_error', 'missing_channel', 'due', v_due,
                'lateness_ms', tw.lateness_ms(v_due)));
            CONTINUE;
        END IF;
        v_due := coalesce(m.rung_at, m.created_at) + make_interval(secs => p_wakeup_s);
        UPDATE state.agent_inbox SET rung_at = now() WHERE inbox_id = m.inbox_id;
        IF NOT (m.target_kind || '.' || m.target) = ANY (v_targets) THEN
            v_targets := v_targets || (m.target_kind || '.' || m.target);
            v_pub := v_pub || tw.doorbell(m.target_kind, m.target, 'pending_wakeup', m.profile);
        END IF;
        v_log := v_log || jsonb_build_array(jsonb_build_object(
            'action', 'rering', 'inbox_id', m.inbox_id, 'target', m.target, 'turn_id', m.turn_id,
            'epoch', m.turn_epoch, 'due', v_due, 'lateness_ms', tw.lateness_ms(v_due)));
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- Turn deadlines (submit --timeout): whatever the state, past deadline_at the turn ends `timeout`.
CREATE OR REPLACE FUNCTION tw.wd_turn_deadlines(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r     record;
    v_res jsonb;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    FOR r IN
        SELECT turn_id, agent, turn_epoch, status, deadline_at, tw.turn_deadline_seconds(t) AS seconds
          FROM state.turns t
         WHERE deadline_at < now() AND status IN ('pending', 'dispatched', 'running', 'suspended')
         ORDER BY deadline_at LIMIT p_limit
    LOOP
        v_res := tw.end_turn(r.turn_id, 'turn_deadline_exceeded', 'timeout',
                     format('the turn did not end within its %s second deadline (it was %s)',
                            tw.seconds_text(r.seconds), r.status), false);
        IF v_res IS NOT NULL THEN
            v_pub := v_pub || v_res;
            v_log := v_log || jsonb_build_array(jsonb_build_object(
                'agent', r.agent, 'turn_id', r.turn_id, 'epoch', r.turn_epoch, 'status_before', r.status,
                'due', r.deadline_at, 'lateness_ms', tw.lateness_ms(r.deadline_at)));
        END IF;
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- Rule tree_cancel (issue 23): the child turns that a transaction could not cancel within its batch
-- (tw.cancel_children_upto) are cancelled here, one batch per run: each run is its own transaction, and the
-- rule is due again at once while anything is left. A parent's row is taken first (lock order of a tree), and
-- skipped while another transaction holds it; so are, at any depth below it (tw.cancel_skip_locked), a child's
-- agent row and a pending child's turn row, which are left for a later run: so a run does not wait behind a
-- slow transaction (a client holding an agent), nor in a cycle with one that locks many agents or turns in
-- another order (dispatch_pending, publish_policies, which deadlocked with it in the test when it waited).
-- What it still waits for is the row of a turn whose agent it holds (force_finish): whoever holds that row
-- goes on down the tree from it, never back up to what the rule holds. A record goes when nothing it covers is
-- open any more.
CREATE OR REPLACE FUNCTION tw.wd_tree_cancels(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r      record;
    m      state.tree_cancels;
    v_left integer;
    v_more boolean;
    v_pub  jsonb := '[]'::jsonb;
    v_log  jsonb := '[]'::jsonb;
BEGIN
    PERFORM set_config('tw.cancel_skip_locked', 'on', true);
    FOR r IN SELECT turn_id FROM state.tree_cancels ORDER BY requested_at LIMIT p_limit LOOP
        EXIT WHEN tw.cancel_left() <= 0;
        PERFORM 1 FROM state.turns WHERE turn_id = r.turn_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        SELECT * INTO m FROM state.tree_cancels WHERE turn_id = r.turn_id;
        CONTINUE WHEN NOT FOUND;
        v_left := tw.cancel_left();
        v_pub := v_pub || tw.cancel_children_upto(m.turn_id, -2147483648, m.max_step, m.message, false);
        SELECT max_step INTO m.max_step FROM state.tree_cancels WHERE turn_id = m.turn_id;
        v_more := EXISTS (SELECT 1 FROM state.turns
                           WHERE parent_turn_id = m.turn_id AND parent_step <= m.max_step
                             AND status IN ('pending', 'dispatched', 'running', 'suspended'));
        IF NOT v_more THEN
            DELETE FROM state.tree_cancels WHERE turn_id = m.turn_id;
        END IF;
        IF tw.cancel_left() < v_left THEN
            v_log := v_log || jsonb_build_array(jsonb_build_object(
                'parent_turn_id', m.turn_id, 'cancelled', v_left - tw.cancel_left(), 'more', v_more,
                'due', m.requested_at, 'lateness_ms', tw.lateness_ms(m.requested_at)));
        END IF;
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- When each PMO rule is next due, in ms from now (null: nothing waits); every term is one min() over a
-- partial index (turns_dispatched_profile_ring_idx, turns_dispatched_profile_idx, turns_running_idx,
-- agent_inbox_pending_ring_idx, agent_inbox_pending_nochannel_idx, turns_deadline_idx) or a small table's
-- index (tree_cancels_requested_idx).
DROP FUNCTION IF EXISTS tw.pmo_next_due(integer, integer, integer, integer, integer);
CREATE OR REPLACE FUNCTION tw.pmo_next_due(p_retry_s integer, p_timeout_s integer, p_reap_s integer,
                                           p_wakeup_s integer, p_skip_s integer, p_stale_s integer)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN jsonb_build_object(
        -- Per profile with dispatched turns: its oldest turn, or its clock if that started later.
        -- Per profile with dispatched turns: its oldest turn, or its clock if that started later; none while
        -- its clock stands still (every serving worker busy).
        '2.4', tw.ms_until((SELECT min(CASE WHEN c.clock < 'infinity' THEN greatest(c.ring, c.clock) END)
                              FROM tw.dispatched_clocks(p_stale_s) c)
                           + make_interval(secs => p_retry_s)),
        '2.5', tw.ms_until((SELECT min(CASE WHEN c.clock < 'infinity' THEN greatest(c.oldest, c.clock) END)
                              FROM tw.dispatched_clocks(p_stale_s) c)
                           + make_interval(secs => p_timeout_s)),
        '2.6', tw.ms_until((SELECT min(updated_at) FROM state.turns WHERE status = 'running')
                           + make_interval(secs => p_reap_s)),
        '2.7', tw.ms_until(least(
                   (SELECT min(coalesce(rung_at, created_at)) FROM state.agent_inbox WHERE status = 'pending')
                   + make_interval(secs => p_wakeup_s),
                   (SELECT min(created_at) FROM state.agent_inbox WHERE status = 'pending' AND channel_id IS NULL)
                   + make_interval(secs => p_skip_s))),
        'deadline', tw.ms_until((SELECT min(deadline_at) FROM state.turns
                                  WHERE deadline_at IS NOT NULL
                                    AND status IN ('pending', 'dispatched', 'running', 'suspended'))),
        'tree_cancel', tw.ms_until((SELECT min(requested_at) FROM state.tree_cancels)))
        || tw.pmo_policy_next_due();  -- retries, queue budgets, warnings (0007_policies_fn.sql)
END $$;

-- Liveness (contract section 9) ------------------------------------------------------------------------

-- The advisory lock class of liveness locks ('tw'); the object is the daemon's daemon_no.
CREATE OR REPLACE FUNCTION tw.live_class()
RETURNS integer LANGUAGE sql IMMUTABLE AS $$ SELECT 29815 $$;

-- Give back everything a gone daemon held, for another worker at once: its processing inbox items (agent
-- steps and tool calls) and resume-ledger leases go back to pending with a doorbell. Its claim tokens are
-- cleared, so a late write from the old process (a host that comes back) fails its compare-and-set. The turns
-- themselves stay as they are: the next claim of the item takes them up again.
CREATE OR REPLACE FUNCTION tw.reclaim_daemon(p_id text, p_why text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r     record;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    FOR r IN
        UPDATE state.agent_inbox i
           SET status = 'pending', processed_at = NULL, archived_at = NULL, claim_token = NULL, rung_at = now()
         WHERE status = 'processing' AND claimed_by = p_id
        RETURNING 'inbox' AS fence, i.inbox_id AS id, i.target_kind, i.target, i.profile, i.message_type,
                  i.turn_id, i.turn_epoch, i.step, i.tool_call_id
    LOOP
        v_pub := v_pub || tw.doorbell(r.target_kind, r.target, 'reclaimed', r.profile);
        v_log := v_log || jsonb_build_array(to_jsonb(r) || jsonb_build_object('daemon', p_id, 'why', p_why));
        PERFORM tw.note_reclaim(to_jsonb(r), format('worker %s is gone (%s)', p_id, p_why));
    END LOOP;
    FOR r IN
        UPDATE state.turn_resume_ledger l
           SET status = 'pending', lease_token = NULL, lease_expires_at = NULL, updated_at = now()
         WHERE status = 'processing' AND claimed_by = p_id
        RETURNING 'ledger' AS fence, l.ledger_id AS id, l.agent, l.profile, l.turn_id, l.turn_epoch, l.step
    LOOP
        v_pub := v_pub || tw.doorbell('agent', r.agent, 'reclaimed', r.profile);
        v_log := v_log || jsonb_build_array(to_jsonb(r) || jsonb_build_object('daemon', p_id, 'why', p_why));
        PERFORM tw.note_reclaim(to_jsonb(r), format('worker %s is gone (%s)', p_id, p_why));
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- A worker holds only what it knows it holds. What it claimed in a statement whose answer never reached it
-- (the connection broke after the commit) is recorded as its own but runs nowhere; its heartbeat would not
-- refresh it, but it is not gone either. Called with the worker's holdings (the fences its heartbeat sends)
-- every heartbeat: an inbox item or resume lease claimed by p_worker, not among them, and claimed more than
-- p_grace_s ago (longer than any answer can still be on its way: twice the query timeout) goes back to pending
-- for any worker, as when a worker is gone.
CREATE OR REPLACE FUNCTION tw.release_unknown(p_worker text, p_holdings jsonb, p_grace_s integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r     record;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    FOR r IN
        UPDATE state.agent_inbox i
           SET status = 'pending', processed_at = NULL, archived_at = NULL, claim_token = NULL, rung_at = now()
          FROM (SELECT inbox_id FROM state.agent_inbox
                 WHERE status = 'processing' AND processed_at < now() - make_interval(secs => p_grace_s)
                   AND claimed_by = p_worker
                   AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(p_holdings) h
                                    WHERE coalesce(h ->> 'fence', 'inbox') <> 'ledger'
                                      AND (h ->> 'id')::bigint = inbox_id AND (h ->> 'token')::bigint = claim_token)
                 FOR UPDATE SKIP LOCKED) x
         WHERE i.inbox_id = x.inbox_id
        RETURNING 'inbox' AS fence, i.inbox_id AS id, i.target_kind, i.target, i.profile, i.message_type,
                  i.turn_id, i.turn_epoch, i.step, i.tool_call_id
    LOOP
        v_pub := v_pub || tw.doorbell(r.target_kind, r.target, 'reclaimed', r.profile);
        v_log := v_log || jsonb_build_array(to_jsonb(r));
        PERFORM tw.note_reclaim(to_jsonb(r), format('worker %s claimed it but never heard so', p_worker));
    END LOOP;
    FOR r IN
        UPDATE state.turn_resume_ledger l
           SET status = 'pending', lease_token = NULL, lease_expires_at = NULL, updated_at = now()
          FROM (SELECT ledger_id FROM state.turn_resume_ledger
                 WHERE status = 'processing' AND updated_at < now() - make_interval(secs => p_grace_s)
                   AND claimed_by = p_worker
                   AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(p_holdings) h
                                    WHERE h ->> 'fence' = 'ledger' AND (h ->> 'id')::bigint = ledger_id
                                      AND (h ->> 'token')::bigint = lease_token)
                 FOR UPDATE SKIP LOCKED) x
         WHERE l.ledger_id = x.ledger_id
        RETURNING 'ledger' AS fence, l.ledger_id AS id, l.agent, l.profile, l.turn_id, l.turn_epoch, l.step
    LOOP
        v_pub := v_pub || tw.doorbell('agent', r.agent, 'reclaimed', r.profile);
        v_log := v_log || jsonb_build_array(to_jsonb(r));
        PERFORM tw.note_reclaim(to_jsonb(r), format('worker %s claimed it but never heard so', p_worker));
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- Register this daemon and take its liveness lock on the calling session (which must be a connection of its
-- own, kept for the daemon's life). Called again after every reconnect: the same incarnation takes its row
-- and lock back (nothing it held is lost if nobody judged it gone meanwhile). A row left by an earlier
-- process with the same host:pid (a reused pid) is a daemon that is gone: what it held is given back first.
CREATE OR REPLACE FUNCTION tw.daemon_register(p_id text, p_kind text, p_host text, p_pid integer,
                                              p_incarnation text, p_info jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    d     state.daemons;
    v_res jsonb := jsonb_build_object('actions', '[]'::jsonb, 'publish', '[]'::jsonb);
BEGIN
    -- Lock order as in tw.reclaim_gone_daemons: the liveness key, then the row.
    SELECT * INTO d FROM state.daemons WHERE daemon_id = p_id;
    IF FOUND AND d.incarnation <> p_incarnation THEN
        IF NOT pg_try_advisory_xact_lock(tw.live_class(), d.daemon_no) THEN
            RAISE EXCEPTION 'daemon id % is held by a live session (pid % of host % still runs?)', p_id, d.pid,
                d.host USING ERRCODE = '55P03';
        END IF;
        v_res := tw.reclaim_daemon(p_id, 'replaced');
        UPDATE state.daemons
           SET kind = p_kind, host = p_host, pid = p_pid, incarnation = p_incarnation, info = p_info,
               started_at = now(), locked_at = now(), last_seen_at = now(), gone_at = NULL, gone_reason = NULL
         WHERE daemon_id = p_id
        RETURNING * INTO d;
    ELSIF FOUND THEN
        -- Our own row: wait for a reclaimer that may hold our key right now, then take it back.
        PERFORM pg_advisory_xact_lock(tw.live_class(), d.daemon_no);
        UPDATE state.daemons SET info = p_info, locked_at = now(), last_seen_at = now(), gone_at = NULL,
               gone_reason = NULL
         WHERE daemon_id = p_id
        RETURNING * INTO d;
    ELSE
        INSERT INTO state.daemons (daemon_id, kind, host, pid, incarnation, info)
        VALUES (p_id, p_kind, p_host, p_pid, p_incarnation, p_info)
        RETURNING * INTO d;
    END IF;
    -- Session level: held until this connection ends, whatever happens to this transaction.
    PERFORM pg_advisory_lock(tw.live_class(), d.daemon_no);
    RETURN v_res || jsonb_build_object('daemon_no', d.daemon_no, 'was_gone', d.gone_at IS NOT NULL);
END $$;

-- A daemon that leaves on purpose (SIGTERM) says so; what it still holds is handed back by its own shutdown.
CREATE OR REPLACE FUNCTION tw.daemon_leave(p_id text, p_incarnation text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE state.daemons SET gone_at = now(), gone_reason = 'stopped', last_seen_at = now()
     WHERE daemon_id = p_id AND incarnation = p_incarnation AND gone_at IS NULL;
END $$;

CREATE OR REPLACE FUNCTION tw.daemon_seen(p_id text, p_incarnation text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE state.daemons SET last_seen_at = now() WHERE daemon_id = p_id AND incarnation = p_incarnation;
END $$;

-- Every daemon polls this a few times a second: a daemon whose liveness key can be taken has no session any
-- more, so it is marked gone and what it held is reclaimed, in one transaction (the key, held to commit, keeps
-- two pollers from doing it twice). With nothing gone it writes nothing. Rows gone for a day are dropped.
CREATE OR REPLACE FUNCTION tw.reclaim_gone_daemons(p_self text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    d     state.daemons;
    v_res jsonb;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    FOR d IN SELECT * FROM state.daemons WHERE gone_at IS NULL AND daemon_id <> p_self ORDER BY daemon_no LOOP
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(tw.live_class(), d.daemon_no);
        UPDATE state.daemons SET gone_at = now(), gone_reason = 'session ended'
         WHERE daemon_id = d.daemon_id AND incarnation = d.incarnation AND gone_at IS NULL;
        CONTINUE WHEN NOT FOUND;
        v_res := tw.reclaim_daemon(d.daemon_id, 'session ended');
        v_pub := v_pub || (v_res -> 'publish');
        v_log := v_log || jsonb_build_array(jsonb_build_object(
            'action', 'daemon_gone', 'daemon', d.daemon_id, 'kind', d.kind, 'last_seen_at', d.last_seen_at,
            'reclaimed', jsonb_array_length(v_res -> 'actions')))
            || (v_res -> 'actions');
    END LOOP;
    IF random() < 0.001 THEN
        DELETE FROM state.daemons WHERE gone_at < now() - interval '1 day';
    END IF;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- `turnwatch daemons`: every daemon seen in the last day, alive or gone (alive: its liveness key is held
-- right now), with what it holds.
CREATE OR REPLACE FUNCTION tw.daemons()
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'daemon_id', d.daemon_id, 'kind', d.kind, 'host', d.host, 'pid', d.pid,
               'started_at', d.started_at, 'last_seen_at', d.last_seen_at, 'gone_at', d.gone_at,
               'gone_reason', d.gone_reason, 'info', d.info, 'slots', d.slots, 'free_since', d.free_since,
               'alive', l.granted IS NOT NULL AND d.gone_at IS NULL,
               'holds', jsonb_build_object(
                   'steps', (SELECT count(*) FROM state.agent_inbox i
                              WHERE i.status = 'processing' AND i.claimed_by = d.daemon_id
                                AND i.target_kind = 'agent')
                            + (SELECT count(*) FROM state.turn_resume_ledger r
                                WHERE r.status = 'processing' AND r.claimed_by = d.daemon_id),
                   'tool_calls', (SELECT count(*) FROM state.agent_inbox i
                                   WHERE i.status = 'processing' AND i.claimed_by = d.daemon_id
                                     AND i.target_kind = 'tool')))
               ORDER BY d.kind, d.daemon_id), '[]'::jsonb)
      FROM state.daemons d
      LEFT JOIN pg_locks l ON l.locktype = 'advisory' AND l.classid::bigint = tw.live_class()
                          AND l.objid::bigint = d.daemon_no AND l.objsubid = 2 AND l.granted
     WHERE d.gone_at IS NULL OR d.gone_at > now() - interval '1 day'
    );
END $$;

-- A worker's capacity (worker/capacity.c): free since p_free_ms milliseconds ago (the first report of a stretch
-- keeps its start), or busy. Read by tw.profile_clock.
CREATE OR REPLACE FUNCTION tw.daemon_capacity(p_id text, p_free boolean, p_free_ms bigint, p_slots integer)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE state.daemons
       SET free_since = CASE WHEN p_free THEN coalesce(free_since, now() - make_interval(secs => p_free_ms / 1000.0))
                        END,
           slots = p_slots
     WHERE daemon_id = p_id;
END $$;
