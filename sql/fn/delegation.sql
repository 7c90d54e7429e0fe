-- Delegation (docs/roster.md): child turns, their ends as their parents' call results, trees.

--
-- Lock order across a tree: an ancestor's rows before a descendant's (parent agent, parent turn, child agent,
-- child turn). A path that ends a child therefore takes the parent's turn row first (tw.lock_parent), and a
-- parent that ends or times out a call cancels its children while holding its own rows. A step that delegates
-- takes its tree's counter row before any of these (tw.tree_lock); nothing else takes it, so a transaction
-- waiting for it holds nothing another one waits for.

-- Lock the counter of p_turn's tree ([worker] max_tree_turns, issue 23), creating it at the tree's first
-- delegation, before anything else of the step is locked: the steps of one tree count their children one
-- after the other. Returns the root.
CREATE OR REPLACE FUNCTION tw.tree_lock(p_turn uuid)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    v_root uuid;
BEGIN
    SELECT coalesce(root_turn_id, turn_id) INTO v_root FROM state.turns WHERE turn_id = p_turn;
    IF v_root IS NOT NULL THEN
        INSERT INTO state.turn_trees (root_turn_id) VALUES (v_root) ON CONFLICT DO NOTHING;
        PERFORM 1 FROM state.turn_trees WHERE root_turn_id = v_root FOR UPDATE;
    END IF;
    RETURN v_root;
END $$;

-- How many child turns one transaction may cancel through tw.cancel_children, at every depth (issue 23: a
-- cancel of a tree of 96,513 turns was one transaction of minutes, holding its locks all along). What is left
-- goes to state.tree_cancels for the PMO's rule tree_cancel, one batch per transaction. The transaction
-- setting tw.cancel_batch may lower it (tests); tw.cancel_left counts down what this transaction may still do.
-- Anyone may set either (a client too, before its cancel): neither is believed above 500, so a setting can
-- only make a transaction do less.
CREATE OR REPLACE FUNCTION tw.cancel_batch()
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT least(coalesce(nullif(current_setting('tw.cancel_batch', true), '')::integer, 500), 500)
$$;

CREATE OR REPLACE FUNCTION tw.cancel_left()
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT least(coalesce(nullif(current_setting('tw.cancel_left', true), '')::integer, tw.cancel_batch()),
                 tw.cancel_batch())
$$;

-- Lock the parent turn of p_turn, if it has one, before anything of p_turn is locked. p_wait false: SKIP
-- LOCKED (false when busy: try again later). True when there is no parent or it is now held.
CREATE OR REPLACE FUNCTION tw.lock_parent(p_turn uuid, p_wait boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_parent uuid;
BEGIN
    SELECT parent_turn_id INTO v_parent FROM state.turns WHERE turn_id = p_turn;
    IF v_parent IS NULL THEN
        RETURN true;
    END IF;
    IF p_wait THEN
        PERFORM 1 FROM state.turns WHERE turn_id = v_parent FOR UPDATE;
    ELSE
        PERFORM 1 FROM state.turns WHERE turn_id = v_parent FOR UPDATE SKIP LOCKED;
    END IF;
    RETURN FOUND;
END $$;

-- A child turn has just ended (the caller holds the parent's turn row, then the child's): its result becomes
-- the result of the call that started it, in this transaction. done -> ok with the child's output;
-- failed|timeout|cancelled -> error child_failed|child_timeout|child_cancelled with the child's error.
CREATE OR REPLACE FUNCTION tw.child_ended(c state.turns)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_out jsonb;
    v_res jsonb;
BEGIN
    IF c.parent_turn_id IS NULL THEN
        RETURN '[]'::jsonb;
    END IF;
    -- Only while the call that started this child still waits for it (not timed out, not cancelled, not a
    -- newer call that reuses the id).
    PERFORM 1 FROM state.turn_waiting_tools
     WHERE turn_id = c.parent_turn_id AND step = c.parent_step AND tool_call_id = c.parent_tool_call_id
       AND child_turn_id = c.turn_id AND wait_status = 'waiting';
    IF NOT FOUND THEN
        RETURN '[]'::jsonb;
    END IF;
    IF c.status = 'done' THEN
        SELECT content -> 'output' INTO v_out FROM state.cards WHERE card_id = c.deliverable_card_id;
        v_res := tw.deliver_result(c.parent_turn_id, c.parent_tool_call_id, 'ok', coalesce(v_out, 'null'::jsonb),
                                   NULL, NULL, 'tool.result');
    ELSE
        v_res := tw.deliver_result(c.parent_turn_id, c.parent_tool_call_id, 'error', NULL,
                     jsonb_strip_nulls(jsonb_build_object(
                         'code', CASE c.status WHEN 'failed' THEN 'child_failed' WHEN 'timeout' THEN 'child_timeout'
                                               ELSE 'child_cancelled' END,
                         'message', format('child turn %s of agent %s ended %s: %s', c.turn_id, c.agent, c.status,
                                           coalesce(c.error_message, c.error, c.status)),
                         'child_turn_id', c.turn_id, 'child_error', c.error)),
                     NULL, 'tool.result');
    END IF;
    RETURN coalesce(v_res -> 'publish', '[]'::jsonb);
END $$;

-- Cancel the child turns of p_turn that have not ended, those of steps p_from to p_to (NULL: its last): each
-- ends `cancelled` with the output contract, and its own children with it (force_finish recurses), as long as
-- this transaction's batch lasts (tw.cancel_left). What it cannot cancel now (the batch is used up, or, with
-- p_wait false, a child's row or agent is busy) is recorded in state.tree_cancels for the rule tree_cancel,
-- which the PMO runs at once (NOTIFY tw_due). The caller holds p_turn's row.
CREATE OR REPLACE FUNCTION tw.cancel_children_upto(p_turn uuid, p_from integer, p_to integer, p_message text,
                                                   p_wait boolean)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_child uuid;
    v_left  integer;
    v_res   jsonb;
    v_to    integer := p_to;
    v_rest  boolean := false;
    v_pub   jsonb := '[]'::jsonb;
BEGIN
    FOR v_child IN
        SELECT turn_id FROM state.turns
         WHERE parent_turn_id = p_turn AND parent_step BETWEEN p_from AND coalesce(p_to, 2147483647)
           AND status IN ('pending', 'dispatched', 'running', 'suspended')
         ORDER BY seq
    LOOP
        v_left := tw.cancel_left();
        IF v_left <= 0 THEN
            v_rest := true;
            EXIT;
        END IF;
        -- Taken before the child's own children use the batch; given back if the child was not cancelled.
        PERFORM set_config('tw.cancel_left', (v_left - 1)::text, true);
        v_res := tw.end_turn(v_child, 'cancelled', 'cancelled', p_message, p_wait);
        IF v_res IS NULL THEN
            PERFORM set_config('tw.cancel_left', (tw.cancel_left() + 1)::text, true);
            v_rest := v_rest OR EXISTS (SELECT 1 FROM state.turns WHERE turn_id = v_child
                                           AND status IN ('pending', 'dispatched', 'running', 'suspended'));
        END IF;
        v_pub := v_pub || coalesce(v_res, '[]'::jsonb);
    END LOOP;
    IF v_rest THEN
        -- Every step so far of a turn that ended, of the attempt that failed when it is retried (back to
        -- pending, its next attempt starts at step_base). Up to p_to: the children of earlier steps have all
        -- ended or are recorded here already (a turn resumes only after cancelling the calls of its step it
        -- no longer waits for).
        IF v_to IS NULL THEN
            SELECT CASE WHEN status IN ('done', 'failed', 'timeout', 'cancelled') THEN step ELSE step_base - 1 END
              INTO v_to FROM state.turns WHERE turn_id = p_turn;
        END IF;
        INSERT INTO state.tree_cancels AS x (turn_id, max_step, message) VALUES (p_turn, v_to, p_message)
        ON CONFLICT (turn_id) DO UPDATE SET max_step = greatest(x.max_step, EXCLUDED.max_step);
        PERFORM pg_notify('tw_due', 'tree_cancel');
    END IF;
    RETURN v_pub;
END $$;

-- Cancel the child turns of p_turn that have not ended: those of step p_step, or of every step (NULL).
-- Bounded per transaction (tw.cancel_children_upto). Waits for the children's rows, unless the transaction
-- setting tw.cancel_skip_locked is on (the rule tree_cancel: it leaves a busy child for its next run rather
-- than wait behind another transaction at any depth).
CREATE OR REPLACE FUNCTION tw.cancel_children(p_turn uuid, p_step integer, p_message text)
RETURNS jsonb LANGUAGE sql AS $$
    SELECT tw.cancel_children_upto(p_turn, coalesce(p_step, -2147483648), p_step, p_message,
                                   current_setting('tw.cancel_skip_locked', true) IS DISTINCT FROM 'on')
$$;

-- A delegating call (a [tool.X] with agent_profile) of the turn t, whose waiting row the caller has just
-- written: start its child turn on an agent of that profile, in this transaction, or fail the call at once
-- (delegation_depth, an unusable args.agent, or delegation_limit: its tree has p_max_tree turns already; the
-- caller holds the tree's counter, tw.tree_lock). The child's deadline is the call's (rule 2.2 cancels it
-- with the call's timeout report); args.timeout_seconds can only shorten it.
CREATE OR REPLACE FUNCTION tw.delegate(t state.turns, p_call jsonb, p_deadline timestamptz, p_max_depth integer,
                                       p_max_tree integer DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_profile text := p_call ->> 'agent_profile';
    v_args    jsonb := p_call -> 'args';
    v_agent   text;
    v_bound   text;
    v_retired timestamptz;
    v_code    text;
    v_msg     text;
    v_own     timestamptz;
    v_id      uuid;
    v_root    uuid := coalesce(t.root_turn_id, t.turn_id);
    v_turns   integer;
    v_child   state.turns;
BEGIN
    IF t.depth >= p_max_depth THEN
        v_code := 'delegation_depth';
        v_msg := format('turn %s is at delegation depth %s, the maximum (max_delegation_depth = %s)', t.turn_id,
                        t.depth, p_max_depth);
    ELSIF jsonb_typeof(v_args -> 'agent') = 'string' THEN
        v_agent := v_args ->> 'agent';
        SELECT profile, retired_at INTO v_bound, v_retired FROM state.agents WHERE agent = v_agent;
        IF NOT tw.name_ok(v_agent) OR v_bound IS NULL THEN
            v_code := 'unknown_agent';
            v_msg := format('args.agent %s names no agent of the roster', left(v_agent, 80));
        ELSIF v_bound <> v_profile THEN
            v_code := 'unknown_agent';
            v_msg := format('agent %s is bound to profile %s, not %s', v_agent, v_bound, v_profile);
        ELSIF v_retired IS NOT NULL THEN
            v_code := 'agent_retired';
            v_msg := format('agent %s was retired at %s', v_agent, v_retired);
        END IF;
    ELSIF v_args ? 'agent' THEN
        v_code := 'unknown_agent';
        v_msg := 'args.agent must be a string naming an agent';
    END IF;
    IF v_code IS NULL AND v_args ? 'timeout_seconds' THEN
        IF jsonb_typeof(v_args -> 'timeout_seconds') <> 'number'
           OR (v_args ->> 'timeout_seconds')::numeric NOT BETWEEN 1 AND tw.limit_turn_timeout_max() THEN
            v_code := 'bad_args';
            v_msg := format('args.timeout_seconds must be a number of seconds from 1 to %s',
                            tw.limit_turn_timeout_max());
        ELSE
            v_own := now() + make_interval(secs => (v_args ->> 'timeout_seconds')::numeric);
        END IF;
    END IF;
    -- Last, so that only a child that is made counts.
    IF v_code IS NULL AND p_max_tree IS NOT NULL THEN
        UPDATE state.turn_trees SET turns = turns + 1 WHERE root_turn_id = v_root AND turns < p_max_tree
        RETURNING turns INTO v_turns;
        IF v_turns IS NULL THEN
            SELECT turns INTO v_turns FROM state.turn_trees WHERE root_turn_id = v_root;
            v_code := 'delegation_limit';
            v_msg := format('the delegation tree of turn %s has %s turns, the maximum (max_tree_turns = %s)',
                            v_root, coalesce(v_turns, 0), p_max_tree);
        END IF;
    END IF;
    IF v_code IS NOT NULL THEN
        RETURN tw.deliver_result(t.turn_id, p_call ->> 'id', 'error', NULL,
                                 jsonb_build_object('code', v_code, 'message', v_msg), NULL, 'tool.result')
               -> 'publish';
    END IF;
    IF v_agent IS NULL THEN
        v_agent := left(v_profile, 51) || '-' || left(replace(gen_random_uuid()::text, '-', ''), 12);
        INSERT INTO state.agents (agent, profile) VALUES (v_agent, v_profile);
    END IF;
    INSERT INTO state.turns AS c (agent, profile, channel_id, input, timeout_seconds, deadline_at, depth,
                                  parent_turn_id, parent_step, parent_tool_call_id, root_turn_id, limit_key, priority)
    VALUES (v_agent, v_profile, t.channel_id, coalesce(v_args -> 'input', '{}'::jsonb),
            CASE WHEN v_own < p_deadline THEN (v_args ->> 'timeout_seconds')::numeric::integer END,
            CASE WHEN v_own < p_deadline THEN v_own END, t.depth + 1, t.turn_id, t.step, p_call ->> 'id', v_root,
            t.limit_key, t.priority)
    RETURNING c.* INTO v_child;
    v_id := v_child.turn_id;
    PERFORM tw.turns_move(ARRAY[v_child], true);  -- its agent's queue, its timers
    UPDATE state.turn_waiting_tools SET child_turn_id = v_id, started_at = now()
     WHERE turn_id = t.turn_id AND step = t.step AND tool_call_id = p_call ->> 'id';
    -- Announced at once (no NOTIFY round trip through the PMO) when the agent is idle.
    RETURN tw.dispatch_next(v_agent);
END $$;

-- The delegation tree a turn belongs to, from its root: each node its status and the call that started it,
-- children in start order, 64 levels below the root at most ("children" is [] on a node of the last level).
-- NULL for an unknown turn. With p_max, only the first p_max turns in that order (depth first, each turn
-- before its children, the root first); when that leaves turns out, the root says so with "truncated": true
-- and "tree_turns" (how many the tree has), and each node that lost children has "children_total" (how many it
-- has). One statement, linear in the tree's size: a recursive query finds the nodes with their paths (the seq
-- of each turn from the root down), and the nested document is written in one ordered pass over them: each
-- node's fields, its children opened, then the brackets that close it and each ancestor the next node is not
-- under (all of them after the last node). A tree of
-- max_tree_turns (10,000) answers in tens of milliseconds.
CREATE OR REPLACE FUNCTION tw.turn_tree(p_turn uuid, p_max integer DEFAULT NULL)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    WITH RECURSIVE up (turn_id, parent_turn_id, n) AS (
        SELECT t.turn_id, t.parent_turn_id, 0 FROM state.turns t WHERE t.turn_id = p_turn
        UNION ALL
        SELECT t.turn_id, t.parent_turn_id, up.n + 1
          FROM up JOIN state.turns t ON t.turn_id = up.parent_turn_id
         WHERE up.n < 64
    ), down (turn_id, parent_turn_id, lvl, path) AS (
        SELECT t.turn_id, NULL::uuid, 0, ARRAY[t.seq]
          FROM state.turns t
         WHERE t.turn_id = (SELECT up.turn_id FROM up ORDER BY up.n DESC LIMIT 1)
        UNION ALL
        SELECT c.turn_id, c.parent_turn_id, d.lvl + 1, d.path || c.seq
          FROM down d JOIN state.turns c ON c.parent_turn_id = d.turn_id
         WHERE d.lvl < 64
    ), numbered AS (
        SELECT d.*, row_number() OVER (ORDER BY d.path) AS pos, count(*) OVER () AS total FROM down d
    ), shown AS (
        SELECT n.*, p_max IS NOT NULL AND n.total > greatest(p_max, 1) AS cut
          FROM numbered n
         WHERE p_max IS NULL OR n.pos <= greatest(p_max, 1)
    ), kids AS (
        SELECT d.parent_turn_id AS turn_id, count(*) AS n FROM down d WHERE d.parent_turn_id IS NOT NULL
         GROUP BY d.parent_turn_id
    ), kids_shown AS (
        SELECT s.parent_turn_id AS turn_id, count(*) AS n FROM shown s WHERE s.parent_turn_id IS NOT NULL
         GROUP BY s.parent_turn_id
    ), nodes AS (
        SELECT s.lvl, s.pos, lead(s.lvl, 1, -1) OVER (ORDER BY s.pos) AS next_lvl,
               json_strip_nulls(json_build_object(
                   'turn_id', t.turn_id, 'agent', t.agent, 'profile', t.profile, 'status', t.status,
                   'error', t.error, 'depth', t.depth, 'parent_tool_call_id', t.parent_tool_call_id,
                   'created_at', t.created_at, 'ended_at', t.ended_at,
                   'children_total', CASE WHEN s.cut AND k.n > coalesce(ks.n, 0) THEN k.n END,
                   'truncated', CASE WHEN s.cut AND s.lvl = 0 THEN true END,
                   'tree_turns', CASE WHEN s.cut AND s.lvl = 0 THEN s.total END))::text AS doc
          FROM shown s
          JOIN state.turns t ON t.turn_id = s.turn_id
          LEFT JOIN kids k ON k.turn_id = s.turn_id
          LEFT JOIN kids_shown ks ON ks.turn_id = s.turn_id
    )
    SELECT string_agg(
               left(x.doc, -1) || ', "children": ['
               || CASE WHEN x.next_lvl > x.lvl THEN ''
                       ELSE repeat(']}', x.lvl - greatest(x.next_lvl, 0) + 1)
                            || CASE WHEN x.next_lvl >= 0 THEN ', ' ELSE '' END
                  END,
               '' ORDER BY x.pos)::jsonb
      FROM nodes x
$$;
