-- migrate: repeatable (re-applied by `turnwatch migrate` whenever this text changes: CREATE OR REPLACE only;
-- a function whose signature or return type changes is dropped explicitly first).
-- Reading the roster and delegation trees (contract section 14), for the CLI and any SQL client. Read-only.

-- One agent: its binding, state and turns by status.
CREATE OR REPLACE FUNCTION tw.agent_info(p_agent text)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'agent', a.agent, 'profile', a.profile, 'status', a.status, 'retired', a.retired_at IS NOT NULL,
        'created_at', a.created_at, 'retired_at', a.retired_at, 'metadata', a.metadata,
        'active_turn_id', a.active_agent_turn_id, 'turn_epoch', a.turn_epoch, 'updated_at', a.updated_at,
        'turns', (SELECT coalesce(jsonb_object_agg(s.status, s.n), '{}'::jsonb)
                    FROM (SELECT t.status, count(*) AS n FROM state.turns t WHERE t.agent = a.agent
                           GROUP BY t.status) s))
      FROM state.agents a WHERE a.agent = p_agent
$$;

-- The roster in id order, p_limit at a time after p_after (keyset paging: cheap at any depth of a million
-- rows). p_retired: NULL every agent, true the retired ones, false the active ones.
CREATE OR REPLACE FUNCTION tw.agents_list(p_profile text, p_retired boolean, p_after text, p_limit integer)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'agent', a.agent, 'profile', a.profile, 'status', a.status, 'retired', a.retired_at IS NOT NULL,
               'created_at', a.created_at, 'active_turn_id', a.active_agent_turn_id) ORDER BY a.agent), '[]')
      FROM (SELECT * FROM state.agents a
             WHERE (p_profile IS NULL OR a.profile = p_profile)
               AND (p_retired IS NULL OR (a.retired_at IS NOT NULL) = p_retired)
               AND (p_after IS NULL OR a.agent > p_after)
             ORDER BY a.agent LIMIT p_limit) a
$$;

-- The published profiles with the live workers that serve each.
CREATE OR REPLACE FUNCTION tw.profiles()
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'profile', p.profile, 'updated_at', p.updated_at,
               'workers', (SELECT coalesce(jsonb_agg(d.daemon_id ORDER BY d.daemon_id), '[]')
                             FROM state.daemons d
                            WHERE d.kind = 'worker' AND d.gone_at IS NULL AND d.info -> 'profiles' ? p.profile))
               ORDER BY p.profile), '[]')
      FROM state.profiles p
$$;

-- A turn and its subtree: each node its status and the call that started it; children in start order.
CREATE OR REPLACE FUNCTION tw.turn_subtree(p_turn uuid, p_depth integer DEFAULT 0)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    t       state.turns;
    v_kids  jsonb := '[]'::jsonb;
    v_child uuid;
BEGIN
    SELECT * INTO t FROM state.turns WHERE turn_id = p_turn;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF p_depth < 64 THEN
        FOR v_child IN SELECT turn_id FROM state.turns WHERE parent_turn_id = p_turn ORDER BY seq LOOP
            v_kids := v_kids || jsonb_build_array(tw.turn_subtree(v_child, p_depth + 1));
        END LOOP;
    END IF;
    RETURN jsonb_strip_nulls(jsonb_build_object(
        'turn_id', t.turn_id, 'agent', t.agent, 'profile', t.profile, 'status', t.status, 'error', t.error,
        'depth', t.depth, 'parent_tool_call_id', t.parent_tool_call_id, 'created_at', t.created_at,
        'ended_at', t.ended_at))
        || jsonb_build_object('children', v_kids);
END $$;

-- The whole tree a turn belongs to, from its root.
CREATE OR REPLACE FUNCTION tw.turn_tree(p_turn uuid)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_root   uuid := p_turn;
    v_parent uuid;
BEGIN
    FOR i IN 1..64 LOOP
        SELECT parent_turn_id INTO v_parent FROM state.turns WHERE turn_id = v_root;
        EXIT WHEN v_parent IS NULL;
        v_root := v_parent;
    END LOOP;
    RETURN tw.turn_subtree(v_root);
END $$;
