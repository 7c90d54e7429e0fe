-- Applying a step's outcome, and the agent going idle or on to its next turn.

-- finish_turn_idle: the agent goes idle, its active turn and channel are cleared, and with
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

-- Close everything the turns p_turns still hold: waiting calls, inbox messages, ledger entries.
-- Limited calls give their limits back; the grants that follow are rung by NOTIFY tw_ring (tw.api_publish).
CREATE OR REPLACE FUNCTION tw.close_turn_work(p_turns uuid[], p_outcome text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_lim boolean;
BEGIN
    WITH u AS (
        UPDATE state.turn_waiting_tools
           SET wait_status = 'cancelled', result_status = 'cancelled', settled_at = now(),
               error = jsonb_build_object('code', 'cancelled', 'message', 'the turn ended: ' || p_outcome)
         WHERE turn_id = ANY (p_turns) AND wait_status = 'waiting'
        RETURNING limits
    )
    SELECT bool_or(limits IS NOT NULL) INTO v_lim FROM u;
    IF v_lim THEN
        PERFORM tw.api_publish(tw.flow_release_turns(p_turns));
    END IF;
    UPDATE state.agent_inbox
       SET status = 'archived', processed_at = coalesce(processed_at, now()), archived_at = now(), outcome = p_outcome
     WHERE turn_id = ANY (p_turns) AND status IN ('pending', 'processing');
    UPDATE state.turn_resume_ledger SET status = 'done', outcome = p_outcome, updated_at = now()
     WHERE turn_id = ANY (p_turns) AND status IN ('pending', 'processing');
END
$$;

-- Turn t as its completion makes it (tw.complete_set): done, its deliverable the card p_card. A function of its
-- own, as tw.turn_dispatching.
CREATE OR REPLACE FUNCTION tw.turn_done(t state.turns, p_card uuid)
RETURNS state.turns LANGUAGE plpgsql STABLE AS $$
BEGIN
    t.status := 'done';
    t.deliverable_card_id := p_card;
    t.ended_at := now();
    t.updated_at := now();
    RETURN t;
END $$;

-- Running turns that completed, all at once (p_turns and p_outputs are parallel arrays; the caller holds each
-- turn's row and its agent's and has checked the fence): each turn's task.deliverable card, the turn done, its
-- runtime rows gone, its agent's idle event and its final task event. The agents themselves are the caller's to
-- move (idle, or on to their next turns: tw.next_turns for many, tw.dispatch for one). Returns what to publish,
-- the agents and their ended turns (in agent order), as arrays: unpacked from a JSON answer, they took two
-- statements more a completion.
CREATE OR REPLACE FUNCTION tw.complete_set(p_turns uuid[], p_outputs jsonb[], OUT o_publish jsonb,
                                           OUT o_agents text[], OUT o_ended uuid[])
RETURNS record LANGUAGE plpgsql AS $$
BEGIN
    WITH c AS (
        INSERT INTO state.cards (card_type, turn_id, agent, turn_epoch, step, output_box_id, content)
        SELECT 'task.deliverable', t.turn_id, t.agent, t.turn_epoch, t.step, t.output_box_id, tw.card_done(p.output)
          FROM unnest(p_turns, p_outputs) p (turn_id, output) JOIN state.turns t ON t.turn_id = p.turn_id
        RETURNING card_id, turn_id
    ), d AS (
        SELECT * FROM tw.turns_move(ARRAY(
            SELECT tw.turn_done(t, c.card_id) FROM c JOIN state.turns t ON t.turn_id = c.turn_id))
    ), evs AS MATERIALIZED (
        -- Materialized, each row's id drawn once: a lateral subquery drawing it could be cached (Memoize)
        -- and give rows the same id.
        SELECT gen_random_uuid() AS id, v.kind, tw.ev_subject(d.agent, v.kind) AS subject, v.body, d.turn_id,
               d.turn_epoch
          FROM d
         CROSS JOIN LATERAL (VALUES
               (1, 'state', tw.ev_state(d.agent, d.profile, 'idle', d.turn_id, d.turn_epoch, NULL, NULL)),
               (2, 'task', tw.ev_task(ROW(d.*)::state.turns))
               ) v (n, kind, body)
    ), ev AS (
        INSERT INTO state.outbox (event_id, kind, subject, payload, turn_id, turn_epoch)
        SELECT id, kind, subject, tw.ev_payload(body, id), turn_id, turn_epoch
          FROM evs
        RETURNING event_id, subject, payload, turn_id, kind
    )
    SELECT coalesce(jsonb_agg(tw.ev_publish(ev.event_id, ev.subject, ev.payload)
                              ORDER BY ev.turn_id, ev.kind), '[]'::jsonb),
           coalesce((SELECT array_agg(d.agent ORDER BY d.agent) FROM d), '{}'),
           coalesce((SELECT array_agg(d.turn_id ORDER BY d.agent) FROM d), '{}')
      INTO o_publish, o_agents, o_ended
      FROM ev;
END $$;

-- Apply the outcome of an agent step, alone: tw.apply_steps with one item (one definition of a step's apply),
-- its answer as one item's: {"applied":bool,"publish":[...],"next"?}. An item that tw.apply_steps would refuse
-- as invalid goes to tw.apply_one, which raises what it raises for it.
CREATE OR REPLACE FUNCTION tw.apply_step(p_fence jsonb, p_reply jsonb, p_worker text DEFAULT NULL,
                                         p_profiles text[] DEFAULT NULL)
RETURNS json LANGUAGE plpgsql AS $$
DECLARE
    v_item jsonb := jsonb_build_object('fence', p_fence, 'reply', p_reply);
    v_res  jsonb;
BEGIN
    IF NOT tw.apply_item_valid(v_item) THEN
        RETURN tw.apply_one(p_fence, p_reply, p_worker, p_profiles);
    END IF;
    v_res := tw.apply_steps(jsonb_build_array(v_item), p_worker, p_profiles)::jsonb;
    RETURN json_build_object('applied', coalesce((v_res -> 'results' -> 0 ->> 'applied')::boolean, false),
                             'publish', v_res -> 'publish', 'next', v_res -> 'next' -> 0);
END $$;

-- One step's outcome, for tw.apply_steps (the items it does not apply set-based). p_fence is the claim job
-- ({"fence","id","token","turn_id","epoch","step"}); p_reply is the validated reply: {"complete":{"output"}}
-- | {"fail":{"error","message"}} | {"tool_calls":[{"id","tool","args","timeout_seconds","wait_seconds",
-- "external"}],"wait":"all"|"any"|n,"state"}. Returns json {"applied":bool,"publish":[...],"next"?}; a lost
-- fence applies nothing. When the turn ends and p_worker is given, the agent's next turn (if tw.dispatch found
-- one) is taken for p_worker in the same transaction and returned as "next": the worker whose slot just freed
-- runs it without another claim round trip. While other turns wait for a slot, the slot goes to the oldest of them among p_profiles
-- (the worker's profiles) instead, so that slots are shared fairly. A call with "agent_profile" delegates
-- (tw.delegate); p_reply's "max_delegation_depth" and "max_tree_turns" bound the tree.
CREATE OR REPLACE FUNCTION tw.apply_one(p_fence jsonb, p_reply jsonb, p_worker text DEFAULT NULL,
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
    v_lims   text[];
    v_limited text[] := '{}';
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
        v_pub := (tw.complete_set(ARRAY[v_turn], ARRAY[p_reply -> 'complete' -> 'output'])).o_publish;
        SELECT * INTO t FROM state.turns WHERE turn_id = v_turn;
    ELSIF p_reply ? 'fail' THEN
        -- Failed, or back to pending for another attempt (tw.step_failed, sql/fn/policy.sql).
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
            IF v_call ? 'limits' AND NOT v_deleg AND NOT coalesce((v_call ->> 'external')::boolean, false) THEN
                -- Its tool has limits (docs/flow-control.md): it waits for them (tw.flow_ask below); its own
                -- deadline and warning start when it starts (tw.claim), until then only its limits' max wait.
                v_lims := ARRAY(SELECT jsonb_array_elements_text(v_call -> 'limits'));
                INSERT INTO state.turn_waiting_tools (turn_id, step, tool_call_id, call_index, agent, tool, args,
                                                      timeout_seconds, external, turn_epoch, deadline_at, call_card_id,
                                                      timeout_source, limits, wait_seconds, warn_seconds, rl_max)
                VALUES (t.turn_id, t.step, v_call ->> 'id', v_i, t.agent, v_call ->> 'tool', v_call -> 'args',
                        (v_call ->> 'timeout_seconds')::integer, false, t.turn_epoch, tw.flow_wait_deadline(v_lims),
                        v_card, v_call ->> 'timeout_source', v_lims, (v_call ->> 'wait_seconds')::integer,
                        (v_call ->> 'warn_seconds')::double precision, (v_call ->> 'rate_limited_retries')::integer);
                v_limited := v_limited || (v_call ->> 'id');
                v_i := v_i + 1;
                CONTINUE;
            END IF;
            INSERT INTO state.turn_waiting_tools (turn_id, step, tool_call_id, call_index, agent, tool, args,
                                                  timeout_seconds, external, turn_epoch, deadline_at, call_card_id,
                                                  timeout_source, warn_at, rl_max)
            VALUES (t.turn_id, t.step, v_call ->> 'id', v_i, t.agent, v_call ->> 'tool', v_call -> 'args',
                    (v_call ->> 'timeout_seconds')::integer,
                    coalesce((v_call ->> 'external')::boolean, false) OR v_deleg,
                    t.turn_epoch, now() + make_interval(secs => (v_call ->> 'wait_seconds')::integer), v_card,
                    v_call ->> 'timeout_source',
                    now() + make_interval(secs => (v_call ->> 'warn_seconds')::double precision),
                    (v_call ->> 'rate_limited_retries')::integer)
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
        SELECT * INTO t FROM state.turns WHERE turn_id = v_turn;  -- as the calls above left it
        t.status := 'suspended';
        t.suspended_at := now();
        t.updated_at := now();
        t.agent_state := p_reply -> 'state';
        t.wait_mode := CASE WHEN jsonb_typeof(v_wait) = 'number' THEN 'n' ELSE v_wait #>> '{}' END;
        t.wait_count := CASE WHEN jsonb_typeof(v_wait) = 'number' THEN (v_wait #>> '{}')::integer END;
        t.resume_deadline := (SELECT min(deadline_at) FROM state.turn_waiting_tools
                               WHERE turn_id = v_turn AND step = t.step);
        t := tw.turn_move(t);
        UPDATE state.agents SET status = 'suspended', updated_at = now() WHERE agent = t.agent;
        v_pub := tw.agent_state_event(t.agent, t.profile, 'suspended', t.turn_id, t.turn_epoch) || v_pub;
        FOREACH v_tool IN ARRAY v_tools LOOP
            v_pub := v_pub || tw.doorbell('tool', v_tool, 'tool.call');
        END LOOP;
        IF cardinality(v_limited) > 0 THEN
            v_pub := v_pub || tw.flow_ask(t, v_limited);
        END IF;
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

-- Group commit (worker/applier.c): the outcomes of many steps in one transaction. Its set-based statements
-- look rows up by key, a handful of a large table: their plans are made with enable_seqscan off, so that a plan
-- cached while the tables were small (a new database) never scans them whole once they are large. p_items is an array of
-- {"fence","reply"} as tw.apply_step takes them; the answer is {"results":[{"applied"}...] (in p_items' order),
-- "publish":[...], "next":[jobs]}. The locks of every item are taken first, each kind in one fixed order (the
-- counters of trees that delegate, the parents' turns, the agents, the turns), so a batch waits for other
-- transactions in the order every path does and never deadlocks with them. A batch of several items does not
-- wait for an agent row another transaction holds (an application's open submit, say): it takes the agents'
-- rows with SKIP LOCKED, and an item whose agent it did not get is not applied, takes no further lock (its
-- tree's counter and its parent's turn, taken before the agents, stay held until the batch commits, which
-- does not wait for that agent) and says so ({"applied":false,"busy":true}); the worker sends it again alone,
-- and a batch of one item waits for its agent's row as every path does (at most lock_timeout), holding no
-- other agent's row meanwhile (SKIP LOCKED never waits: the order argument above still holds). A stale or
-- ended item applies nothing and says so; an error rolls the whole batch back, and the worker then sends each
-- of its items alone.
--
-- The common case, a turn of no tree completing, is done for all such items at once in a few set-based
-- statements, with its agent's next turn (tw.next_turns); the rest (fail, tool calls, a child or a parent of
-- children) one by one through tw.apply_one, in the same transaction.
-- An item of tw.apply_steps that can be read at all: a fence of the shape tw.step_job makes and a reply of a
-- known kind. Any other item is refused on its own (not applied, "invalid"), never failing the batch.
CREATE OR REPLACE FUNCTION tw.apply_item_valid(p_item jsonb)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_typeof(p_item -> 'fence') = 'object' AND jsonb_typeof(p_item -> 'reply') = 'object'
           AND p_item -> 'fence' ->> 'turn_id' ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'
           AND jsonb_typeof(p_item -> 'fence' -> 'agent') = 'string'
           AND p_item -> 'fence' ->> 'epoch' ~ '^[0-9]{1,18}$' AND p_item -> 'fence' ->> 'step' ~ '^[0-9]{1,9}$'
           AND p_item -> 'fence' ->> 'id' ~ '^[0-9]{1,18}$' AND p_item -> 'fence' ->> 'token' ~ '^-?[0-9]{1,18}$'
           AND (p_item -> 'reply') ?| ARRAY['complete', 'fail', 'tool_calls'], false)
$$;

CREATE OR REPLACE FUNCTION tw.apply_steps(p_items jsonb, p_worker text DEFAULT NULL, p_profiles text[] DEFAULT NULL)
RETURNS json LANGUAGE plpgsql AS $$
DECLARE
    v_n      integer := jsonb_array_length(p_items);
    -- Invalid items, by their place; each is replaced below by one that matches nothing (the nil turn id).
    v_bad    integer[] := ARRAY(SELECT e.ord FROM jsonb_array_elements(p_items) WITH ORDINALITY e (v, ord)
                                 WHERE NOT tw.apply_item_valid(e.v));
    v_nil    constant jsonb := '{"fence":{"turn_id":"00000000-0000-0000-0000-000000000000","agent":"","epoch":0,
                                 "step":0,"id":0,"token":0},"reply":{"complete":{}}}';
    -- Items whose agent row another transaction holds (a batch of several items only), replaced the same way.
    v_busy   integer[] := '{}';
    v_got    text[];
    v_ids    uuid[];
    v_plain  integer[];
    v_agents text[];
    v_ended  uuid[];
    v_res    json;
    v_out    jsonb := '[]'::jsonb;
    v_pub    jsonb;
    v_more   jsonb := '[]'::jsonb;
    v_next   jsonb := '[]'::jsonb;
    v_took   jsonb;
    it       record;
BEGIN
    IF cardinality(v_bad) > 0 THEN
        SELECT jsonb_agg(CASE WHEN e.ord = ANY (v_bad) THEN v_nil ELSE e.v END ORDER BY e.ord)
          INTO p_items FROM jsonb_array_elements(p_items) WITH ORDINALITY e (v, ord);
    END IF;
    v_ids := ARRAY(SELECT (i -> 'fence' ->> 'turn_id')::uuid FROM jsonb_array_elements(p_items) i);
    -- The counters of the trees whose steps delegate, one root after the other in root order.
    FOR it IN
        SELECT DISTINCT ON (coalesce(t.root_turn_id, t.turn_id)) t.turn_id
          FROM jsonb_array_elements(p_items) i JOIN state.turns t ON t.turn_id = (i -> 'fence' ->> 'turn_id')::uuid
         WHERE i -> 'reply' ? 'max_tree_turns'
           AND EXISTS (SELECT 1 FROM jsonb_array_elements(i -> 'reply' -> 'tool_calls') c WHERE c ? 'agent_profile')
         ORDER BY coalesce(t.root_turn_id, t.turn_id)
    LOOP
        PERFORM tw.tree_lock(it.turn_id);
    END LOOP;
    PERFORM 1 FROM state.turns
     WHERE turn_id IN (SELECT parent_turn_id FROM state.turns WHERE turn_id = ANY (v_ids) AND parent_turn_id IS NOT NULL)
     ORDER BY turn_id FOR UPDATE;
    IF v_n > 1 THEN
        -- Not waiting for one agent while holding the others: the rows free now, and the items of the others
        -- are left out from here on (their turns are not locked, nothing of them is read or written).
        SELECT coalesce(array_agg(x.agent), '{}') INTO v_got
          FROM (SELECT agent FROM state.agents
                 WHERE agent IN (SELECT i -> 'fence' ->> 'agent' FROM jsonb_array_elements(p_items) i)
                 ORDER BY agent FOR UPDATE SKIP LOCKED) x;
        v_busy := ARRAY(SELECT e.ord FROM jsonb_array_elements(p_items) WITH ORDINALITY e (v, ord)
                         WHERE NOT (e.v -> 'fence' ->> 'agent') = ANY (v_got)
                           AND EXISTS (SELECT 1 FROM state.agents a WHERE a.agent = e.v -> 'fence' ->> 'agent'));
        IF cardinality(v_busy) > 0 THEN
            SELECT jsonb_agg(CASE WHEN e.ord = ANY (v_busy) THEN v_nil ELSE e.v END ORDER BY e.ord)
              INTO p_items FROM jsonb_array_elements(p_items) WITH ORDINALITY e (v, ord);
            v_ids := ARRAY(SELECT (i -> 'fence' ->> 'turn_id')::uuid FROM jsonb_array_elements(p_items) i);
        END IF;
    ELSE
        PERFORM 1 FROM state.agents
         WHERE agent IN (SELECT i -> 'fence' ->> 'agent' FROM jsonb_array_elements(p_items) i)
         ORDER BY agent FOR UPDATE;
    END IF;
    PERFORM 1 FROM state.turns WHERE turn_id = ANY (v_ids) ORDER BY turn_id FOR UPDATE;

    -- Completions of turns of no tree, compare-and-set on turn, agent and fence, all at once.
    WITH items AS (
        SELECT e.ord::integer AS ord, e.v -> 'fence' AS f, e.v -> 'reply' AS r
          FROM jsonb_array_elements(p_items) WITH ORDINALITY e (v, ord)
    ), cand AS (
        SELECT i.ord, (i.f ->> 'id')::bigint AS fid, (i.f ->> 'token')::bigint AS tok,
               coalesce(i.f ->> 'fence', 'inbox') AS fkind
          FROM items i
          JOIN state.turns t ON t.turn_id = (i.f ->> 'turn_id')::uuid
          JOIN state.agents a ON a.agent = i.f ->> 'agent'
         WHERE i.r ? 'complete' AND t.status = 'running' AND t.turn_epoch = (i.f ->> 'epoch')::bigint
           AND t.step = (i.f ->> 'step')::integer AND a.turn_epoch = t.turn_epoch
           AND a.active_agent_turn_id = t.turn_id AND t.parent_turn_id IS NULL
           AND NOT EXISTS (SELECT 1 FROM state.turn_trees x WHERE x.root_turn_id = t.turn_id)
    ), fi AS (
        UPDATE state.agent_inbox m SET status = 'archived', archived_at = now(), outcome = 'applied'
          FROM cand c
         WHERE c.fkind <> 'ledger' AND m.inbox_id = c.fid AND m.status = 'processing' AND m.claim_token = c.tok
        RETURNING c.ord
    ), fl AS (
        UPDATE state.turn_resume_ledger l SET status = 'done', outcome = 'applied', updated_at = now()
          FROM cand c
         WHERE c.fkind = 'ledger' AND l.ledger_id = c.fid AND l.status = 'processing' AND l.lease_token = c.tok
        RETURNING c.ord
    )
    SELECT coalesce(array_agg(ord ORDER BY ord), '{}') INTO v_plain FROM (SELECT ord FROM fi UNION ALL SELECT ord FROM fl) x;

    IF cardinality(v_plain) > 0 THEN
        SELECT c.o_publish, c.o_agents, c.o_ended INTO v_pub, v_agents, v_ended
          FROM tw.complete_set(ARRAY(SELECT (e.v -> 'fence' ->> 'turn_id')::uuid
                                       FROM jsonb_array_elements(p_items) WITH ORDINALITY e (v, ord)
                                      WHERE e.ord = ANY (v_plain) ORDER BY e.ord),
                               ARRAY(SELECT e.v -> 'reply' -> 'complete' -> 'output'
                                       FROM jsonb_array_elements(p_items) WITH ORDINALITY e (v, ord)
                                      WHERE e.ord = ANY (v_plain) ORDER BY e.ord)) c;
        -- The agents go idle, or on to their next turns (taken for this worker when it has the slot).
        v_took := tw.next_turns(v_agents, v_ended, p_worker, p_profiles);
        v_pub := v_pub || (v_took -> 'publish');
        v_next := v_next || (v_took -> 'jobs');
    ELSE
        v_pub := '[]'::jsonb;
    END IF;

    -- Everything else, one by one (in p_items' order), through the same locks.
    FOR it IN SELECT e.v, e.ord::integer AS ord FROM jsonb_array_elements(p_items) WITH ORDINALITY e (v, ord)
               WHERE NOT e.ord = ANY (v_plain) ORDER BY e.ord LOOP
        v_res := tw.apply_one(it.v -> 'fence', it.v -> 'reply', p_worker, p_profiles);
        v_more := v_more || jsonb_build_array(jsonb_build_object('ord', it.ord, 'applied', (v_res ->> 'applied')::boolean));
        v_pub := v_pub || (v_res -> 'publish')::jsonb;
        IF json_typeof(v_res -> 'next') = 'object' THEN
            v_next := v_next || jsonb_build_array((v_res -> 'next')::jsonb);
        END IF;
    END LOOP;
    SELECT jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
                         'applied', CASE WHEN g.ord = ANY (v_plain) THEN true
                                         ELSE coalesce((SELECT (m ->> 'applied')::boolean FROM jsonb_array_elements(v_more) m
                                                         WHERE (m ->> 'ord')::integer = g.ord), false) END,
                         'invalid', CASE WHEN g.ord = ANY (v_bad) THEN true END,
                         'busy', CASE WHEN g.ord = ANY (v_busy) THEN true END))
                     ORDER BY g.ord)
      INTO v_out FROM generate_series(1, v_n) g (ord);
    RETURN json_build_object('results', v_out, 'publish', v_pub, 'next', v_next);
END $$;

-- Turn t as a dispatch makes it (tw.next_turns): dispatched under the epoch p_epoch, or running at once for
-- the worker (p_take). A function of its own: jsonb_populate_record on a JSON patch cost ~55k instructions a row.
CREATE OR REPLACE FUNCTION tw.turn_dispatching(t state.turns, p_epoch bigint, p_take boolean)
RETURNS state.turns LANGUAGE plpgsql STABLE AS $$
BEGIN
    t.status := CASE WHEN p_take THEN 'running' ELSE 'dispatched' END;
    t.turn_epoch := p_epoch;
    t.dispatched_at := now();
    t.started_at := CASE WHEN p_take THEN now() END;
    t.updated_at := now();
    RETURN t;
END $$;

-- The agents p_agents, whose turns p_ended have just ended (the caller holds their rows and wrote their idle
-- events), go idle or on to the head of their queues, all at once: tw.dispatch for many agents. With p_worker
-- (the worker whose slots those turns freed) the next turns are taken at once for it, claimed and running,
-- unless other dispatched turns wait for a slot (then they are announced, and the freed slots go to the oldest
-- waiting turns through tw.claim_turns, as tw.apply_one does). Returns {"publish","jobs"}.
CREATE OR REPLACE FUNCTION tw.next_turns(p_agents text[], p_ended uuid[], p_worker text, p_profiles text[],
                                          p_asked boolean DEFAULT false)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_take   boolean := false;
    v_nagent text[];
    v_nturn  uuid[];
    v_pub    jsonb := '[]'::jsonb;
    v_jobs   jsonb := '[]'::jsonb;
    v_free   integer;
    v_claim  jsonb;
    v_flow   text[];
BEGIN
    -- The next turns are taken for p_worker unless other turns wait for a slot. A statement only with a worker
    -- (its subquery starts an executor, which a submit's dispatch, with none, does not need).
    IF p_worker IS NOT NULL THEN
        v_take := NOT EXISTS (SELECT 1 FROM state.agent_inbox
                               WHERE status = 'pending' AND target_kind = 'agent' AND message_type = 'turn');
    END IF;
    -- The head of each queue (a retried or later turn waits for its ready_at); tw.turns_move below takes it
    -- out. One of a profile with limits is left to tw.flow_dispatch (lim), unless its limits are held already
    -- (p_asked: tw.flow_dispatch is the caller). The head is the first entry of the queue's index, its turn
    -- joined after the LIMIT: joined inside, the turns of the whole queue were read for every dispatch (3 ms
    -- a turn with 2,000 turns queued per agent, docs/performance.md). A place's turn is pending (they move
    -- together); one that is not as this snapshot sees it is left for the agent's next dispatch.
    WITH f AS (SELECT * FROM unnest(p_agents, p_ended) f (agent, ended)),
    h AS MATERIALIZED (
          SELECT f.agent, q.seq, q.turn_id,
                 NOT p_asked AND coalesce((SELECT p.limits IS NOT NULL FROM state.profiles p
                                            WHERE p.profile = q.profile), false) AS lim
            FROM f
           CROSS JOIN LATERAL (SELECT q.seq, q.turn_id, q.profile FROM state.turn_queue q
                                WHERE q.agent = f.agent AND (q.ready_at IS NULL OR q.ready_at <= now())
                                ORDER BY q.seq LIMIT 1) q
            JOIN state.turns t ON t.turn_id = q.turn_id AND t.status = 'pending')
    SELECT array_agg(h.agent ORDER BY h.agent) FILTER (WHERE NOT h.lim),
           array_agg(h.turn_id ORDER BY h.agent) FILTER (WHERE NOT h.lim),
           array_agg(h.agent ORDER BY h.agent) FILTER (WHERE h.lim)
      INTO v_nagent, v_nturn, v_flow FROM h;
    -- Their rows, still pending: a watchdog (a deadline, a cancel) may have ended one since this statement's
    -- snapshot, and it must not be dispatched then (locked turn by turn, then their queue places: the order of
    -- every path that ends a pending turn). The agents that lose theirs look again at their next dispatch.
    IF cardinality(v_nturn) > 0 THEN
        SELECT array_agg(t.agent ORDER BY t.agent), array_agg(t.turn_id ORDER BY t.agent) INTO v_nagent, v_nturn
          FROM (SELECT t.agent, t.turn_id FROM state.turns t
                 WHERE t.turn_id = ANY (v_nturn) AND t.status = 'pending' ORDER BY t.turn_id FOR UPDATE) t;
    END IF;
    v_nagent := coalesce(v_nagent, '{}');
    v_nturn := coalesce(v_nturn, '{}');
    -- Those with nothing to do now go idle (their turn ended; the caller wrote the idle event). No turn ended
    -- (a submit's dispatch of an idle agent): no agent to idle, and the statement is not run.
    IF cardinality(array_remove(p_ended, NULL)) > 0 THEN
        UPDATE state.agents a
           SET status = 'idle', active_agent_turn_id = NULL, active_channel_id = NULL, updated_at = now(),
               rerung_at = NULL
          FROM unnest(p_agents, p_ended) f (agent, ended)
         WHERE a.agent = f.agent AND a.active_agent_turn_id = f.ended AND NOT f.agent = ANY (v_nagent);
    END IF;
    IF cardinality(v_nturn) > 0 THEN
        WITH ag AS (
            UPDATE state.agents a
               SET status = CASE WHEN v_take THEN 'running' ELSE 'dispatched' END, active_agent_turn_id = n.turn_id,
                   active_channel_id = t.channel_id, turn_epoch = a.turn_epoch + 1, updated_at = now(), rerung_at = NULL
              FROM unnest(v_nagent, v_nturn) n (agent, turn_id) JOIN state.turns t ON t.turn_id = n.turn_id
             WHERE a.agent = n.agent
            RETURNING a.agent, a.turn_epoch, n.turn_id
        ), nt AS (
            SELECT * FROM tw.turns_move(ARRAY(
                SELECT tw.turn_dispatching(t, ag.turn_epoch, v_take) FROM ag JOIN state.turns t ON t.turn_id = ag.turn_id))
        ), ib AS (
            INSERT INTO state.agent_inbox (target_kind, target, profile, turn_seq, message_type, turn_id, turn_epoch,
                                           step, channel_id, payload, status, processed_at, claim_token, claimed_by,
                                           attempts)
            SELECT 'agent', nt.agent, nt.profile, nt.seq, 'turn', nt.turn_id, nt.turn_epoch, nt.step, nt.channel_id,
                   jsonb_build_object('turn_id', nt.turn_id, 'epoch', nt.turn_epoch),
                   CASE WHEN v_take THEN 'processing' ELSE 'pending' END, CASE WHEN v_take THEN now() END,
                   CASE WHEN v_take THEN nextval('state.claim_token_seq') END,
                   CASE WHEN v_take THEN p_worker END, CASE WHEN v_take THEN 1 ELSE 0 END
              FROM nt
            RETURNING inbox_id, turn_id, claim_token
        ), evs AS MATERIALIZED (
            -- Each row's id drawn once (see tw.apply_steps).
            SELECT gen_random_uuid() AS id, v.status, nt.agent, nt.profile, nt.turn_id, nt.turn_epoch
              FROM nt
             CROSS JOIN LATERAL (SELECT 'dispatched' AS status UNION ALL SELECT 'running' WHERE v_take) v
        ), ev AS (
            INSERT INTO state.outbox (event_id, kind, subject, payload, turn_id, turn_epoch)
            SELECT id, 'state', tw.ev_subject(agent, 'state'),
                   tw.ev_payload(tw.ev_state(agent, profile, status, turn_id, turn_epoch, NULL, NULL), id),
                   turn_id, turn_epoch
              FROM evs
            RETURNING event_id, subject, payload, turn_id, payload ->> 'status' AS status
        )
        SELECT coalesce((SELECT jsonb_agg(tw.ev_publish(ev.event_id, ev.subject, ev.payload)
                                          ORDER BY ev.turn_id, ev.status = 'running') FROM ev), '[]'::jsonb)
               || CASE WHEN v_take THEN '[]'::jsonb
                       ELSE coalesce((SELECT jsonb_agg(tw.doorbell('agent', nt.agent, 'dispatch', nt.profile) -> 0) FROM nt),
                                     '[]'::jsonb) END,
               coalesce((SELECT jsonb_agg(tw.step_job('inbox', ib.inbox_id, ib.claim_token,
                                                      ROW(nt.*)::state.turns)) FROM nt JOIN ib USING (turn_id)
                          WHERE v_take), '[]'::jsonb)
          INTO v_pub, v_jobs;
        PERFORM tw.dispatch_arms();
    END IF;
    -- Freed slots with no next turn of their own go to the oldest turns waiting for one.
    v_free := cardinality(p_agents) - jsonb_array_length(v_jobs);
    IF p_worker IS NOT NULL AND p_profiles IS NOT NULL AND v_free > 0 AND NOT v_take THEN
        v_claim := tw.claim_turns(p_worker, p_profiles, v_free);
        v_pub := v_pub || (v_claim -> 'publish');
        v_jobs := v_jobs || (v_claim -> 'jobs');
    END IF;
    IF v_flow IS NOT NULL THEN
        v_pub := v_pub || tw.flow_next_turns(v_flow);
    END IF;
    RETURN jsonb_build_object('publish', v_pub, 'jobs', v_jobs);
END $$;
