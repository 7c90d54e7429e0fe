-- Rule 2.7 (PMO): pending inbox items are re-rung; one with no channel past the skip time is skipped.

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

-- Due: the oldest pending item's last ring (or creation) plus the spacing, or a channel-less one's skip time
-- (agent_inbox_pending_ring_idx, agent_inbox_pending_nochannel_idx).
CREATE OR REPLACE FUNCTION tw.due_rering_pending(p_wakeup_s integer, p_skip_s integer)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT least((SELECT min(coalesce(rung_at, created_at)) FROM state.agent_inbox WHERE status = 'pending')
                 + make_interval(secs => p_wakeup_s),
                 (SELECT min(created_at) FROM state.agent_inbox WHERE status = 'pending' AND channel_id IS NULL)
                 + make_interval(secs => p_skip_s))
$$;
