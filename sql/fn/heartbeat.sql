-- Heartbeats: what a worker holds is renewed in one call; what it holds but does not know of goes back.

-- Renew what a worker holds: p_holdings = [{"fence","id","token","kind","turn_id","epoch","step",
-- "tool_call_id"}]. Returns the indexes (0-based) of holdings that were lost: reclaimed, reaped,
-- cancelled, or (for tools) no longer waited for. The worker stops those programs.
CREATE OR REPLACE FUNCTION tw.heartbeat(p_worker text, p_holdings jsonb, p_lease_s integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    h      record;
    v_lost jsonb := '[]'::jsonb;
    v_ok   boolean;
BEGIN
    -- Lock order as everywhere: agent, turn, then the inbox row or ledger entry; agents in name order so
    -- that a heartbeat and the PMO's dispatch scan never wait on each other in a cycle.
    FOR h IN
        SELECT e.value AS v, e.ordinality - 1 AS i
          FROM jsonb_array_elements(p_holdings) WITH ORDINALITY e
         ORDER BY e.value ->> 'agent', e.ordinality
    LOOP
        v_ok := true;
        IF h.v ->> 'kind' = 'step' THEN
            -- Skipped while another transaction holds the row (an application's submit in a transaction it
            -- keeps open holds it FOR SHARE): the turn's own row below is what rule 2.6 reads.
            UPDATE state.agents SET updated_at = now()
             WHERE agent = (SELECT agent FROM state.agents
                             WHERE agent = h.v ->> 'agent' AND turn_epoch = (h.v ->> 'epoch')::bigint
                               AND status = 'running'
                               FOR NO KEY UPDATE SKIP LOCKED);
            v_ok := NULL;
            UPDATE state.turns SET updated_at = now()
             WHERE turn_id = (h.v ->> 'turn_id')::uuid AND turn_epoch = (h.v ->> 'epoch')::bigint
               AND status = 'running' AND step = (h.v ->> 'step')::integer
            RETURNING true INTO v_ok;
            IF v_ok THEN
                UPDATE state.turn_running SET beat_at = now() WHERE turn_id = (h.v ->> 'turn_id')::uuid;
            END IF;
        ELSIF h.v ->> 'kind' = 'tool' THEN
            v_ok := NULL;
            SELECT true INTO v_ok FROM state.turn_waiting_tools
             WHERE turn_id = (h.v ->> 'turn_id')::uuid AND step = (h.v ->> 'step')::integer
               AND tool_call_id = h.v ->> 'tool_call_id' AND wait_status = 'waiting';
        END IF;
        IF v_ok THEN
            v_ok := NULL;
            IF h.v ->> 'fence' = 'ledger' THEN
                UPDATE state.turn_resume_ledger
                   SET lease_expires_at = now() + make_interval(secs => p_lease_s), updated_at = now()
                 WHERE ledger_id = (h.v ->> 'id')::bigint AND status = 'processing'
                   AND lease_token = (h.v ->> 'token')::bigint
                RETURNING true INTO v_ok;
            ELSE
                UPDATE state.agent_inbox SET processed_at = now()
                 WHERE inbox_id = (h.v ->> 'id')::bigint AND status = 'processing'
                   AND claim_token = (h.v ->> 'token')::bigint
                RETURNING true INTO v_ok;
            END IF;
        END IF;
        IF v_ok IS NULL THEN
            v_lost := v_lost || to_jsonb(h.i);
        END IF;
    END LOOP;
    RETURN v_lost;
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
