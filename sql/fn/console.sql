-- The console's reads (turnwatch console): turns with filters, a turn with its timeline.

-- The smallest seq at or after which every turn was created at or after p_at, by bisection over seq (each probe
-- one index lookup, some 20 to 40 in all). It assumes created_at grows with seq, which holds but for a turn
-- submitted in a transaction that stayed open while later ones committed; such a turn may be put on the other
-- side of a `before` bound. NULL when no turn was created at or after p_at.
CREATE OR REPLACE FUNCTION tw.console_seq_from(p_at timestamptz)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_lo  bigint;
    v_hi  bigint;
    v_mid bigint;
    v_at  timestamptz;
BEGIN
    SELECT seq INTO v_lo FROM state.turns ORDER BY seq LIMIT 1;
    SELECT seq, created_at INTO v_hi, v_at FROM state.turns ORDER BY seq DESC LIMIT 1;
    IF v_hi IS NULL OR v_at < p_at THEN
        RETURN NULL;
    END IF;
    -- The first row at or after seq x is created at f(x); find the smallest x in [lo, hi] with f(x) >= p_at.
    WHILE v_lo < v_hi LOOP
        v_mid := v_lo + (v_hi - v_lo) / 2;
        SELECT created_at INTO v_at FROM state.turns WHERE seq >= v_mid ORDER BY seq LIMIT 1;
        IF v_at >= p_at THEN
            v_hi := v_mid;
        ELSE
            v_lo := v_mid + 1;
        END IF;
    END LOOP;
    RETURN v_lo;
END $$;

-- Turns newest first (by seq), p_limit at a time below p_cursor (a seq; NULL from the newest). Filters: agent (its
-- index), profile, status, created_at >= p_since, created_at < p_before (a seq bound from tw.console_seq_from, then
-- the exact test). A page reads at most 20,000 turns: a filter that few turns match may come back short, with
-- "next" where to go on (a seq) and "examined" how many it read; "next" is NULL once there is nothing older.
-- The walk stops at the first turn created before p_since (seq order is time order, as above).
CREATE OR REPLACE FUNCTION tw.console_turns(p_agent text, p_profile text, p_status text, p_since timestamptz,
                                            p_before timestamptz, p_cursor bigint, p_limit integer)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    c        refcursor;
    t        record;
    v_top    bigint := p_cursor;
    v_bound  bigint;
    v_rows   jsonb := '[]'::jsonb;
    v_n      integer := 0;
    v_seen   integer := 0;
    v_next   bigint;
    v_budget constant integer := 20000;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 500 THEN
        RAISE EXCEPTION 'limit must be from 1 to 500' USING ERRCODE = '22023';
    END IF;
    IF p_before IS NOT NULL THEN
        v_bound := tw.console_seq_from(p_before);
        IF v_bound IS NOT NULL AND (v_top IS NULL OR v_bound < v_top) THEN
            v_top := v_bound;
        END IF;
    END IF;
    -- Two plans, each on its own index (turns_agent_idx, turns_seq_idx), read backwards.
    IF p_agent IS NOT NULL THEN
        OPEN c FOR SELECT x.seq, x.turn_id, x.agent, x.profile, x.status, x.error, x.attempt, x.depth,
                          x.parent_turn_id, x.channel_id, x.created_at, x.started_at, x.ended_at
                     FROM state.turns x
                    WHERE x.agent = p_agent AND x.seq < coalesce(v_top, 9223372036854775807)
                    ORDER BY x.agent DESC, x.seq DESC;
    ELSE
        OPEN c FOR SELECT x.seq, x.turn_id, x.agent, x.profile, x.status, x.error, x.attempt, x.depth,
                          x.parent_turn_id, x.channel_id, x.created_at, x.started_at, x.ended_at
                     FROM state.turns x
                    WHERE x.seq < coalesce(v_top, 9223372036854775807)
                    ORDER BY x.seq DESC;
    END IF;
    LOOP
        FETCH c INTO t;
        EXIT WHEN NOT FOUND;
        v_seen := v_seen + 1;
        EXIT WHEN p_since IS NOT NULL AND t.created_at < p_since;
        IF (p_profile IS NULL OR t.profile = p_profile) AND (p_status IS NULL OR t.status = p_status)
           AND (p_before IS NULL OR t.created_at < p_before) THEN
            v_rows := v_rows || jsonb_build_array(jsonb_build_object(
                'seq', t.seq, 'turn_id', t.turn_id, 'agent', t.agent, 'profile', t.profile, 'status', t.status,
                'error', t.error, 'attempt', t.attempt, 'depth', t.depth, 'parent_turn_id', t.parent_turn_id,
                'channel_id', t.channel_id, 'created_at', t.created_at, 'started_at', t.started_at,
                'ended_at', t.ended_at));
            v_n := v_n + 1;
            IF v_n >= p_limit THEN
                v_next := t.seq;
                EXIT;
            END IF;
        END IF;
        IF v_seen >= v_budget THEN
            v_next := t.seq;
            EXIT;
        END IF;
    END LOOP;
    CLOSE c;
    RETURN jsonb_build_object('turns', v_rows, 'next', v_next, 'examined', v_seen, 'now', now());
END $$;

-- One turn with what its page shows: the fields of tw.turn_show, the deliverable's content, and the timeline's
-- data on the database clock ("now"): its transitions (state.turn_history), its steps (the `turn` message of each
-- attempt and a resume ledger entry per later step: when it was ready, taken, ended, by which worker, with what
-- outcome), its tool calls (issued, taken by a program, settled, deadline, warning time, child turn), warnings,
-- forced ends and the deadlines the turn row holds. Each list at most 2,000 entries ("truncated" says so). NULL
-- for an unknown turn. Every read is by turn id (or parent id) through an index.
CREATE OR REPLACE FUNCTION tw.console_turn(turn uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT tw.turn_show(t.turn_id) || jsonb_build_object(
        'now', now(), 'seq', t.seq, 'step_base', t.step_base, 'queue_deadline_at', t.queue_deadline_at,
        'queue_warn_at', t.queue_warn_at, 'deadline_warn_at', t.deadline_warn_at, 'retry_due_at', t.retry_due_at,
        'deliverable', (SELECT c.content FROM state.cards c WHERE c.card_id = t.deliverable_card_id),
        'transitions', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'at', h.at, 'from', h.from_status, 'to', h.to_status, 'turn_epoch', h.turn_epoch,
                'attempt', h.attempt, 'actor', h.actor, 'reason', h.reason)
                || jsonb_strip_nulls(jsonb_build_object('waited_from', h.waited_from, 'limit', h.wait_limit,
                                                        'tool_call_id', h.tool_call_id)) ORDER BY h.id), '[]')
            FROM (SELECT * FROM state.turn_history h WHERE h.turn_id = t.turn_id ORDER BY h.id LIMIT 2000) h),
        'steps', (SELECT coalesce(jsonb_agg(to_jsonb(s) ORDER BY s.ready_at, s.step), '[]') FROM (
            SELECT m.step, 'turn' AS source, m.turn_epoch, m.claimed_by AS worker, m.created_at AS ready_at,
                   m.processed_at AS started_at,
                   CASE WHEN m.status IN ('archived', 'skipped') THEN m.archived_at END AS ended_at,
                   m.status, m.outcome, m.attempts
              FROM state.agent_inbox m
             WHERE m.turn_id = t.turn_id AND m.target_kind = 'agent' AND m.message_type = 'turn'
            UNION ALL
            -- A ledger entry records the suspended step whose results are in; the step it runs is the next one.
            -- Its updated_at is when it was taken while it runs, when it ended once done; the start of a done one
            -- is the history's "resumed" after it was ready.
            SELECT l.step + 1, 'resume', l.turn_epoch, l.claimed_by, l.created_at,
                   CASE l.status
                       WHEN 'processing' THEN l.updated_at
                       WHEN 'done' THEN (SELECT min(h.at) FROM state.turn_history h
                                          WHERE h.turn_id = l.turn_id AND h.at >= l.created_at
                                            AND h.from_status = 'suspended' AND h.to_status = 'running')
                   END,
                   CASE WHEN l.status = 'done' THEN l.updated_at END, l.status, l.outcome, l.attempts
              FROM state.turn_resume_ledger l
             WHERE l.turn_id = t.turn_id
             LIMIT 2000) s),
        'tool_calls', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'tool_call_id', w.tool_call_id, 'tool', w.tool, 'step', w.step, 'status', w.wait_status,
                'result_status', w.result_status, 'error', w.error, 'external', w.external,
                'timeout_seconds', w.timeout_seconds, 'timeout_source', w.timeout_source,
                'created_at', w.created_at, 'started_at', w.started_at, 'deadline_at', w.deadline_at,
                'warn_at', w.warn_at, 'settled_at', w.settled_at, 'child_turn_id', w.child_turn_id,
                'child_agent', k.agent, 'child_status', k.status,
                'progress', w.progress) -- an MCP tool's last progress (docs/mcp.md)
                ORDER BY w.step, w.call_index), '[]')
            FROM (SELECT * FROM state.turn_waiting_tools w WHERE w.turn_id = t.turn_id
                   ORDER BY w.step, w.call_index LIMIT 2000) w
            LEFT JOIN state.turns k ON k.turn_id = w.child_turn_id),
        -- Flow control: what the turn and its calls wait for now (sql/fn/turn_limits.sql).
        'limit_waits', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'tool_call_id', nullif(c.tool_call_id, ''), 'since', c.since,
                'limit', coalesce(c.blocked, c.limits[1])) ORDER BY c.seq), '[]')
            FROM state.limit_calls c WHERE c.turn_id = t.turn_id AND c.status = 'waiting'),
        'truncated', (SELECT count(*) > 2000 FROM (SELECT 1 FROM state.turn_history h WHERE h.turn_id = t.turn_id
                                                   LIMIT 2001) x)
                  OR (SELECT count(*) > 2000 FROM (SELECT 1 FROM state.turn_waiting_tools w
                                                     WHERE w.turn_id = t.turn_id LIMIT 2001) x))
      FROM state.turns t
     WHERE t.turn_id = $1
$$;
