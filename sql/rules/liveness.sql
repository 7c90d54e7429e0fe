-- Liveness (both daemons): daemons whose session ended are marked gone and what they held goes back.

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
