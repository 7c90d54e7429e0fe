-- Rule 2.1 (worker): processing inbox items whose lease expired go back to pending.

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

-- Due: the oldest processing item's lease end (agent_inbox_processing_idx).
CREATE OR REPLACE FUNCTION tw.due_reclaim_inbox(p_lease_s integer)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT min(processed_at) + make_interval(secs => p_lease_s) FROM state.agent_inbox WHERE status = 'processing'
$$;
