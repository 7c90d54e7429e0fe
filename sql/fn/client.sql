-- Reading turns for clients of the SQL API and observers (the Python library, turn show, turns list).

-- What a waiting client needs: the status, and once the turn has ended, its error and the output of its
-- deliverable. "output" is the agent's output of a done turn (null otherwise); "deliverable" the whole card
-- (for a turn ended by a watchdog, a deadline or a cancel: the fallback card with the reason and the last
-- state). NULL for an unknown turn.
CREATE OR REPLACE FUNCTION tw.turn_outcome(turn uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'turn_id', t.turn_id, 'agent', t.agent, 'profile', t.profile, 'status', t.status,
        'terminal', t.status IN ('done', 'failed', 'timeout', 'cancelled'),
        'error', t.error, 'error_message', t.error_message, 'turn_epoch', t.turn_epoch, 'attempt', t.attempt,
        'deliverable_card_id', t.deliverable_card_id,
        'output', CASE WHEN t.status = 'done' THEN c.content -> 'output' END,
        'deliverable', c.content, 'created_at', t.created_at, 'ended_at', t.ended_at,
        'pending_reason', tw.pending_reason(t))
      FROM state.turns t
      LEFT JOIN state.cards c ON c.card_id = t.deliverable_card_id
     WHERE t.turn_id = $1
$$;

-- tw.turn_outcome for a client that waits for the turn's end (LISTEN tw_turn_end first): it registers as the
-- turn's waiter, so that the end's transaction notifies, and reads the turn FOR SHARE, which waits for a move of
-- the turn in flight: either that move ends the turn and this read sees it ended, or the move comes after this
-- registration and sees it. Nothing is lost in between. NULL for an unknown turn.
CREATE OR REPLACE FUNCTION tw.turn_wait(turn uuid)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
BEGIN
    SELECT t.status INTO v_status FROM state.turns t WHERE t.turn_id = $1;
    IF v_status IS NULL THEN
        RETURN NULL;
    END IF;
    IF v_status NOT IN ('done', 'failed', 'timeout', 'cancelled') THEN
        INSERT INTO state.turn_waiters (turn_id, pid) VALUES ($1, pg_backend_pid()) ON CONFLICT DO NOTHING;
        PERFORM 1 FROM state.turns t WHERE t.turn_id = $1 FOR SHARE;
    END IF;
    RETURN tw.turn_outcome($1);
END $$;

-- `turnwatch turn show ID --json` as one value: the turn with its tool calls (each with its effective timeout and
-- where it came from), forced ends, warnings and children. NULL for an unknown turn. max_attempts is the policy
-- of the turn's profile. "children" holds the first 100 children in start order (a tree may have 10,000:
-- tw.turn_tree gives them all); "children_total" says how many there are, "children_truncated" whether some
-- are left out.
CREATE OR REPLACE FUNCTION tw.turn_show(turn uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'turn_id', t.turn_id, 'agent', t.agent, 'profile', t.profile, 'channel_id', t.channel_id,
        'output_box_id', t.output_box_id, 'depth', t.depth, 'parent_turn_id', t.parent_turn_id,
        'parent_tool_call_id', t.parent_tool_call_id,
        'status', t.status, 'turn_epoch', t.turn_epoch, 'step', t.step, 'error', t.error,
        'attempt', t.attempt, 'max_attempts', (tw.policy(t.profile)).max_attempts, 'replay_of', t.replay_of,
        'retry_at', t.retry_at, 'timeout', t.timeout_detail,
        -- A turn that runs later (sql/fn/later.sql): when, and why a pending turn waits.
        'not_before', t.not_before, 'pending_reason', tw.pending_reason(t),
        'error_message', t.error_message, 'deliverable_card_id', t.deliverable_card_id,
        'idempotency_key', t.idempotency_key, 'timeout_seconds', t.timeout_seconds, 'deadline_at', t.deadline_at,
        'resume_deadline', t.resume_deadline,
        'wait', CASE t.wait_mode WHEN 'n' THEN to_jsonb(t.wait_count) ELSE to_jsonb(t.wait_mode) END,
        'created_at', t.created_at, 'dispatched_at', t.dispatched_at, 'started_at', t.started_at,
        'suspended_at', t.suspended_at, 'ended_at', t.ended_at, 'updated_at', t.updated_at,
        'tool_calls', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'tool_call_id', w.tool_call_id, 'tool', w.tool, 'step', w.step,
                -- Flow control: a call waiting for its limits is waiting_limit (docs/flow-control.md).
                'status', CASE WHEN lc.status = 'waiting' THEN 'waiting_limit' ELSE w.wait_status END,
                'result_status', w.result_status, 'error', w.error, 'external', w.external,
                'timeout_seconds', w.timeout_seconds, 'timeout_source', w.timeout_source,
                'created_at', w.created_at, 'started_at', w.started_at,
                'deadline_at', w.deadline_at, 'settled_at', w.settled_at, 'child_turn_id', w.child_turn_id,
                'limits', w.limits, 'granted_at', lc.granted_at, 'tries', w.tries,
                -- An MCP tool's last progress (docs/mcp.md).
                'progress', w.progress)
                ORDER BY w.step, w.call_index), '[]')
            FROM state.turn_waiting_tools w
            LEFT JOIN state.limit_calls lc ON w.limits IS NOT NULL AND lc.turn_id = w.turn_id AND lc.step = w.step
                                          AND lc.tool_call_id = w.tool_call_id
           WHERE w.turn_id = t.turn_id),
        'limit_key', t.limit_key, 'priority', t.priority,
        'force_terminations', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'reason', f.reason, 'turn_epoch', f.turn_epoch, 'at', f.created_at) ORDER BY f.id), '[]')
            FROM state.force_terminations f WHERE f.turn_id = t.turn_id),
        'warnings', (SELECT coalesce(jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
                'kind', x.kind, 'attempt', x.attempt, 'tool_call_id', nullif(x.tool_call_id, ''),
                'limit_seconds', x.limit_seconds, 'elapsed_seconds', x.elapsed_seconds, 'due_at', x.due_at,
                'at', x.created_at)) ORDER BY x.created_at), '[]')
            FROM state.turn_warnings x WHERE x.turn_id = t.turn_id),
        'children', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'turn_id', c.turn_id, 'agent', c.agent, 'status', c.status, 'error', c.error,
                'tool_call_id', c.parent_tool_call_id) ORDER BY c.seq), '[]')
            FROM (SELECT * FROM state.turns c WHERE c.parent_turn_id = t.turn_id
                   ORDER BY c.seq LIMIT 100) c),
        'children_total', k.n, 'children_truncated', k.n > 100)
      FROM state.turns t
      CROSS JOIN LATERAL (SELECT count(*) AS n FROM state.turns c WHERE c.parent_turn_id = t.turn_id) k
     WHERE t.turn_id = $1
$$;

-- `turnwatch turns list`: turns newest first (by seq), of one agent and in one status if given, at most p_limit.
CREATE OR REPLACE FUNCTION tw.turns_list(p_agent text, p_status text, p_limit integer)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(to_jsonb(x) - 'seq' ORDER BY x.seq DESC), '[]')
      FROM (SELECT t.seq, t.turn_id, t.agent, t.channel_id, t.status, t.turn_epoch, t.error, t.deliverable_card_id,
                   t.created_at, t.ended_at
              FROM state.turns t
             WHERE (p_agent IS NULL OR t.agent = p_agent) AND (p_status IS NULL OR t.status = p_status)
             ORDER BY t.seq DESC LIMIT tw.check_limit(p_limit, 100000)) x
$$;
