-- A turnwatch database as release 2 left it (commit 1cfa575, schema version 9), for the upgrade test
-- (tests/test_cli.c, migrate_from_release2): migrated by that release's `turnwatch migrate`, then used by its
-- daemons and CLI, which left a turn done, one suspended on the external tool `ext` (call x1) with a deadline,
-- one running (its worker killed with SIGKILL), one pending for an idle agent and one queued behind the
-- suspended turn. pg_dump --no-owner --no-privileges --inserts, psql meta-commands removed.
--
-- PostgreSQL database dump
--


-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: state; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA state;


--
-- Name: tw; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA tw;


--
-- Name: agent_status; Type: DOMAIN; Schema: state; Owner: -
--

CREATE DOMAIN state.agent_status AS text
	CONSTRAINT agent_status_check CHECK ((VALUE = ANY (ARRAY['idle'::text, 'dispatched'::text, 'running'::text, 'suspended'::text])));


--
-- Name: card_type; Type: DOMAIN; Schema: state; Owner: -
--

CREATE DOMAIN state.card_type AS text
	CONSTRAINT card_type_check CHECK ((VALUE = ANY (ARRAY['tool.call'::text, 'tool.result'::text, 'task.deliverable'::text])));


--
-- Name: event_kind; Type: DOMAIN; Schema: state; Owner: -
--

CREATE DOMAIN state.event_kind AS text
	CONSTRAINT event_kind_check CHECK ((VALUE = ANY (ARRAY['state'::text, 'task'::text, 'retry'::text, 'warning'::text])));


--
-- Name: inbox_status; Type: DOMAIN; Schema: state; Owner: -
--

CREATE DOMAIN state.inbox_status AS text
	CONSTRAINT inbox_status_check CHECK ((VALUE = ANY (ARRAY['pending'::text, 'processing'::text, 'archived'::text, 'skipped'::text])));


--
-- Name: ledger_status; Type: DOMAIN; Schema: state; Owner: -
--

CREATE DOMAIN state.ledger_status AS text
	CONSTRAINT ledger_status_check CHECK ((VALUE = ANY (ARRAY['pending'::text, 'processing'::text, 'done'::text])));


--
-- Name: name; Type: DOMAIN; Schema: state; Owner: -
--

CREATE DOMAIN state.name AS text
	CONSTRAINT name_check CHECK ((VALUE ~ '^[A-Za-z0-9_-]{1,64}$'::text));


--
-- Name: positive_seconds; Type: DOMAIN; Schema: state; Owner: -
--

CREATE DOMAIN state.positive_seconds AS integer
	CONSTRAINT positive_seconds_check CHECK ((VALUE > 0));


--
-- Name: result_status; Type: DOMAIN; Schema: state; Owner: -
--

CREATE DOMAIN state.result_status AS text
	CONSTRAINT result_status_check CHECK ((VALUE = ANY (ARRAY['ok'::text, 'error'::text, 'timeout'::text, 'cancelled'::text])));


--
-- Name: target_kind; Type: DOMAIN; Schema: state; Owner: -
--

CREATE DOMAIN state.target_kind AS text
	CONSTRAINT target_kind_check CHECK ((VALUE = ANY (ARRAY['agent'::text, 'tool'::text])));


--
-- Name: turn_status; Type: DOMAIN; Schema: state; Owner: -
--

CREATE DOMAIN state.turn_status AS text
	CONSTRAINT turn_status_check CHECK ((VALUE = ANY (ARRAY['pending'::text, 'dispatched'::text, 'running'::text, 'suspended'::text, 'done'::text, 'failed'::text, 'timeout'::text, 'cancelled'::text])));


--
-- Name: wait_mode; Type: DOMAIN; Schema: state; Owner: -
--

CREATE DOMAIN state.wait_mode AS text
	CONSTRAINT wait_mode_check CHECK ((VALUE = ANY (ARRAY['all'::text, 'any'::text, 'n'::text])));


--
-- Name: wait_status; Type: DOMAIN; Schema: state; Owner: -
--

CREATE DOMAIN state.wait_status AS text
	CONSTRAINT wait_status_check CHECK ((VALUE = ANY (ARRAY['waiting'::text, 'received'::text, 'timeout'::text, 'cancelled'::text])));


--
-- Name: actor(); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.actor() RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(nullif(current_setting('tw.actor', true), ''), 'sql')
$$;


--
-- Name: add_agent(text, text, jsonb); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.add_agent(agent text, profile text, metadata jsonb DEFAULT '{}'::jsonb) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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
    IF octet_length(v_meta::text) > 65536 THEN
        RAISE EXCEPTION 'agent metadata is % bytes; at most 65536', octet_length(v_meta::text)
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
    RETURN false;
END $$;


--
-- Name: agent_idle(text, uuid, boolean); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.agent_idle(p_agent text, p_turn uuid, p_bump boolean) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_epoch bigint;
BEGIN
    UPDATE state.agents
       SET status = 'idle', active_agent_turn_id = NULL, active_channel_id = NULL, updated_at = now(),
           rerung_at = NULL, turn_epoch = turn_epoch + CASE WHEN p_bump THEN 1 ELSE 0 END
     WHERE agent = p_agent AND active_agent_turn_id = p_turn
    RETURNING turn_epoch INTO v_epoch;
    RETURN v_epoch;
END $$;


--
-- Name: agent_info(text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.agent_info(p_agent text) RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
    SELECT jsonb_build_object(
        'agent', a.agent, 'profile', a.profile, 'status', a.status, 'retired', a.retired_at IS NOT NULL,
        'created_at', a.created_at, 'retired_at', a.retired_at, 'metadata', a.metadata,
        'active_turn_id', a.active_agent_turn_id, 'turn_epoch', a.turn_epoch, 'updated_at', a.updated_at,
        'turns', (SELECT coalesce(jsonb_object_agg(s.status, s.n), '{}'::jsonb)
                    FROM (SELECT t.status, count(*) AS n FROM state.turns t WHERE t.agent = a.agent
                           GROUP BY t.status) s))
      FROM state.agents a WHERE a.agent = p_agent
$$;


--
-- Name: agent_state_event(text, text, text, uuid, bigint, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.agent_state_event(p_agent text, p_profile text, p_status text, p_turn uuid, p_epoch bigint, p_error text DEFAULT NULL::text) RETURNS jsonb
    LANGUAGE sql
    AS $$
    SELECT tw.emit('state', 'evt.agent.' || p_agent || '.state',
                   jsonb_build_object('agent', p_agent, 'profile', p_profile, 'status', p_status, 'turn_id', p_turn,
                                      'turn_epoch', p_epoch, 'error', p_error,
                                      'timeout', CASE WHEN p_error IS NOT NULL THEN
                                          (SELECT timeout_detail FROM state.turns WHERE turn_id = p_turn) END),
                   p_turn, p_epoch)
$$;


--
-- Name: agents_list(text, boolean, text, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.agents_list(p_profile text, p_retired boolean, p_after text, p_limit integer) RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'agent', a.agent, 'profile', a.profile, 'status', a.status, 'retired', a.retired_at IS NOT NULL,
               'created_at', a.created_at, 'active_turn_id', a.active_agent_turn_id) ORDER BY a.agent), '[]')
      FROM (SELECT * FROM state.agents a
             WHERE (p_profile IS NULL OR a.profile = p_profile)
               AND (p_retired IS NULL OR (a.retired_at IS NOT NULL) = p_retired)
               AND (p_after IS NULL OR a.agent > p_after)
             ORDER BY a.agent LIMIT p_limit) a
$$;


--
-- Name: api_publish(jsonb); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.api_publish(p_publish jsonb) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_bells jsonb;
BEGIN
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_publish) e WHERE e ? 'event_id') THEN
        PERFORM pg_notify('tw_outbox', '');
    END IF;
    SELECT jsonb_agg(e) INTO v_bells FROM jsonb_array_elements(p_publish) e WHERE NOT e ? 'event_id';
    IF v_bells IS NOT NULL AND octet_length(v_bells::text) < 7900 THEN
        PERFORM pg_notify('tw_ring', v_bells::text);
    END IF;
END $$;


--
-- Name: apply_step(jsonb, jsonb, text, text[]); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.apply_step(p_fence jsonb, p_reply jsonb, p_worker text DEFAULT NULL::text, p_profiles text[] DEFAULT NULL::text[]) RETURNS json
    LANGUAGE plpgsql
    AS $$
DECLARE
    t        state.turns;
    a        state.agents;
    v_turn   uuid := (p_fence ->> 'turn_id')::uuid;
    v_epoch  bigint := (p_fence ->> 'epoch')::bigint;
    v_step   integer := (p_fence ->> 'step')::integer;
    v_id     bigint := (p_fence ->> 'id')::bigint;
    v_token  bigint := (p_fence ->> 'token')::bigint;
    v_ok     boolean;
    v_card   uuid;
    v_pub    jsonb := '[]'::jsonb;
    v_call   jsonb;
    v_i      integer := 0;
    v_wait   jsonb;
    v_tools  text[] := '{}';
    v_tool   text;
    v_took   jsonb;
    v_deleg  boolean;
    v_deadline timestamptz;
BEGIN
    -- A child's end is its parent's call result: the parent's turn row first (lock order of a tree).
    PERFORM tw.lock_parent(v_turn, true);
    SELECT * INTO a FROM state.agents WHERE agent = p_fence ->> 'agent' FOR UPDATE;
    SELECT * INTO t FROM state.turns WHERE turn_id = v_turn FOR UPDATE;
    IF NOT FOUND OR t.status <> 'running' OR t.turn_epoch <> v_epoch OR t.step <> v_step
       OR a.turn_epoch <> v_epoch OR a.active_agent_turn_id IS DISTINCT FROM v_turn THEN
        RETURN json_build_object('applied', false, 'publish', '[]'::json);
    END IF;
    IF p_fence ->> 'fence' = 'ledger' THEN
        UPDATE state.turn_resume_ledger SET status = 'done', outcome = 'applied', updated_at = now()
         WHERE ledger_id = v_id AND status = 'processing' AND lease_token = v_token
        RETURNING true INTO v_ok;
    ELSE
        UPDATE state.agent_inbox SET status = 'archived', archived_at = now(), outcome = 'applied'
         WHERE inbox_id = v_id AND status = 'processing' AND claim_token = v_token
        RETURNING true INTO v_ok;
    END IF;
    IF v_ok IS NULL THEN
        RETURN json_build_object('applied', false, 'publish', '[]'::json);
    END IF;

    IF p_reply ? 'complete' THEN
        INSERT INTO state.cards (card_type, turn_id, agent, turn_epoch, step, output_box_id, content)
        VALUES ('task.deliverable', t.turn_id, t.agent, t.turn_epoch, t.step, t.output_box_id,
                jsonb_build_object('partial', false, 'output', p_reply -> 'complete' -> 'output'))
        RETURNING card_id INTO v_card;
        UPDATE state.turns SET status = 'done', deliverable_card_id = v_card, ended_at = now(), updated_at = now()
         WHERE turn_id = v_turn RETURNING * INTO t;
        v_pub := tw.agent_state_event(t.agent, t.profile, 'idle', t.turn_id, t.turn_epoch) || tw.task_event(t);
    ELSIF p_reply ? 'fail' THEN
        -- Failed, or back to pending for another attempt (contract 11, 0007_policies_fn.sql).
        v_pub := tw.step_failed(t, p_reply -> 'fail');
        SELECT * INTO t FROM state.turns WHERE turn_id = v_turn;
    ELSIF p_reply ? 'tool_calls' THEN
        FOR v_call IN SELECT * FROM jsonb_array_elements(p_reply -> 'tool_calls') LOOP
            INSERT INTO state.cards (card_type, turn_id, agent, turn_epoch, step, tool_call_id, output_box_id, content)
            VALUES ('tool.call', t.turn_id, t.agent, t.turn_epoch, t.step, v_call ->> 'id', t.output_box_id,
                    jsonb_build_object('tool', v_call ->> 'tool', 'args', v_call -> 'args',
                                       'timeout_seconds', (v_call ->> 'timeout_seconds')::integer))
            RETURNING card_id INTO v_card;
            v_deleg := v_call ? 'agent_profile';
            INSERT INTO state.turn_waiting_tools (turn_id, step, tool_call_id, call_index, agent, tool, args,
                                                  timeout_seconds, external, turn_epoch, deadline_at, call_card_id,
                                                  timeout_source, warn_at)
            VALUES (t.turn_id, t.step, v_call ->> 'id', v_i, t.agent, v_call ->> 'tool', v_call -> 'args',
                    (v_call ->> 'timeout_seconds')::integer,
                    coalesce((v_call ->> 'external')::boolean, false) OR v_deleg,
                    t.turn_epoch, now() + make_interval(secs => (v_call ->> 'wait_seconds')::integer), v_card,
                    v_call ->> 'timeout_source',
                    now() + make_interval(secs => (v_call ->> 'warn_seconds')::double precision))
            RETURNING deadline_at INTO v_deadline;
            IF v_deleg THEN
                v_pub := v_pub || tw.delegate(t, v_call, v_deadline,
                                              coalesce((p_reply ->> 'max_delegation_depth')::integer, 8));
            ELSIF NOT coalesce((v_call ->> 'external')::boolean, false) THEN
                INSERT INTO state.agent_inbox (target_kind, target, message_type, turn_id, turn_epoch, step,
                                               tool_call_id, channel_id, payload)
                VALUES ('tool', v_call ->> 'tool', 'tool.call', t.turn_id, t.turn_epoch, t.step, v_call ->> 'id',
                        t.channel_id, jsonb_build_object('tool_call_id', v_call ->> 'id', 'card_id', v_card));
                IF NOT (v_call ->> 'tool') = ANY (v_tools) THEN
                    v_tools := v_tools || (v_call ->> 'tool');
                END IF;
            END IF;
            v_i := v_i + 1;
        END LOOP;
        v_wait := coalesce(p_reply -> 'wait', '"all"'::jsonb);
        UPDATE state.turns
           SET status = 'suspended', suspended_at = now(), updated_at = now(), agent_state = p_reply -> 'state',
               wait_mode = CASE WHEN jsonb_typeof(v_wait) = 'number' THEN 'n' ELSE v_wait #>> '{}' END,
               wait_count = CASE WHEN jsonb_typeof(v_wait) = 'number' THEN (v_wait #>> '{}')::integer END,
               resume_deadline = (SELECT min(deadline_at) FROM state.turn_waiting_tools
                                   WHERE turn_id = v_turn AND step = t.step)
         WHERE turn_id = v_turn RETURNING * INTO t;
        UPDATE state.agents SET status = 'suspended', updated_at = now() WHERE agent = t.agent;
        v_pub := tw.agent_state_event(t.agent, t.profile, 'suspended', t.turn_id, t.turn_epoch) || v_pub;
        FOREACH v_tool IN ARRAY v_tools LOOP
            v_pub := v_pub || tw.doorbell('tool', v_tool, 'tool.call');
        END LOOP;
    ELSE
        RAISE EXCEPTION 'apply_step: reply has none of complete, fail, tool_calls' USING ERRCODE = '22023';
    END IF;
    IF t.status IN ('done', 'failed', 'pending') THEN  -- pending: retried (step_failed)
        -- A child's result goes to its parent's call; children of its own still open are cancelled (those of
        -- an attempt that is retried too: they belong to the attempt that failed).
        IF t.status <> 'pending' THEN
            v_pub := v_pub || tw.child_ended(t);
        END IF;
        v_pub := v_pub || tw.cancel_children(t.turn_id, NULL, format('the parent turn %s ended %s', t.turn_id,
                                                                     t.status));
        -- The agent goes idle (the event above) and on to its next turn, if any, in one row update.
        v_took := tw.dispatch(t.agent, p_worker, t.turn_id);
        v_pub := v_pub || (v_took -> 'publish');
        -- Its own next turn waits behind older ones: the freed slot goes to the oldest waiting turn of the
        -- agents this worker serves, in this same transaction.
        IF p_worker IS NOT NULL AND p_profiles IS NOT NULL AND NOT (v_took ? 'job') THEN
            v_took := tw.claim_turns(p_worker, p_profiles, 1);
            v_pub := v_pub || (v_took -> 'publish');
            v_took := jsonb_build_object('job', v_took -> 'jobs' -> 0);
        END IF;
    END IF;
    -- json, not jsonb: the answer is written out once, where a jsonb one would be built and then written.
    RETURN json_build_object('applied', true, 'publish', v_pub, 'next', v_took -> 'job');
END $$;


--
-- Name: cancel_children(uuid, integer, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.cancel_children(p_turn uuid, p_step integer, p_message text) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_child uuid;
    v_pub   jsonb := '[]'::jsonb;
BEGIN
    FOR v_child IN
        SELECT turn_id FROM state.turns
         WHERE parent_turn_id = p_turn AND (p_step IS NULL OR parent_step = p_step)
           AND status IN ('pending', 'dispatched', 'running', 'suspended')
         ORDER BY seq
    LOOP
        v_pub := v_pub || coalesce(tw.end_turn(v_child, 'cancelled', 'cancelled', p_message, true), '[]'::jsonb);
    END LOOP;
    RETURN v_pub;
END $$;


--
-- Name: cancel_turn(uuid); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.cancel_turn(turn uuid) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_res jsonb;
BEGIN
    IF turn IS NULL THEN
        RAISE EXCEPTION 'a turn id is required' USING ERRCODE = '22023';
    END IF;
    v_res := tw.cancel_turn_ex(turn);
    PERFORM tw.api_publish(v_res -> 'publish');
    RETURN v_res ->> 'result';
END $$;


--
-- Name: cancel_turn_ex(uuid); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.cancel_turn_ex(p_turn uuid) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_res    jsonb;
    v_status text;
BEGIN
    v_res := tw.end_turn(p_turn, 'cancelled', 'cancelled', 'cancelled by request', true);
    SELECT status INTO v_status FROM state.turns WHERE turn_id = p_turn;
    IF v_status IS NULL THEN
        RETURN jsonb_build_object('result', 'unknown_turn', 'publish', '[]'::jsonb);
    ELSIF v_res IS NULL THEN
        RETURN jsonb_build_object('result', 'already_ended', 'status', v_status, 'publish', '[]'::jsonb);
    END IF;
    RETURN jsonb_build_object('result', 'cancelled', 'status', v_status, 'publish', v_res);
END $$;


--
-- Name: check_ident(text, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.check_ident(p_what text, p_value text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF p_value IS NOT NULL AND (octet_length(p_value) NOT BETWEEN 1 AND 256 OR p_value ~ '[\x01-\x1f\x7f]') THEN
        RAISE EXCEPTION 'invalid %: 1 to 256 bytes, no control characters', p_what USING ERRCODE = '22023';
    END IF;
END $$;


--
-- Name: check_name(text, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.check_name(p_what text, p_value text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $_$
BEGIN
    IF p_value IS NULL OR p_value !~ '^[A-Za-z0-9_-]{1,64}$' THEN
        RAISE EXCEPTION 'invalid % %: allowed are [A-Za-z0-9_-], 1 to 64 characters', p_what,
            coalesce(quote_literal(left(p_value, 80)), 'NULL') USING ERRCODE = '22023';
    END IF;
END $_$;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: turns; Type: TABLE; Schema: state; Owner: -
--

CREATE TABLE state.turns (
    turn_id uuid DEFAULT gen_random_uuid() NOT NULL,
    seq bigint NOT NULL,
    agent state.name NOT NULL,
    channel_id text NOT NULL,
    output_box_id text,
    input jsonb NOT NULL,
    idempotency_key text,
    status state.turn_status DEFAULT 'pending'::text NOT NULL,
    turn_epoch bigint,
    step integer DEFAULT 0 NOT NULL,
    agent_state jsonb,
    wait_mode state.wait_mode,
    wait_count integer,
    resume_deadline timestamp with time zone,
    timeout_seconds state.positive_seconds,
    deadline_at timestamp with time zone,
    error text,
    error_message text,
    deliverable_card_id uuid,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    dispatched_at timestamp with time zone,
    started_at timestamp with time zone,
    suspended_at timestamp with time zone,
    ended_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    rerung_at timestamp with time zone,
    attempt integer DEFAULT 1 NOT NULL,
    step_base integer DEFAULT 0 NOT NULL,
    retry_at timestamp with time zone,
    retry_due_at timestamp with time zone,
    replay_of uuid,
    queue_deadline_at timestamp with time zone,
    queue_warn_at timestamp with time zone,
    deadline_warn_at timestamp with time zone,
    timeout_detail jsonb,
    profile text NOT NULL,
    depth integer DEFAULT 0 NOT NULL,
    parent_turn_id uuid,
    parent_step integer,
    parent_tool_call_id text
)
WITH (autovacuum_vacuum_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02', autovacuum_vacuum_cost_delay='0');
ALTER TABLE ONLY state.turns ALTER COLUMN input SET STATISTICS 0;
ALTER TABLE ONLY state.turns ALTER COLUMN agent_state SET STATISTICS 0;


--
-- Name: child_ended(state.turns); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.child_ended(c state.turns) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: claim(text, text[], text[], integer, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.claim(p_worker text, p_profiles text[], p_tools text[], p_max integer, p_lease_s integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $_$
DECLARE
    m       state.agent_inbox;
    l       state.turn_resume_ledger;
    t       state.turns;
    w       state.turn_waiting_tools;
    a       state.agents;
    v_jobs  jsonb := '[]'::jsonb;
    v_pub   jsonb := '[]'::jsonb;
    v_n     integer := 0;
    v_more  boolean := false;
    v_token bigint;
    v_res   jsonb;
    v_tools boolean := false;
BEGIN
    -- Results first: they are cheap and may turn into ledger entries claimed just below.
    FOR m IN
        SELECT * FROM state.agent_inbox
         WHERE status = 'pending' AND target_kind = 'agent' AND profile = ANY (p_profiles)
           AND message_type IN ('tool.result', 'timeout')
         ORDER BY inbox_id LIMIT 200 FOR UPDATE SKIP LOCKED
    LOOP
        v_res := tw.consume_result(m);
        IF v_res IS NULL THEN
            v_more := true;
        ELSE
            v_pub := v_pub || v_res;
        END IF;
    END LOOP;

    FOR l IN
        SELECT * FROM state.turn_resume_ledger
         WHERE status = 'pending' AND profile = ANY (p_profiles)
         ORDER BY ledger_id LIMIT p_max FOR UPDATE SKIP LOCKED
    LOOP
        SELECT * INTO a FROM state.agents WHERE agent = l.agent FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN v_more := true; CONTINUE; END IF;
        SELECT * INTO t FROM state.turns WHERE turn_id = l.turn_id FOR UPDATE;
        IF t.status NOT IN ('suspended', 'running') OR t.turn_epoch <> l.turn_epoch
           OR a.turn_epoch <> l.turn_epoch OR a.active_agent_turn_id IS DISTINCT FROM t.turn_id
           OR t.step NOT IN (l.step, l.step + 1) THEN
            UPDATE state.turn_resume_ledger SET status = 'done', outcome = 'stale', updated_at = now()
             WHERE ledger_id = l.ledger_id;
            CONTINUE;
        END IF;
        v_token := nextval('state.claim_token_seq');
        UPDATE state.turn_resume_ledger
           SET status = 'processing', lease_token = v_token, claimed_by = p_worker, attempts = attempts + 1,
               lease_expires_at = now() + make_interval(secs => p_lease_s), updated_at = now()
         WHERE ledger_id = l.ledger_id;
        UPDATE state.turns SET status = 'running', step = l.step + 1, resume_deadline = NULL, updated_at = now()
         WHERE turn_id = t.turn_id
        RETURNING * INTO t;
        IF a.status <> 'running' THEN
            UPDATE state.agents SET status = 'running', updated_at = now() WHERE agent = a.agent;
            v_pub := v_pub || tw.agent_state_event(a.agent, t.profile, 'running', t.turn_id, t.turn_epoch);
        ELSE
            UPDATE state.agents SET updated_at = now() WHERE agent = a.agent;
        END IF;
        v_jobs := v_jobs || jsonb_build_array(tw.step_job('ledger', l.ledger_id, v_token, t));
        v_n := v_n + 1;
    END LOOP;

    IF v_n < p_max THEN
        v_res := tw.claim_turns(p_worker, p_profiles, p_max - v_n);
        v_jobs := v_jobs || (v_res -> 'jobs');
        v_pub := v_pub || (v_res -> 'publish');
        v_n := v_n + jsonb_array_length(v_res -> 'jobs');
        v_more := v_more OR (v_res ->> 'more')::boolean;
    END IF;

    IF v_n < p_max AND cardinality(p_tools) > 0 THEN
        FOR m IN
            SELECT * FROM state.agent_inbox
             WHERE status = 'pending' AND target_kind = 'tool' AND target = ANY (p_tools)
               AND message_type = 'tool.call'
             ORDER BY inbox_id LIMIT p_max - v_n FOR UPDATE SKIP LOCKED
        LOOP
            -- We hold the message; force_finish holds the turn, then updates its waiting rows and messages.
            -- Take the turn first, without waiting: a busy turn is retried on the next claim.
            PERFORM 1 FROM state.turns WHERE turn_id = m.turn_id FOR UPDATE SKIP LOCKED;
            IF NOT FOUND AND EXISTS (SELECT 1 FROM state.turns WHERE turn_id = m.turn_id) THEN
                v_more := true;
                CONTINUE;
            END IF;
            SELECT * INTO w FROM state.turn_waiting_tools
             WHERE turn_id = m.turn_id AND step = m.step AND tool_call_id = m.tool_call_id;
            IF NOT FOUND OR w.wait_status <> 'waiting' OR w.turn_epoch IS DISTINCT FROM m.turn_epoch THEN
                PERFORM tw.inbox_archive(m.inbox_id, 'stale');
                CONTINUE;
            END IF;
            v_token := tw.inbox_take(m.inbox_id, p_worker);
            UPDATE state.turn_waiting_tools SET started_at = coalesce(started_at, now())
             WHERE turn_id = w.turn_id AND step = w.step AND tool_call_id = w.tool_call_id;
            v_jobs := v_jobs || jsonb_build_array(jsonb_build_object(
                'kind', 'tool', 'fence', 'inbox', 'id', m.inbox_id, 'token', v_token,
                'turn_id', w.turn_id, 'agent', w.agent, 'epoch', w.turn_epoch, 'step', w.step,
                'tool', w.tool, 'tool_call_id', w.tool_call_id, 'timeout_seconds', w.timeout_seconds,
                'doc', jsonb_build_object('tool_call_id', w.tool_call_id, 'tool', w.tool, 'args', w.args,
                                          'turn_id', w.turn_id)::text));
            v_n := v_n + 1;
            v_tools := true;
        END LOOP;
    END IF;

    -- A claim that wrote no event and started no tool does not wait for its WAL flush (one flush fewer on
    -- every step's path). Lost in a crash of PostgreSQL, it is as if it never happened: the items are pending
    -- again, the claiming worker's apply fails its fence, and the step runs again, as after a lost lease. The
    -- step's apply waits for its flush, which makes this claim durable first (the WAL is written in order).
    -- Events must not be published from a commit that can be lost, and a tool's side effects must not be
    -- repeated for a claim the database forgot: those claims wait as every other change does.
    IF NOT v_tools AND NOT jsonb_path_exists(v_pub, '$[*].event_id') THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN jsonb_build_object('jobs', v_jobs, 'publish', v_pub, 'more', v_more OR v_n >= p_max);
END $_$;


--
-- Name: claim_turns(text, text[], integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.claim_turns(p_worker text, p_profiles text[], p_max integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    m      state.agent_inbox;
    a      state.agents;
    v_res  jsonb;
    v_jobs jsonb := '[]'::jsonb;
    v_pub  jsonb := '[]'::jsonb;
    v_more boolean := false;
BEGIN
    FOR m IN
        SELECT * FROM state.agent_inbox
         WHERE status = 'pending' AND target_kind = 'agent' AND profile = ANY (p_profiles) AND message_type = 'turn'
         ORDER BY turn_seq, inbox_id LIMIT p_max FOR UPDATE SKIP LOCKED
    LOOP
        SELECT * INTO a FROM state.agents WHERE agent = m.target FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            v_more := true;
            CONTINUE;
        END IF;
        v_res := tw.take_turn_message(m, a, p_worker);
        v_pub := v_pub || (v_res -> 'publish');
        IF v_res ? 'job' THEN
            v_jobs := v_jobs || jsonb_build_array(v_res -> 'job');
        END IF;
    END LOOP;
    RETURN jsonb_build_object('jobs', v_jobs, 'publish', v_pub, 'more', v_more);
END $$;


--
-- Name: close_turn_work(uuid, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.close_turn_work(p_turn uuid, p_outcome text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE state.turn_waiting_tools
       SET wait_status = 'cancelled', result_status = 'cancelled', settled_at = now(),
           error = jsonb_build_object('code', 'cancelled', 'message', 'the turn ended: ' || p_outcome)
     WHERE turn_id = p_turn AND wait_status = 'waiting';
    UPDATE state.agent_inbox
       SET status = 'archived', processed_at = coalesce(processed_at, now()), archived_at = now(), outcome = p_outcome
     WHERE turn_id = p_turn AND status IN ('pending', 'processing');
    UPDATE state.turn_resume_ledger SET status = 'done', outcome = p_outcome, updated_at = now()
     WHERE turn_id = p_turn AND status IN ('pending', 'processing');
END
$$;


--
-- Name: agent_inbox; Type: TABLE; Schema: state; Owner: -
--

CREATE TABLE state.agent_inbox (
    inbox_id bigint NOT NULL,
    target_kind state.target_kind NOT NULL,
    target state.name NOT NULL,
    message_type text NOT NULL,
    turn_id uuid,
    turn_epoch bigint,
    step integer,
    tool_call_id text,
    channel_id text,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    status state.inbox_status DEFAULT 'pending'::text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    processed_at timestamp with time zone,
    archived_at timestamp with time zone,
    claim_token bigint,
    claimed_by text,
    attempts integer DEFAULT 0 NOT NULL,
    outcome text,
    watchdog_error text,
    watchdog_at timestamp with time zone,
    rung_at timestamp with time zone,
    profile text,
    turn_seq bigint
)
WITH (autovacuum_vacuum_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02', autovacuum_vacuum_cost_delay='0');
ALTER TABLE ONLY state.agent_inbox ALTER COLUMN payload SET STATISTICS 0;


--
-- Name: consume_result(state.agent_inbox); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.consume_result(m state.agent_inbox) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    t        state.turns;
    v_total  integer;
    v_done   integer;
    v_need   integer;
    v_ledger bigint;
    v_pub    jsonb := '[]'::jsonb;
BEGIN
    -- Compare-and-set on the message: a replay for a message already consumed changes nothing.
    PERFORM 1 FROM state.agent_inbox WHERE inbox_id = m.inbox_id AND status = 'pending' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN v_pub;
    END IF;
    -- The claim holds this inbox row: never wait for the turn here (force_finish holds the turn and
    -- updates the turn's inbox rows). A busy turn is retried on the next claim.
    SELECT * INTO t FROM state.turns WHERE turn_id = m.turn_id FOR UPDATE SKIP LOCKED;
    IF NOT FOUND AND EXISTS (SELECT 1 FROM state.turns WHERE turn_id = m.turn_id) THEN
        RETURN NULL;
    END IF;
    IF NOT FOUND OR t.status <> 'suspended' OR t.turn_epoch IS DISTINCT FROM m.turn_epoch OR t.step <> m.step THEN
        PERFORM tw.inbox_archive(m.inbox_id, 'stale');
        RETURN v_pub;
    END IF;
    SELECT count(*), count(*) FILTER (WHERE wait_status <> 'waiting') INTO v_total, v_done
      FROM state.turn_waiting_tools WHERE turn_id = t.turn_id AND step = t.step;
    v_need := CASE t.wait_mode WHEN 'any' THEN 1 WHEN 'n' THEN least(t.wait_count, v_total) ELSE v_total END;
    IF v_done >= v_need THEN
        INSERT INTO state.turn_resume_ledger (turn_id, agent, profile, turn_epoch, step)
        VALUES (t.turn_id, t.agent, t.profile, t.turn_epoch, t.step)
        ON CONFLICT (turn_id, step) DO NOTHING
        RETURNING ledger_id INTO v_ledger;
        IF v_ledger IS NOT NULL THEN
            UPDATE state.turn_waiting_tools
               SET wait_status = 'cancelled', result_status = 'cancelled', settled_at = now(),
                   error = jsonb_build_object('code', 'cancelled',
                                              'message', 'the turn resumed before this call settled')
             WHERE turn_id = t.turn_id AND step = t.step AND wait_status = 'waiting';
            UPDATE state.agent_inbox SET status = 'archived', processed_at = coalesce(processed_at, now()),
                   archived_at = now(), outcome = 'cancelled'
             WHERE turn_id = t.turn_id AND step = t.step AND message_type = 'tool.call'
               AND status IN ('pending', 'processing');
            UPDATE state.turns SET resume_deadline = NULL, updated_at = now() WHERE turn_id = t.turn_id;
            v_pub := tw.cancel_children(t.turn_id, t.step, 'the turn resumed before this call settled')
                     || tw.doorbell('agent', t.agent, 'resume', t.profile);
        END IF;
    END IF;
    PERFORM tw.inbox_archive(m.inbox_id, 'applied');
    RETURN v_pub;
END $$;


--
-- Name: daemon_capacity(text, boolean, bigint, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.daemon_capacity(p_id text, p_free boolean, p_free_ms bigint, p_slots integer) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE state.daemons
       SET free_since = CASE WHEN p_free THEN coalesce(free_since, now() - make_interval(secs => p_free_ms / 1000.0))
                        END,
           slots = p_slots
     WHERE daemon_id = p_id;
END $$;


--
-- Name: daemon_leave(text, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.daemon_leave(p_id text, p_incarnation text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE state.daemons SET gone_at = now(), gone_reason = 'stopped', last_seen_at = now()
     WHERE daemon_id = p_id AND incarnation = p_incarnation AND gone_at IS NULL;
END $$;


--
-- Name: daemon_register(text, text, text, integer, text, jsonb); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.daemon_register(p_id text, p_kind text, p_host text, p_pid integer, p_incarnation text, p_info jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: daemon_seen(text, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.daemon_seen(p_id text, p_incarnation text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE state.daemons SET last_seen_at = now() WHERE daemon_id = p_id AND incarnation = p_incarnation;
END $$;


--
-- Name: daemons(); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.daemons() RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN (
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'daemon_id', d.daemon_id, 'kind', d.kind, 'host', d.host, 'pid', d.pid,
               'started_at', d.started_at, 'last_seen_at', d.last_seen_at, 'gone_at', d.gone_at,
               'gone_reason', d.gone_reason, 'info', d.info, 'slots', d.slots, 'free_since', d.free_since,
               'alive', l.granted IS NOT NULL AND d.gone_at IS NULL,
               'holds', jsonb_build_object(
                   'steps', (SELECT count(*) FROM state.agent_inbox i
                              WHERE i.status = 'processing' AND i.claimed_by = d.daemon_id
                                AND i.target_kind = 'agent')
                            + (SELECT count(*) FROM state.turn_resume_ledger r
                                WHERE r.status = 'processing' AND r.claimed_by = d.daemon_id),
                   'tool_calls', (SELECT count(*) FROM state.agent_inbox i
                                   WHERE i.status = 'processing' AND i.claimed_by = d.daemon_id
                                     AND i.target_kind = 'tool')))
               ORDER BY d.kind, d.daemon_id), '[]'::jsonb)
      FROM state.daemons d
      LEFT JOIN pg_locks l ON l.locktype = 'advisory' AND l.classid::bigint = tw.live_class()
                          AND l.objid::bigint = d.daemon_no AND l.objsubid = 2 AND l.granted
     WHERE d.gone_at IS NULL OR d.gone_at > now() - interval '1 day'
    );
END $$;


--
-- Name: dead_letters(text, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.dead_letters(p_agent text DEFAULT NULL::text, p_limit integer DEFAULT 100) RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(jsonb_agg(to_jsonb(x) ORDER BY x.ended_at DESC, x.turn_id), '[]'::jsonb)
      FROM (SELECT t.turn_id, t.agent, t.channel_id, t.status, t.error, t.error_message, t.attempt,
                   (tw.policy(t.profile)).max_attempts, t.created_at, t.ended_at, t.replay_of, t.timeout_detail,
                   (SELECT count(*) FROM state.turns r WHERE r.replay_of = t.turn_id) AS replays
              FROM state.turns t
             WHERE t.status IN ('failed', 'timeout') AND (p_agent IS NULL OR t.agent = p_agent)
             ORDER BY t.ended_at DESC LIMIT p_limit) x
$$;


--
-- Name: delegate(state.turns, jsonb, timestamp with time zone, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.delegate(t state.turns, p_call jsonb, p_deadline timestamp with time zone, p_max_depth integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $_$
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
BEGIN
    IF t.depth >= p_max_depth THEN
        v_code := 'delegation_depth';
        v_msg := format('turn %s is at delegation depth %s, the maximum (max_delegation_depth = %s)', t.turn_id,
                        t.depth, p_max_depth);
    ELSIF jsonb_typeof(v_args -> 'agent') = 'string' THEN
        v_agent := v_args ->> 'agent';
        SELECT profile, retired_at INTO v_bound, v_retired FROM state.agents WHERE agent = v_agent;
        IF v_agent !~ '^[A-Za-z0-9_-]{1,64}$' OR v_bound IS NULL THEN
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
           OR (v_args ->> 'timeout_seconds')::numeric NOT BETWEEN 1 AND 31536000 THEN
            v_code := 'bad_args';
            v_msg := 'args.timeout_seconds must be a number of seconds from 1 to 31536000';
        ELSE
            v_own := now() + make_interval(secs => (v_args ->> 'timeout_seconds')::numeric);
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
                                  parent_turn_id, parent_step, parent_tool_call_id)
    VALUES (v_agent, v_profile, t.channel_id, coalesce(v_args -> 'input', '{}'::jsonb),
            CASE WHEN v_own < p_deadline THEN (v_args ->> 'timeout_seconds')::numeric::integer END,
            CASE WHEN v_own < p_deadline THEN v_own END, t.depth + 1, t.turn_id, t.step, p_call ->> 'id')
    RETURNING c.turn_id INTO v_id;
    UPDATE state.turn_waiting_tools SET child_turn_id = v_id, started_at = now()
     WHERE turn_id = t.turn_id AND step = t.step AND tool_call_id = p_call ->> 'id';
    -- Announced at once (no NOTIFY round trip through the PMO) when the agent is idle.
    RETURN tw.dispatch_next(v_agent);
END $_$;


--
-- Name: deliver_result(uuid, text, text, jsonb, jsonb, jsonb, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.deliver_result(p_turn uuid, p_call text, p_status text, p_output jsonb, p_error jsonb, p_fence jsonb, p_message_type text) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    t      state.turns;
    w      state.turn_waiting_tools;
    v_card uuid;
    v_ok   boolean;
    v_res  text;
    v_pub  jsonb := '[]'::jsonb;
BEGIN
    -- Lock order: the turn before its inbox rows (as force_finish does).
    SELECT * INTO t FROM state.turns WHERE turn_id = p_turn FOR UPDATE;
    IF p_fence IS NOT NULL THEN
        UPDATE state.agent_inbox SET status = 'archived', archived_at = now(), outcome = 'applied'
         WHERE inbox_id = (p_fence ->> 'id')::bigint AND status = 'processing'
           AND claim_token = (p_fence ->> 'token')::bigint
        RETURNING true INTO v_ok;
        IF v_ok IS NULL THEN
            RETURN jsonb_build_object('result', 'lost', 'publish', '[]'::jsonb);
        END IF;
    END IF;
    IF t.turn_id IS NULL THEN
        RETURN jsonb_build_object('result', 'unknown_turn', 'publish', '[]'::jsonb);
    END IF;
    SELECT * INTO w FROM state.turn_waiting_tools
     WHERE turn_id = p_turn AND tool_call_id = p_call ORDER BY step DESC LIMIT 1 FOR UPDATE;
    IF NOT FOUND THEN
        v_res := 'unknown_call';
    ELSIF t.status NOT IN ('pending', 'dispatched', 'running', 'suspended') THEN
        v_res := 'ended';
    ELSIF w.wait_status <> 'waiting' THEN
        v_res := CASE w.wait_status WHEN 'cancelled' THEN 'cancelled' WHEN 'timeout' THEN 'timed_out'
                                    ELSE 'duplicate' END;
    ELSIF w.turn_epoch <> t.turn_epoch THEN
        v_res := 'stale';
    END IF;
    IF v_res IS NOT NULL THEN
        IF p_fence IS NOT NULL THEN
            UPDATE state.agent_inbox SET outcome = v_res WHERE inbox_id = (p_fence ->> 'id')::bigint;
        END IF;
        RETURN jsonb_build_object('result', v_res, 'publish', '[]'::jsonb);
    END IF;
    INSERT INTO state.cards (card_type, turn_id, agent, turn_epoch, step, tool_call_id, output_box_id, content)
    VALUES ('tool.result', t.turn_id, t.agent, t.turn_epoch, w.step, w.tool_call_id, t.output_box_id,
            jsonb_strip_nulls(jsonb_build_object('tool', w.tool, 'status', p_status, 'output', p_output,
                                                 'error', p_error)))
    RETURNING card_id INTO v_card;
    UPDATE state.turn_waiting_tools
       SET wait_status = CASE WHEN p_status = 'timeout' THEN 'timeout' ELSE 'received' END,
           result_status = p_status, output = p_output, error = p_error, result_card_id = v_card, settled_at = now()
     WHERE turn_id = w.turn_id AND step = w.step AND tool_call_id = w.tool_call_id;
    INSERT INTO state.agent_inbox (target_kind, target, profile, message_type, turn_id, turn_epoch, step,
                                   tool_call_id, channel_id, payload)
    VALUES ('agent', t.agent, t.profile, p_message_type, t.turn_id, t.turn_epoch, w.step, w.tool_call_id,
            t.channel_id, jsonb_build_object('card_id', v_card, 'status', p_status));
    -- A delegating call settled other than by its child (its timeout report, a result posted from outside):
    -- the child and its subtree are cancelled in this transaction. A child that has ended changes nothing.
    IF w.child_turn_id IS NOT NULL THEN
        v_pub := coalesce(tw.end_turn(w.child_turn_id, 'cancelled', 'cancelled',
                                      format('its call %s in turn %s settled first (%s)', w.tool_call_id, t.turn_id,
                                             p_status), true), '[]'::jsonb);
    END IF;
    RETURN jsonb_build_object('result', 'accepted', 'card_id', v_card,
                              'publish', tw.doorbell('agent', t.agent, p_message_type, t.profile) || v_pub);
END $$;


--
-- Name: dispatch(text, text, uuid); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.dispatch(p_agent text, p_worker text, p_ended uuid DEFAULT NULL::uuid) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    a       state.agents;
    t       state.turns;
    v_epoch bigint;
    v_token bigint;
    v_inbox bigint;
    v_take  boolean := p_worker IS NOT NULL;
    v_pub   jsonb;
BEGIN
    IF p_ended IS NULL THEN
        SELECT * INTO a FROM state.agents WHERE agent = p_agent FOR UPDATE;
        IF NOT FOUND OR a.status <> 'idle' THEN
            RETURN jsonb_build_object('publish', '[]'::jsonb);
        END IF;
    END IF;
    -- Fairness: while any dispatched turn still waits for a worker slot, the freed slot is not kept for
    -- this agent; its turn is announced, and claims serve the oldest waiting turn first. Otherwise an
    -- agent with a long queue would hold the slot and starve the others into 2.5 dispatch timeouts.
    IF v_take AND EXISTS (SELECT 1 FROM state.agent_inbox
                           WHERE status = 'pending' AND target_kind = 'agent' AND message_type = 'turn') THEN
        v_take := false;
    END IF;
    SELECT * INTO t FROM state.turns
     WHERE agent = p_agent AND status = 'pending' AND (retry_at IS NULL OR retry_at <= now())  -- a retry waits
     ORDER BY seq LIMIT 1 FOR UPDATE;
    IF NOT FOUND THEN
        IF p_ended IS NOT NULL THEN
            PERFORM tw.agent_idle(p_agent, p_ended, false);
        END IF;
        RETURN jsonb_build_object('publish', '[]'::jsonb);
    END IF;
    UPDATE state.agents
       SET status = CASE WHEN v_take THEN 'running' ELSE 'dispatched' END, active_agent_turn_id = t.turn_id,
           active_channel_id = t.channel_id, turn_epoch = turn_epoch + 1, updated_at = now(), rerung_at = NULL
     WHERE agent = p_agent
    RETURNING turn_epoch INTO v_epoch;
    UPDATE state.turns
       SET status = CASE WHEN v_take THEN 'running' ELSE 'dispatched' END, turn_epoch = v_epoch,
           dispatched_at = now(), started_at = CASE WHEN v_take THEN now() END, updated_at = now()
     WHERE turn_id = t.turn_id
    RETURNING * INTO t;
    IF v_take THEN
        v_token := nextval('state.claim_token_seq');
    END IF;
    INSERT INTO state.agent_inbox (target_kind, target, profile, turn_seq, message_type, turn_id, turn_epoch, step,
                                   channel_id, payload, status, processed_at, claim_token, claimed_by, attempts)
    VALUES ('agent', p_agent, t.profile, t.seq, 'turn', t.turn_id, v_epoch, t.step, t.channel_id,
            jsonb_build_object('turn_id', t.turn_id, 'epoch', v_epoch),
            CASE WHEN v_take THEN 'processing' ELSE 'pending' END, CASE WHEN v_take THEN now() END, v_token,
            p_worker, CASE WHEN v_take THEN 1 ELSE 0 END)
    RETURNING inbox_id INTO v_inbox;
    v_pub := tw.agent_state_event(p_agent, t.profile, 'dispatched', t.turn_id, v_epoch);
    IF NOT v_take THEN
        RETURN jsonb_build_object('publish', v_pub || tw.doorbell('agent', p_agent, 'dispatch', t.profile));
    END IF;
    RETURN jsonb_build_object(
        'publish', v_pub || tw.agent_state_event(p_agent, t.profile, 'running', t.turn_id, v_epoch),
        'job', tw.step_job('inbox', v_inbox, v_token, t));
END $$;


--
-- Name: dispatch_next(text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.dispatch_next(p_agent text) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
BEGIN
    RETURN tw.dispatch(p_agent, NULL) -> 'publish';
END $$;


--
-- Name: dispatch_pending(integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.dispatch_pending(p_limit integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_agent text;
    v_pub   jsonb := '[]'::jsonb;
BEGIN
    FOR v_agent IN
        WITH RECURSIVE pa(agent) AS (
            (SELECT t.agent::text FROM state.turns t WHERE t.status = 'pending' ORDER BY t.agent, t.seq LIMIT 1)
            UNION ALL
            SELECT (SELECT t.agent::text FROM state.turns t WHERE t.status = 'pending' AND t.agent > pa.agent
                     ORDER BY t.agent, t.seq LIMIT 1)
              FROM pa WHERE pa.agent IS NOT NULL)
        SELECT a.agent FROM pa JOIN state.agents a ON a.agent = pa.agent
         WHERE a.status = 'idle'
         ORDER BY a.agent LIMIT p_limit
    LOOP
        v_pub := v_pub || tw.dispatch_next(v_agent);
    END LOOP;
    RETURN v_pub;
END $$;


--
-- Name: dispatched_clocks(integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.dispatched_clocks(p_stale_s integer) RETURNS TABLE(profile text, clock timestamp with time zone, oldest timestamp with time zone, ring timestamp with time zone)
    LANGUAGE sql STABLE
    AS $$
    SELECT p.p, tw.profile_clock(p.p, p_stale_s),
           (SELECT min(t.updated_at) FROM state.turns t WHERE t.status = 'dispatched' AND t.profile = p.p),
           (SELECT min(coalesce(t.rerung_at, t.updated_at)) FROM state.turns t
             WHERE t.status = 'dispatched' AND t.profile = p.p)
      FROM tw.dispatched_profiles() p(p)
$$;


--
-- Name: dispatched_profiles(); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.dispatched_profiles() RETURNS SETOF text
    LANGUAGE sql STABLE
    AS $$
    WITH RECURSIVE pp(profile) AS (
        (SELECT t.profile FROM state.turns t WHERE t.status = 'dispatched' ORDER BY t.profile LIMIT 1)
        UNION ALL
        SELECT (SELECT t.profile FROM state.turns t WHERE t.status = 'dispatched' AND t.profile > pp.profile
                 ORDER BY t.profile LIMIT 1)
          FROM pp WHERE pp.profile IS NOT NULL)
    SELECT profile FROM pp WHERE profile IS NOT NULL
$$;


--
-- Name: doc_max_text(); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.doc_max_text() RETURNS integer
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT 1048576 + 65536 $$;


--
-- Name: doorbell(text, text, text, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.doorbell(p_kind text, p_target text, p_reason text, p_profile text DEFAULT NULL::text) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT jsonb_build_array(jsonb_build_object(
        'subject', 'cmd.' || p_kind || '.' || p_target || '.wakeup',
        'data', jsonb_strip_nulls(jsonb_build_object('target', p_target, 'reason', p_reason,
                                                     'profile', p_profile))))
$$;


--
-- Name: emit(text, text, jsonb, uuid, bigint); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.emit(p_kind text, p_subject text, p_payload jsonb, p_turn uuid, p_epoch bigint) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_id      uuid := gen_random_uuid();
    v_payload jsonb := jsonb_strip_nulls(p_payload || jsonb_build_object('event_id', v_id, 'at', now()));
BEGIN
    INSERT INTO state.outbox (event_id, kind, subject, payload, turn_id, turn_epoch)
    VALUES (v_id, p_kind, p_subject, v_payload, p_turn, p_epoch);
    -- The payload goes out as the text the outbox holds ("text"), not as a JSON value ("data"): a daemon that
    -- parsed and re-encoded it would publish 11.997999999999999 for the 11.998 of record, or fail on an integer
    -- wider than 64 bits, and an event on NATS must be the outbox's, byte for byte in meaning.
    RETURN jsonb_build_array(jsonb_build_object('event_id', v_id, 'subject', p_subject, 'text', v_payload::text));
END $$;


--
-- Name: end_policy(state.turns, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.end_policy(t state.turns, p_code text) RETURNS text
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    p state.policies := tw.policy(t.profile);
BEGIN
    IF p_code IS NULL OR p_code IN ('cancelled', 'turn_deadline_exceeded') OR p.max_attempts <= 1
       OR NOT (p_code = ANY (p.retry_on) OR '*' = ANY (p.retry_on)) THEN
        RETURN 'fail';
    END IF;
    -- The shortest wait the jitter can give: a retry that cannot start before the turn's deadline is none.
    IF t.attempt >= p.max_attempts
       OR (t.deadline_at IS NOT NULL
           AND now() + make_interval(secs => 0.8 * least(p.retry_backoff_seconds
                                                         * power(2::double precision, least(t.attempt - 1, 60)),
                                                         p.retry_backoff_max_seconds)) >= t.deadline_at) THEN
        RETURN 'dead_letter';
    END IF;
    RETURN 'retry';
END $$;


--
-- Name: end_turn(uuid, text, text, text, boolean); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.end_turn(p_turn uuid, p_reason text, p_final text, p_message text, p_wait boolean) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_agent  text;
    v_got    text;
    v_status text;
BEGIN
    SELECT agent, status INTO v_agent, v_status FROM state.turns WHERE turn_id = p_turn;
    IF v_agent IS NULL THEN
        RETURN NULL;
    END IF;
    -- A child's end is its parent's call result: the parent's turn row before anything of the child's.
    IF NOT tw.lock_parent(p_turn, p_wait) THEN
        RETURN NULL;
    END IF;
    -- A pending turn touches no agent row: the deadline rule (p_wait false) locks the turn alone, so that a busy
    -- agent does not delay its deadline. If a dispatch took the turn meanwhile, it holds the agent and we must
    -- not ask for it while holding the turn (lock order): try again later.
    IF v_status = 'pending' AND NOT p_wait THEN
        SELECT status INTO v_status FROM state.turns WHERE turn_id = p_turn FOR UPDATE SKIP LOCKED;
        IF v_status IS DISTINCT FROM 'pending' THEN
            RETURN NULL;
        END IF;
        RETURN tw.force_finish(p_turn, p_reason, p_final, p_message);
    END IF;
    IF p_wait THEN
        SELECT agent INTO v_got FROM state.agents WHERE agent = v_agent FOR UPDATE;
    ELSE
        SELECT agent INTO v_got FROM state.agents WHERE agent = v_agent FOR UPDATE SKIP LOCKED;
    END IF;
    IF v_got IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN tw.force_finish(p_turn, p_reason, p_final, p_message);
END $$;


--
-- Name: finish_turn_idle(text, text, uuid, boolean, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.finish_turn_idle(p_agent text, p_profile text, p_turn uuid, p_bump boolean, p_error text) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_epoch bigint := tw.agent_idle(p_agent, p_turn, p_bump);
BEGIN
    IF v_epoch IS NULL THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN tw.agent_state_event(p_agent, p_profile, 'idle', p_turn, v_epoch, p_error);
END $$;


--
-- Name: force_finish(uuid, text, text, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.force_finish(p_turn uuid, p_reason text, p_final text, p_message text) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    t      state.turns;
    v_card uuid;
    v_pub  jsonb := '[]'::jsonb;
    v_was  text;
BEGIN
    SELECT * INTO t FROM state.turns WHERE turn_id = p_turn FOR UPDATE;
    IF NOT FOUND OR t.status NOT IN ('pending', 'dispatched', 'running', 'suspended') THEN
        RETURN NULL;
    END IF;
    v_was := t.status;
    PERFORM tw.close_turn_work(t.turn_id, p_reason);
    INSERT INTO state.force_terminations (turn_id, agent, turn_epoch, reason, detail)
    VALUES (t.turn_id, t.agent, t.turn_epoch, p_reason,
            jsonb_build_object('status_before', v_was, 'step', t.step, 'message', p_message));
    -- Contract 11: another attempt instead of an end, when the agent's policy says so (0007_policies_fn.sql).
    v_pub := tw.retry_turn(t, p_reason, p_message, true);
    IF v_pub IS NOT NULL THEN
        -- The children of the attempt that failed go with it (contract section 14).
        RETURN v_pub || tw.cancel_children(t.turn_id, NULL, format('the parent turn %s is retried after %s',
                                                                   t.turn_id, p_reason));
    END IF;
    v_pub := '[]'::jsonb;
    INSERT INTO state.cards (card_type, turn_id, agent, turn_epoch, step, output_box_id, content)
    VALUES ('task.deliverable', t.turn_id, t.agent, t.turn_epoch, t.step, t.output_box_id,
            jsonb_build_object('partial', true, 'fallback', true, 'status', p_final, 'reason', p_reason,
                               'message', p_message, 'status_before', v_was, 'step', t.step,
                               'last_state', t.agent_state,
                               'tool_results', tw.tool_results(t.turn_id, t.step)))
    ON CONFLICT DO NOTHING
    RETURNING card_id INTO v_card;
    UPDATE state.turns
       SET status = p_final, error = p_reason, error_message = p_message, ended_at = now(), updated_at = now(),
           resume_deadline = NULL, deliverable_card_id = coalesce(v_card, deliverable_card_id),
           timeout_detail = tw.timeout_detail(t, p_reason, NULL, NULL)
     WHERE turn_id = t.turn_id
    RETURNING * INTO t;
    IF v_was <> 'pending' THEN
        v_pub := v_pub || tw.finish_turn_idle(t.agent, t.profile, t.turn_id, true, p_reason);
    END IF;
    v_pub := v_pub || tw.task_event(t)
             || tw.cancel_children(t.turn_id, NULL, format('the parent turn %s ended %s (%s)', t.turn_id,
                                                           p_final, p_reason))
             || tw.child_ended(t);
    IF v_was <> 'pending' THEN
        v_pub := v_pub || tw.dispatch_next(t.agent);
    END IF;
    RETURN v_pub;
END $$;


--
-- Name: heartbeat(text, jsonb, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.heartbeat(p_worker text, p_holdings jsonb, p_lease_s integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
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
            UPDATE state.agents SET updated_at = now()
             WHERE agent = h.v ->> 'agent' AND turn_epoch = (h.v ->> 'epoch')::bigint AND status = 'running';
            v_ok := NULL;
            UPDATE state.turns SET updated_at = now()
             WHERE turn_id = (h.v ->> 'turn_id')::uuid AND turn_epoch = (h.v ->> 'epoch')::bigint
               AND status = 'running' AND step = (h.v ->> 'step')::integer
            RETURNING true INTO v_ok;
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


--
-- Name: inbox_archive(bigint, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.inbox_archive(p_id bigint, p_outcome text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
        UPDATE state.agent_inbox
           SET status = 'archived', processed_at = coalesce(processed_at, now()), archived_at = now(), outcome = p_outcome
         WHERE inbox_id = p_id;
END
$$;


--
-- Name: inbox_take(bigint, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.inbox_take(p_id bigint, p_worker text) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_token bigint;
BEGIN
    UPDATE state.agent_inbox
       SET status = 'processing', processed_at = now(), archived_at = NULL,
           claim_token = nextval('state.claim_token_seq'), claimed_by = p_worker, attempts = attempts + 1
     WHERE inbox_id = p_id
    RETURNING claim_token INTO v_token;
    RETURN v_token;
END
$$;


--
-- Name: lateness_ms(timestamp with time zone); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.lateness_ms(p_due timestamp with time zone) RETURNS bigint
    LANGUAGE sql STABLE
    AS $$
    SELECT round(extract(epoch FROM clock_timestamp() - p_due) * 1000)::bigint
$$;


--
-- Name: live_class(); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.live_class() RETURNS integer
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT 29815 $$;


--
-- Name: lock_parent(uuid, boolean); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.lock_parent(p_turn uuid, p_wait boolean) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: ms_until(timestamp with time zone); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.ms_until(p_due timestamp with time zone) RETURNS bigint
    LANGUAGE sql STABLE
    AS $$
    SELECT ceil(extract(epoch FROM p_due - clock_timestamp()) * 1000)::bigint
$$;


--
-- Name: note_reclaim(jsonb, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.note_reclaim(p_item jsonb, p_why text) RETURNS void
    LANGUAGE sql
    AS $$
    INSERT INTO state.turn_history (turn_id, from_status, to_status, turn_epoch, attempt, actor, reason)
    SELECT t.turn_id, t.status, t.status, t.turn_epoch, t.attempt, tw.actor(),
           format('reclaimed: %s; step %s goes to another worker', p_why, (p_item ->> 'step')::integer - t.step_base)
      FROM state.turns t
     WHERE t.turn_id = (p_item ->> 'turn_id')::uuid AND coalesce(p_item ->> 'target_kind', 'agent') = 'agent'
$$;


--
-- Name: outbox_claim(integer, integer, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.outbox_claim(p_min_age_ms integer, p_lease_s integer, p_limit integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_from    xid8;
    v_horizon xid8 := pg_snapshot_xmin(pg_current_snapshot());
    v_to      xid8;
    v_out     jsonb;
BEGIN
    SELECT xid INTO v_from FROM state.outbox_cursor;
    -- A data-modifying WITH must be the top-level statement, hence SELECT ... INTO.
    WITH c AS (
        UPDATE state.outbox o SET relay_lease_until = now() + make_interval(secs => p_lease_s)
         WHERE event_id IN (SELECT event_id FROM state.outbox
                             WHERE xid >= v_from AND published_at IS NULL
                               AND created_at < now() - make_interval(secs => p_min_age_ms / 1000.0)
                               AND (relay_lease_until IS NULL OR relay_lease_until < now())
                             ORDER BY xid, seq LIMIT p_limit FOR UPDATE SKIP LOCKED)
        RETURNING o.xid, o.seq, o.event_id, o.subject, o.payload)
    SELECT coalesce(jsonb_agg(jsonb_build_object('event_id', event_id, 'subject', subject, 'text', payload::text)
                              ORDER BY xid, seq), '[]'::jsonb)
      INTO v_out
      FROM c;
    -- Every transaction below v_horizon has ended, so nothing can still appear below the new cursor.
    SELECT least(min(xid), v_horizon) INTO v_to FROM state.outbox WHERE xid >= v_from AND published_at IS NULL;
    UPDATE state.outbox_cursor SET xid = v_to WHERE xid < v_to;
    RETURN v_out;
END
$$;


--
-- Name: outbox_mark_published(uuid[]); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.outbox_mark_published(p_ids uuid[]) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_n integer;
BEGIN
    -- Not worth a WAL flush of its own: lost in a crash of PostgreSQL, a mark only makes the relay publish
    -- those events again, under the same event ids (at least once, as ever). Any later commit that waits for
    -- its flush makes this one durable too.
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE state.outbox SET published_at = now() WHERE event_id = ANY (p_ids) AND published_at IS NULL;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;


--
-- Name: pmo_next_due(integer, integer, integer, integer, integer, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.pmo_next_due(p_retry_s integer, p_timeout_s integer, p_reap_s integer, p_wakeup_s integer, p_skip_s integer, p_stale_s integer) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN jsonb_build_object(
        -- Per profile with dispatched turns: its oldest turn, or its clock if that started later.
        -- Per profile with dispatched turns: its oldest turn, or its clock if that started later; none while
        -- its clock stands still (every serving worker busy).
        '2.4', tw.ms_until((SELECT min(CASE WHEN c.clock < 'infinity' THEN greatest(c.ring, c.clock) END)
                              FROM tw.dispatched_clocks(p_stale_s) c)
                           + make_interval(secs => p_retry_s)),
        '2.5', tw.ms_until((SELECT min(CASE WHEN c.clock < 'infinity' THEN greatest(c.oldest, c.clock) END)
                              FROM tw.dispatched_clocks(p_stale_s) c)
                           + make_interval(secs => p_timeout_s)),
        '2.6', tw.ms_until((SELECT min(updated_at) FROM state.turns WHERE status = 'running')
                           + make_interval(secs => p_reap_s)),
        '2.7', tw.ms_until(least(
                   (SELECT min(coalesce(rung_at, created_at)) FROM state.agent_inbox WHERE status = 'pending')
                   + make_interval(secs => p_wakeup_s),
                   (SELECT min(created_at) FROM state.agent_inbox WHERE status = 'pending' AND channel_id IS NULL)
                   + make_interval(secs => p_skip_s))),
        'deadline', tw.ms_until((SELECT min(deadline_at) FROM state.turns
                                  WHERE deadline_at IS NOT NULL
                                    AND status IN ('pending', 'dispatched', 'running', 'suspended'))))
        || tw.pmo_policy_next_due();  -- retries, queue budgets, warnings (0007_policies_fn.sql)
END $$;


--
-- Name: pmo_policy_next_due(); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.pmo_policy_next_due() RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
    SELECT jsonb_build_object(
        'retry', tw.ms_until((SELECT min(retry_due_at) FROM state.turns
                               WHERE retry_due_at IS NOT NULL AND status = 'pending')),
        'queue', tw.ms_until((SELECT min(queue_deadline_at) FROM state.turns
                               WHERE queue_deadline_at IS NOT NULL AND status IN ('pending', 'dispatched'))),
        'warn', tw.ms_until(least(
                    (SELECT min(deadline_warn_at) FROM state.turns
                      WHERE deadline_warn_at IS NOT NULL
                        AND status IN ('pending', 'dispatched', 'running', 'suspended')),
                    (SELECT min(queue_warn_at) FROM state.turns
                      WHERE queue_warn_at IS NOT NULL AND status IN ('pending', 'dispatched')))))
$$;


--
-- Name: policies; Type: TABLE; Schema: state; Owner: -
--

CREATE TABLE state.policies (
    profile state.name NOT NULL,
    max_attempts integer DEFAULT 1 NOT NULL,
    retry_on text[] DEFAULT '{step_timeout,agent_exit,timeout_reaped_by_watchdog,dispatch_timeout}'::text[] NOT NULL,
    retry_backoff_seconds integer DEFAULT 1 NOT NULL,
    retry_backoff_max_seconds integer DEFAULT 300 NOT NULL,
    queue_timeout_seconds integer DEFAULT 0 NOT NULL,
    warn_at_percent integer DEFAULT 80 NOT NULL,
    tool_timeout_seconds integer DEFAULT 30 NOT NULL,
    step_timeout_seconds integer,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_by text,
    CONSTRAINT policies_max_attempts_check CHECK ((max_attempts >= 1)),
    CONSTRAINT policies_queue_timeout_seconds_check CHECK ((queue_timeout_seconds >= 0)),
    CONSTRAINT policies_retry_backoff_max_seconds_check CHECK ((retry_backoff_max_seconds >= 1)),
    CONSTRAINT policies_retry_backoff_seconds_check CHECK ((retry_backoff_seconds >= 1)),
    CONSTRAINT policies_tool_timeout_seconds_check CHECK ((tool_timeout_seconds >= 1)),
    CONSTRAINT policies_warn_at_percent_check CHECK (((warn_at_percent >= 0) AND (warn_at_percent <= 99)))
);


--
-- Name: policy(text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.policy(p_profile text) RETURNS state.policies
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    p state.policies;
BEGIN
    SELECT * INTO p FROM state.policies WHERE profile = p_profile;
    IF NOT FOUND THEN
        p.profile := p_profile;
        p.max_attempts := 1;
        p.retry_on := '{step_timeout,agent_exit,timeout_reaped_by_watchdog,dispatch_timeout}';
        p.retry_backoff_seconds := 1;
        p.retry_backoff_max_seconds := 300;
        p.queue_timeout_seconds := 0;
        p.warn_at_percent := 80;
        p.tool_timeout_seconds := 30;
    END IF;
    RETURN p;
END $$;


--
-- Name: post_tool_result(uuid, text, text, jsonb); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.post_tool_result(turn uuid, call text, status text, output jsonb) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_err jsonb;
    v_res jsonb;
BEGIN
    IF turn IS NULL THEN
        RAISE EXCEPTION 'a turn id is required' USING ERRCODE = '22023';
    END IF;
    IF call IS NULL THEN
        RAISE EXCEPTION 'a tool call id is required' USING ERRCODE = '22023';
    END IF;
    PERFORM tw.check_ident('tool call id', call);
    IF status IS NULL OR status NOT IN ('ok', 'error') THEN
        RAISE EXCEPTION 'status must be ok or error, not %', coalesce(quote_literal(left(status, 40)), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF output IS NULL THEN
        RAISE EXCEPTION 'an output document is required' USING ERRCODE = '22023';
    END IF;
    IF octet_length(output::text) > tw.doc_max_text() THEN
        RAISE EXCEPTION 'the output document is % bytes in PostgreSQL''s text form; at most % (1 MiB of compact JSON)',
            octet_length(output::text), tw.doc_max_text() USING ERRCODE = '22023';
    END IF;
    IF status = 'error' THEN
        v_err := CASE WHEN jsonb_typeof(output -> 'code') = 'string' THEN output
                      WHEN jsonb_typeof(output) = 'string' THEN jsonb_build_object('code', 'tool_error', 'message', output)
                      ELSE jsonb_build_object('code', 'tool_error', 'detail', output) END;
        v_res := tw.deliver_result(turn, call, 'error', NULL, v_err, NULL, 'tool.result');
    ELSE
        v_res := tw.deliver_result(turn, call, 'ok', output, NULL, NULL, 'tool.result');
    END IF;
    PERFORM tw.api_publish(coalesce(v_res -> 'publish', '[]'::jsonb));
    RETURN v_res ->> 'result';
END $$;


--
-- Name: profile_clock(text, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.profile_clock(p_profile text, p_stale_s integer) RETURNS timestamp with time zone
    LANGUAGE sql STABLE
    AS $$
    SELECT CASE WHEN count(*) = 0 THEN '-infinity'::timestamptz ELSE coalesce(min(free_since), 'infinity') END
      FROM state.daemons
     WHERE kind = 'worker' AND gone_at IS NULL AND last_seen_at > now() - make_interval(secs => p_stale_s)
       AND info -> 'profiles' ? p_profile
$$;


--
-- Name: profiles(); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.profiles() RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'profile', p.profile, 'updated_at', p.updated_at,
               'workers', (SELECT coalesce(jsonb_agg(d.daemon_id ORDER BY d.daemon_id), '[]')
                             FROM state.daemons d
                            WHERE d.kind = 'worker' AND d.gone_at IS NULL AND d.info -> 'profiles' ? p.profile))
               ORDER BY p.profile), '[]')
      FROM state.profiles p
$$;


--
-- Name: publish_policies(jsonb, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.publish_policies(p_policies jsonb, p_by text) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_changed text[];
BEGIN
    WITH up AS (
    INSERT INTO state.policies AS p (profile, max_attempts, retry_on, retry_backoff_seconds,
                                     retry_backoff_max_seconds, queue_timeout_seconds, warn_at_percent,
                                     tool_timeout_seconds, step_timeout_seconds, updated_by)
    SELECT e ->> 'profile', (e ->> 'max_attempts')::integer,
           ARRAY(SELECT jsonb_array_elements_text(e -> 'retry_on')),
           (e ->> 'retry_backoff_seconds')::integer, (e ->> 'retry_backoff_max_seconds')::integer,
           (e ->> 'queue_timeout_seconds')::integer, (e ->> 'warn_at_percent')::integer,
           (e ->> 'tool_timeout_seconds')::integer, (e ->> 'step_timeout_seconds')::integer, p_by
      FROM jsonb_array_elements(p_policies) e
     ORDER BY e ->> 'profile'  -- two daemons publishing at once lock the rows in one order
    ON CONFLICT (profile) DO UPDATE
       SET max_attempts = EXCLUDED.max_attempts, retry_on = EXCLUDED.retry_on,
           retry_backoff_seconds = EXCLUDED.retry_backoff_seconds,
           retry_backoff_max_seconds = EXCLUDED.retry_backoff_max_seconds,
           queue_timeout_seconds = EXCLUDED.queue_timeout_seconds, warn_at_percent = EXCLUDED.warn_at_percent,
           tool_timeout_seconds = EXCLUDED.tool_timeout_seconds,
           step_timeout_seconds = EXCLUDED.step_timeout_seconds, updated_by = EXCLUDED.updated_by,
           updated_at = now()
     WHERE (p.max_attempts, p.retry_on, p.retry_backoff_seconds, p.retry_backoff_max_seconds,
            p.queue_timeout_seconds, p.warn_at_percent, p.tool_timeout_seconds, p.step_timeout_seconds)
           IS DISTINCT FROM
           (EXCLUDED.max_attempts, EXCLUDED.retry_on, EXCLUDED.retry_backoff_seconds,
            EXCLUDED.retry_backoff_max_seconds, EXCLUDED.queue_timeout_seconds, EXCLUDED.warn_at_percent,
            EXCLUDED.tool_timeout_seconds, EXCLUDED.step_timeout_seconds)
    RETURNING p.profile::text)
    SELECT array_agg(profile) INTO v_changed FROM up;
    IF v_changed IS NULL THEN
        RETURN 0;
    END IF;
    -- The pending turns of those profiles (turns_pending_idx) and their agents' active ones, locked in the lock
    -- order of every path (agents by name, then turns); a warning already sent is not planned again. Taking the
    -- agents waits for a submit in flight (it holds its agent FOR SHARE, or has just inserted it: every profile
    -- is an agent of its name), so its turn is updated here or was queued under the new policy.
    INSERT INTO state.agents (agent, profile) SELECT a, a FROM unnest(v_changed) a ORDER BY a ON CONFLICT DO NOTHING;
    PERFORM 1 FROM state.agents WHERE agent = ANY (v_changed) ORDER BY agent FOR UPDATE;
    PERFORM 1 FROM state.turns
     WHERE turn_id IN (SELECT turn_id FROM state.turns WHERE profile = ANY (v_changed) AND status = 'pending'
                       UNION ALL
                       SELECT active_agent_turn_id FROM state.agents
                        WHERE agent = ANY (v_changed) AND active_agent_turn_id IS NOT NULL)
     ORDER BY turn_id FOR UPDATE;
    UPDATE state.turns t
       SET queue_deadline_at = CASE WHEN p.queue_timeout_seconds > 0 AND t.status IN ('pending', 'dispatched')
                                    THEN coalesce(t.retry_at, t.created_at)
                                         + make_interval(secs => p.queue_timeout_seconds) END,
           queue_warn_at = CASE WHEN p.queue_timeout_seconds > 0 AND p.warn_at_percent > 0
                                     AND t.status IN ('pending', 'dispatched')
                                     AND NOT EXISTS (SELECT 1 FROM state.turn_warnings x
                                                      WHERE x.turn_id = t.turn_id AND x.kind = 'queue'
                                                        AND x.attempt = t.attempt)
                                THEN coalesce(t.retry_at, t.created_at)
                                     + make_interval(secs => p.queue_timeout_seconds * p.warn_at_percent / 100.0)
                           END,
           deadline_warn_at = CASE WHEN t.deadline_at IS NOT NULL AND p.warn_at_percent > 0
                                        AND NOT EXISTS (SELECT 1 FROM state.turn_warnings x
                                                         WHERE x.turn_id = t.turn_id AND x.kind = 'turn_deadline')
                                   THEN t.deadline_at
                                        - make_interval(secs => t.timeout_seconds * (100 - p.warn_at_percent) / 100.0)
                              END
      FROM state.policies p
     WHERE p.profile = t.profile
       AND t.turn_id IN (SELECT turn_id FROM state.turns WHERE profile = ANY (v_changed) AND status = 'pending'
                         UNION ALL
                         SELECT active_agent_turn_id FROM state.agents
                          WHERE agent = ANY (v_changed) AND active_agent_turn_id IS NOT NULL);
    IF FOUND THEN
        PERFORM pg_notify('tw_due', 'policy');
    END IF;
    RETURN cardinality(v_changed);
END $$;


--
-- Name: publish_profiles(text[]); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.publish_profiles(p_profiles text[]) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_p         text;
    v_conflicts jsonb := '[]'::jsonb;
BEGIN
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
    SELECT coalesce(jsonb_agg(jsonb_build_object('agent', a.agent, 'profile', a.profile)), '[]'::jsonb)
      INTO v_conflicts
      FROM state.agents a WHERE a.agent = ANY (p_profiles) AND a.profile <> a.agent;
    RETURN jsonb_build_object('conflicts', v_conflicts);
END $$;


--
-- Name: reclaim_daemon(text, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.reclaim_daemon(p_id text, p_why text) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: reclaim_gone_daemons(text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.reclaim_gone_daemons(p_self text) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    d     state.daemons;
    v_res jsonb;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    FOR d IN SELECT * FROM state.daemons WHERE gone_at IS NULL AND daemon_id <> p_self ORDER BY daemon_no LOOP
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(tw.live_class(), d.daemon_no);
        UPDATE state.daemons SET gone_at = now(), gone_reason = 'session ended'
         WHERE daemon_id = d.daemon_id AND incarnation = d.incarnation AND gone_at IS NULL;
        CONTINUE WHEN NOT FOUND;
        v_res := tw.reclaim_daemon(d.daemon_id, 'session ended');
        v_pub := v_pub || (v_res -> 'publish');
        v_log := v_log || jsonb_build_array(jsonb_build_object(
            'action', 'daemon_gone', 'daemon', d.daemon_id, 'kind', d.kind, 'last_seen_at', d.last_seen_at,
            'reclaimed', jsonb_array_length(v_res -> 'actions')))
            || (v_res -> 'actions');
    END LOOP;
    IF random() < 0.001 THEN
        DELETE FROM state.daemons WHERE gone_at < now() - interval '1 day';
    END IF;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;


--
-- Name: release(text, bigint, bigint); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.release(p_fence text, p_id bigint, p_token bigint) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_kind    text;
    v_target  text;
    v_profile text;
BEGIN
    IF p_fence = 'ledger' THEN
        UPDATE state.turn_resume_ledger SET status = 'pending', lease_token = NULL, lease_expires_at = NULL,
               updated_at = now()
         WHERE ledger_id = p_id AND status = 'processing' AND lease_token = p_token
        RETURNING 'agent', agent, profile INTO v_kind, v_target, v_profile;
    ELSE
        UPDATE state.agent_inbox SET status = 'pending', processed_at = NULL, archived_at = NULL, claim_token = NULL
         WHERE inbox_id = p_id AND status = 'processing' AND claim_token = p_token
        RETURNING target_kind, target, profile INTO v_kind, v_target, v_profile;
    END IF;
    IF v_target IS NULL THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN tw.doorbell(v_kind, v_target, 'released', v_profile);
END $$;


--
-- Name: replay_turn(uuid, boolean); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.replay_turn(p_turn uuid, p_again boolean DEFAULT false) RETURNS TABLE(turn_id uuid, created boolean)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    o    state.turns;
    v_id uuid;
BEGIN
    -- Replays of one turn one at a time (not its row lock: lock order wants the agent first).
    PERFORM pg_advisory_xact_lock(hashtextextended('tw.replay:' || p_turn::text, 0));
    SELECT * INTO o FROM state.turns t WHERE t.turn_id = p_turn;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no turn %', p_turn USING ERRCODE = '22023';
    END IF;
    IF o.status NOT IN ('failed', 'timeout') THEN
        RAISE EXCEPTION 'turn % is not a dead letter: it is %', p_turn, o.status USING ERRCODE = '22023';
    END IF;
    IF NOT p_again THEN
        SELECT r.turn_id INTO v_id FROM state.turns r WHERE r.replay_of = p_turn ORDER BY r.seq LIMIT 1;
        IF v_id IS NOT NULL THEN
            RETURN QUERY SELECT v_id, false;
            RETURN;
        END IF;
    END IF;
    PERFORM set_config('tw.reason', 'replay of ' || p_turn, true);
    -- The same agent and profile (a retired agent cannot be replayed: submit refuses it).
    SELECT s.turn_id INTO v_id
      FROM tw.submit_turn_ex(o.agent, o.channel_id, o.input, o.timeout_seconds, NULL, o.output_box_id, o.profile) s;
    PERFORM set_config('tw.reason', '', true);
    UPDATE state.turns u SET replay_of = p_turn WHERE u.turn_id = v_id;
    RETURN QUERY SELECT v_id, true;
END $$;


--
-- Name: requeue_expired_resume_ledgers(integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.requeue_expired_resume_ledgers(p_limit integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: retire_agent(text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.retire_agent(agent text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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
    RETURN false;
END $$;


--
-- Name: retry_delay(integer, integer, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.retry_delay(p_attempt integer, p_base integer, p_max integer) RETURNS double precision
    LANGUAGE sql
    AS $$
    SELECT least(b * (0.8 + 0.4 * random()), p_max::double precision)
      FROM (SELECT least(p_base * power(2::double precision, least(greatest(p_attempt, 1) - 1, 60)),
                         p_max::double precision) AS b) x
$$;


--
-- Name: retry_turn(state.turns, text, text, boolean, jsonb); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.retry_turn(t state.turns, p_code text, p_message text, p_idle boolean, p_given jsonb DEFAULT NULL::jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    p       state.policies;
    v_at    timestamptz;
    v_epoch bigint;
    v_det   jsonb;
    v_pub   jsonb := '[]'::jsonb;
BEGIN
    IF tw.end_policy(t, p_code) <> 'retry' THEN
        RETURN NULL;
    END IF;
    p := tw.policy(t.profile);
    v_at := now() + make_interval(secs => tw.retry_delay(t.attempt, p.retry_backoff_seconds,
                                                         p.retry_backoff_max_seconds));
    v_det := tw.timeout_detail(t, p_code, 'retry', p_given);
    PERFORM tw.close_turn_work(t.turn_id, 'retried');
    IF t.status = 'pending' THEN
        v_epoch := NULL;  -- never dispatched: no agent holds it
    ELSIF p_idle THEN
        v_epoch := tw.agent_idle(t.agent, t.turn_id, true);
    ELSE
        UPDATE state.agents SET turn_epoch = turn_epoch + 1, updated_at = now()
         WHERE agent = t.agent AND active_agent_turn_id = t.turn_id
        RETURNING turn_epoch INTO v_epoch;
    END IF;
    PERFORM set_config('tw.reason', format('retry after %s%s', p_code, coalesce(': ' || p_message, '')), true);
    UPDATE state.turns
       SET status = 'pending', attempt = attempt + 1, turn_epoch = coalesce(v_epoch, turn_epoch),
           step = step + 1, step_base = step + 1, agent_state = NULL, wait_mode = NULL, wait_count = NULL,
           resume_deadline = NULL, dispatched_at = NULL, started_at = NULL, suspended_at = NULL, rerung_at = NULL,
           error = NULL, error_message = NULL, timeout_detail = NULL, retry_at = v_at, retry_due_at = v_at,
           queue_deadline_at = CASE WHEN p.queue_timeout_seconds > 0
                                    THEN v_at + make_interval(secs => p.queue_timeout_seconds) END,
           queue_warn_at = CASE WHEN p.queue_timeout_seconds > 0 AND p.warn_at_percent > 0
                                THEN v_at + make_interval(secs => p.queue_timeout_seconds * p.warn_at_percent / 100.0)
                           END,
           updated_at = now()
     WHERE turn_id = t.turn_id
    RETURNING * INTO t;
    PERFORM set_config('tw.reason', '', true);
    -- The PMO dispatches it at retry_at: tell it the next due time moved (transactional, no NATS needed).
    PERFORM pg_notify('tw_due', 'retry');
    IF v_epoch IS NOT NULL THEN
        v_pub := tw.emit('state', 'evt.agent.' || t.agent || '.state',
                         jsonb_build_object('agent', t.agent, 'profile', t.profile, 'status', 'idle',
                                            'turn_id', t.turn_id,
                                            'turn_epoch', v_epoch, 'error', p_code, 'timeout', v_det),
                         t.turn_id, v_epoch);
    END IF;
    v_pub := v_pub || tw.emit('retry', 'evt.agent.' || t.agent || '.retry',
                              jsonb_build_object('agent', t.agent, 'profile', t.profile, 'turn_id', t.turn_id,
                                                 'turn_epoch', t.turn_epoch, 'attempt', t.attempt, 'max_attempts', p.max_attempts,
                                                 'error', p_code, 'error_message', p_message,
                                                 'retry_at', v_at, 'timeout', v_det),
                              t.turn_id, t.turn_epoch);
    IF p_idle AND v_epoch IS NOT NULL THEN
        v_pub := v_pub || tw.dispatch_next(t.agent);
    END IF;
    RETURN v_pub;
END $$;


--
-- Name: step_document(state.turns, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.step_document(t state.turns, p_step integer) RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
    SELECT jsonb_build_object(
        'turn_id', t.turn_id, 'agent', t.agent, 'profile', t.profile, 'channel_id', t.channel_id,
        'epoch', t.turn_epoch, 'depth', t.depth,
        'step', p_step - t.step_base, 'attempt', t.attempt, 'input', t.input,  -- steps count from 0 per attempt
        'state', CASE WHEN p_step = t.step_base THEN NULL ELSE t.agent_state END,
        'tool_results', CASE WHEN p_step = t.step_base THEN '[]'::jsonb
                             ELSE tw.tool_results(t.turn_id, p_step - 1) END)
$$;


--
-- Name: step_failed(state.turns, jsonb); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.step_failed(t state.turns, p_fail jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_code text := coalesce(p_fail ->> 'error', 'agent_failed');
    v_pub  jsonb := tw.retry_turn(t, v_code, p_fail ->> 'message', false, p_fail -> 'timeout');
BEGIN
    IF v_pub IS NOT NULL THEN
        RETURN v_pub;
    END IF;
    UPDATE state.turns
       SET status = 'failed', error = v_code, error_message = p_fail ->> 'message', ended_at = now(),
           updated_at = now(), timeout_detail = tw.timeout_detail(t, v_code, NULL, p_fail -> 'timeout')
     WHERE turn_id = t.turn_id
    RETURNING * INTO t;
    RETURN tw.agent_state_event(t.agent, t.profile, 'idle', t.turn_id, t.turn_epoch, t.error) || tw.task_event(t);
END $$;


--
-- Name: step_job(text, bigint, bigint, state.turns); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.step_job(p_fence text, p_id bigint, p_token bigint, t state.turns) RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
    SELECT jsonb_build_object('kind', 'step', 'fence', p_fence, 'id', p_id, 'token', p_token,
                              'turn_id', t.turn_id, 'agent', t.agent, 'profile', t.profile,
                              'epoch', t.turn_epoch, 'step', t.step,
                              'doc', tw.step_document(t, t.step)::text)
$$;


--
-- Name: submit_turn(text, text, jsonb, integer, text, text, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.submit_turn(agent text, channel text, input jsonb, timeout_seconds integer DEFAULT NULL::integer, idempotency_key text DEFAULT NULL::text, box text DEFAULT NULL::text, profile text DEFAULT NULL::text) RETURNS uuid
    LANGUAGE sql
    AS $_$
    SELECT turn_id FROM tw.submit_turn_ex($1, $2, $3, $4, $5, $6, $7)
$_$;


--
-- Name: submit_turn_ex(text, text, jsonb, integer, text, text, text, text[]); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.submit_turn_ex(p_agent text, p_channel text, p_input jsonb, p_timeout_s integer, p_idem text, p_box text, p_profile text, p_known text[] DEFAULT NULL::text[]) RETURNS TABLE(turn_id uuid, created boolean)
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_id      uuid;
    v_agent   text;
    v_channel text;
    v_status  text;
    v_profile text;
    v_retired timestamptz;
BEGIN
    PERFORM tw.check_name('agent', p_agent);
    IF p_profile IS NOT NULL THEN
        PERFORM tw.check_name('profile', p_profile);
    END IF;
    IF p_channel IS NULL THEN
        RAISE EXCEPTION 'a channel is required' USING ERRCODE = '22023';
    END IF;
    PERFORM tw.check_ident('channel', p_channel);
    PERFORM tw.check_ident('box', p_box);
    PERFORM tw.check_ident('idempotency key', p_idem);
    IF p_input IS NULL THEN
        RAISE EXCEPTION 'an input document is required' USING ERRCODE = '22023';
    END IF;
    IF p_timeout_s IS NOT NULL AND p_timeout_s NOT BETWEEN 1 AND 31536000 THEN
        RAISE EXCEPTION 'timeout_seconds must be from 1 to 31536000, not %', p_timeout_s USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_input::text) > tw.doc_max_text() THEN
        RAISE EXCEPTION 'the input document is % bytes in PostgreSQL''s text form; at most % (1 MiB of compact JSON)',
            octet_length(p_input::text), tw.doc_max_text() USING ERRCODE = '22023';
    END IF;
    IF p_idem IS NOT NULL THEN
        SELECT t.turn_id, t.agent, t.channel_id INTO v_id, v_agent, v_channel
          FROM state.turns t WHERE t.idempotency_key = p_idem;
        IF FOUND THEN
            IF v_agent <> p_agent OR v_channel <> p_channel THEN
                RAISE EXCEPTION 'idempotency key % already names turn % for agent % on channel %',
                    p_idem, v_id, v_agent, v_channel USING ERRCODE = '22023';
            END IF;
            RETURN QUERY SELECT v_id, false;
            RETURN;
        END IF;
    END IF;
    -- Held FOR SHARE until commit, the agent's status stays as read: an idle agent needs the PMO now; a busy
    -- one takes this turn when its current turn ends, for that apply_step needs the row FOR UPDATE, so it
    -- waits for this commit and then sees the turn.
    SELECT a.status, a.profile, a.retired_at INTO v_status, v_profile, v_retired
      FROM state.agents a WHERE a.agent = p_agent FOR SHARE;
    IF NOT FOUND THEN
        v_profile := coalesce(p_profile, p_agent);
        IF v_profile = ANY (p_known) THEN
            PERFORM tw.publish_profiles(ARRAY[v_profile]);
        END IF;
        IF NOT EXISTS (SELECT 1 FROM state.profiles p WHERE p.profile = v_profile) THEN
            IF p_profile IS NULL THEN
                RAISE EXCEPTION 'unknown agent ''%'': not in the roster, and no [agent.%] profile (give a profile to add it)',
                    p_agent, p_agent USING ERRCODE = '22023';
            END IF;
            RAISE EXCEPTION 'unknown profile %: no daemon or migrate has published an [agent.%] section',
                v_profile, v_profile USING ERRCODE = '22023';
        END IF;
        INSERT INTO state.agents (agent, profile) VALUES (p_agent, v_profile) ON CONFLICT DO NOTHING;
        SELECT a.status, a.profile, a.retired_at INTO v_status, v_profile, v_retired
          FROM state.agents a WHERE a.agent = p_agent FOR SHARE;
    END IF;
    IF p_profile IS NOT NULL AND v_profile <> p_profile THEN
        RAISE EXCEPTION 'agent % is bound to profile %, not %', p_agent, v_profile, p_profile USING ERRCODE = '22023';
    END IF;
    IF v_retired IS NOT NULL THEN
        RAISE EXCEPTION 'agent_retired: agent % was retired at % and takes no new turns', p_agent, v_retired
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO state.turns AS t (agent, profile, channel_id, output_box_id, input, idempotency_key,
                                  timeout_seconds, deadline_at)
    VALUES (p_agent, v_profile, p_channel, p_box, p_input, p_idem, p_timeout_s,
            CASE WHEN p_timeout_s IS NOT NULL THEN now() + make_interval(secs => p_timeout_s) END)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING t.turn_id INTO v_id;
    IF v_id IS NULL THEN
        -- A concurrent submit with the same key won; answer with its turn.
        SELECT t.turn_id INTO v_id FROM state.turns t WHERE t.idempotency_key = p_idem;
        RETURN QUERY SELECT v_id, false;
        RETURN;
    END IF;
    IF v_status = 'idle' THEN
        PERFORM pg_notify('tw_turn', p_agent);
    END IF;
    -- A deadline may now be due sooner than any the PMOs sleep for (contract section 9). Transactional, and
    -- the CLI or an application submitting through SQL need no NATS for it; only turns with a deadline pay
    -- for a notification.
    IF p_timeout_s IS NOT NULL THEN
        PERFORM pg_notify('tw_due', 'turn_deadline');
    END IF;
    RETURN QUERY SELECT v_id, true;
END $$;


--
-- Name: agents; Type: TABLE; Schema: state; Owner: -
--

CREATE TABLE state.agents (
    agent state.name NOT NULL,
    status state.agent_status DEFAULT 'idle'::text NOT NULL,
    active_agent_turn_id uuid,
    active_channel_id text,
    turn_epoch bigint DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    rerung_at timestamp with time zone,
    profile text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    retired_at timestamp with time zone,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT agents_check CHECK ((((status)::text = 'idle'::text) = (active_agent_turn_id IS NULL)))
)
WITH (autovacuum_vacuum_scale_factor='0.0', autovacuum_vacuum_threshold='500', autovacuum_analyze_scale_factor='0.05', fillfactor='70');
ALTER TABLE ONLY state.agents ALTER COLUMN metadata SET STATISTICS 0;


--
-- Name: take_turn_message(state.agent_inbox, state.agents, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.take_turn_message(m state.agent_inbox, a state.agents, p_worker text) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    t       state.turns;
    v_token bigint;
    v_pub   jsonb := '[]'::jsonb;
BEGIN
    SELECT * INTO t FROM state.turns WHERE turn_id = m.turn_id FOR UPDATE;
    IF NOT FOUND OR t.status NOT IN ('dispatched', 'running') OR t.step <> m.step
       OR t.turn_epoch IS DISTINCT FROM m.turn_epoch OR a.turn_epoch <> m.turn_epoch
       OR a.active_agent_turn_id IS DISTINCT FROM t.turn_id THEN
        PERFORM tw.inbox_archive(m.inbox_id, 'stale');
        RETURN jsonb_build_object('publish', v_pub);
    END IF;
    v_token := tw.inbox_take(m.inbox_id, p_worker);
    UPDATE state.turns SET status = 'running', started_at = coalesce(started_at, now()), updated_at = now()
     WHERE turn_id = t.turn_id
    RETURNING * INTO t;
    IF a.status <> 'running' THEN
        UPDATE state.agents SET status = 'running', updated_at = now() WHERE agent = a.agent;
        v_pub := tw.agent_state_event(a.agent, t.profile, 'running', t.turn_id, t.turn_epoch);
    ELSE
        UPDATE state.agents SET updated_at = now() WHERE agent = a.agent;
    END IF;
    RETURN jsonb_build_object('publish', v_pub, 'job', tw.step_job('inbox', m.inbox_id, v_token, t));
END $$;


--
-- Name: task_event(state.turns); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.task_event(t state.turns) RETURNS jsonb
    LANGUAGE sql
    AS $$
    SELECT tw.emit('task', 'evt.agent.' || t.agent || '.task',
                   jsonb_build_object('agent', t.agent, 'profile', t.profile, 'turn_id', t.turn_id,
                                      'channel_id', t.channel_id, 'turn_epoch', t.turn_epoch, 'status', t.status,
                                      'error', t.error, 'error_message', t.error_message,
                                      'deliverable_card_id', t.deliverable_card_id, 'attempt', t.attempt,
                                      'timeout', t.timeout_detail,
                                      'parent_turn_id', t.parent_turn_id,
                                      'parent_tool_call_id', t.parent_tool_call_id),
                   t.turn_id, t.turn_epoch)
$$;


--
-- Name: timeout_detail(state.turns, text, text, jsonb); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.timeout_detail(t state.turns, p_code text, p_policy text, p_given jsonb) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    v_kind  text := CASE p_code WHEN 'step_timeout' THEN 'step_timeout' WHEN 'dispatch_timeout' THEN 'dispatch'
                                WHEN 'timeout_reaped_by_watchdog' THEN 'heartbeat'
                                WHEN 'turn_deadline_exceeded' THEN 'turn_deadline' WHEN 'queue_timeout' THEN 'queue'
                    END;
    v_since timestamptz;
    v_limit numeric;
BEGIN
    IF v_kind IS NULL THEN
        RETURN NULL;
    END IF;
    v_since := CASE v_kind WHEN 'turn_deadline' THEN t.created_at WHEN 'queue' THEN coalesce(t.retry_at, t.created_at)
                           ELSE t.updated_at END;
    v_limit := coalesce((p_given ->> 'limit_seconds')::numeric,
                        CASE v_kind WHEN 'turn_deadline' THEN t.timeout_seconds
                                    WHEN 'queue' THEN extract(epoch FROM t.queue_deadline_at - v_since)
                                    WHEN 'step_timeout' THEN (tw.policy(t.profile)).step_timeout_seconds
                                    ELSE nullif(current_setting('tw.timeout_limit', true), '')::numeric END);
    RETURN jsonb_strip_nulls(jsonb_build_object(
        'kind', v_kind, 'limit_seconds', round(v_limit, 3),
        'elapsed_seconds', round(coalesce((p_given ->> 'elapsed_seconds')::numeric,
                                          extract(epoch FROM now() - v_since)), 3),
        'attempt', t.attempt, 'policy', coalesce(p_policy, tw.end_policy(t, p_code))));
END $$;


--
-- Name: tool_results(uuid, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.tool_results(p_turn uuid, p_step integer) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN (
    SELECT coalesce(jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
               'tool_call_id', w.tool_call_id, 'tool', w.tool,
               'status', coalesce(w.result_status, CASE w.wait_status WHEN 'cancelled' THEN 'cancelled' END),
               'output', w.output, 'error', w.error)) ORDER BY w.call_index), '[]'::jsonb)
      FROM state.turn_waiting_tools w
     WHERE w.turn_id = p_turn AND w.step = p_step
    );
END
$$;


--
-- Name: turn_history(uuid); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.turn_history(p_turn uuid) RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('at', h.at, 'from', h.from_status, 'to', h.to_status,
                                                 'turn_epoch', h.turn_epoch, 'attempt', h.attempt,
                                                 'actor', h.actor, 'reason', h.reason) ORDER BY h.id),
                    '[]'::jsonb)
      FROM state.turn_history h
     WHERE h.turn_id = p_turn
$$;


--
-- Name: turn_subtree(uuid, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.turn_subtree(p_turn uuid, p_depth integer DEFAULT 0) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$
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


--
-- Name: turn_tree(uuid); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.turn_tree(p_turn uuid) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$
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


--
-- Name: turns_history(); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.turns_history() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_from   text;
    v_reason text := nullif(current_setting('tw.reason', true), '');
BEGIN
    IF TG_OP = 'UPDATE' THEN
        v_from := OLD.status;
    END IF;
    IF v_reason IS NULL THEN
        v_reason := CASE
            WHEN v_from IS NULL THEN 'submitted'
            WHEN NEW.status IN ('failed', 'timeout', 'cancelled')
                THEN coalesce(NEW.error, NEW.status) || coalesce(': ' || NEW.error_message, '')
            WHEN NEW.status = 'done' THEN 'completed'
            WHEN NEW.status = 'dispatched' THEN 'dispatched'
            WHEN NEW.status = 'suspended' THEN 'waiting for tool calls'
            WHEN NEW.status = 'running' AND v_from = 'suspended' THEN 'resumed'
            WHEN NEW.status = 'running' AND v_from = 'pending' THEN 'dispatched and claimed'
            WHEN NEW.status = 'running' THEN 'claimed'
        END;
    END IF;
    INSERT INTO state.turn_history (turn_id, from_status, to_status, turn_epoch, attempt, actor, reason)
    VALUES (NEW.turn_id, v_from, NEW.status, NEW.turn_epoch, NEW.attempt,
            coalesce(nullif(current_setting('tw.actor', true), ''), 'sql'), v_reason);  -- tw.actor(), inlined
    RETURN NULL;
END $$;


--
-- Name: turns_queued(); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.turns_queued() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    p state.policies := tw.policy(NEW.profile);
BEGIN
    IF p.queue_timeout_seconds > 0 THEN
        NEW.queue_deadline_at := NEW.created_at + make_interval(secs => p.queue_timeout_seconds);
        IF p.warn_at_percent > 0 THEN
            NEW.queue_warn_at := NEW.created_at
                                 + make_interval(secs => p.queue_timeout_seconds * p.warn_at_percent / 100.0);
        END IF;
        PERFORM pg_notify('tw_due', 'queue');
    END IF;
    IF NEW.deadline_at IS NOT NULL AND p.warn_at_percent > 0 THEN
        NEW.deadline_warn_at := NEW.deadline_at
                                - make_interval(secs => NEW.timeout_seconds * (100 - p.warn_at_percent) / 100.0);
    END IF;
    RETURN NEW;
END $$;


--
-- Name: warn(state.turns, text, integer, integer, text, numeric, numeric, timestamp with time zone); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.warn(t state.turns, p_kind text, p_attempt integer, p_step integer, p_call text, p_limit numeric, p_elapsed numeric, p_due timestamp with time zone) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO state.turn_warnings (turn_id, kind, attempt, step, tool_call_id, turn_epoch, limit_seconds,
                                     elapsed_seconds, due_at)
    VALUES (t.turn_id, p_kind, p_attempt, p_step, coalesce(p_call, ''), t.turn_epoch, round(p_limit, 3),
            round(p_elapsed, 3), p_due)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN tw.emit('warning', 'evt.agent.' || t.agent || '.warning',
                   jsonb_build_object('agent', t.agent, 'profile', t.profile, 'turn_id', t.turn_id,
                                      'turn_epoch', t.turn_epoch, 'attempt', t.attempt, 'kind', p_kind,
                                      'tool_call_id', p_call,
                                      'limit_seconds', round(p_limit, 3), 'elapsed_seconds', round(p_elapsed, 3),
                                      'due_at', p_due),
                   t.turn_id, t.turn_epoch);
END $$;


--
-- Name: warn_step(jsonb, numeric, numeric); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.warn_step(p_fence jsonb, p_limit numeric, p_elapsed numeric) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    t state.turns;
BEGIN
    SELECT * INTO t FROM state.turns WHERE turn_id = (p_fence ->> 'turn_id')::uuid;
    IF NOT FOUND OR t.status <> 'running' OR t.turn_epoch <> (p_fence ->> 'epoch')::bigint
       OR t.step <> (p_fence ->> 'step')::integer
       OR NOT (CASE WHEN p_fence ->> 'fence' = 'ledger'
                    THEN EXISTS (SELECT 1 FROM state.turn_resume_ledger
                                  WHERE ledger_id = (p_fence ->> 'id')::bigint AND status = 'processing'
                                    AND lease_token = (p_fence ->> 'token')::bigint)
                    ELSE EXISTS (SELECT 1 FROM state.agent_inbox
                                  WHERE inbox_id = (p_fence ->> 'id')::bigint AND status = 'processing'
                                    AND claim_token = (p_fence ->> 'token')::bigint) END) THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN tw.warn(t, 'step_timeout', t.attempt, t.step, NULL, p_limit, p_elapsed,
                   now() + make_interval(secs => greatest(p_limit - p_elapsed, 0)));
END $$;


--
-- Name: wd_pmo_warnings(integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.wd_pmo_warnings(p_limit integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    r     record;
    t     state.turns;
    v_due timestamptz;
    v_res jsonb;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    FOR r IN
        (SELECT turn_id, 'turn_deadline' AS kind, deadline_warn_at AS warn_at FROM state.turns
          WHERE deadline_warn_at <= now() AND status IN ('pending', 'dispatched', 'running', 'suspended')
          ORDER BY deadline_warn_at LIMIT p_limit)
        UNION ALL
        (SELECT turn_id, 'queue', queue_warn_at FROM state.turns
          WHERE queue_warn_at <= now() AND status IN ('pending', 'dispatched')
          ORDER BY queue_warn_at LIMIT p_limit)
    LOOP
        SELECT * INTO t FROM state.turns WHERE turn_id = r.turn_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        IF r.kind = 'turn_deadline' THEN
            CONTINUE WHEN t.deadline_warn_at IS NULL OR t.deadline_warn_at > now()
                       OR t.status NOT IN ('pending', 'dispatched', 'running', 'suspended');
            v_due := t.deadline_warn_at;
            UPDATE state.turns SET deadline_warn_at = NULL WHERE turn_id = t.turn_id;
            -- Once per turn (its deadline spans every attempt): attempt 0 in the key.
            v_res := tw.warn(t, 'turn_deadline', 0, -1, NULL, t.timeout_seconds,
                             extract(epoch FROM now() - t.created_at), t.deadline_at);
        ELSE
            CONTINUE WHEN t.queue_warn_at IS NULL OR t.queue_warn_at > now()
                       OR t.status NOT IN ('pending', 'dispatched');
            v_due := t.queue_warn_at;
            UPDATE state.turns SET queue_warn_at = NULL WHERE turn_id = t.turn_id;
            v_res := tw.warn(t, 'queue', t.attempt, -1, NULL,
                             extract(epoch FROM t.queue_deadline_at - coalesce(t.retry_at, t.created_at)),
                             extract(epoch FROM now() - coalesce(t.retry_at, t.created_at)), t.queue_deadline_at);
        END IF;
        v_pub := v_pub || v_res;
        v_log := v_log || jsonb_build_array(jsonb_build_object(
            'action', 'warning', 'kind', r.kind, 'agent', t.agent, 'turn_id', t.turn_id, 'attempt', t.attempt,
            'due', v_due, 'lateness_ms', tw.lateness_ms(v_due)));
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;


--
-- Name: wd_queue_timeouts(integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.wd_queue_timeouts(p_limit integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    r     record;
    t     state.turns;
    v_got text;
    v_res jsonb;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    FOR r IN
        SELECT turn_id, agent, status, queue_deadline_at FROM state.turns
         WHERE queue_deadline_at < now() AND status IN ('pending', 'dispatched')
         ORDER BY queue_deadline_at LIMIT p_limit
    LOOP
        v_got := NULL;
        -- A child's end is its parent's call result: the parent's turn row first (lock order of a tree).
        CONTINUE WHEN NOT tw.lock_parent(r.turn_id, false);
        IF r.status = 'dispatched' THEN
            SELECT agent INTO v_got FROM state.agents
             WHERE agent = r.agent AND active_agent_turn_id = r.turn_id FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN v_got IS NULL;
        END IF;
        SELECT * INTO t FROM state.turns WHERE turn_id = r.turn_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND OR t.status IS DISTINCT FROM r.status OR t.queue_deadline_at >= now();
        v_res := tw.force_finish(t.turn_id, 'queue_timeout', 'timeout',
                     format('the turn was not running %s seconds after it was queued (it was %s)',
                            round(extract(epoch FROM t.queue_deadline_at - coalesce(t.retry_at, t.created_at))),
                            t.status));
        IF v_res IS NOT NULL THEN
            v_pub := v_pub || v_res;
            v_log := v_log || jsonb_build_array(jsonb_build_object(
                'agent', t.agent, 'turn_id', t.turn_id, 'attempt', t.attempt, 'status_before', t.status,
                'due', t.queue_deadline_at, 'lateness_ms', tw.lateness_ms(t.queue_deadline_at)));
        END IF;
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;


--
-- Name: wd_reap(text, integer, text, text, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.wd_reap(p_status text, p_after_s integer, p_reason text, p_final text, p_limit integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    r     record;
    v_res jsonb;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    -- The limit, for the `timeout` details of the events (tw.timeout_detail).
    PERFORM set_config('tw.timeout_limit', p_after_s::text, true);
    FOR r IN
        SELECT turn_id, agent FROM state.turns
         WHERE status = p_status AND updated_at < now() - make_interval(secs => p_after_s)
         ORDER BY updated_at LIMIT p_limit
    LOOP
        v_res := tw.wd_reap_one(r.turn_id, r.agent, p_status, now() - make_interval(secs => p_after_s), p_after_s,
                                '-infinity', p_reason, p_final);
        CONTINUE WHEN v_res IS NULL;
        v_pub := v_pub || (v_res -> 'publish');
        v_log := v_log || jsonb_build_array(v_res -> 'action');
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;


--
-- Name: wd_reap_dispatched(integer, integer, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.wd_reap_dispatched(p_after_s integer, p_stale_s integer, p_limit integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_prof  text;
    v_clock timestamptz;
    r       record;
    v_res   jsonb;
    v_pub   jsonb := '[]'::jsonb;
    v_log   jsonb := '[]'::jsonb;
    v_n     integer := 0;
BEGIN
    -- The limit, for the `timeout` details of the events (tw.timeout_detail).
    PERFORM set_config('tw.timeout_limit', p_after_s::text, true);
    FOR v_prof IN SELECT tw.dispatched_profiles() LOOP
        v_clock := tw.profile_clock(v_prof, p_stale_s);
        CONTINUE WHEN v_clock >= now() - make_interval(secs => p_after_s);
        FOR r IN
            SELECT turn_id, agent FROM state.turns
             WHERE status = 'dispatched' AND profile = v_prof AND updated_at < now() - make_interval(secs => p_after_s)
             ORDER BY updated_at LIMIT p_limit - v_n
        LOOP
            v_res := tw.wd_reap_one(r.turn_id, r.agent, 'dispatched', now() - make_interval(secs => p_after_s),
                                    p_after_s, v_clock, 'dispatch_timeout', 'timeout');
            CONTINUE WHEN v_res IS NULL;
            v_pub := v_pub || (v_res -> 'publish');
            v_log := v_log || jsonb_build_array(v_res -> 'action');
            v_n := v_n + 1;
        END LOOP;
        EXIT WHEN v_n >= p_limit;
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;


--
-- Name: wd_reap_one(uuid, text, text, timestamp with time zone, integer, timestamp with time zone, text, text); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.wd_reap_one(p_turn uuid, p_agent text, p_status text, p_before timestamp with time zone, p_after_s integer, p_clock timestamp with time zone, p_reason text, p_final text) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    a     state.agents;
    v_upd timestamptz;
    v_due timestamptz;
    v_res jsonb;
BEGIN
    IF NOT tw.lock_parent(p_turn, false) THEN
        RETURN NULL;
    END IF;
    SELECT * INTO a FROM state.agents WHERE agent = p_agent FOR UPDATE SKIP LOCKED;
    IF NOT FOUND OR a.status <> p_status OR a.active_agent_turn_id IS DISTINCT FROM p_turn THEN
        RETURN NULL;
    END IF;
    SELECT updated_at INTO v_upd FROM state.turns
     WHERE turn_id = p_turn AND status = p_status AND turn_epoch = a.turn_epoch FOR UPDATE;
    IF v_upd IS NULL OR v_upd >= p_before THEN
        RETURN NULL;
    END IF;
    v_due := greatest(v_upd, p_clock) + make_interval(secs => p_after_s);
    v_res := tw.force_finish(p_turn, p_reason, p_final,
                 format('agent %s stayed %s for more than %s seconds (last update %s)%s', a.agent, p_status,
                        p_after_s, v_upd,
                        CASE WHEN p_status <> 'dispatched' THEN ''
                             WHEN p_clock = '-infinity' THEN format('; no live worker serves profile %s', a.profile)
                             ELSE format('; a worker serving profile %s had a free slot since %s and did not take it',
                                         a.profile, p_clock) END));
    IF v_res IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN jsonb_build_object('publish', v_res, 'action', jsonb_build_object(
        'agent', a.agent, 'profile', a.profile, 'turn_id', p_turn, 'epoch', a.turn_epoch, 'due', v_due,
        'lateness_ms', tw.lateness_ms(v_due)));
END $$;


--
-- Name: wd_reclaim_inbox(integer, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.wd_reclaim_inbox(p_timeout_s integer, p_limit integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: wd_rering_dispatched(integer, integer, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.wd_rering_dispatched(p_retry_s integer, p_stale_s integer, p_limit integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_prof  text;
    v_clock timestamptz;
    r       record;
    a       state.agents;
    t       state.turns;
    v_pub   jsonb := '[]'::jsonb;
    v_log   jsonb := '[]'::jsonb;
    v_enq   boolean;
    v_due   timestamptz;
    v_n     integer := 0;
BEGIN
    FOR v_prof IN SELECT tw.dispatched_profiles() LOOP
        v_clock := tw.profile_clock(v_prof, p_stale_s);
        CONTINUE WHEN v_clock >= now() - make_interval(secs => p_retry_s);
        FOR r IN
            SELECT turn_id, agent FROM state.turns
             WHERE status = 'dispatched' AND profile = v_prof
               AND coalesce(rerung_at, updated_at) < now() - make_interval(secs => p_retry_s)
             ORDER BY coalesce(rerung_at, updated_at) LIMIT p_limit - v_n
        LOOP
            SELECT * INTO a FROM state.agents WHERE agent = r.agent FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND OR a.status <> 'dispatched' OR a.active_agent_turn_id IS DISTINCT FROM r.turn_id;
            SELECT * INTO t FROM state.turns WHERE turn_id = r.turn_id FOR UPDATE;
            CONTINUE WHEN t.status <> 'dispatched' OR t.turn_epoch <> a.turn_epoch
                       OR coalesce(t.rerung_at, t.updated_at) >= now() - make_interval(secs => p_retry_s);
            v_due := greatest(coalesce(t.rerung_at, t.updated_at), v_clock) + make_interval(secs => p_retry_s);
            v_enq := false;
            IF NOT EXISTS (SELECT 1 FROM state.agent_inbox
                            WHERE turn_id = t.turn_id AND turn_epoch = t.turn_epoch
                              AND message_type = 'turn' AND status IN ('pending', 'processing')) THEN
                INSERT INTO state.agent_inbox (target_kind, target, profile, turn_seq, message_type, turn_id, turn_epoch,
                                               step, channel_id, payload)
                VALUES ('agent', a.agent, t.profile, t.seq, 'turn', t.turn_id, t.turn_epoch, t.step, t.channel_id,
                        jsonb_build_object('turn_id', t.turn_id, 'epoch', t.turn_epoch, 'rering', true));
                v_enq := true;
            END IF;
            UPDATE state.turns SET rerung_at = now() WHERE turn_id = t.turn_id;
            v_pub := v_pub || tw.doorbell('agent', a.agent, 'dispatched_retry', t.profile);
            v_log := v_log || jsonb_build_array(jsonb_build_object(
                'agent', a.agent, 'profile', t.profile, 'turn_id', t.turn_id, 'epoch', t.turn_epoch,
                'enqueued', v_enq, 'due', v_due, 'lateness_ms', tw.lateness_ms(v_due)));
            v_n := v_n + 1;
        END LOOP;
        EXIT WHEN v_n >= p_limit;
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;


--
-- Name: wd_rering_pending(integer, integer, integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.wd_rering_pending(p_wakeup_s integer, p_skip_s integer, p_limit integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    m         record;
    v_pub     jsonb := '[]'::jsonb;
    v_log     jsonb := '[]'::jsonb;
    v_targets text[] := '{}';
    v_due     timestamptz;
BEGIN
    FOR m IN
        SELECT i.inbox_id, i.target_kind, i.target, i.profile, i.created_at, i.rung_at, i.turn_id, i.turn_epoch,
               coalesce(i.channel_id, CASE WHEN i.target_kind = 'agent' THEN ag.active_channel_id END) AS channel
          FROM (SELECT * FROM state.agent_inbox
                 WHERE status = 'pending' AND coalesce(rung_at, created_at) < now() - make_interval(secs => p_wakeup_s)
                 ORDER BY coalesce(rung_at, created_at) LIMIT p_limit FOR UPDATE SKIP LOCKED) i
          LEFT JOIN state.agents ag ON i.target_kind = 'agent' AND ag.agent = i.target
        UNION ALL
        -- A channel-less item is skipped as soon as it is old enough, not at its next re-ring.
        SELECT i.inbox_id, i.target_kind, i.target, i.profile, i.created_at, i.rung_at, i.turn_id, i.turn_epoch, NULL
          FROM (SELECT * FROM state.agent_inbox
                 WHERE status = 'pending' AND channel_id IS NULL
                   AND created_at < now() - make_interval(secs => p_skip_s)
                   AND coalesce(rung_at, created_at) >= now() - make_interval(secs => p_wakeup_s)
                 ORDER BY created_at LIMIT p_limit FOR UPDATE SKIP LOCKED) i
          LEFT JOIN state.agents ag ON i.target_kind = 'agent' AND ag.agent = i.target
         WHERE i.target_kind <> 'agent' OR ag.active_channel_id IS NULL
    LOOP
        IF m.channel IS NULL AND m.created_at < now() - make_interval(secs => p_skip_s) THEN
            v_due := m.created_at + make_interval(secs => p_skip_s);
            UPDATE state.agent_inbox
               SET status = 'skipped', watchdog_error = 'missing_channel', watchdog_at = now()
             WHERE inbox_id = m.inbox_id;
            v_log := v_log || jsonb_build_array(jsonb_build_object(
                'action', 'skipped', 'inbox_id', m.inbox_id, 'target', m.target, 'turn_id', m.turn_id,
                'epoch', m.turn_epoch, 'watchdog_error', 'missing_channel', 'due', v_due,
                'lateness_ms', tw.lateness_ms(v_due)));
            CONTINUE;
        END IF;
        v_due := coalesce(m.rung_at, m.created_at) + make_interval(secs => p_wakeup_s);
        UPDATE state.agent_inbox SET rung_at = now() WHERE inbox_id = m.inbox_id;
        IF NOT (m.target_kind || '.' || m.target) = ANY (v_targets) THEN
            v_targets := v_targets || (m.target_kind || '.' || m.target);
            v_pub := v_pub || tw.doorbell(m.target_kind, m.target, 'pending_wakeup', m.profile);
        END IF;
        v_log := v_log || jsonb_build_array(jsonb_build_object(
            'action', 'rering', 'inbox_id', m.inbox_id, 'target', m.target, 'turn_id', m.turn_id,
            'epoch', m.turn_epoch, 'due', v_due, 'lateness_ms', tw.lateness_ms(v_due)));
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;


--
-- Name: wd_retry_due(integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.wd_retry_due(p_limit integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    r     record;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
    v_res jsonb;
BEGIN
    FOR r IN
        SELECT turn_id, agent, attempt, turn_epoch, retry_due_at FROM state.turns
         WHERE retry_due_at <= now() AND status = 'pending'
         ORDER BY retry_due_at LIMIT p_limit
    LOOP
        v_res := tw.dispatch_next(r.agent);
        UPDATE state.turns SET retry_due_at = NULL WHERE turn_id = r.turn_id AND retry_due_at = r.retry_due_at;
        CONTINUE WHEN NOT FOUND;
        v_pub := v_pub || v_res;
        v_log := v_log || jsonb_build_array(jsonb_build_object(
            'agent', r.agent, 'turn_id', r.turn_id, 'attempt', r.attempt, 'epoch', r.turn_epoch,
            'dispatched', jsonb_array_length(v_res) > 0, 'due', r.retry_due_at,
            'lateness_ms', tw.lateness_ms(r.retry_due_at)));
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;


--
-- Name: wd_tool_timeouts(integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.wd_tool_timeouts(p_limit integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    t     state.turns;
    w     state.turn_waiting_tools;
    v_res jsonb;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    FOR t IN
        SELECT * FROM state.turns
         WHERE status = 'suspended' AND resume_deadline < now()
         ORDER BY resume_deadline LIMIT p_limit FOR UPDATE SKIP LOCKED
    LOOP
        FOR w IN
            SELECT * FROM state.turn_waiting_tools
             WHERE turn_id = t.turn_id AND step = t.step AND wait_status = 'waiting' AND deadline_at < now()
             ORDER BY deadline_at, call_index
        LOOP
            IF w.call_card_id IS NULL
               OR NOT EXISTS (SELECT 1 FROM state.cards c WHERE c.card_id = w.call_card_id) THEN
                v_log := v_log || jsonb_build_array(jsonb_build_object(
                    'action', 'skipped_missing_card', 'turn_id', t.turn_id, 'tool_call_id', w.tool_call_id,
                    'epoch', t.turn_epoch, 'due', w.deadline_at));
                CONTINUE;
            END IF;
            v_res := tw.deliver_result(t.turn_id, w.tool_call_id, 'timeout', NULL,
                         jsonb_build_object('code', 'tool_timeout', 'message',
                             format('tool %s did not answer call %s within %s seconds', w.tool, w.tool_call_id,
                                    round(extract(epoch FROM w.deadline_at - t.suspended_at)))),
                         NULL, 'timeout');
            IF v_res ->> 'result' = 'accepted' THEN
                v_pub := v_pub || (v_res -> 'publish');
                v_log := v_log || jsonb_build_array(jsonb_build_object(
                    'action', 'timeout_report', 'turn_id', t.turn_id, 'tool_call_id', w.tool_call_id,
                    'epoch', t.turn_epoch, 'due', w.deadline_at, 'lateness_ms', tw.lateness_ms(w.deadline_at)));
            END IF;
        END LOOP;
        UPDATE state.turns
           SET resume_deadline = (SELECT min(deadline_at) FROM state.turn_waiting_tools x
                                   WHERE x.turn_id = t.turn_id AND x.step = t.step AND x.wait_status = 'waiting'
                                     AND (x.deadline_at >= now()
                                          OR EXISTS (SELECT 1 FROM state.cards c WHERE c.card_id = x.call_card_id)))
         WHERE turn_id = t.turn_id;
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;


--
-- Name: wd_tool_warnings(integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.wd_tool_warnings(p_limit integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    w     state.turn_waiting_tools;
    t     state.turns;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    FOR w IN
        SELECT * FROM state.turn_waiting_tools
         WHERE warn_at <= now() AND wait_status = 'waiting'
         ORDER BY warn_at LIMIT p_limit FOR UPDATE SKIP LOCKED
    LOOP
        UPDATE state.turn_waiting_tools SET warn_at = NULL
         WHERE turn_id = w.turn_id AND step = w.step AND tool_call_id = w.tool_call_id;
        SELECT * INTO t FROM state.turns WHERE turn_id = w.turn_id;
        CONTINUE WHEN t.status <> 'suspended' OR t.turn_epoch IS DISTINCT FROM w.turn_epoch;
        v_pub := v_pub || tw.warn(t, 'tool_call', t.attempt, w.step, w.tool_call_id,
                                  extract(epoch FROM w.deadline_at - w.created_at),
                                  extract(epoch FROM now() - w.created_at), w.deadline_at);
        v_log := v_log || jsonb_build_array(jsonb_build_object(
            'action', 'warning', 'kind', 'tool_call', 'turn_id', w.turn_id, 'tool_call_id', w.tool_call_id,
            'epoch', w.turn_epoch, 'due', w.warn_at, 'lateness_ms', tw.lateness_ms(w.warn_at)));
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;


--
-- Name: wd_turn_deadlines(integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.wd_turn_deadlines(p_limit integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    r     record;
    v_res jsonb;
    v_pub jsonb := '[]'::jsonb;
    v_log jsonb := '[]'::jsonb;
BEGIN
    FOR r IN
        SELECT turn_id, agent, turn_epoch, status, deadline_at, timeout_seconds FROM state.turns
         WHERE deadline_at < now() AND status IN ('pending', 'dispatched', 'running', 'suspended')
         ORDER BY deadline_at LIMIT p_limit
    LOOP
        v_res := tw.end_turn(r.turn_id, 'turn_deadline_exceeded', 'timeout',
                     format('the turn did not end within its %s second deadline (it was %s)',
                            r.timeout_seconds, r.status), false);
        IF v_res IS NOT NULL THEN
            v_pub := v_pub || v_res;
            v_log := v_log || jsonb_build_array(jsonb_build_object(
                'agent', r.agent, 'turn_id', r.turn_id, 'epoch', r.turn_epoch, 'status_before', r.status,
                'due', r.deadline_at, 'lateness_ms', tw.lateness_ms(r.deadline_at)));
        END IF;
    END LOOP;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;


--
-- Name: worker_next_due(integer); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.worker_next_due(p_lease_s integer) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN jsonb_build_object(
        '2.1', tw.ms_until((SELECT min(processed_at) FROM state.agent_inbox WHERE status = 'processing')
                           + make_interval(secs => p_lease_s)),
        '2.2', tw.ms_until((SELECT min(resume_deadline) FROM state.turns WHERE status = 'suspended')),
        '2.3', tw.ms_until((SELECT min(lease_expires_at) FROM state.turn_resume_ledger
                             WHERE status = 'processing')))
        || tw.worker_policy_next_due();  -- tool call warnings (0007_policies_fn.sql)
END $$;


--
-- Name: worker_policy_next_due(); Type: FUNCTION; Schema: tw; Owner: -
--

CREATE FUNCTION tw.worker_policy_next_due() RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
    SELECT jsonb_build_object(
        'warn', tw.ms_until((SELECT min(warn_at) FROM state.turn_waiting_tools
                              WHERE warn_at IS NOT NULL AND wait_status = 'waiting')))
$$;


--
-- Name: agent_inbox_inbox_id_seq; Type: SEQUENCE; Schema: state; Owner: -
--

CREATE SEQUENCE state.agent_inbox_inbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: agent_inbox_inbox_id_seq; Type: SEQUENCE OWNED BY; Schema: state; Owner: -
--

ALTER SEQUENCE state.agent_inbox_inbox_id_seq OWNED BY state.agent_inbox.inbox_id;


--
-- Name: cards; Type: TABLE; Schema: state; Owner: -
--

CREATE TABLE state.cards (
    card_id uuid DEFAULT gen_random_uuid() NOT NULL,
    card_type state.card_type NOT NULL,
    turn_id uuid NOT NULL,
    agent text NOT NULL,
    turn_epoch bigint,
    step integer,
    tool_call_id text,
    output_box_id text,
    content jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);
ALTER TABLE ONLY state.cards ALTER COLUMN content SET STATISTICS 0;


--
-- Name: claim_token_seq; Type: SEQUENCE; Schema: state; Owner: -
--

CREATE SEQUENCE state.claim_token_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: daemons; Type: TABLE; Schema: state; Owner: -
--

CREATE TABLE state.daemons (
    daemon_id text NOT NULL,
    daemon_no integer NOT NULL,
    kind text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    incarnation text NOT NULL,
    info jsonb DEFAULT '{}'::jsonb NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    locked_at timestamp with time zone DEFAULT now() NOT NULL,
    last_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    gone_at timestamp with time zone,
    gone_reason text,
    slots integer,
    free_since timestamp with time zone,
    CONSTRAINT daemons_kind_check CHECK ((kind = ANY (ARRAY['pmo'::text, 'worker'::text])))
);


--
-- Name: daemons_daemon_no_seq; Type: SEQUENCE; Schema: state; Owner: -
--

ALTER TABLE state.daemons ALTER COLUMN daemon_no ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME state.daemons_daemon_no_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: force_terminations; Type: TABLE; Schema: state; Owner: -
--

CREATE TABLE state.force_terminations (
    id bigint NOT NULL,
    turn_id uuid NOT NULL,
    agent text NOT NULL,
    turn_epoch bigint,
    reason text NOT NULL,
    detail jsonb,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);
ALTER TABLE ONLY state.force_terminations ALTER COLUMN detail SET STATISTICS 0;


--
-- Name: force_terminations_id_seq; Type: SEQUENCE; Schema: state; Owner: -
--

CREATE SEQUENCE state.force_terminations_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: force_terminations_id_seq; Type: SEQUENCE OWNED BY; Schema: state; Owner: -
--

ALTER SEQUENCE state.force_terminations_id_seq OWNED BY state.force_terminations.id;


--
-- Name: outbox; Type: TABLE; Schema: state; Owner: -
--

CREATE TABLE state.outbox (
    event_id uuid NOT NULL,
    seq bigint NOT NULL,
    kind state.event_kind NOT NULL,
    subject text NOT NULL,
    payload jsonb NOT NULL,
    turn_id uuid,
    turn_epoch bigint,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    relay_lease_until timestamp with time zone,
    published_at timestamp with time zone,
    xid xid8 DEFAULT pg_current_xact_id() NOT NULL
)
WITH (autovacuum_vacuum_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02', autovacuum_vacuum_cost_delay='0', fillfactor='50');
ALTER TABLE ONLY state.outbox ALTER COLUMN payload SET STATISTICS 0;


--
-- Name: outbox_cursor; Type: TABLE; Schema: state; Owner: -
--

CREATE TABLE state.outbox_cursor (
    one boolean DEFAULT true NOT NULL,
    xid xid8 NOT NULL,
    CONSTRAINT outbox_cursor_one_check CHECK (one)
);


--
-- Name: outbox_seq_seq; Type: SEQUENCE; Schema: state; Owner: -
--

CREATE SEQUENCE state.outbox_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: outbox_seq_seq; Type: SEQUENCE OWNED BY; Schema: state; Owner: -
--

ALTER SEQUENCE state.outbox_seq_seq OWNED BY state.outbox.seq;


--
-- Name: profiles; Type: TABLE; Schema: state; Owner: -
--

CREATE TABLE state.profiles (
    profile state.name NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: schema_migrations; Type: TABLE; Schema: state; Owner: -
--

CREATE TABLE state.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL,
    checksum text
);


--
-- Name: turn_history; Type: TABLE; Schema: state; Owner: -
--

CREATE TABLE state.turn_history (
    id bigint NOT NULL,
    turn_id uuid NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    from_status text,
    to_status text NOT NULL,
    turn_epoch bigint,
    attempt integer NOT NULL,
    actor text NOT NULL,
    reason text
)
WITH (autovacuum_vacuum_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02');


--
-- Name: turn_history_id_seq; Type: SEQUENCE; Schema: state; Owner: -
--

ALTER TABLE state.turn_history ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME state.turn_history_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: turn_resume_ledger; Type: TABLE; Schema: state; Owner: -
--

CREATE TABLE state.turn_resume_ledger (
    ledger_id bigint NOT NULL,
    turn_id uuid NOT NULL,
    agent text NOT NULL,
    turn_epoch bigint NOT NULL,
    step integer NOT NULL,
    status state.ledger_status DEFAULT 'pending'::text NOT NULL,
    lease_token bigint,
    lease_expires_at timestamp with time zone,
    claimed_by text,
    attempts integer DEFAULT 0 NOT NULL,
    outcome text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    profile text NOT NULL
)
WITH (autovacuum_vacuum_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02');


--
-- Name: turn_resume_ledger_ledger_id_seq; Type: SEQUENCE; Schema: state; Owner: -
--

CREATE SEQUENCE state.turn_resume_ledger_ledger_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: turn_resume_ledger_ledger_id_seq; Type: SEQUENCE OWNED BY; Schema: state; Owner: -
--

ALTER SEQUENCE state.turn_resume_ledger_ledger_id_seq OWNED BY state.turn_resume_ledger.ledger_id;


--
-- Name: turn_waiting_tools; Type: TABLE; Schema: state; Owner: -
--

CREATE TABLE state.turn_waiting_tools (
    turn_id uuid NOT NULL,
    step integer NOT NULL,
    tool_call_id text NOT NULL,
    call_index integer NOT NULL,
    agent text NOT NULL,
    tool text NOT NULL,
    args jsonb NOT NULL,
    timeout_seconds integer NOT NULL,
    external boolean DEFAULT false NOT NULL,
    turn_epoch bigint NOT NULL,
    wait_status state.wait_status DEFAULT 'waiting'::text NOT NULL,
    deadline_at timestamp with time zone NOT NULL,
    call_card_id uuid,
    result_card_id uuid,
    result_status state.result_status,
    output jsonb,
    error jsonb,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    settled_at timestamp with time zone,
    timeout_source text,
    warn_at timestamp with time zone,
    child_turn_id uuid
)
WITH (autovacuum_vacuum_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02');
ALTER TABLE ONLY state.turn_waiting_tools ALTER COLUMN args SET STATISTICS 0;
ALTER TABLE ONLY state.turn_waiting_tools ALTER COLUMN output SET STATISTICS 0;
ALTER TABLE ONLY state.turn_waiting_tools ALTER COLUMN error SET STATISTICS 0;


--
-- Name: turn_warnings; Type: TABLE; Schema: state; Owner: -
--

CREATE TABLE state.turn_warnings (
    turn_id uuid NOT NULL,
    kind text NOT NULL,
    attempt integer NOT NULL,
    step integer DEFAULT '-1'::integer NOT NULL,
    tool_call_id text DEFAULT ''::text NOT NULL,
    turn_epoch bigint,
    limit_seconds numeric NOT NULL,
    elapsed_seconds numeric NOT NULL,
    due_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT turn_warnings_kind_check CHECK ((kind = ANY (ARRAY['turn_deadline'::text, 'step_timeout'::text, 'tool_call'::text, 'queue'::text])))
);


--
-- Name: turns_seq_seq; Type: SEQUENCE; Schema: state; Owner: -
--

CREATE SEQUENCE state.turns_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: turns_seq_seq; Type: SEQUENCE OWNED BY; Schema: state; Owner: -
--

ALTER SEQUENCE state.turns_seq_seq OWNED BY state.turns.seq;


--
-- Name: agent_inbox inbox_id; Type: DEFAULT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.agent_inbox ALTER COLUMN inbox_id SET DEFAULT nextval('state.agent_inbox_inbox_id_seq'::regclass);


--
-- Name: force_terminations id; Type: DEFAULT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.force_terminations ALTER COLUMN id SET DEFAULT nextval('state.force_terminations_id_seq'::regclass);


--
-- Name: outbox seq; Type: DEFAULT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.outbox ALTER COLUMN seq SET DEFAULT nextval('state.outbox_seq_seq'::regclass);


--
-- Name: turn_resume_ledger ledger_id; Type: DEFAULT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.turn_resume_ledger ALTER COLUMN ledger_id SET DEFAULT nextval('state.turn_resume_ledger_ledger_id_seq'::regclass);


--
-- Name: turns seq; Type: DEFAULT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.turns ALTER COLUMN seq SET DEFAULT nextval('state.turns_seq_seq'::regclass);


--
-- Data for Name: agent_inbox; Type: TABLE DATA; Schema: state; Owner: -
--

INSERT INTO state.agent_inbox VALUES
	(1, 'agent', 'echo', 'turn', 'd09dcec6-672d-4958-b25a-bcf348d417fc', 1, 0, NULL, 'r2-done', '{"epoch": 1, "turn_id": "d09dcec6-672d-4958-b25a-bcf348d417fc"}', 'archived', '2026-11-26 15:31:26.749747+00', '2026-11-26 15:31:26.784957+00', '2026-11-26 15:31:26.800529+00', 1, 'vm:18737', 1, 'applied', NULL, NULL, NULL, 'echo', 1),
	(2, 'agent', 'tester', 'turn', 'bdb1f269-1135-442c-8c66-56e92f08b9c9', 1, 0, NULL, 'r2-suspended', '{"epoch": 1, "turn_id": "bdb1f269-1135-442c-8c66-56e92f08b9c9"}', 'archived', '2026-11-26 15:31:26.805392+00', '2026-11-26 15:31:26.800529+00', '2026-11-26 15:31:26.838377+00', 2, 'vm:18737', 1, 'applied', NULL, NULL, NULL, 'tester', 2),
	(3, 'agent', 'support-7', 'turn', 'ae47949f-7830-4101-93bd-81c8655fc778', 1, 0, NULL, 'r2-roster', '{"epoch": 1, "turn_id": "ae47949f-7830-4101-93bd-81c8655fc778"}', 'processing', '2026-11-26 15:31:26.857357+00', '2026-11-26 15:31:26.896845+00', NULL, 3, 'vm:18737', 1, NULL, NULL, NULL, NULL, 'echo', 3);


--
-- Data for Name: agents; Type: TABLE DATA; Schema: state; Owner: -
--

INSERT INTO state.agents VALUES
	('idle', 'idle', NULL, NULL, 0, '2026-11-26 15:31:25.703641+00', NULL, 'idle', '2026-11-26 15:31:25.703641+00', NULL, '{}'),
	('echo', 'idle', NULL, NULL, 1, '2026-11-26 15:31:26.800529+00', NULL, 'echo', '2026-11-26 15:31:25.703641+00', NULL, '{}'),
	('tester', 'suspended', 'bdb1f269-1135-442c-8c66-56e92f08b9c9', 'r2-suspended', 1, '2026-11-26 15:31:26.838377+00', NULL, 'tester', '2026-11-26 15:31:25.703641+00', NULL, '{}'),
	('support-7', 'running', 'ae47949f-7830-4101-93bd-81c8655fc778', 'r2-roster', 1, '2026-11-26 15:31:26.896845+00', NULL, 'echo', '2026-11-26 15:31:26.84732+00', NULL, '{}');


--
-- Data for Name: cards; Type: TABLE DATA; Schema: state; Owner: -
--

INSERT INTO state.cards VALUES
	('c5541819-a62a-450e-8285-512e848915e3', 'task.deliverable', 'd09dcec6-672d-4958-b25a-bcf348d417fc', 'echo', 1, 0, NULL, NULL, '{"output": {"echo": {"text": "done before the upgrade"}, "step": 0}, "partial": false}', '2026-11-26 15:31:26.800529+00'),
	('25f7230e-40b7-458a-b824-76415a58e2f6', 'tool.call', 'bdb1f269-1135-442c-8c66-56e92f08b9c9', 'tester', 1, 0, 'x1', NULL, '{"args": {"q": 1}, "tool": "ext", "timeout_seconds": 3600}', '2026-11-26 15:31:26.838377+00');


--
-- Data for Name: daemons; Type: TABLE DATA; Schema: state; Owner: -
--

INSERT INTO state.daemons OVERRIDING SYSTEM VALUE VALUES
	('vm:18736', 1, 'pmo', 'vm', 18736, '9249d7fb2a213014', '{"watchdog_interval_seconds": 1}', '2026-11-26 15:31:25.772718+00', '2026-11-26 15:31:25.772718+00', '2026-11-26 15:31:25.960631+00', NULL, NULL, NULL, NULL),
	('vm:18737', 2, 'worker', 'vm', 18737, '6598db346dca457d', '{"tools": [], "profiles": ["echo", "tester", "idle"], "concurrency": 4}', '2026-11-26 15:31:25.788977+00', '2026-11-26 15:31:25.788977+00', '2026-11-26 15:31:25.954121+00', NULL, NULL, 4, '2026-11-26 15:31:25.778083+00');


--
-- Data for Name: force_terminations; Type: TABLE DATA; Schema: state; Owner: -
--



--
-- Data for Name: outbox; Type: TABLE DATA; Schema: state; Owner: -
--

INSERT INTO state.outbox VALUES
	('b12889b9-7583-4a1e-a476-54c7f11c83dc', 1, 'state', 'evt.agent.echo.state', '{"at": "2026-11-26T15:31:26.749747+00:00", "agent": "echo", "status": "dispatched", "profile": "echo", "turn_id": "d09dcec6-672d-4958-b25a-bcf348d417fc", "event_id": "b12889b9-7583-4a1e-a476-54c7f11c83dc", "turn_epoch": 1}', 'd09dcec6-672d-4958-b25a-bcf348d417fc', 1, '2026-11-26 15:31:26.749747+00', NULL, '2026-11-26 15:31:26.785297+00', '747'),
	('fe2e225d-03d5-4e58-b7c8-045b6ff87a46', 3, 'state', 'evt.agent.tester.state', '{"at": "2026-11-26T15:31:26.805392+00:00", "agent": "tester", "status": "dispatched", "profile": "tester", "turn_id": "bdb1f269-1135-442c-8c66-56e92f08b9c9", "event_id": "fe2e225d-03d5-4e58-b7c8-045b6ff87a46", "turn_epoch": 1}', 'bdb1f269-1135-442c-8c66-56e92f08b9c9', 1, '2026-11-26 15:31:26.805392+00', NULL, '2026-11-26 15:31:26.806913+00', '754'),
	('ed8aaa1f-f5a9-4a65-b20f-ae83c29110f6', 2, 'state', 'evt.agent.echo.state', '{"at": "2026-11-26T15:31:26.784957+00:00", "agent": "echo", "status": "running", "profile": "echo", "turn_id": "d09dcec6-672d-4958-b25a-bcf348d417fc", "event_id": "ed8aaa1f-f5a9-4a65-b20f-ae83c29110f6", "turn_epoch": 1}', 'd09dcec6-672d-4958-b25a-bcf348d417fc', 1, '2026-11-26 15:31:26.784957+00', NULL, '2026-11-26 15:31:26.81483+00', '751'),
	('7352919f-28b5-4381-9845-7f5d5e470a54', 4, 'state', 'evt.agent.echo.state', '{"at": "2026-11-26T15:31:26.800529+00:00", "agent": "echo", "status": "idle", "profile": "echo", "turn_id": "d09dcec6-672d-4958-b25a-bcf348d417fc", "event_id": "7352919f-28b5-4381-9845-7f5d5e470a54", "turn_epoch": 1}', 'd09dcec6-672d-4958-b25a-bcf348d417fc', 1, '2026-11-26 15:31:26.800529+00', NULL, '2026-11-26 15:31:26.82459+00', '753'),
	('7dc927d6-73c0-47c8-af7d-36b92683891a', 5, 'task', 'evt.agent.echo.task', '{"at": "2026-11-26T15:31:26.800529+00:00", "agent": "echo", "status": "done", "attempt": 1, "profile": "echo", "turn_id": "d09dcec6-672d-4958-b25a-bcf348d417fc", "event_id": "7dc927d6-73c0-47c8-af7d-36b92683891a", "channel_id": "r2-done", "turn_epoch": 1, "deliverable_card_id": "c5541819-a62a-450e-8285-512e848915e3"}', 'd09dcec6-672d-4958-b25a-bcf348d417fc', 1, '2026-11-26 15:31:26.800529+00', NULL, '2026-11-26 15:31:26.82459+00', '753'),
	('dc4c4279-55c0-4d2d-8dc2-857d59b83ccc', 6, 'state', 'evt.agent.tester.state', '{"at": "2026-11-26T15:31:26.800529+00:00", "agent": "tester", "status": "running", "profile": "tester", "turn_id": "bdb1f269-1135-442c-8c66-56e92f08b9c9", "event_id": "dc4c4279-55c0-4d2d-8dc2-857d59b83ccc", "turn_epoch": 1}', 'bdb1f269-1135-442c-8c66-56e92f08b9c9', 1, '2026-11-26 15:31:26.800529+00', NULL, '2026-11-26 15:31:26.82459+00', '753'),
	('fb4d562f-9792-4420-a0d7-3371b166ab2b', 7, 'state', 'evt.agent.tester.state', '{"at": "2026-11-26T15:31:26.838377+00:00", "agent": "tester", "status": "suspended", "profile": "tester", "turn_id": "bdb1f269-1135-442c-8c66-56e92f08b9c9", "event_id": "fb4d562f-9792-4420-a0d7-3371b166ab2b", "turn_epoch": 1}', 'bdb1f269-1135-442c-8c66-56e92f08b9c9', 1, '2026-11-26 15:31:26.838377+00', NULL, '2026-11-26 15:31:26.904709+00', '758'),
	('cd34dff7-f07c-4da5-9102-25986f9281ba', 8, 'state', 'evt.agent.support-7.state', '{"at": "2026-11-26T15:31:26.857357+00:00", "agent": "support-7", "status": "dispatched", "profile": "echo", "turn_id": "ae47949f-7830-4101-93bd-81c8655fc778", "event_id": "cd34dff7-f07c-4da5-9102-25986f9281ba", "turn_epoch": 1}', 'ae47949f-7830-4101-93bd-81c8655fc778', 1, '2026-11-26 15:31:26.857357+00', NULL, '2026-11-26 15:31:26.859207+00', '760'),
	('d0c5bb40-3b46-4927-b279-d07b67dee5d8', 9, 'state', 'evt.agent.support-7.state', '{"at": "2026-11-26T15:31:26.896845+00:00", "agent": "support-7", "status": "running", "profile": "echo", "turn_id": "ae47949f-7830-4101-93bd-81c8655fc778", "event_id": "d0c5bb40-3b46-4927-b279-d07b67dee5d8", "turn_epoch": 1}', 'ae47949f-7830-4101-93bd-81c8655fc778', 1, '2026-11-26 15:31:26.896845+00', NULL, '2026-11-26 15:31:26.906036+00', '762');


--
-- Data for Name: outbox_cursor; Type: TABLE DATA; Schema: state; Owner: -
--

INSERT INTO state.outbox_cursor VALUES
	(true, '747');


--
-- Data for Name: policies; Type: TABLE DATA; Schema: state; Owner: -
--

INSERT INTO state.policies VALUES
	('echo', 1, '{step_timeout,agent_exit,timeout_reaped_by_watchdog,dispatch_timeout}', 1, 300, 0, 80, 30, 120, '2026-11-26 15:31:25.786985+00', 'vm:18737'),
	('idle', 1, '{step_timeout,agent_exit,timeout_reaped_by_watchdog,dispatch_timeout}', 1, 300, 0, 80, 30, 120, '2026-11-26 15:31:25.786985+00', 'vm:18737'),
	('tester', 1, '{step_timeout,agent_exit,timeout_reaped_by_watchdog,dispatch_timeout}', 1, 300, 0, 80, 30, 120, '2026-11-26 15:31:25.786985+00', 'vm:18737');


--
-- Data for Name: profiles; Type: TABLE DATA; Schema: state; Owner: -
--

INSERT INTO state.profiles VALUES
	('echo', '2026-11-26 15:31:25.703641+00'),
	('idle', '2026-11-26 15:31:25.703641+00'),
	('tester', '2026-11-26 15:31:25.703641+00');


--
-- Data for Name: schema_migrations; Type: TABLE DATA; Schema: state; Owner: -
--

INSERT INTO state.schema_migrations VALUES
	(1, '0001_schema.sql', '2026-11-26 15:31:25.640483+00', 'cbdd920ebbdd7ebc7b57367eec728ce7'),
	(3, '0003_hot_path.sql', '2026-11-26 15:31:25.661365+00', '3bb0fbd4713281c7471666c115b890eb'),
	(4, '0004_liveness_due.sql', '2026-11-26 15:31:25.665004+00', '85cd3bbe4ceb4ff8c7a740d150ce3cde'),
	(6, '0006_policies.sql', '2026-11-26 15:31:25.67006+00', 'ebd418eae5180685c1d580a1bcd6e607'),
	(8, '0008_roster.sql', '2026-11-26 15:31:25.677197+00', 'cbe359ecd06df6ce2ebf25c201b737e2'),
	(2, '0002_functions.sql', '2026-11-26 15:31:25.684148+00', '291e655d0ba8397f0b594047dfa238ee'),
	(5, '0005_watchdogs.sql', '2026-11-26 15:31:25.694171+00', '49a487bf90c02e021e7181638a635ebe'),
	(7, '0007_policies_fn.sql', '2026-11-26 15:31:25.697944+00', '04e1f4ddd00e01b07798997c4bfdc61c'),
	(9, '0009_roster_cli.sql', '2026-11-26 15:31:25.702098+00', '9d81c6a661a025172b1d3212ea456aea');


--
-- Data for Name: turn_history; Type: TABLE DATA; Schema: state; Owner: -
--

INSERT INTO state.turn_history OVERRIDING SYSTEM VALUE VALUES
	(1, 'd09dcec6-672d-4958-b25a-bcf348d417fc', '2026-11-26 15:31:26.743174+00', NULL, 'pending', NULL, 1, 'cli', 'submitted'),
	(2, 'd09dcec6-672d-4958-b25a-bcf348d417fc', '2026-11-26 15:31:26.749747+00', 'pending', 'dispatched', 1, 1, 'vm:18736', 'dispatched'),
	(3, 'd09dcec6-672d-4958-b25a-bcf348d417fc', '2026-11-26 15:31:26.784957+00', 'dispatched', 'running', 1, 1, 'vm:18737', 'claimed'),
	(4, 'd09dcec6-672d-4958-b25a-bcf348d417fc', '2026-11-26 15:31:26.800529+00', 'running', 'done', 1, 1, 'vm:18737', 'completed'),
	(5, 'bdb1f269-1135-442c-8c66-56e92f08b9c9', '2026-11-26 15:31:26.794244+00', NULL, 'pending', NULL, 1, 'cli', 'submitted'),
	(6, 'bdb1f269-1135-442c-8c66-56e92f08b9c9', '2026-11-26 15:31:26.805392+00', 'pending', 'dispatched', 1, 1, 'vm:18736', 'dispatched'),
	(7, 'bdb1f269-1135-442c-8c66-56e92f08b9c9', '2026-11-26 15:31:26.800529+00', 'dispatched', 'running', 1, 1, 'vm:18737', 'claimed'),
	(8, 'bdb1f269-1135-442c-8c66-56e92f08b9c9', '2026-11-26 15:31:26.838377+00', 'running', 'suspended', 1, 1, 'vm:18737', 'waiting for tool calls'),
	(9, 'ae47949f-7830-4101-93bd-81c8655fc778', '2026-11-26 15:31:26.84732+00', NULL, 'pending', NULL, 1, 'cli', 'submitted'),
	(10, 'ae47949f-7830-4101-93bd-81c8655fc778', '2026-11-26 15:31:26.857357+00', 'pending', 'dispatched', 1, 1, 'vm:18736', 'dispatched'),
	(11, 'ae47949f-7830-4101-93bd-81c8655fc778', '2026-11-26 15:31:26.896845+00', 'dispatched', 'running', 1, 1, 'vm:18737', 'claimed'),
	(12, '72acc564-25fb-4a43-9da6-18df04eb6e02', '2026-11-26 15:31:26.940342+00', NULL, 'pending', NULL, 1, 'cli', 'submitted'),
	(13, 'a7792a3e-8053-4cd7-88d2-cef3fe368d55', '2026-11-26 15:31:26.967868+00', NULL, 'pending', NULL, 1, 'cli', 'submitted');


--
-- Data for Name: turn_resume_ledger; Type: TABLE DATA; Schema: state; Owner: -
--



--
-- Data for Name: turn_waiting_tools; Type: TABLE DATA; Schema: state; Owner: -
--

INSERT INTO state.turn_waiting_tools VALUES
	('bdb1f269-1135-442c-8c66-56e92f08b9c9', 0, 'x1', 0, 'tester', 'ext', '{"q": 1}', 3600, true, 1, 'waiting', '2026-11-26 16:31:26.838377+00', '25f7230e-40b7-458a-b824-76415a58e2f6', NULL, NULL, NULL, NULL, '2026-11-26 15:31:26.838377+00', NULL, NULL, 'tool', '2026-11-26 16:19:26.838377+00', NULL);


--
-- Data for Name: turn_warnings; Type: TABLE DATA; Schema: state; Owner: -
--



--
-- Data for Name: turns; Type: TABLE DATA; Schema: state; Owner: -
--

INSERT INTO state.turns VALUES
	('d09dcec6-672d-4958-b25a-bcf348d417fc', 1, 'echo', 'r2-done', NULL, '{"text": "done before the upgrade"}', NULL, 'done', 1, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'c5541819-a62a-450e-8285-512e848915e3', '2026-11-26 15:31:26.743174+00', '2026-11-26 15:31:26.749747+00', '2026-11-26 15:31:26.784957+00', NULL, '2026-11-26 15:31:26.800529+00', '2026-11-26 15:31:26.800529+00', NULL, 1, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'echo', 0, NULL, NULL, NULL),
	('bdb1f269-1135-442c-8c66-56e92f08b9c9', 2, 'tester', 'r2-suspended', NULL, '{"mode": "tools", "calls": [{"id": "x1", "args": {"q": 1}, "tool": "ext"}]}', NULL, 'suspended', 1, 0, '{"seen": [], "round": 1}', 'all', NULL, '2026-11-26 16:31:26.838377+00', 3600, '2026-11-26 16:31:26.794244+00', NULL, NULL, NULL, '2026-11-26 15:31:26.794244+00', '2026-11-26 15:31:26.805392+00', '2026-11-26 15:31:26.800529+00', '2026-11-26 15:31:26.838377+00', NULL, '2026-11-26 15:31:26.838377+00', NULL, 1, 0, NULL, NULL, NULL, NULL, NULL, '2026-11-26 16:19:26.794244+00', NULL, 'tester', 0, NULL, NULL, NULL),
	('ae47949f-7830-4101-93bd-81c8655fc778', 3, 'support-7', 'r2-roster', NULL, '{"n": 7}', NULL, 'running', 1, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '2026-11-26 15:31:26.84732+00', '2026-11-26 15:31:26.857357+00', '2026-11-26 15:31:26.896845+00', NULL, NULL, '2026-11-26 15:31:26.896845+00', NULL, 1, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'echo', 0, NULL, NULL, NULL),
	('72acc564-25fb-4a43-9da6-18df04eb6e02', 4, 'idle', 'r2-pending', NULL, '{"n": 1}', NULL, 'pending', NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '2026-11-26 15:31:26.940342+00', NULL, NULL, NULL, NULL, '2026-11-26 15:31:26.940342+00', NULL, 1, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'idle', 0, NULL, NULL, NULL),
	('a7792a3e-8053-4cd7-88d2-cef3fe368d55', 5, 'tester', 'r2-queued', NULL, '{"mode": "complete"}', NULL, 'pending', NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '2026-11-26 15:31:26.967868+00', NULL, NULL, NULL, NULL, '2026-11-26 15:31:26.967868+00', NULL, 1, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'tester', 0, NULL, NULL, NULL);


--
-- Name: agent_inbox_inbox_id_seq; Type: SEQUENCE SET; Schema: state; Owner: -
--

SELECT pg_catalog.setval('state.agent_inbox_inbox_id_seq', 3, true);


--
-- Name: claim_token_seq; Type: SEQUENCE SET; Schema: state; Owner: -
--

SELECT pg_catalog.setval('state.claim_token_seq', 3, true);


--
-- Name: daemons_daemon_no_seq; Type: SEQUENCE SET; Schema: state; Owner: -
--

SELECT pg_catalog.setval('state.daemons_daemon_no_seq', 2, true);


--
-- Name: force_terminations_id_seq; Type: SEQUENCE SET; Schema: state; Owner: -
--

SELECT pg_catalog.setval('state.force_terminations_id_seq', 1, false);


--
-- Name: outbox_seq_seq; Type: SEQUENCE SET; Schema: state; Owner: -
--

SELECT pg_catalog.setval('state.outbox_seq_seq', 9, true);


--
-- Name: turn_history_id_seq; Type: SEQUENCE SET; Schema: state; Owner: -
--

SELECT pg_catalog.setval('state.turn_history_id_seq', 13, true);


--
-- Name: turn_resume_ledger_ledger_id_seq; Type: SEQUENCE SET; Schema: state; Owner: -
--

SELECT pg_catalog.setval('state.turn_resume_ledger_ledger_id_seq', 1, false);


--
-- Name: turns_seq_seq; Type: SEQUENCE SET; Schema: state; Owner: -
--

SELECT pg_catalog.setval('state.turns_seq_seq', 5, true);


--
-- Name: agent_inbox agent_inbox_pkey; Type: CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.agent_inbox
    ADD CONSTRAINT agent_inbox_pkey PRIMARY KEY (inbox_id);


--
-- Name: agents agents_pkey; Type: CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.agents
    ADD CONSTRAINT agents_pkey PRIMARY KEY (agent);


--
-- Name: cards cards_pkey; Type: CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.cards
    ADD CONSTRAINT cards_pkey PRIMARY KEY (card_id);


--
-- Name: daemons daemons_daemon_no_key; Type: CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.daemons
    ADD CONSTRAINT daemons_daemon_no_key UNIQUE (daemon_no);


--
-- Name: daemons daemons_pkey; Type: CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.daemons
    ADD CONSTRAINT daemons_pkey PRIMARY KEY (daemon_id);


--
-- Name: force_terminations force_terminations_pkey; Type: CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.force_terminations
    ADD CONSTRAINT force_terminations_pkey PRIMARY KEY (id);


--
-- Name: outbox_cursor outbox_cursor_pkey; Type: CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.outbox_cursor
    ADD CONSTRAINT outbox_cursor_pkey PRIMARY KEY (one);


--
-- Name: outbox outbox_pkey; Type: CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.outbox
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (event_id);


--
-- Name: policies policies_pkey; Type: CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.policies
    ADD CONSTRAINT policies_pkey PRIMARY KEY (profile);


--
-- Name: profiles profiles_pkey; Type: CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.profiles
    ADD CONSTRAINT profiles_pkey PRIMARY KEY (profile);


--
-- Name: schema_migrations schema_migrations_pkey; Type: CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);


--
-- Name: turn_resume_ledger turn_resume_ledger_pkey; Type: CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.turn_resume_ledger
    ADD CONSTRAINT turn_resume_ledger_pkey PRIMARY KEY (ledger_id);


--
-- Name: turn_resume_ledger turn_resume_ledger_turn_id_step_key; Type: CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.turn_resume_ledger
    ADD CONSTRAINT turn_resume_ledger_turn_id_step_key UNIQUE (turn_id, step);


--
-- Name: turn_waiting_tools turn_waiting_tools_pkey; Type: CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.turn_waiting_tools
    ADD CONSTRAINT turn_waiting_tools_pkey PRIMARY KEY (turn_id, step, tool_call_id);


--
-- Name: turn_warnings turn_warnings_pkey; Type: CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.turn_warnings
    ADD CONSTRAINT turn_warnings_pkey PRIMARY KEY (turn_id, kind, attempt, step, tool_call_id);


--
-- Name: turns turns_pkey; Type: CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.turns
    ADD CONSTRAINT turns_pkey PRIMARY KEY (turn_id);


--
-- Name: agent_inbox_pending_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX agent_inbox_pending_idx ON state.agent_inbox USING btree (target_kind, target, inbox_id) WHERE ((status)::text = 'pending'::text);


--
-- Name: agent_inbox_pending_nochannel_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX agent_inbox_pending_nochannel_idx ON state.agent_inbox USING btree (created_at) WHERE (((status)::text = 'pending'::text) AND (channel_id IS NULL));


--
-- Name: agent_inbox_pending_profile_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX agent_inbox_pending_profile_idx ON state.agent_inbox USING btree (profile, inbox_id) WHERE (((status)::text = 'pending'::text) AND ((target_kind)::text = 'agent'::text));


--
-- Name: agent_inbox_pending_ring_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX agent_inbox_pending_ring_idx ON state.agent_inbox USING btree (COALESCE(rung_at, created_at)) WHERE ((status)::text = 'pending'::text);


--
-- Name: agent_inbox_pending_turn_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX agent_inbox_pending_turn_idx ON state.agent_inbox USING btree (profile, turn_seq) WHERE (((status)::text = 'pending'::text) AND ((target_kind)::text = 'agent'::text) AND (message_type = 'turn'::text));


--
-- Name: agent_inbox_processing_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX agent_inbox_processing_idx ON state.agent_inbox USING btree (processed_at) WHERE ((status)::text = 'processing'::text);


--
-- Name: agent_inbox_turn_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX agent_inbox_turn_idx ON state.agent_inbox USING btree (turn_id);


--
-- Name: agents_profile_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX agents_profile_idx ON state.agents USING btree (profile, agent);


--
-- Name: cards_box_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX cards_box_idx ON state.cards USING btree (output_box_id) WHERE (output_box_id IS NOT NULL);


--
-- Name: cards_one_call_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE UNIQUE INDEX cards_one_call_idx ON state.cards USING btree (turn_id, step, tool_call_id) WHERE ((card_type)::text = 'tool.call'::text);


--
-- Name: cards_one_deliverable_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE UNIQUE INDEX cards_one_deliverable_idx ON state.cards USING btree (turn_id) WHERE ((card_type)::text = 'task.deliverable'::text);


--
-- Name: cards_one_result_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE UNIQUE INDEX cards_one_result_idx ON state.cards USING btree (turn_id, step, tool_call_id) WHERE ((card_type)::text = 'tool.result'::text);


--
-- Name: daemons_live_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX daemons_live_idx ON state.daemons USING btree (daemon_no) WHERE (gone_at IS NULL);


--
-- Name: force_terminations_turn_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX force_terminations_turn_idx ON state.force_terminations USING btree (turn_id);


--
-- Name: outbox_one_task_event_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE UNIQUE INDEX outbox_one_task_event_idx ON state.outbox USING btree (turn_id) WHERE ((kind)::text = 'task'::text);


--
-- Name: outbox_xid_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX outbox_xid_idx ON state.outbox USING btree (xid, seq);


--
-- Name: turn_history_turn_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turn_history_turn_idx ON state.turn_history USING btree (turn_id, id);


--
-- Name: turn_resume_ledger_lease_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turn_resume_ledger_lease_idx ON state.turn_resume_ledger USING btree (lease_expires_at) WHERE ((status)::text = 'processing'::text);


--
-- Name: turn_resume_ledger_pending_profile_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turn_resume_ledger_pending_profile_idx ON state.turn_resume_ledger USING btree (profile, ledger_id) WHERE ((status)::text = 'pending'::text);


--
-- Name: turn_waiting_tools_waiting_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turn_waiting_tools_waiting_idx ON state.turn_waiting_tools USING btree (deadline_at) WHERE ((wait_status)::text = 'waiting'::text);


--
-- Name: turn_waiting_tools_warn_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turn_waiting_tools_warn_idx ON state.turn_waiting_tools USING btree (warn_at) WHERE ((warn_at IS NOT NULL) AND ((wait_status)::text = 'waiting'::text));


--
-- Name: turns_agent_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turns_agent_idx ON state.turns USING btree (agent, seq);


--
-- Name: turns_dead_letter_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turns_dead_letter_idx ON state.turns USING btree (ended_at) WHERE ((status)::text = ANY (ARRAY['failed'::text, 'timeout'::text]));


--
-- Name: turns_deadline_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turns_deadline_idx ON state.turns USING btree (deadline_at) WHERE ((deadline_at IS NOT NULL) AND ((status)::text = ANY (ARRAY['pending'::text, 'dispatched'::text, 'running'::text, 'suspended'::text])));


--
-- Name: turns_deadline_warn_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turns_deadline_warn_idx ON state.turns USING btree (deadline_warn_at) WHERE ((deadline_warn_at IS NOT NULL) AND ((status)::text = ANY (ARRAY['pending'::text, 'dispatched'::text, 'running'::text, 'suspended'::text])));


--
-- Name: turns_dispatched_profile_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turns_dispatched_profile_idx ON state.turns USING btree (profile, updated_at) WHERE ((status)::text = 'dispatched'::text);


--
-- Name: turns_dispatched_profile_ring_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turns_dispatched_profile_ring_idx ON state.turns USING btree (profile, COALESCE(rerung_at, updated_at)) WHERE ((status)::text = 'dispatched'::text);


--
-- Name: turns_idempotency_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE UNIQUE INDEX turns_idempotency_idx ON state.turns USING btree (idempotency_key) WHERE (idempotency_key IS NOT NULL);


--
-- Name: turns_parent_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turns_parent_idx ON state.turns USING btree (parent_turn_id) WHERE (parent_turn_id IS NOT NULL);


--
-- Name: turns_pending_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turns_pending_idx ON state.turns USING btree (agent, seq) WHERE ((status)::text = 'pending'::text);


--
-- Name: turns_queue_deadline_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turns_queue_deadline_idx ON state.turns USING btree (queue_deadline_at) WHERE ((queue_deadline_at IS NOT NULL) AND ((status)::text = ANY (ARRAY['pending'::text, 'dispatched'::text])));


--
-- Name: turns_queue_warn_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turns_queue_warn_idx ON state.turns USING btree (queue_warn_at) WHERE ((queue_warn_at IS NOT NULL) AND ((status)::text = ANY (ARRAY['pending'::text, 'dispatched'::text])));


--
-- Name: turns_replay_of_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turns_replay_of_idx ON state.turns USING btree (replay_of) WHERE (replay_of IS NOT NULL);


--
-- Name: turns_resume_deadline_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turns_resume_deadline_idx ON state.turns USING btree (resume_deadline) WHERE ((status)::text = 'suspended'::text);


--
-- Name: turns_retry_due_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turns_retry_due_idx ON state.turns USING btree (retry_due_at) WHERE ((retry_due_at IS NOT NULL) AND ((status)::text = 'pending'::text));


--
-- Name: turns_running_idx; Type: INDEX; Schema: state; Owner: -
--

CREATE INDEX turns_running_idx ON state.turns USING btree (updated_at) WHERE ((status)::text = 'running'::text);


--
-- Name: turns turns_history_insert; Type: TRIGGER; Schema: state; Owner: -
--

CREATE TRIGGER turns_history_insert AFTER INSERT ON state.turns FOR EACH ROW EXECUTE FUNCTION tw.turns_history();


--
-- Name: turns turns_history_update; Type: TRIGGER; Schema: state; Owner: -
--

CREATE TRIGGER turns_history_update AFTER UPDATE OF status, attempt ON state.turns FOR EACH ROW WHEN ((((old.status)::text IS DISTINCT FROM (new.status)::text) OR (old.attempt IS DISTINCT FROM new.attempt))) EXECUTE FUNCTION tw.turns_history();


--
-- Name: turns turns_queued; Type: TRIGGER; Schema: state; Owner: -
--

CREATE TRIGGER turns_queued BEFORE INSERT ON state.turns FOR EACH ROW EXECUTE FUNCTION tw.turns_queued();


--
-- Name: cards cards_turn_id_fkey; Type: FK CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.cards
    ADD CONSTRAINT cards_turn_id_fkey FOREIGN KEY (turn_id) REFERENCES state.turns(turn_id);


--
-- Name: force_terminations force_terminations_turn_id_fkey; Type: FK CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.force_terminations
    ADD CONSTRAINT force_terminations_turn_id_fkey FOREIGN KEY (turn_id) REFERENCES state.turns(turn_id);


--
-- Name: turn_resume_ledger turn_resume_ledger_turn_id_fkey; Type: FK CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.turn_resume_ledger
    ADD CONSTRAINT turn_resume_ledger_turn_id_fkey FOREIGN KEY (turn_id) REFERENCES state.turns(turn_id);


--
-- Name: turn_waiting_tools turn_waiting_tools_turn_id_fkey; Type: FK CONSTRAINT; Schema: state; Owner: -
--

ALTER TABLE ONLY state.turn_waiting_tools
    ADD CONSTRAINT turn_waiting_tools_turn_id_fkey FOREIGN KEY (turn_id) REFERENCES state.turns(turn_id);


--
-- PostgreSQL database dump complete
--


