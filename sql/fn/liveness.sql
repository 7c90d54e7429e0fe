-- Liveness (docs/watchdogs.md): daemons register, hold a lock, and hand back what a gone one held.

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

-- `turnwatch daemons`: every daemon seen in the last day, alive or gone (alive: its liveness key is held
-- right now), with what it holds: how many steps and tool calls, and the turn ids of the first 100 of each
-- (by turn id; one id per tool call, so a turn with two calls in flight shows twice).
CREATE OR REPLACE FUNCTION tw.daemons()
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'daemon_id', d.daemon_id, 'kind', d.kind, 'host', d.host, 'pid', d.pid,
               'started_at', d.started_at, 'last_seen_at', d.last_seen_at, 'gone_at', d.gone_at,
               'gone_reason', d.gone_reason, 'info', d.info, 'slots', d.slots, 'free_since', d.free_since,
               'alive', l.granted IS NOT NULL AND d.gone_at IS NULL,
               'holds', jsonb_build_object('steps', s.n, 'step_turn_ids', s.ids,
                                           'tool_calls', t.n, 'tool_call_turn_ids', t.ids))
               ORDER BY d.kind, d.daemon_id), '[]'::jsonb)
      FROM state.daemons d
      LEFT JOIN pg_locks l ON l.locktype = 'advisory' AND l.classid::bigint = tw.live_class()
                          AND l.objid::bigint = d.daemon_no AND l.objsubid = 2 AND l.granted
      CROSS JOIN LATERAL (
          SELECT count(*) AS n,
                 coalesce(jsonb_agg(h.turn_id ORDER BY h.turn_id) FILTER (WHERE h.k <= 100), '[]'::jsonb) AS ids
            FROM (SELECT x.turn_id, row_number() OVER (ORDER BY x.turn_id) AS k
                    FROM (SELECT i.turn_id FROM state.agent_inbox i
                           WHERE i.status = 'processing' AND i.claimed_by = d.daemon_id
                             AND i.target_kind = 'agent'
                          UNION ALL
                          SELECT r.turn_id FROM state.turn_resume_ledger r
                           WHERE r.status = 'processing' AND r.claimed_by = d.daemon_id) x) h) s
      CROSS JOIN LATERAL (
          SELECT count(*) AS n,
                 coalesce(jsonb_agg(h.turn_id ORDER BY h.turn_id) FILTER (WHERE h.k <= 100), '[]'::jsonb) AS ids
            FROM (SELECT i.turn_id, row_number() OVER (ORDER BY i.turn_id) AS k
                    FROM state.agent_inbox i
                   WHERE i.status = 'processing' AND i.claimed_by = d.daemon_id
                     AND i.target_kind = 'tool') h) t
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
