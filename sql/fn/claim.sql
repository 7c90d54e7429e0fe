-- Claims: a worker takes inbox items and resume ledger entries; results are consumed on the way.

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
    w        state.turn_waiting_tools;
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
    -- The step's other results waiting to be consumed (those that found the turn busy: their siblings held it)
    -- are consumed with this one: the count below, made after, includes them. One a claim holds is left to it.
    UPDATE state.agent_inbox SET status = 'archived', processed_at = coalesce(processed_at, now()),
           archived_at = now(), outcome = 'applied'
     WHERE inbox_id IN (SELECT x.inbox_id FROM state.agent_inbox x
                         WHERE x.turn_id = t.turn_id AND x.step = t.step AND x.status = 'pending'
                           AND x.target_kind = 'agent' AND x.message_type IN ('tool.result', 'timeout')
                           AND x.turn_epoch = t.turn_epoch AND x.inbox_id <> m.inbox_id
                           FOR UPDATE SKIP LOCKED);
    SELECT count(*), count(*) FILTER (WHERE wait_status <> 'waiting') INTO v_total, v_done
      FROM state.turn_waiting_tools WHERE turn_id = t.turn_id AND step = t.step;
    v_need := CASE t.wait_mode WHEN 'any' THEN 1 WHEN 'n' THEN least(t.wait_count, v_total) ELSE v_total END;
    IF v_done >= v_need THEN
        INSERT INTO state.turn_resume_ledger (turn_id, agent, profile, turn_epoch, step)
        VALUES (t.turn_id, t.agent, t.profile, t.turn_epoch, t.step)
        ON CONFLICT (turn_id, step) DO NOTHING
        RETURNING ledger_id INTO v_ledger;
        IF v_ledger IS NOT NULL AND t.flow_limits IS NOT NULL THEN
            PERFORM tw.flow_turn_resume(t, v_ledger);  -- its limits again first (sql/fn/turn_limits.sql)
        END IF;
        IF v_ledger IS NOT NULL THEN
            FOR w IN
                UPDATE state.turn_waiting_tools
                   SET wait_status = 'cancelled', result_status = 'cancelled', settled_at = now(),
                       error = jsonb_build_object('code', 'cancelled',
                                                  'message', 'the turn resumed before this call settled')
                 WHERE turn_id = t.turn_id AND step = t.step AND wait_status = 'waiting'
                RETURNING *
            LOOP
                IF w.limits IS NOT NULL THEN
                    v_pub := v_pub || tw.flow_release(w.turn_id, w.step, w.tool_call_id);
                END IF;
            END LOOP;
            UPDATE state.agent_inbox SET status = 'archived', processed_at = coalesce(processed_at, now()),
                   archived_at = now(), outcome = 'cancelled'
             WHERE turn_id = t.turn_id AND step = t.step AND message_type = 'tool.call'
               AND status IN ('pending', 'processing');
            UPDATE state.turns SET resume_deadline = NULL, updated_at = now() WHERE turn_id = t.turn_id;
            v_pub := v_pub || tw.cancel_children(t.turn_id, t.step, 'the turn resumed before this call settled')
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
    t.status := 'running';
    t.started_at := coalesce(t.started_at, now());
    t.updated_at := now();
    t := tw.turn_move(t);
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

-- Call w starts for the worker that holds its tool.call message p_inbox under the claim token p_token (the
-- caller holds its turn): its started_at; a limited call's own deadline and warning count from now, not from its
-- wait. Returns the worker's job.
CREATE OR REPLACE FUNCTION tw.tool_call_start(w state.turn_waiting_tools, p_inbox bigint, p_token bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_deadline timestamptz;
BEGIN
    IF w.limits IS NULL THEN
        UPDATE state.turn_waiting_tools SET started_at = coalesce(started_at, now())
         WHERE turn_id = w.turn_id AND step = w.step AND tool_call_id = w.tool_call_id;
    ELSIF w.started_at IS NULL THEN
        v_deadline := now() + make_interval(secs => w.wait_seconds);
        UPDATE state.turn_waiting_tools
           SET started_at = now(), deadline_at = v_deadline, warn_at = now() + make_interval(secs => w.warn_seconds)
         WHERE turn_id = w.turn_id AND step = w.step AND tool_call_id = w.tool_call_id;
        -- The turn's resume_deadline (its calls' earliest, rule 2.2) moves when this call's deadline is now the
        -- earliest, or its old one (its limits' max wait) was: otherwise it stays, and the turn's row is not
        -- written (a fan-out's later starts; this is inside a limit's hand-over, docs/flow-control.md).
        UPDATE state.turns x
           SET resume_deadline = (SELECT min(y.deadline_at) FROM state.turn_waiting_tools y
                                   WHERE y.turn_id = x.turn_id AND y.step = x.step AND y.wait_status = 'waiting')
         WHERE x.turn_id = w.turn_id
           AND (x.resume_deadline IS NULL OR x.resume_deadline > v_deadline OR x.resume_deadline = w.deadline_at);
    END IF;
    RETURN jsonb_build_object(
        'kind', 'tool', 'fence', 'inbox', 'id', p_inbox, 'token', p_token,
        'turn_id', w.turn_id, 'agent', w.agent, 'epoch', w.turn_epoch, 'step', w.step,
        'tool', w.tool, 'tool_call_id', w.tool_call_id, 'timeout_seconds', w.timeout_seconds,
        'doc', jsonb_build_object('tool_call_id', w.tool_call_id, 'tool', w.tool, 'args', w.args,
                                  'turn_id', w.turn_id)::text);
END $$;

-- A granted call's tool.call message (tw.flow_grant_take): from now on a worker of its tool can claim it. With
-- p_worker (the worker whose result gave the slot back, tw.deliver_result) it is written already claimed by that
-- worker and the call starts (tw.tool_call_start), with no search of the inbox and no claim (docs/flow-control.md,
-- "Hand-over"); returns that worker's job. NULL, the message written for a claim, without p_worker, or when the
-- call's turn is busy (another transaction holds it: taken without waiting, as tw.take_tool_calls takes it) or the
-- call no longer waits.
CREATE OR REPLACE FUNCTION tw.flow_call_message(p_turn uuid, p_step integer, p_call text, p_worker text DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    w         state.turn_waiting_tools;
    v_channel text;
    v_take    boolean := false;
    v_inbox   bigint;
    v_token   bigint;
BEGIN
    IF p_worker IS NOT NULL THEN
        SELECT channel_id INTO v_channel FROM state.turns WHERE turn_id = p_turn FOR UPDATE SKIP LOCKED;
        v_take := FOUND;
    END IF;
    IF NOT v_take THEN
        SELECT channel_id INTO v_channel FROM state.turns WHERE turn_id = p_turn;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    SELECT * INTO w FROM state.turn_waiting_tools WHERE turn_id = p_turn AND step = p_step AND tool_call_id = p_call;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_take := v_take AND w.wait_status = 'waiting';
    INSERT INTO state.agent_inbox (target_kind, target, message_type, turn_id, turn_epoch, step, tool_call_id,
                                   channel_id, payload, status, processed_at, claim_token, claimed_by, attempts)
    VALUES ('tool', w.tool, 'tool.call', w.turn_id, w.turn_epoch, w.step, w.tool_call_id, v_channel,
            jsonb_build_object('tool_call_id', w.tool_call_id, 'card_id', w.call_card_id),
            CASE WHEN v_take THEN 'processing' ELSE 'pending' END, CASE WHEN v_take THEN now() END,
            CASE WHEN v_take THEN nextval('state.claim_token_seq') END, CASE WHEN v_take THEN p_worker END,
            CASE WHEN v_take THEN 1 ELSE 0 END)
    RETURNING inbox_id, claim_token INTO v_inbox, v_token;
    IF NOT v_take THEN
        RETURN NULL;
    END IF;
    RETURN tw.tool_call_start(w, v_inbox, v_token);
END $$;

-- Take up to p_max pending tool.call messages of the tools p_tools for p_worker (tw.claim; a call granted by a
-- release is taken in the grant, tw.flow_call_message): each call starts now, its job as the worker runs it. Returns
-- {"jobs":[...],"more":b}; "more" when a call's turn was busy (taken again at the next claim).
CREATE OR REPLACE FUNCTION tw.take_tool_calls(p_worker text, p_tools text[], p_max integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    m       state.agent_inbox;
    w       state.turn_waiting_tools;
    v_token bigint;
    v_jobs  jsonb := '[]'::jsonb;
    v_more  boolean := false;
BEGIN
    FOR m IN
        SELECT * FROM state.agent_inbox
         WHERE status = 'pending' AND target_kind = 'tool' AND target = ANY (p_tools) AND message_type = 'tool.call'
         ORDER BY inbox_id LIMIT p_max FOR UPDATE SKIP LOCKED
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
        v_jobs := v_jobs || jsonb_build_array(tw.tool_call_start(w, m.inbox_id, v_token));
    END LOOP;
    RETURN jsonb_build_object('jobs', v_jobs, 'more', v_more);
END $$;

-- Claim up to p_max pieces of work for a worker serving the profiles p_profiles and the tools p_tools: agent
-- steps from resume ledger entries and `turn` messages, tool runs from `tool.call` messages. Result messages
-- for agents of served profiles are consumed on the way (they need no program). Returns
-- {"jobs":[...],"publish":[...],"more":b,"busy":b}: "more" when it took as many as it could (claim again at once),
-- "busy" when it left an item whose turn or agent another transaction held (the worker claims again a moment
-- later: that transaction is about to end).
CREATE OR REPLACE FUNCTION tw.claim(p_worker text, p_profiles text[], p_tools text[], p_max integer,
                                    p_lease_s integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    m       state.agent_inbox;
    l       state.turn_resume_ledger;
    t       state.turns;
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
        t.status := 'running';
        t.step := l.step + 1;
        t.resume_deadline := NULL;
        t.updated_at := now();
        t := tw.turn_move(t);
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
        v_res := tw.take_tool_calls(p_worker, p_tools, p_max - v_n);
        v_jobs := v_jobs || (v_res -> 'jobs');
        v_n := v_n + jsonb_array_length(v_res -> 'jobs');
        v_more := v_more OR (v_res ->> 'more')::boolean;
        v_tools := jsonb_array_length(v_res -> 'jobs') > 0;
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
    RETURN jsonb_build_object('jobs', v_jobs, 'publish', v_pub, 'more', v_n >= p_max, 'busy', v_more);
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
