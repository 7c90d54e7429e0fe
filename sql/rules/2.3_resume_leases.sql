-- Rule 2.3 (worker): resume ledger leases that expired go back to pending (requeue_expired_resume_ledgers).

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

-- Due: the earliest expiry of a resume lease (turn_resume_ledger_lease_idx).
CREATE OR REPLACE FUNCTION tw.due_resume_leases()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT min(lease_expires_at) FROM state.turn_resume_ledger WHERE status = 'processing'
$$;
