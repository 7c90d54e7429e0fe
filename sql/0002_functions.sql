-- migrate: repeatable (re-applied by `turnwatch migrate` whenever this text changes: CREATE OR REPLACE only;
-- a function whose signature or return type changes is dropped explicitly first).
-- turnwatch state machine: every state change that others react to is one of these functions, run as
-- one transaction with a compare-and-set on status and turn_epoch. They return the events they wrote to
-- the outbox and the doorbells to ring as a jsonb array of {"subject","data"[,"event_id"]} that the
-- caller publishes after commit. "Now" is always the database clock.
--
-- Lock order, everywhere: agent row, then turn row, then inbox / ledger / waiting rows. Paths that
-- already hold an inbox or ledger row lock take the agent row with SKIP LOCKED and retry later. Before all of
-- them, and only in a step that delegates: its tree's counter row (state.turn_trees, tw.tree_lock).

CREATE SCHEMA IF NOT EXISTS tw;

-- Events and doorbells ----------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION tw.emit(p_kind text, p_subject text, p_payload jsonb, p_turn uuid, p_epoch bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
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

-- The helpers below that are a single expression are LANGUAGE sql: the planner inlines them into the
-- calling expression, which costs nothing per call (a plpgsql call sets up a frame every time).
DROP FUNCTION IF EXISTS tw.agent_state_event(text, text, uuid, bigint, text);
CREATE OR REPLACE FUNCTION tw.agent_state_event(p_agent text, p_profile text, p_status text, p_turn uuid,
                                                p_epoch bigint, p_error text DEFAULT NULL)
RETURNS jsonb LANGUAGE sql AS $$
    SELECT tw.emit('state', 'evt.agent.' || p_agent || '.state',
                   jsonb_build_object('agent', p_agent, 'profile', p_profile, 'status', p_status, 'turn_id', p_turn,
                                      'turn_epoch', p_epoch, 'error', p_error,
                                      'timeout', CASE WHEN p_error IS NOT NULL THEN
                                          (SELECT timeout_detail FROM state.turns WHERE turn_id = p_turn) END),
                   p_turn, p_epoch)
$$;

CREATE OR REPLACE FUNCTION tw.task_event(t state.turns)
RETURNS jsonb LANGUAGE sql AS $$
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

-- A doorbell: cmd.<kind>.<target>.wakeup. Agent doorbells also name the agent's profile, so that a worker,
-- subscribed to every agent's doorbell, looks at its inbox only for the profiles it serves.
DROP FUNCTION IF EXISTS tw.doorbell(text, text, text);
CREATE OR REPLACE FUNCTION tw.doorbell(p_kind text, p_target text, p_reason text, p_profile text DEFAULT NULL)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_array(jsonb_build_object(
        'subject', 'cmd.' || p_kind || '.' || p_target || '.wakeup',
        'data', jsonb_strip_nulls(jsonb_build_object('target', p_target, 'reason', p_reason,
                                                     'profile', p_profile))))
$$;

-- Submit and dispatch -----------------------------------------------------------------------------

-- Validation of what comes from outside (contract section 8), for the SQL API as for the CLI: the same rules
-- as common/names.c, the errors SQLSTATE 22023.
CREATE OR REPLACE FUNCTION tw.check_name(p_what text, p_value text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_value IS NULL OR p_value !~ '^[A-Za-z0-9_-]{1,64}$' THEN
        RAISE EXCEPTION 'invalid % %: allowed are [A-Za-z0-9_-], 1 to 64 characters', p_what,
            coalesce(quote_literal(left(p_value, 80)), 'NULL') USING ERRCODE = '22023';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION tw.check_ident(p_what text, p_value text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_value IS NOT NULL AND (octet_length(p_value) NOT BETWEEN 1 AND 256 OR p_value ~ '[\x01-\x1f\x7f]') THEN
        RAISE EXCEPTION 'invalid %: 1 to 256 bytes, no control characters', p_what USING ERRCODE = '22023';
    END IF;
END $$;

-- Documents are limited to 1 MiB of compact JSON (contract section 8; the CLI measures what it sends). A jsonb
-- value's text form adds a space after every ':' and ',', so the SQL functions, which see only that form, allow
-- it 64 KiB more.
CREATE OR REPLACE FUNCTION tw.doc_max_text()
RETURNS integer LANGUAGE sql IMMUTABLE AS $$ SELECT 1048576 + 65536 $$;

-- The length in bytes of a jsonb value written as compact JSON, as a user writes it and as the CLI measures
-- it: its text form less the space PostgreSQL puts after every ':' and ',' between tokens (not those inside
-- strings, which the first alternative keeps as they are).
CREATE OR REPLACE FUNCTION tw.json_compact_length(p_doc jsonb)
RETURNS bigint LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT octet_length(regexp_replace(p_doc::text, '("(?:[^"\\]|\\.)*")|([:,]) ', '\1\2', 'g'))::bigint
$$;

-- A turn's own deadline in seconds, exactly as it applies (deadline_at was set in the transaction that created
-- the turn): a delegated child's args.timeout_seconds may have a fraction that the whole-second timeout_seconds
-- column rounds (issue 23: 1.4 s was reported as a "1 second deadline"). NULL without a deadline.
CREATE OR REPLACE FUNCTION tw.turn_deadline_seconds(t state.turns)
RETURNS numeric LANGUAGE sql IMMUTABLE AS $$
    SELECT extract(epoch FROM t.deadline_at - t.created_at)
$$;

-- Seconds for a message: up to milliseconds, no trailing zeros (1.4, 600, 0.25).
CREATE OR REPLACE FUNCTION tw.seconds_text(p_seconds numeric)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT rtrim(rtrim(round(p_seconds, 3)::text, '0'), '.')
$$;

-- Profiles and the roster (contract section 14) -----------------------------------------------------------

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

-- An answer that says a thing exists (a repeated idempotency key's turn, an agent already in the roster, a
-- result already posted) must be as durable as the thing (contract section 17): given only after a commit that
-- the synchronous standby confirmed. Such an answer often comes from a pure read, whose commit writes no WAL
-- and so waits for nothing: on a primary that is about to be demoted and rewound, the thing may exist there
-- only. This writes one small WAL record in the transaction (a transactional logical message, which also
-- takes a transaction id), so that its commit is flushed and waits for the standby like any write; and since
-- the thing committed before this transaction saw it, the standby then has it too. (pg_current_xact_id()
-- alone is not enough: a transaction with an id but no WAL of its own commits without waiting.)
CREATE OR REPLACE FUNCTION tw.durable_answer()
RETURNS void LANGUAGE sql AS $$
    SELECT pg_logical_emit_message(true, 'turnwatch', 'answer')
$$;

-- Add an agent to the roster: true when it was created, false when it exists bound to the same profile.
-- An unknown profile, a bad id or an id bound to another profile is an error (22023).
DROP FUNCTION IF EXISTS tw.add_agent(text, text, jsonb);
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
DROP FUNCTION IF EXISTS tw.retire_agent(text);
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

-- Submit ------------------------------------------------------------------------------------------------------

-- The one submit path (the CLI calls it too). Returns the turn and whether this call created it (false: the
-- idempotency key named an existing turn). An agent that does not exist is added in this transaction when a
-- profile is given (or when its own name is a profile: every profile is an agent of its name). p_known: the
-- profiles of the caller's own config (the CLI's), published here if no daemon has yet; looked at only when
-- the agent is new.
DROP FUNCTION IF EXISTS tw.submit_turn(text, text, text, jsonb, integer, text);
DROP FUNCTION IF EXISTS tw.submit_turn_ex(text, text, jsonb, integer, text, text, text);
CREATE OR REPLACE FUNCTION tw.submit_turn_ex(p_agent text, p_channel text, p_input jsonb, p_timeout_s integer,
                                             p_idem text, p_box text, p_profile text,
                                             p_known text[] DEFAULT NULL)
RETURNS TABLE (turn_id uuid, created boolean) LANGUAGE plpgsql AS $$
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
            PERFORM tw.durable_answer();
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
        PERFORM tw.durable_answer();
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

-- The SQL API (contract sections 12 and 14): callable in the caller's own transaction; the turn exists only if
-- that transaction commits, and the PMO hears of it through NOTIFY tw_turn at commit.
DROP FUNCTION IF EXISTS tw.submit_turn(text, text, jsonb, integer, text, text);
DROP FUNCTION IF EXISTS tw.submit_turn(text, text, jsonb, integer, text, text, text);
CREATE OR REPLACE FUNCTION tw.submit_turn(agent text, channel text, input jsonb, timeout_seconds integer DEFAULT NULL,
                                          idempotency_key text DEFAULT NULL, box text DEFAULT NULL,
                                          profile text DEFAULT NULL)
RETURNS uuid LANGUAGE sql AS $$
    SELECT turn_id FROM tw.submit_turn_ex($1, $2, $3, $4, $5, $6, $7)
$$;

-- dispatch_next: if the agent is idle, hand its oldest pending turn to it (new epoch, a `turn` inbox
-- message, a doorbell). One active turn per agent, FIFO per agent.
-- dispatch: if the agent is idle, hand it its oldest pending turn under a new epoch. Without p_worker the
-- turn is announced (a pending `turn` message and a doorbell) for whichever worker claims it; with p_worker
-- (the worker whose slot the agent's last turn just freed) it is taken at once: the agent and turn go
-- straight to running and the message is inserted already claimed, with the same state events. Returns
-- {"publish":[...],"job"?}.
--
-- With p_ended, the caller (apply_step) holds the agent row and the agent's turn p_ended has just ended: the
-- agent goes idle here, or straight on to its next turn, in one row update instead of two (the caller emits
-- the idle state event either way).
DROP FUNCTION IF EXISTS tw.dispatch(text, text);
CREATE OR REPLACE FUNCTION tw.dispatch(p_agent text, p_worker text, p_ended uuid DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
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

-- dispatch_next (seed 002): announce the agent's next turn, if it is idle and has one.
CREATE OR REPLACE FUNCTION tw.dispatch_next(p_agent text)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN tw.dispatch(p_agent, NULL) -> 'publish';
END $$;

-- The PMO's scan: dispatch for every idle agent that has pending turns. The agents with pending turns are
-- found by skipping through turns_pending_idx one agent at a time (a loose index scan), so the scan costs one
-- index probe per such agent, however many agents are registered and however many turns wait.
CREATE OR REPLACE FUNCTION tw.dispatch_pending(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
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

-- The step document (contract section 5) --------------------------------------------------------

CREATE OR REPLACE FUNCTION tw.tool_results(p_turn uuid, p_step integer)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
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

CREATE OR REPLACE FUNCTION tw.step_document(t state.turns, p_step integer)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'turn_id', t.turn_id, 'agent', t.agent, 'profile', t.profile, 'channel_id', t.channel_id,
        'epoch', t.turn_epoch, 'depth', t.depth,
        'step', p_step - t.step_base, 'attempt', t.attempt, 'input', t.input,  -- steps count from 0 per attempt
        'state', CASE WHEN p_step = t.step_base THEN NULL ELSE t.agent_state END,
        'tool_results', CASE WHEN p_step = t.step_base THEN '[]'::jsonb
                             ELSE tw.tool_results(t.turn_id, p_step - 1) END)
$$;

-- The job a worker runs for an agent step: its fence (inbox claim or ledger lease) and the step document.
-- Documents travel as their text (as do tool calls' in tw.claim): the worker hands them to the program as
-- they are, so an input's 0.1 or 2^70 reaches the agent as written, and parsing never fails the claim.
CREATE OR REPLACE FUNCTION tw.step_job(p_fence text, p_id bigint, p_token bigint, t state.turns)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('kind', 'step', 'fence', p_fence, 'id', p_id, 'token', p_token,
                              'turn_id', t.turn_id, 'agent', t.agent, 'profile', t.profile,
                              'epoch', t.turn_epoch, 'step', t.step,
                              'doc', tw.step_document(t, t.step)::text)
$$;

-- Inbox rows ----------------------------------------------------------------------------------------

-- Archive an inbox row, saying why (applied, stale, cancelled, ...).
CREATE OR REPLACE FUNCTION tw.inbox_archive(p_id bigint, p_outcome text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
        UPDATE state.agent_inbox
           SET status = 'archived', processed_at = coalesce(processed_at, now()), archived_at = now(), outcome = p_outcome
         WHERE inbox_id = p_id;
END
$$;

-- Take an inbox row for a worker under a fresh claim token; returns the token.
CREATE OR REPLACE FUNCTION tw.inbox_take(p_id bigint, p_worker text)
RETURNS bigint LANGUAGE plpgsql AS $$
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

-- Consuming results -------------------------------------------------------------------------------

-- A tool.result or timeout message for an agent: when the turn's wait condition now holds, write the
-- resume ledger entry (once per suspended step) and cancel the calls still waiting.
CREATE OR REPLACE FUNCTION tw.consume_result(m state.agent_inbox)
RETURNS jsonb LANGUAGE plpgsql AS $$
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

-- Take a `turn` message for p_worker: the turn becomes running, the message processing under a fresh claim
-- token. The caller holds the message row and the agent row. Returns {"job"?, "publish"}; a message that no
-- longer matches its turn (stale epoch, ended turn) is archived with no effect.
CREATE OR REPLACE FUNCTION tw.take_turn_message(m state.agent_inbox, a state.agents, p_worker text)
RETURNS jsonb LANGUAGE plpgsql AS $$
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

-- Take up to p_max waiting `turn` messages of the profiles p_profiles for p_worker, in submit order (the turns'
-- seq), whichever agents they are for. A message whose agent row is busy is left for the next claim ("more"). Returns
-- {"jobs","publish","more"}.
DROP FUNCTION IF EXISTS tw.claim_turns(text, text[], integer);
CREATE OR REPLACE FUNCTION tw.claim_turns(p_worker text, p_profiles text[], p_max integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
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

-- Claim -------------------------------------------------------------------------------------------

-- Claim up to p_max pieces of work for a worker serving the profiles p_profiles and the tools p_tools: agent
-- steps from resume ledger entries and `turn` messages, tool runs from `tool.call` messages. Result messages
-- for agents of served profiles are consumed on the way (they need no program). Returns
-- {"jobs":[...],"publish":[...],"more":b}.
DROP FUNCTION IF EXISTS tw.claim(text, text[], text[], integer, integer);
CREATE OR REPLACE FUNCTION tw.claim(p_worker text, p_profiles text[], p_tools text[], p_max integer,
                                    p_lease_s integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
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
END $$;

-- Give claimed work back (graceful shutdown): another worker can take it at once.
CREATE OR REPLACE FUNCTION tw.release(p_fence text, p_id bigint, p_token bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
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

-- Ending turns ------------------------------------------------------------------------------------

-- finish_turn_idle (seed 002): the agent goes idle, its active turn and channel are cleared, and with
-- p_bump the epoch moves so that anything stamped with the old one has no effect. agent_idle is the row
-- update alone; it returns the agent's epoch, or NULL when p_turn is not its active turn.
CREATE OR REPLACE FUNCTION tw.agent_idle(p_agent text, p_turn uuid, p_bump boolean)
RETURNS bigint LANGUAGE plpgsql AS $$
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

DROP FUNCTION IF EXISTS tw.finish_turn_idle(text, uuid, boolean, text);
CREATE OR REPLACE FUNCTION tw.finish_turn_idle(p_agent text, p_profile text, p_turn uuid, p_bump boolean,
                                               p_error text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint := tw.agent_idle(p_agent, p_turn, p_bump);
BEGIN
    IF v_epoch IS NULL THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN tw.agent_state_event(p_agent, p_profile, 'idle', p_turn, v_epoch, p_error);
END $$;

-- Close everything a turn still holds: waiting calls, inbox messages, ledger entries.
CREATE OR REPLACE FUNCTION tw.close_turn_work(p_turn uuid, p_outcome text)
RETURNS void LANGUAGE plpgsql AS $$
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

-- Delegation (contract section 14) ----------------------------------------------------------------------------
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
-- setting tw.cancel_batch overrides it (tests); tw.cancel_left counts down what this transaction may still do.
CREATE OR REPLACE FUNCTION tw.cancel_batch()
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('tw.cancel_batch', true), '')::integer, 500)
$$;

CREATE OR REPLACE FUNCTION tw.cancel_left()
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('tw.cancel_left', true), '')::integer, tw.cancel_batch())
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
DROP FUNCTION IF EXISTS tw.delegate(state.turns, jsonb, timestamptz, integer);
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
                                  parent_turn_id, parent_step, parent_tool_call_id, root_turn_id)
    VALUES (v_agent, v_profile, t.channel_id, coalesce(v_args -> 'input', '{}'::jsonb),
            CASE WHEN v_own < p_deadline THEN (v_args ->> 'timeout_seconds')::numeric::integer END,
            CASE WHEN v_own < p_deadline THEN v_own END, t.depth + 1, t.turn_id, t.step, p_call ->> 'id', v_root)
    RETURNING c.turn_id INTO v_id;
    UPDATE state.turn_waiting_tools SET child_turn_id = v_id, started_at = now()
     WHERE turn_id = t.turn_id AND step = t.step AND tool_call_id = p_call ->> 'id';
    -- Announced at once (no NOTIFY round trip through the PMO) when the agent is idle.
    RETURN tw.dispatch_next(v_agent);
END $$;

-- The output contract of a forced end (2.5, 2.6, turn deadline, cancel), in the caller's transaction:
-- finish_turn_idle (+epoch), record_force_termination, a fallback task.deliverable, the state event,
-- the final task event with deliverable_card_id, then dispatch_next. The caller holds the parent's turn row
-- (if any), then the agent row lock (when the turn is active), and has checked status and epoch. A child's end
-- becomes its call's result in the parent; the turn's own children are cancelled.
CREATE OR REPLACE FUNCTION tw.force_finish(p_turn uuid, p_reason text, p_final text, p_message text)
RETURNS jsonb LANGUAGE plpgsql AS $$
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

-- Apply the outcome of an agent step. p_fence is the claim job ({"fence","id","token","turn_id",
-- "epoch","step"}); p_reply is the validated reply: {"complete":{"output"}} | {"fail":{"error","message"}}
-- | {"tool_calls":[{"id","tool","args","timeout_seconds","wait_seconds","external"}],"wait":"all"|"any"|n,
-- "state"}. Returns json {"applied":bool,"publish":[...],"next"?}; a lost fence applies nothing. When the turn
-- ends and p_worker is given, the agent's next turn (if dispatch_next found one) is taken for p_worker in
-- the same transaction and returned as "next": the worker whose slot just freed runs it without another
-- claim round trip. While other turns wait for a slot, the slot goes to the oldest of them among p_profiles
-- (the worker's profiles) instead, so that slots are shared fairly. A call with "agent_profile" delegates
-- (tw.delegate); p_reply's "max_delegation_depth" and "max_tree_turns" bound the tree.
DROP FUNCTION IF EXISTS tw.apply_step(jsonb, jsonb, text, text[]);
CREATE OR REPLACE FUNCTION tw.apply_step(p_fence jsonb, p_reply jsonb, p_worker text DEFAULT NULL,
                                         p_profiles text[] DEFAULT NULL)
RETURNS json LANGUAGE plpgsql AS $$
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
    v_tree   integer;
BEGIN
    -- A step that delegates counts its children against its tree's bound: the tree's counter first.
    IF p_reply ? 'max_tree_turns' AND EXISTS (SELECT 1 FROM jsonb_array_elements(p_reply -> 'tool_calls') c
                                               WHERE c ? 'agent_profile') THEN
        PERFORM tw.tree_lock(v_turn);
        v_tree := (p_reply ->> 'max_tree_turns')::integer;
    END IF;
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
                                              coalesce((p_reply ->> 'max_delegation_depth')::integer, 8), v_tree);
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

-- Tool results ------------------------------------------------------------------------------------

-- Deliver a result (from a tool program, the CLI, or a 2.2 timeout report) for the newest call with
-- that id in the turn. p_fence is the tool job's claim ({"id","token"}) or NULL. Returns
-- {"result": accepted|unknown_turn|unknown_call|ended|duplicate|stale|lost, "card_id", "publish"}.
CREATE OR REPLACE FUNCTION tw.deliver_result(p_turn uuid, p_call text, p_status text, p_output jsonb,
                                             p_error jsonb, p_fence jsonb, p_message_type text)
RETURNS jsonb LANGUAGE plpgsql AS $$
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

-- Heartbeat ---------------------------------------------------------------------------------------

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

-- Cancel (and the turn deadline rule in 0005_watchdogs.sql) -----------------------------------------

-- End one turn by force with the output contract, taking the agent lock first (lock order). Returns
-- NULL when the turn had already ended, or the agent row is busy (p_wait false: try again next tick).
CREATE OR REPLACE FUNCTION tw.end_turn(p_turn uuid, p_reason text, p_final text, p_message text, p_wait boolean)
RETURNS jsonb LANGUAGE plpgsql AS $$
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

-- The CLI's cancel: the result and what to publish ({"result","status"?,"publish"}).
DROP FUNCTION IF EXISTS tw.cancel_turn(uuid);
CREATE OR REPLACE FUNCTION tw.cancel_turn_ex(p_turn uuid)
RETURNS jsonb LANGUAGE plpgsql AS $$
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

-- The SQL API (contract section 12) ---------------------------------------------------------------------
--
-- Callable by any client in its own transaction; what they change exists only if that transaction commits.
-- Such a client publishes nothing itself: at commit, NOTIFY tw_outbox has a PMO relay the events they wrote
-- at once, and NOTIFY tw_ring hands it the doorbells to ring (contract: doorbells are hints; the watchdogs
-- ring again anyway). Neither needs NATS on the client's side.
CREATE OR REPLACE FUNCTION tw.api_publish(p_publish jsonb)
RETURNS void LANGUAGE plpgsql AS $$
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

CREATE OR REPLACE FUNCTION tw.cancel_turn(turn uuid)
RETURNS text LANGUAGE plpgsql AS $$
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

-- A result posted from outside (`turnwatch tool-result`, tw.post_tool_result): deliver_result for the calls of
-- external tools only. A call whose tool runs a program gets its result from the worker, a delegating call
-- from its child turn: a result posted for either, where deliver_result would have taken it, is refused
-- (not_external, with the tool and the child turn) and changes nothing (issue 23: it replaced a running tool's
-- result). A call that no longer waits keeps its answer (ended, duplicate, timed_out, cancelled, stale). The
-- turn's row first, as deliver_result takes it, so the call read is the one it would settle.
CREATE OR REPLACE FUNCTION tw.deliver_posted_result(p_turn uuid, p_call text, p_status text, p_output jsonb,
                                                    p_error jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    t state.turns;
    w state.turn_waiting_tools;
BEGIN
    SELECT * INTO t FROM state.turns WHERE turn_id = p_turn FOR UPDATE;
    SELECT * INTO w FROM state.turn_waiting_tools
     WHERE turn_id = p_turn AND tool_call_id = p_call ORDER BY step DESC LIMIT 1;
    IF FOUND AND (NOT w.external OR w.child_turn_id IS NOT NULL) AND w.wait_status = 'waiting'
       AND w.turn_epoch = t.turn_epoch AND t.status IN ('pending', 'dispatched', 'running', 'suspended') THEN
        RETURN jsonb_strip_nulls(jsonb_build_object('result', 'not_external', 'tool', w.tool,
                                                    'child_turn_id', w.child_turn_id, 'publish', '[]'::jsonb));
    END IF;
    RETURN tw.deliver_result(p_turn, p_call, p_status, p_output, p_error, NULL, 'tool.result');
END $$;

-- A result for an external tool call, exactly as `turnwatch tool-result` posts it: status ok with output as
-- the tool's output, or error with output {"code","message"} (a string is the message). Returns accepted,
-- or why not: unknown_turn, unknown_call, not_external, ended, duplicate, timed_out, cancelled, stale.
DROP FUNCTION IF EXISTS tw.post_tool_result(uuid, text, text, jsonb);
CREATE OR REPLACE FUNCTION tw.post_tool_result(turn uuid, call text, status text, output jsonb)
RETURNS text LANGUAGE plpgsql AS $$
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
        v_res := tw.deliver_posted_result(turn, call, 'error', NULL, v_err);
    ELSE
        v_res := tw.deliver_posted_result(turn, call, 'ok', output, NULL);
    END IF;
    -- accepted or duplicate: deliver_result locks the turn FOR UPDATE (a WAL record) today; said here so that a
    -- rewrite that answers from a read alone keeps the answer durable.
    PERFORM tw.durable_answer();
    PERFORM tw.api_publish(coalesce(v_res -> 'publish', '[]'::jsonb));
    RETURN v_res ->> 'result';
END $$;

-- Outbox relay ------------------------------------------------------------------------------------

-- Claims events that nobody published: their writer died or lost NATS before it could, or is a SQL API client,
-- which leaves them to the relay (NOTIFY tw_outbox). A relay claims again at once while the answer says "more",
-- publishing and marking the batches it has while it claims the next, so that a backlog drains at the speed of
-- the database and NATS (issue 23). Only events older than p_min_age_ms are taken (their writer is given that
-- long to publish them itself), and they are leased for p_lease_s, so that several relays rarely publish the same
-- one twice. A batch of up to p_limit events takes, in this order:
--  * with p_newest > 0, what is unpublished among the p_newest newest events, newest first, up to half the batch:
--    the events a SQL API client has just committed, or whose writer's publish has just failed, never wait
--    behind an older flood;
--  * the rest in (xid, seq) order, from the cursor or from where this relay's previous claim stopped
--    (p_after_xid, p_after_seq), looking at no more than 4 * p_limit events.
-- First the cursor (state.outbox_cursor: every event below it is published) moves up over at most 4 * p_limit
-- published events, to the oldest one still unpublished, but never past the oldest transaction still running:
-- that transaction's events, once committed, will be at or above it. Each call thus looks at a bounded number
-- of rows however large the backlog, and no index needs published_at (its marks stay HOT updates).
-- Returns {"events": [{"event_id","subject","text"}...], "xid", "seq": where the next claim goes on (null: at the
-- cursor), "more": there may be more to claim at once, "newest": the newest events had more than their share}.
CREATE OR REPLACE FUNCTION tw.outbox_claim(p_min_age_ms integer, p_lease_s integer, p_limit integer,
                                           p_newest integer, p_after_xid xid8, p_after_seq bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_horizon  xid8 := pg_snapshot_xmin(pg_current_snapshot());
    v_window   integer := 4 * p_limit;
    v_before   timestamptz := now() - make_interval(secs => p_min_age_ms / 1000.0);
    v_lease    timestamptz := now() + make_interval(secs => p_lease_s);
    v_cur_xid  xid8;
    v_cur_seq  bigint;
    v_xid      xid8;
    v_seq      bigint;
    v_row      record;
    v_row_xid  xid8;
    v_row_seq  bigint;
    v_seen     integer := 0;
    v_open     boolean := false;
    v_more     boolean;
    v_newest   jsonb := '[]';
    v_n_newest integer := 0;
    v_want     integer;
    v_rows     tid[];
    v_n_picked integer := 0;
    v_old      jsonb := '[]';
BEGIN
    -- Not worth a WAL flush of its own (as the marks): lost in a crash of PostgreSQL, a lease or a cursor move
    -- only makes a relay claim those events again, under the same event ids.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT xid, seq INTO v_cur_xid, v_cur_seq FROM state.outbox_cursor;
    v_xid := v_cur_xid;
    v_seq := v_cur_seq;
    FOR v_row IN SELECT xid, seq, published_at IS NULL AS open FROM state.outbox
                  WHERE (xid, seq) >= (v_cur_xid, v_cur_seq) ORDER BY xid, seq LIMIT v_window LOOP
        v_seen := v_seen + 1;
        v_open := v_row.open;
        v_xid := v_row.xid;
        v_seq := v_row.seq + CASE WHEN v_open THEN 0 ELSE 1 END;
        EXIT WHEN v_open;
    END LOOP;
    IF NOT v_open AND v_seen < v_window THEN
        -- All there is, is published.
        v_xid := v_horizon;
        v_seq := 0;
    END IF;
    -- Every transaction below v_horizon has ended, so nothing can still appear below the new cursor.
    IF (v_xid, v_seq) > (v_horizon, 0::bigint) THEN
        v_xid := v_horizon;
        v_seq := 0;
    END IF;
    v_more := NOT v_open AND v_seen = v_window AND (v_xid, v_seq) < (v_horizon, 0::bigint);
    IF (v_xid, v_seq) > (v_cur_xid, v_cur_seq) THEN
        UPDATE state.outbox_cursor SET xid = v_xid, seq = v_seq WHERE (xid, seq) < (v_xid, v_seq);
        v_cur_xid := v_xid;
        v_cur_seq := v_seq;
    END IF;

    -- The newest events first. A data-modifying WITH must be the top-level statement, hence SELECT ... INTO.
    IF p_newest > 0 AND p_limit > 1 THEN
        SELECT xid, seq INTO v_xid, v_seq FROM state.outbox ORDER BY xid DESC, seq DESC OFFSET p_newest - 1 LIMIT 1;
        IF NOT FOUND OR (v_xid, v_seq) < (v_cur_xid, v_cur_seq) THEN
            v_xid := v_cur_xid;
            v_seq := v_cur_seq;
        END IF;
        WITH c AS (
            UPDATE state.outbox o SET relay_lease_until = v_lease
             WHERE event_id IN (SELECT event_id FROM state.outbox
                                 WHERE (xid, seq) >= (v_xid, v_seq) AND published_at IS NULL AND created_at < v_before
                                   AND (relay_lease_until IS NULL OR relay_lease_until < now())
                                 ORDER BY xid DESC, seq DESC LIMIT p_limit / 2 FOR UPDATE SKIP LOCKED)
            RETURNING o.xid, o.seq, o.event_id, o.subject, o.payload)
        SELECT coalesce(jsonb_agg(jsonb_build_object('event_id', event_id, 'subject', subject, 'text', payload::text)
                                  ORDER BY xid DESC, seq DESC), '[]'::jsonb), count(*)
          INTO v_newest, v_n_newest
          FROM c;
    END IF;

    -- Then the oldest, from where the previous claim stopped if that is above the cursor.
    IF p_after_xid IS NOT NULL AND (p_after_xid, p_after_seq + 1) > (v_cur_xid, v_cur_seq) THEN
        v_xid := p_after_xid;
        v_seq := p_after_seq + 1;
    ELSE
        v_xid := v_cur_xid;
        v_seq := v_cur_seq;
    END IF;
    v_want := p_limit - v_n_newest;
    -- The next events in that order, at most v_window of them looked at; what another relay holds is skipped.
    SELECT array_agg(ctid), count(*), (array_agg(xid ORDER BY xid DESC, seq DESC))[1],
           (array_agg(seq ORDER BY xid DESC, seq DESC))[1]
      INTO v_rows, v_n_picked, v_row_xid, v_row_seq
      FROM (SELECT ctid, xid, seq
              FROM (SELECT ctid, xid, seq, published_at, created_at, relay_lease_until FROM state.outbox
                     WHERE (xid, seq) >= (v_xid, v_seq) ORDER BY xid, seq LIMIT v_window) w
             WHERE published_at IS NULL AND created_at < v_before
               AND (relay_lease_until IS NULL OR relay_lease_until < now())
             ORDER BY xid, seq LIMIT v_want) e;
    IF v_n_picked > 0 THEN
        -- By ctid, a third of the cost of finding them again by event_id. A row changed since (published, or
        -- leased by another relay) is not found at its old place, and is rightly left alone; whatever row is
        -- locked there is checked again, so only an unpublished, unleased event is ever claimed.
        WITH c AS (
            UPDATE state.outbox o SET relay_lease_until = v_lease
             WHERE ctid IN (SELECT ctid FROM state.outbox
                             WHERE ctid = ANY (v_rows) AND published_at IS NULL AND created_at < v_before
                               AND (relay_lease_until IS NULL OR relay_lease_until < now())
                               FOR UPDATE SKIP LOCKED)
            RETURNING o.xid, o.seq, o.event_id, o.subject, o.payload)
        SELECT coalesce(jsonb_agg(jsonb_build_object('event_id', event_id, 'subject', subject, 'text', payload::text)
                                  ORDER BY xid, seq), '[]'::jsonb)
          INTO v_old
          FROM c;
    END IF;
    -- Where the next claim of this drain goes on: after the last event taken when the batch is full, else after
    -- the window when it was full; otherwise this drain is over and the next one starts at the cursor.
    IF v_n_picked < v_want THEN
        SELECT xid, seq INTO v_row_xid, v_row_seq FROM state.outbox
         WHERE (xid, seq) >= (v_xid, v_seq) ORDER BY xid, seq OFFSET v_window - 1 LIMIT 1;
    END IF;
    RETURN jsonb_build_object('events', v_newest || v_old, 'xid', v_row_xid::text, 'seq', v_row_seq,
                              'more', v_more OR v_row_xid IS NOT NULL,
                              'newest', v_n_newest > 0 AND v_n_newest = p_limit / 2);
END
$$;

-- The claim of releases up to 2 (oldest first, from the cursor), for a PMO of that release during an upgrade.
CREATE OR REPLACE FUNCTION tw.outbox_claim(p_min_age_ms integer, p_lease_s integer, p_limit integer)
RETURNS jsonb LANGUAGE sql AS $$
    SELECT tw.outbox_claim(p_min_age_ms, p_lease_s, p_limit, 0, NULL, NULL) -> 'events'
$$;

CREATE OR REPLACE FUNCTION tw.outbox_mark_published(p_ids uuid[])
RETURNS integer LANGUAGE plpgsql AS $$
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
