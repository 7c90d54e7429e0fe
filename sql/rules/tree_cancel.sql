-- Large delegation trees (PMO): what a cancel left to cancel, one bounded batch per run.

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

-- Due: the oldest cancel left to finish (tree_cancels_requested_idx).
CREATE OR REPLACE FUNCTION tw.due_tree_cancels()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT min(requested_at) FROM state.tree_cancels
$$;
