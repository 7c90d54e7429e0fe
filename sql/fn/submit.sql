-- Submitting a turn (the SQL API of sections 12 and 14), and what its queueing fixes.

-- The one submit path (the CLI calls it too). Returns the turn and whether this call created it (false: the
-- idempotency key named an existing turn). An agent that does not exist is added in this transaction when a
-- profile is given (or when its own name is a profile: every profile is an agent of its name). p_known: the
-- profiles of the caller's own config (the CLI's), published here if no daemon has yet; looked at only when
-- the agent is new.
CREATE OR REPLACE FUNCTION tw.submit_turn_ex(p_agent text, p_channel text, p_input jsonb, p_timeout_s integer,
                                             p_idem text, p_box text, p_profile text,
                                             p_known text[] DEFAULT NULL, p_limit_key text DEFAULT NULL,
                                             p_priority integer DEFAULT 0, p_not_before timestamptz DEFAULT NULL)
RETURNS TABLE (turn_id uuid, created boolean) LANGUAGE plpgsql
-- Its statements planned once per session (as the daemons' are), also for a client that does not ask it, and
-- by key as the daemons' are (their sessions have enable_seqscan off): a client's plan made while the tables
-- were small scanned state.turns whole four times per submit in tw.next_turns' joins until the next ANALYZE of
-- the table (docs/performance.md).
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_hashjoin = off
SET enable_mergejoin = off AS $$
DECLARE
    v_id      uuid;
    v_agent   text;
    v_channel text;
    v_status  text;
    v_profile text;
    v_retired timestamptz;
    v_new     state.turns;
    v_own     boolean := false;
    v_pub     jsonb;
    -- A turn that runs later (docs/schedules.md): no dispatch now; rule retry_due dispatches it at its time.
    v_later   boolean := coalesce(tw.check_not_before(p_not_before) > now(), false);
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
    -- Flow control (docs/flow-control.md): the key its limits count it under, and its priority.
    PERFORM tw.check_ident('limit key', p_limit_key);
    IF p_priority IS NULL OR p_priority NOT BETWEEN 0 AND 9 THEN
        RAISE EXCEPTION 'priority must be from 0 to 9, not %', coalesce(p_priority::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    IF p_input IS NULL THEN
        RAISE EXCEPTION 'an input document is required' USING ERRCODE = '22023';
    END IF;
    IF p_timeout_s IS NOT NULL AND p_timeout_s NOT BETWEEN 1 AND tw.limit_turn_timeout_max() THEN
        RAISE EXCEPTION 'timeout_seconds must be from 1 to %, not %', tw.limit_turn_timeout_max(), p_timeout_s
            USING ERRCODE = '22023';
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
    -- An idle agent takes the turn in this transaction (tw.dispatch under the row FOR NO KEY UPDATE), and the
    -- workers serving its profile hear of it at commit (NOTIFY tw_work): no PMO in between. Otherwise the row
    -- is held FOR KEY SHARE until commit: a busy agent takes this turn when its current turn ends, for that
    -- apply needs the row FOR UPDATE, so it waits for this commit and then sees the turn; an agent another
    -- submit is dispatching right now (it holds the row FOR NO KEY UPDATE, which KEY SHARE does not wait for)
    -- sees it queued behind that one; an idle one the PMO dispatches (NOTIFY tw_turn).
    SELECT a.status, a.profile, a.retired_at INTO v_status, v_profile, v_retired
      FROM state.agents a WHERE a.agent = p_agent;
    IF FOUND AND v_status = 'idle' AND NOT v_later THEN
        SELECT a.status, a.profile, a.retired_at INTO v_status, v_profile, v_retired
          FROM state.agents a WHERE a.agent = p_agent FOR NO KEY UPDATE SKIP LOCKED;
        v_own := FOUND AND v_status = 'idle';
    END IF;
    IF NOT v_own THEN
        SELECT a.status, a.profile, a.retired_at INTO v_status, v_profile, v_retired
          FROM state.agents a WHERE a.agent = p_agent FOR KEY SHARE;
    END IF;
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
          FROM state.agents a WHERE a.agent = p_agent FOR NO KEY UPDATE SKIP LOCKED;
        v_own := FOUND AND v_status = 'idle' AND NOT v_later;
        IF NOT v_own THEN
            SELECT a.status, a.profile, a.retired_at INTO v_status, v_profile, v_retired
              FROM state.agents a WHERE a.agent = p_agent FOR KEY SHARE;
        END IF;
    END IF;
    IF p_profile IS NOT NULL AND v_profile <> p_profile THEN
        RAISE EXCEPTION 'agent % is bound to profile %, not %', p_agent, v_profile, p_profile USING ERRCODE = '22023';
    END IF;
    IF v_retired IS NOT NULL THEN
        RAISE EXCEPTION 'agent_retired: agent % was retired at % and takes no new turns', p_agent, v_retired
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO state.turns AS t (agent, profile, channel_id, output_box_id, input, idempotency_key,
                                  timeout_seconds, deadline_at, limit_key, priority, not_before)
    VALUES (p_agent, v_profile, p_channel, p_box, p_input, p_idem, p_timeout_s,
            CASE WHEN p_timeout_s IS NOT NULL
                 THEN greatest(now(), p_not_before) + make_interval(secs => p_timeout_s) END, p_limit_key,
            p_priority, p_not_before)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING t.* INTO v_new;
    v_id := v_new.turn_id;
    IF v_id IS NULL THEN
        -- A concurrent submit with the same key won; answer with its turn.
        SELECT t.turn_id INTO v_id FROM state.turns t WHERE t.idempotency_key = p_idem;
        PERFORM tw.durable_answer();
        RETURN QUERY SELECT v_id, false;
        RETURN;
    END IF;
    v_new := tw.turn_move(v_new, true);  -- its agent's queue, its timers (an assignment: no executor)
    IF v_own THEN
        -- Its dispatched event is relayed by a PMO at commit (tw.api_publish's NOTIFY tw_outbox); the doorbell
        -- goes to the workers as NOTIFY tw_work, no NATS needed.
        v_pub := tw.dispatch(p_agent, NULL, NULL, true) -> 'publish';
        IF jsonb_array_length(v_pub) > 0 THEN
            PERFORM pg_notify('tw_outbox', '');
            PERFORM pg_notify('tw_work', v_profile);
        END IF;
    ELSIF v_status = 'idle' AND NOT v_later THEN
        PERFORM pg_notify('tw_turn', p_agent);
    END IF;
    IF v_later THEN
        PERFORM pg_notify('tw_due', 'not_before');
    END IF;
    -- A deadline may now be due sooner than any the PMOs sleep for (docs/watchdogs.md). Transactional, and
    -- the CLI or an application submitting through SQL need no NATS for it; only turns with a deadline pay
    -- for a notification.
    IF p_timeout_s IS NOT NULL THEN
        PERFORM pg_notify('tw_due', 'turn_deadline');
    END IF;
    RETURN QUERY SELECT v_id, true;
END $$;

-- The SQL API (docs/operations.md and docs/roster.md): callable in the caller's own transaction; the turn exists only if
-- that transaction commits, and the PMO hears of it through NOTIFY tw_turn at commit.
CREATE OR REPLACE FUNCTION tw.submit_turn(agent text, channel text, input jsonb, timeout_seconds integer DEFAULT NULL,
                                          idempotency_key text DEFAULT NULL, box text DEFAULT NULL,
                                          profile text DEFAULT NULL, p_limit_key text DEFAULT NULL,
                                          p_priority integer DEFAULT 0, p_not_before timestamptz DEFAULT NULL)
RETURNS uuid LANGUAGE sql AS $$
    SELECT turn_id FROM tw.submit_turn_ex($1, $2, $3, $4, $5, $6, $7, NULL, $8, $9, $10)
$$;

-- Many turns in one call, as tw.submit_turn would make them one after the other (bulk clients; tools/bench):
-- element i of each array is the i-th turn; an array left NULL is NULL for every turn. Turns go into their
-- agents' queues in the arrays' order (seq), so order per agent and across agents is the order given. Agents
-- that exist: tw.submit_set, a handful of set-based statements whatever the number of turns; otherwise (an agent
-- to add) each turn goes through tw.submit_turn_ex. Any invalid element fails the whole call (22023, naming the
-- element).
CREATE OR REPLACE FUNCTION tw.submit_turns(agents text[], channels text[], inputs jsonb[],
                                           timeout_seconds integer[] DEFAULT NULL,
                                           idempotency_keys text[] DEFAULT NULL, boxes text[] DEFAULT NULL,
                                           profiles text[] DEFAULT NULL, not_befores timestamptz[] DEFAULT NULL)
RETURNS TABLE (turn_id uuid, created boolean) LANGUAGE plpgsql
-- Its statements planned once per session (as the daemons' are), also for a client that does not ask it.
SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    v_n integer := coalesce(cardinality(agents), 0);
BEGIN
    IF coalesce(cardinality(channels), 0) <> v_n OR coalesce(cardinality(inputs), 0) <> v_n
       OR cardinality(timeout_seconds) <> v_n OR cardinality(idempotency_keys) <> v_n OR cardinality(boxes) <> v_n
       OR cardinality(profiles) <> v_n OR cardinality(not_befores) <> v_n THEN
        RAISE EXCEPTION 'submit_turns: every array must have as many elements as agents (%)', v_n USING ERRCODE = '22023';
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF v_n > 10000 THEN
        RAISE EXCEPTION 'submit_turns: at most 10000 turns a call, not %', v_n USING ERRCODE = '22023';
    END IF;
    -- The general path: new agents, added with their profiles.
    IF EXISTS (SELECT 1 FROM unnest(agents) a WHERE NOT EXISTS (SELECT 1 FROM state.agents r WHERE r.agent = a)) THEN
        RETURN QUERY
        SELECT s.turn_id, s.created
          FROM generate_series(1, v_n) i
         CROSS JOIN LATERAL tw.submit_turn_ex(agents[i], channels[i], inputs[i], timeout_seconds[i],
                                              idempotency_keys[i], boxes[i], profiles[i],
                                              p_not_before => not_befores[i]) s
         ORDER BY i;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT s.turn_id, s.created
      FROM tw.submit_set('submit_turns', agents, channels, inputs, timeout_seconds, idempotency_keys, boxes,
                         profiles, not_befores, NULL) s
     ORDER BY s.ord;
END $$;

-- The set-based submit: turns for agents in the roster (one that is not is refused: tw.submit_turn_ex adds
-- agents), as tw.submit_turn_ex makes them one at a time, but in a handful of statements whatever their number:
-- checked all at once (p_who names the caller in the error, which names the element), the agents held FOR KEY
-- SHARE in name order, a turn per element or, for an idempotency key that names a turn already (for the same
-- agent and channel), that turn (created false; two elements with one key are one turn). Idle agents are
-- dispatched by a PMO (NOTIFY tw_turn at commit), not in this transaction. Returns each element's ordinal, turn
-- and whether this call created it.
CREATE OR REPLACE FUNCTION tw.submit_set(p_who text, agents text[], channels text[], inputs jsonb[],
                                         timeout_seconds integer[], idempotency_keys text[], boxes text[],
                                         profiles text[], not_befores timestamptz[], limit_keys text[])
RETURNS TABLE (ord integer, turn_id uuid, created boolean) LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    v_n    integer := coalesce(cardinality(agents), 0);
    v_bad  record;
    v_idle text[];
    v_ids  uuid[];
    v_new  boolean[];
BEGIN
    SELECT x.i, x.why INTO v_bad FROM (
        SELECT i, CASE WHEN NOT tw.name_ok(agents[i]) THEN 'an invalid agent id'
                       WHEN profiles[i] IS NOT NULL AND NOT tw.name_ok(profiles[i]) THEN 'an invalid profile'
                       WHEN channels[i] IS NULL THEN 'no channel'
                       WHEN NOT tw.ident_ok(channels[i]) THEN 'an invalid channel (1 to 256 bytes, no control characters)'
                       WHEN NOT tw.ident_ok(boxes[i]) THEN 'an invalid box (1 to 256 bytes, no control characters)'
                       WHEN NOT tw.ident_ok(idempotency_keys[i])
                           THEN 'an invalid idempotency key (1 to 256 bytes, no control characters)'
                       WHEN NOT tw.ident_ok(limit_keys[i]) THEN 'an invalid limit key (1 to 256 bytes, no control characters)'
                       WHEN inputs[i] IS NULL THEN 'no input document'
                       WHEN timeout_seconds[i] IS NOT NULL
                            AND timeout_seconds[i] NOT BETWEEN 1 AND tw.limit_turn_timeout_max()
                           THEN format('timeout_seconds out of range (1 to %s)', tw.limit_turn_timeout_max())
                       WHEN not_befores[i] IS NOT NULL AND NOT isfinite(not_befores[i]) THEN 'an infinite not_before'
                       WHEN octet_length(inputs[i]::text) > tw.doc_max_text()
                           THEN format('an input document of %s bytes (at most %s)', octet_length(inputs[i]::text),
                                       tw.doc_max_text())
                  END AS why
          FROM generate_series(1, v_n) i) x
     WHERE x.why IS NOT NULL ORDER BY x.i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '%: element % has %', p_who, v_bad.i, v_bad.why USING ERRCODE = '22023';
    END IF;
    -- Held FOR KEY SHARE until commit, in name order, as tw.submit_turn_ex holds one: an agent's apply waits for
    -- this commit and then sees the turns; an idle agent is dispatched by a PMO (NOTIFY tw_turn).
    PERFORM 1 FROM state.agents a WHERE a.agent = ANY (agents) ORDER BY a.agent FOR KEY SHARE;
    SELECT x.i, x.why INTO v_bad FROM (
        SELECT i, CASE WHEN r.agent IS NULL THEN format('agent %s not in the roster', agents[i])
                       WHEN r.retired_at IS NOT NULL
                            THEN format('agent_retired: agent %s was retired at %s', r.agent, r.retired_at)
                       WHEN profiles[i] IS NOT NULL AND r.profile <> profiles[i]
                            THEN format('agent %s bound to profile %s, not %s', r.agent, r.profile, profiles[i])
                       WHEN t.turn_id IS NOT NULL AND (t.agent <> agents[i] OR t.channel_id <> channels[i])
                            THEN format('idempotency key %s already naming turn %s for agent %s on channel %s',
                                        idempotency_keys[i], t.turn_id, t.agent, t.channel_id)
                  END AS why
          FROM generate_series(1, v_n) i LEFT JOIN state.agents r ON r.agent = agents[i]
          LEFT JOIN state.turns t ON t.idempotency_key = idempotency_keys[i]) x
     WHERE x.why IS NOT NULL ORDER BY x.i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '%: element % has %', p_who, v_bad.i, v_bad.why USING ERRCODE = '22023';
    END IF;
    -- Two elements with one key must be one turn: the same agent and channel.
    SELECT x.k INTO v_bad FROM (
        SELECT idempotency_keys[i] AS k FROM generate_series(1, v_n) i WHERE idempotency_keys[i] IS NOT NULL
         GROUP BY 1 HAVING count(DISTINCT (agents[i], channels[i])) > 1) x LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '%: idempotency key % given for two different turns (agent or channel)', p_who, v_bad.k
            USING ERRCODE = '22023';
    END IF;
    WITH ins AS (
        -- A key already taken (by a turn before, a concurrent submit or an element before this one) inserts
        -- nothing.
        INSERT INTO state.turns AS t (agent, profile, channel_id, output_box_id, input, timeout_seconds, deadline_at,
                                      not_before, idempotency_key, limit_key)
        SELECT agents[i], r.profile, channels[i], boxes[i], inputs[i], timeout_seconds[i],
               CASE WHEN timeout_seconds[i] IS NOT NULL
                    THEN greatest(now(), not_befores[i]) + make_interval(secs => timeout_seconds[i]) END,
               not_befores[i], idempotency_keys[i], limit_keys[i]
          FROM generate_series(1, v_n) i JOIN state.agents r ON r.agent = agents[i]
         ORDER BY i
        ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING t.*
    ), q AS (
        -- Their agents' queues, their timers (a turn that runs later: ready at its not_before, its timer).
        SELECT count(*) FROM tw.turns_move(ARRAY(SELECT ROW(ins.*)::state.turns FROM ins), true)
    ), plain AS (
        -- An element without a key made a turn of its own, its agent's k-th such in element order (seq).
        SELECT x.i, n.turn_id
          FROM (SELECT i, agents[i] AS agent, row_number() OVER (PARTITION BY agents[i] ORDER BY i) AS k
                  FROM generate_series(1, v_n) i WHERE idempotency_keys[i] IS NULL) x
          JOIN (SELECT ins.turn_id, ins.agent, row_number() OVER (PARTITION BY ins.agent ORDER BY ins.seq) AS k
                  FROM ins WHERE ins.idempotency_key IS NULL) n ON n.agent = x.agent AND n.k = x.k
    )
    SELECT array_agg(coalesce(plain.turn_id, kd.turn_id) ORDER BY g.i),
           array_agg(plain.turn_id IS NOT NULL OR kd.turn_id IS NOT NULL AND g.first ORDER BY g.i)
      INTO v_ids, v_new
      FROM (SELECT i, idempotency_keys[i] AS k, i = min(i) OVER (PARTITION BY idempotency_keys[i]) AS first
              FROM generate_series(1, v_n) i) g
      LEFT JOIN plain ON plain.i = g.i
      LEFT JOIN ins kd ON kd.idempotency_key = g.k
     CROSS JOIN q;
    -- A key that named a turn before this call (or one a concurrent submit made, which the statement above did
    -- not see): that turn, read in a statement of its own.
    RETURN QUERY
    SELECT i, coalesce(v_ids[i], (SELECT t.turn_id FROM state.turns t WHERE t.idempotency_key = idempotency_keys[i])),
           v_new[i]
      FROM generate_series(1, v_n) i;
    IF false = ANY (v_new) THEN
        PERFORM tw.durable_answer();  -- an answer naming a turn another transaction made (tw.submit_turn_ex)
    END IF;
    SELECT array_agg(DISTINCT a.agent) INTO v_idle
      FROM generate_series(1, v_n) i JOIN state.agents a ON a.agent = agents[i]
     WHERE a.status = 'idle' AND NOT coalesce(not_befores[i] > now(), false);
    PERFORM pg_notify('tw_turn', x) FROM unnest(v_idle) x;
    IF timeout_seconds IS NOT NULL AND EXISTS (SELECT 1 FROM unnest(timeout_seconds) x WHERE x IS NOT NULL) THEN
        PERFORM pg_notify('tw_due', 'turn_deadline');
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(not_befores) x WHERE x > now()) THEN
        PERFORM pg_notify('tw_due', 'not_before');
    END IF;
END $$;

-- Trigger: what a new turn's policy fixes when it is queued (the queue budget, the warning before its deadline).
CREATE OR REPLACE FUNCTION tw.turns_queued()
RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p state.policies := tw.policy(NEW.profile);
BEGIN
    IF p.queue_timeout_seconds > 0 THEN
        NEW.queue_deadline_at := tw.turn_start_at(NEW) + make_interval(secs => p.queue_timeout_seconds);
        IF p.warn_at_percent > 0 THEN
            NEW.queue_warn_at := tw.turn_start_at(NEW)
                                 + make_interval(secs => p.queue_timeout_seconds * p.warn_at_percent / 100.0);
        END IF;
        PERFORM pg_notify('tw_due', 'queue');
    END IF;
    IF NEW.deadline_at IS NOT NULL AND p.warn_at_percent > 0 THEN
        NEW.deadline_warn_at := NEW.deadline_at
                                - make_interval(secs => tw.turn_deadline_seconds(NEW)
                                                        * (100 - p.warn_at_percent) / 100.0);
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER turns_queued BEFORE INSERT ON state.turns
    FOR EACH ROW EXECUTE FUNCTION tw.turns_queued();

-- A submit that queued a turn behind a busy agent relies on that agent's turn end to see it: an apply takes the
-- agent row FOR UPDATE, so it waits for the submit's FOR KEY SHARE and then finds the turn. A turn deadline (and
-- any watchdog end, tw.end_turn without waiting) does not wait for a submit: it takes the row FOR NO KEY UPDATE,
-- which a submit's FOR KEY SHARE does not block, so that a client's open transaction cannot postpone a deadline.
-- Such an end cannot see a turn not yet committed and may leave the agent idle with that turn queued. So at
-- commit each client transaction that queued a turn looks at the agent again, FOR SHARE (which waits for an end
-- in flight and reads the row as it left it): an idle agent gets NOTIFY tw_turn, and a PMO dispatches it. An end
-- that comes later waits for nothing and sees the turn. The daemons' own queueing (retries) needs none of this.
-- It runs at commit, outside the SQL API function that queued the turn, so as its owner (a client's role may
-- not read state).
CREATE OR REPLACE FUNCTION tw.queued_at_commit()
RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_status text;
BEGIN
    SELECT a.status INTO v_status FROM state.agents a WHERE a.agent = NEW.agent FOR SHARE;
    IF v_status = 'idle' THEN
        PERFORM pg_notify('tw_turn', NEW.agent);
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS turn_queue_at_commit ON state.turn_queue;  -- a constraint trigger cannot be replaced
-- A daemon's session (tw.wakes = 'nats': its own retries) queues no check at all: the WHEN is judged at the insert.
CREATE CONSTRAINT TRIGGER turn_queue_at_commit AFTER INSERT ON state.turn_queue
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (current_setting('tw.wakes', true) IS DISTINCT FROM 'nats')
    EXECUTE FUNCTION tw.queued_at_commit();
