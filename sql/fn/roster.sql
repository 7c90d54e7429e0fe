-- Profiles and the roster (docs/roster.md): publishing profiles, adding, retiring and reading agents.

-- A daemon publishes the profiles of its config (at start and on reload; `turnwatch migrate` too): each is a
-- profile and an agent of its own name. A profile whose name the roster already binds, as an agent, to another
-- profile is an error (22023), and nothing is published: submits to that agent would run the other profile's
-- program (issue 23; an agent is bound to one profile for its life). The daemons refuse such a configuration.
-- Returns {"conflicts": []} (what it returned when a conflict was only reported).
CREATE OR REPLACE FUNCTION tw.publish_profiles(p_profiles text[])
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_p     text;
    v_bound text;
    v_more  integer;
BEGIN
    IF cardinality(p_profiles) > 10000 THEN
        RAISE EXCEPTION 'at most 10000 profiles a call, not %', cardinality(p_profiles) USING ERRCODE = '22023';
    END IF;
    FOREACH v_p IN ARRAY coalesce(p_profiles, '{}') LOOP
        PERFORM tw.check_name('profile', v_p);
    END LOOP;
    -- In name order, so that two daemons publishing at once never wait on each other in a cycle.
    INSERT INTO state.profiles AS p (profile)
    SELECT DISTINCT x FROM unnest(p_profiles) x ORDER BY 1
    ON CONFLICT (profile) DO UPDATE SET updated_at = now() WHERE p.updated_at < now() - interval '1 minute';
    INSERT INTO state.agents (agent, profile)
    SELECT DISTINCT x, x FROM unnest(p_profiles) x ORDER BY 1
    ON CONFLICT (agent) DO NOTHING;
    -- After the insert, which waits for an agent of that name being added meanwhile: the error rolls it back.
    SELECT a.agent, a.profile, count(*) OVER () - 1 INTO v_p, v_bound, v_more
      FROM state.agents a WHERE a.agent = ANY (p_profiles) AND a.profile <> a.agent ORDER BY a.agent LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'profile %: the roster binds agent % to profile % (an agent keeps its profile for life), so submits to agent % would run profile %''s program; rename [agent.%] in the configuration%',
            v_p, v_p, v_bound, v_p, v_bound, v_p,
            CASE WHEN v_more > 0 THEN format(' (and %s more profile(s) like it)', v_more) ELSE '' END
            USING ERRCODE = '22023';
    END IF;
    RETURN jsonb_build_object('conflicts', '[]'::jsonb);
END $$;

-- Add an agent to the roster: true when it was created, false when it exists bound to the same profile.
-- An unknown profile, a bad id or an id bound to another profile is an error (22023).
CREATE OR REPLACE FUNCTION tw.add_agent(agent text, profile text, metadata jsonb DEFAULT '{}')
RETURNS boolean LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    v_profile text;
    v_id      text := agent;
    v_prof    text := profile;
    v_meta    jsonb := coalesce(metadata, '{}'::jsonb);
BEGIN
    PERFORM tw.check_name('agent id', v_id);
    PERFORM tw.check_name('profile', v_prof);
    IF jsonb_typeof(v_meta) <> 'object' THEN
        RAISE EXCEPTION 'agent metadata must be a JSON object, not %', jsonb_typeof(v_meta) USING ERRCODE = '22023';
    END IF;
    IF octet_length(v_meta::text) > 65536 AND tw.json_compact_length(v_meta) > 65536 THEN
        RAISE EXCEPTION 'agent metadata is % bytes of compact JSON; at most 65536', tw.json_compact_length(v_meta)
            USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM state.profiles p WHERE p.profile = v_prof) THEN
        RAISE EXCEPTION 'unknown profile %: no daemon or migrate has published an [agent.%] section', v_prof, v_prof
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO state.agents AS a (agent, profile, metadata) VALUES (v_id, v_prof, v_meta)
    ON CONFLICT ON CONSTRAINT agents_pkey DO NOTHING;
    IF FOUND THEN
        RETURN true;
    END IF;
    SELECT a.profile INTO v_profile FROM state.agents a WHERE a.agent = v_id;
    IF v_profile <> v_prof THEN
        RAISE EXCEPTION 'agent % is bound to profile %, not %', v_id, v_profile, v_prof USING ERRCODE = '22023';
    END IF;
    PERFORM tw.durable_answer();
    RETURN false;
END $$;

-- Retire an agent: submits fail with agent_retired; turns already submitted still run. True when it was
-- active until now, false when it was retired already; an unknown id is an error (22023).
CREATE OR REPLACE FUNCTION tw.retire_agent(agent text)
RETURNS boolean LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    v_id   text := agent;
    v_done boolean;
BEGIN
    PERFORM tw.check_name('agent id', v_id);
    UPDATE state.agents a SET retired_at = now() WHERE a.agent = v_id AND a.retired_at IS NULL
    RETURNING true INTO v_done;
    IF v_done THEN
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM state.agents a WHERE a.agent = v_id) THEN
        RAISE EXCEPTION 'unknown agent %', v_id USING ERRCODE = '22023';
    END IF;
    PERFORM tw.durable_answer();
    RETURN false;
END $$;

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
             ORDER BY a.agent LIMIT tw.check_limit(p_limit, 100000)) a
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
