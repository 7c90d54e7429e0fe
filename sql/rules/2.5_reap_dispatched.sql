-- Rules 2.5 and 2.6 (PMO): a dispatched turn nobody took (2.5), a running turn nobody heartbeats (2.6), ended by force.

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

-- 2.6: reap running turns (and their agents) with no heartbeat for longer than p_after_s (turn_running_beat_idx).
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
        SELECT x.turn_id, x.agent, x.beat_at, t.status, t.updated_at
          FROM state.turn_running x LEFT JOIN state.turns t ON t.turn_id = x.turn_id
         WHERE x.beat_at < now() - make_interval(secs => p_after_s)
         ORDER BY x.beat_at LIMIT p_limit
    LOOP
        IF r.status IS DISTINCT FROM 'running' THEN
            PERFORM tw.turn_places_gone('running', ARRAY[r.turn_id], ARRAY[r.beat_at]);  -- left behind
            CONTINUE;
        ELSIF r.updated_at > r.beat_at THEN
            UPDATE state.turn_running SET beat_at = r.updated_at WHERE turn_id = r.turn_id AND beat_at = r.beat_at;
            CONTINUE;
        END IF;
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
            SELECT d.turn_id, d.agent FROM state.turn_dispatched d
             WHERE d.profile = v_prof AND d.since < now() - make_interval(secs => p_after_s)
             ORDER BY d.since LIMIT p_limit - v_n
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

-- Due: per profile with dispatched turns, its oldest turn or its clock if that started later, plus the timeout;
-- none while its clock stands still (every serving worker busy).
CREATE OR REPLACE FUNCTION tw.due_reap_dispatched(p_timeout_s integer, p_stale_s integer)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT min(CASE WHEN c.clock < 'infinity' THEN greatest(c.oldest, c.clock) END)
           + make_interval(secs => p_timeout_s)
      FROM tw.dispatched_clocks(p_stale_s) c
$$;
