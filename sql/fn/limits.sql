-- Flow control (docs/flow-control.md): limits that tool calls must hold to start, enforced here for every worker.
--
-- A call of a tool with limits (its turn_waiting_tools row says which) is a row of state.limit_calls: waiting
-- (waiting_limit: it has no tool.call message, so no worker can claim it), then holding (the grant wrote its
-- tool.call message and rang its tool's doorbell). A grant takes one slot of every limit the call names (of
-- those that exist) and one token of each rate; the statement that ends a holder (its result, its timeout, a
-- cancel, its turn's end) gives them back and grants the next waiters in the same transaction. A waiter that
-- waits for a token (or for a pause to end) is granted by rule limit_grants at that time (state.limits
-- next_grant_at, NOTIFY tw_due).
--
-- Lock order: a limit's row in state.limits is taken after the turn and tool-call rows of the statement that
-- releases or asks, and before the usage and limit_calls rows; several limits in name order (tw.flow_lock). A
-- grant never waits for a limit a waiter names beyond those it holds: it takes them with SKIP LOCKED, or leaves
-- the waiter to the rule a moment later.

-- Lock the rows of the limits p_names that exist, in name order; returns their names.
CREATE OR REPLACE FUNCTION tw.flow_lock(p_names text[])
RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(x.name ORDER BY x.name), '{}')
      FROM (SELECT name::text FROM state.limits WHERE name = ANY (p_names) ORDER BY name FOR UPDATE) x
$$;

-- The tokens of a bucket now (refilled continuously, at most burst); NULL when the limit has no rate.
CREATE OR REPLACE FUNCTION tw.flow_tokens(l state.limits, u state.limit_usage)
RETURNS double precision LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN l.rate_n IS NULL THEN NULL
                ELSE least(coalesce(l.burst, l.rate_n)::double precision,
                           coalesce(u.tokens, coalesce(l.burst, l.rate_n)::double precision)
                           + coalesce(extract(epoch FROM now() - u.refilled_at)::double precision, 0)
                             * l.rate_n / l.rate_seconds::double precision) END
$$;

-- The (priority, key) pairs that have waiters, of any limit: a loose scan of limit_calls_queue_idx, one probe
-- a pair, however many wait in each.
CREATE OR REPLACE FUNCTION tw.flow_waiter_keys()
RETURNS TABLE (priority integer, limit_key text) LANGUAGE sql STABLE AS $$
    WITH RECURSIVE k AS (
        (SELECT w.priority, w.limit_key FROM state.limit_calls w WHERE w.status = 'waiting'
          ORDER BY w.priority, w.limit_key LIMIT 1)
        UNION ALL
        SELECT n.priority, n.limit_key
          FROM k CROSS JOIN LATERAL (SELECT w.priority, w.limit_key FROM state.limit_calls w
                                      WHERE w.status = 'waiting' AND (w.priority, w.limit_key) > (k.priority, k.limit_key)
                                      ORDER BY w.priority, w.limit_key LIMIT 1) n
    )
    SELECT k.priority, k.limit_key FROM k
$$;

-- Grant what can start among the waiters of the limits p_locked (the caller holds their rows): highest priority
-- first, then round robin across keys (each key's n-th waiter before any key's n+1-th, a key served longer ago
-- first), FIFO within a key. Only the first few waiters of each key are read (one, then four, sixteen...: a
-- release that frees one slot reads one a key), the next few only when those could not fill the limits; at most
-- 1,000 in one call. With p_worker (the worker whose result gave a slot back, tw.deliver_result), the first call
-- granted to one of its tools p_tools is taken for it at once (tw.flow_call_message): its job. Returns the
-- doorbells to ring (publish) and that job.
CREATE OR REPLACE FUNCTION tw.flow_grant_take(p_locked text[], p_worker text, p_tools text[], OUT publish jsonb,
                                              OUT job jsonb)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    c        record;
    l        state.limits;
    u        state.limit_usage;
    v_locked text[] := p_locked;
    v_full   text[] := '{}';   -- limits (name) or limit keys (name/key) that can grant nobody more now
    v_ok     boolean;
    v_tok    double precision;
    v_at     timestamptz;
    v_next   timestamptz;
    v_tools  text[] := '{}';
    v_pub    jsonb := '[]'::jsonb;
    v_miss   text[];
    v_got    text[];
    v_retry  boolean := false;
    v_waited double precision;
    v_bucket integer;
    v_turn   text;
    v_each   integer := 1;       -- waiters read of each (priority, key) this round
    v_seen   bigint[] := '{}';   -- waiters read in earlier rounds
    v_deeper boolean;            -- a key had more than this round read of it
    v_used   integer;
BEGIN
    IF cardinality(p_locked) = 0 THEN
        publish := v_pub;
        RETURN;
    END IF;
    <<rounds>>
    LOOP
        v_deeper := false;
        FOR c IN
            SELECT w.*, (SELECT max(x.last_grant_at) FROM state.limit_usage x
                          WHERE x.name = ANY (w.limits) AND x.key = w.limit_key) AS served_at
              FROM tw.flow_waiter_keys() k
             CROSS JOIN LATERAL (SELECT w.*, row_number() OVER (ORDER BY w.seq) AS rank
                                   FROM state.limit_calls w
                                  WHERE w.status = 'waiting' AND w.priority = k.priority AND w.limit_key = k.limit_key
                                    AND w.limits && p_locked AND NOT w.seq = ANY (v_seen)
                                  ORDER BY w.seq LIMIT v_each) w
             ORDER BY w.priority DESC, w.rank, served_at NULLS FIRST, w.seq
        LOOP
            -- Every limit locked here is full (the grants so far filled it): no waiter left can start.
            EXIT rounds WHEN p_locked <@ v_full;
            v_seen := v_seen || c.seq;
            v_deeper := v_deeper OR c.rank = v_each;
            IF v_full && c.limits OR (v_full && ARRAY(SELECT n || '/' || c.limit_key FROM unnest(c.limits) n)) THEN
                CONTINUE;
            END IF;
            -- A limit the caller did not lock: taken without waiting, or the waiter is left to the rule.
            v_miss := ARRAY(SELECT n FROM unnest(c.limits) n WHERE NOT n = ANY (v_locked));
            IF cardinality(v_miss) > 0 THEN
                v_got := ARRAY(SELECT name::text FROM state.limits WHERE name = ANY (v_miss) ORDER BY name
                                  FOR UPDATE SKIP LOCKED);
                IF EXISTS (SELECT 1 FROM state.limits WHERE name = ANY (v_miss) AND NOT name = ANY (v_got)) THEN
                    v_retry := true;
                    CONTINUE;
                END IF;
                v_locked := v_locked || v_miss;
            END IF;
            -- Can every limit it names (that exists) take one more?
            v_ok := true;
            FOR l IN SELECT * FROM state.limits WHERE name = ANY (c.limits) ORDER BY name LOOP
                v_at := NULL;
                IF l.paused_until > now() THEN
                    v_at := l.paused_until;
                END IF;
                IF v_at IS NULL AND l.max_concurrent > 0 THEN
                    SELECT * INTO u FROM state.limit_usage
                     WHERE name = l.name AND key = CASE WHEN l.per_key THEN c.limit_key ELSE '' END;
                    IF coalesce(u.in_use, 0) >= l.max_concurrent THEN
                        v_full := v_full || CASE WHEN l.per_key THEN l.name || '/' || c.limit_key ELSE l.name::text END;
                        v_ok := false;
                        EXIT;
                    END IF;
                END IF;
                IF v_at IS NULL AND l.rate_n IS NOT NULL THEN
                    SELECT * INTO u FROM state.limit_usage
                     WHERE name = l.name AND key = CASE WHEN l.per_key THEN c.limit_key ELSE '' END;
                    v_tok := tw.flow_tokens(l, u);
                    IF v_tok < 1 THEN
                        v_at := now() + make_interval(secs => (1 - v_tok) * l.rate_seconds / l.rate_n);
                    END IF;
                END IF;
                IF v_at IS NOT NULL THEN
                    -- Waits for time: rule limit_grants grants it then.
                    v_full := v_full || CASE WHEN l.paused_until > now() OR NOT l.per_key THEN l.name::text
                                             ELSE l.name || '/' || c.limit_key END;
                    IF l.next_grant_at IS NULL OR l.next_grant_at > v_at THEN
                        UPDATE state.limits SET next_grant_at = v_at WHERE name = l.name;
                        v_next := least(v_next, v_at);
                    END IF;
                    v_ok := false;
                    EXIT;
                END IF;
            END LOOP;
            CONTINUE WHEN NOT v_ok;
            -- A turn's own wait (sql/fn/turn_limits.sql): its agent and turn must be ready for it.
            IF c.agent IS NOT NULL THEN
                v_turn := tw.flow_turn_ready(c.turn_id, c.ledger_id);
                v_retry := v_retry OR v_turn = 'retry';
                CONTINUE WHEN v_turn <> 'ok';
            END IF;
            -- Take a slot and a token of each, and count how long it waited.
            v_waited := extract(epoch FROM now() - c.since);
            v_bucket := coalesce((SELECT min(i) FROM generate_subscripts(tw.flow_wait_bounds(), 1) i
                                   WHERE (tw.flow_wait_bounds())[i] >= v_waited),
                                 cardinality(tw.flow_wait_bounds()) + 1);
            FOR l IN SELECT * FROM state.limits WHERE name = ANY (c.limits) ORDER BY name LOOP
                INSERT INTO state.limit_usage (name, key) VALUES (l.name, ''), (l.name, c.limit_key)
                ON CONFLICT DO NOTHING;
                UPDATE state.limit_usage
                   SET in_use = in_use + 1, wait_count = wait_count + 1, wait_sum = wait_sum + v_waited,
                       wait_buckets[v_bucket] = coalesce(wait_buckets[v_bucket], 0) + 1
                 WHERE name = l.name AND key = ''
                RETURNING in_use INTO v_used;
                IF l.per_key AND c.limit_key <> '' THEN
                    UPDATE state.limit_usage SET in_use = in_use + 1 WHERE name = l.name AND key = c.limit_key
                    RETURNING in_use INTO v_used;
                END IF;
                -- Full now (as the check above counts): none of its waiters (of its key) starts in this call.
                IF l.max_concurrent > 0 AND v_used >= l.max_concurrent THEN
                    v_full := v_full || CASE WHEN l.per_key THEN l.name || '/' || c.limit_key ELSE l.name::text END;
                END IF;
                IF l.rate_n IS NOT NULL THEN
                    SELECT * INTO u FROM state.limit_usage
                     WHERE name = l.name AND key = CASE WHEN l.per_key THEN c.limit_key ELSE '' END;
                    UPDATE state.limit_usage SET tokens = tw.flow_tokens(l, u) - 1, refilled_at = now()
                     WHERE name = u.name AND key = u.key;
                END IF;
                UPDATE state.limit_usage SET last_grant_at = clock_timestamp() WHERE name = l.name AND key = c.limit_key;
            END LOOP;
            UPDATE state.limit_calls SET status = 'holding', granted_at = now()
             WHERE turn_id = c.turn_id AND step = c.step AND tool_call_id = c.tool_call_id;
            IF c.agent IS NOT NULL THEN
                v_pub := v_pub || tw.flow_turn_start(c.turn_id, c.agent, c.ledger_id);
                CONTINUE;
            END IF;
            -- Its message; the first for one of p_worker's tools taken for that worker: no doorbell, no claim.
            IF job IS NULL AND c.tool = ANY (p_tools) THEN
                job := tw.flow_call_message(c.turn_id, c.step, c.tool_call_id, p_worker);
                CONTINUE WHEN job IS NOT NULL;  -- else written for a claim
            ELSE
                PERFORM tw.flow_call_message(c.turn_id, c.step, c.tool_call_id);
            END IF;
            IF NOT c.tool = ANY (v_tools) THEN
                v_tools := v_tools || c.tool;
                v_pub := v_pub || tw.doorbell('tool', c.tool, 'tool.call');
            END IF;
        END LOOP;
        EXIT rounds WHEN NOT v_deeper OR cardinality(v_seen) >= 1000 OR p_locked <@ v_full;
        v_each := v_each * 4;
    END LOOP rounds;
    IF v_retry THEN
        -- A waiter needs a limit another transaction holds: the rule tries again in a moment.
        v_at := now() + interval '20 milliseconds';
        UPDATE state.limits SET next_grant_at = least(next_grant_at, v_at)
         WHERE name = ANY (p_locked) AND (next_grant_at IS NULL OR next_grant_at > v_at);
        v_next := least(v_next, v_at);
    END IF;
    IF v_next IS NOT NULL THEN
        PERFORM pg_notify('tw_due', 'limit');
    END IF;
    publish := v_pub;
END $$;

-- tw.flow_grant_take with no worker to take for: the doorbells to ring.
CREATE OR REPLACE FUNCTION tw.flow_grant(p_locked text[])
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN (tw.flow_grant_take(p_locked, NULL, NULL)).publish;
END $$;

-- A limited call ends (its result, its timeout, a cancel, its turn's end): its slots back. The caller holds the
-- call's turn_waiting_tools row (or its turn). Returns the limits it locked, for the grant of the next waiters in
-- the same transaction (tw.flow_release, or tw.deliver_result's tw.flow_grant_take); NULL when the call was not
-- a limited one.
CREATE OR REPLACE FUNCTION tw.flow_release_slots(p_turn uuid, p_step integer, p_call text)
RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
    c        state.limit_calls;
    v_limits text[];
    v_locked text[];
BEGIN
    SELECT limits INTO v_limits FROM state.limit_calls
     WHERE turn_id = p_turn AND step = p_step AND tool_call_id = p_call;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_locked := tw.flow_lock(v_limits);
    DELETE FROM state.limit_calls WHERE turn_id = p_turn AND step = p_step AND tool_call_id = p_call
    RETURNING * INTO c;
    IF c.status = 'holding' THEN
        -- The limit's count and its key's (a key's counts only when the limit is per_key: 0 otherwise, left
        -- so), also of a limit removed meanwhile: its usage stays while it has holders, so that a limit of the
        -- same name set again counts them, and goes with the last of them.
        UPDATE state.limit_usage SET in_use = in_use - 1
         WHERE name = ANY (c.limits) AND (key = '' OR (key = c.limit_key AND c.limit_key <> '')) AND in_use > 0;
        DELETE FROM state.limit_usage u WHERE u.name = ANY (c.limits)
           AND NOT EXISTS (SELECT 1 FROM state.limits x WHERE x.name = u.name)
           AND NOT EXISTS (SELECT 1 FROM state.limit_usage y WHERE y.name = u.name AND y.in_use > 0);
    END IF;
    RETURN v_locked;
END $$;

-- A limited call ends: its slots back, the next waiters granted. Returns the doorbells to ring.
CREATE OR REPLACE FUNCTION tw.flow_release(p_turn uuid, p_step integer, p_call text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_locked text[] := tw.flow_release_slots(p_turn, p_step, p_call);
BEGIN
    RETURN CASE WHEN v_locked IS NULL THEN '[]'::jsonb ELSE tw.flow_grant(v_locked) END;
END $$;

-- Every limited call of the turns p_turns ends (the turns end or go back for another attempt).
CREATE OR REPLACE FUNCTION tw.flow_release_turns(p_turns uuid[])
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r     record;
    v_pub jsonb := '[]'::jsonb;
BEGIN
    FOR r IN SELECT turn_id, step, tool_call_id FROM state.limit_calls WHERE turn_id = ANY (p_turns)
              ORDER BY turn_id, step, tool_call_id LOOP
        v_pub := v_pub || tw.flow_release(r.turn_id, r.step, r.tool_call_id);
    END LOOP;
    RETURN v_pub;
END $$;

-- The step p_turn's calls made (tw.apply_step, for each call whose tool has limits) wait for their limits;
-- those that can start now are granted. Returns the doorbells to ring.
CREATE OR REPLACE FUNCTION tw.flow_ask(t state.turns, p_calls text[])
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_limits text[];
BEGIN
    INSERT INTO state.limit_calls (turn_id, step, tool_call_id, tool, limits, limit_key, priority)
    SELECT w.turn_id, w.step, w.tool_call_id, w.tool, w.limits, coalesce(t.limit_key, ''), t.priority
      FROM state.turn_waiting_tools w
     WHERE w.turn_id = t.turn_id AND w.step = t.step AND w.tool_call_id = ANY (p_calls)
     ORDER BY w.call_index;
    v_limits := ARRAY(SELECT DISTINCT n FROM state.turn_waiting_tools w, unnest(w.limits) n
                       WHERE w.turn_id = t.turn_id AND w.step = t.step AND w.tool_call_id = ANY (p_calls));
    RETURN tw.flow_grant(tw.flow_lock(v_limits));
END $$;

-- Pushback: call w of turn t (the caller holds both rows, and has archived the call's claim) got rate_limited
-- with p_error's retry_after_seconds (1 when it gives none). While it has tries left ([tool.T]
-- rate_limited_retries, w.rl_max) and the turn's deadline is further than the pause: the limits the call names
-- (a tool without any: its own, tool-T, made here) are paused until then for every worker, the call gives back its
-- slots and waits again in its place, the try goes into w.tries, and its own deadline starts again at its next
-- start. Returns the doorbells to ring, or NULL when the call ends with this error instead.
CREATE OR REPLACE FUNCTION tw.flow_pushback(t state.turns, w state.turn_waiting_tools, p_error jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    c        state.limit_calls;
    v_after  numeric;
    v_until  timestamptz;
    v_limits text[] := w.limits;
    v_locked text[];
    v_pub    jsonb;
BEGIN
    IF coalesce(jsonb_array_length(w.tries), 0) >= coalesce(w.rl_max, 3) THEN
        RETURN NULL;
    END IF;
    v_after := CASE WHEN jsonb_typeof(p_error -> 'retry_after_seconds') = 'number'
                    THEN least(greatest((p_error ->> 'retry_after_seconds')::numeric, 0), 3600) ELSE 1 END;
    v_until := now() + make_interval(secs => v_after);
    IF t.deadline_at IS NOT NULL AND v_until >= t.deadline_at THEN
        RETURN NULL;
    END IF;
    IF v_limits IS NULL THEN
        IF octet_length(w.tool) > 59 THEN
            RETURN NULL;
        END IF;
        v_limits := ARRAY['tool-' || w.tool];
        INSERT INTO state.limits (name) VALUES (v_limits[1]) ON CONFLICT DO NOTHING;
        -- As a limited call: its deadline counts from its start, which it loses now.
        UPDATE state.turn_waiting_tools
           SET limits = v_limits,
               wait_seconds = ceil(extract(epoch FROM w.deadline_at - w.created_at))::integer,
               warn_seconds = extract(epoch FROM w.warn_at - w.created_at)::double precision
         WHERE turn_id = w.turn_id AND step = w.step AND tool_call_id = w.tool_call_id;
    END IF;
    v_locked := tw.flow_lock(v_limits);
    UPDATE state.limits
       SET paused_until = greatest(coalesce(paused_until, v_until), v_until),
           next_grant_at = least(coalesce(next_grant_at, v_until), v_until), updated_at = now()
     WHERE name = ANY (v_locked);
    SELECT * INTO c FROM state.limit_calls WHERE turn_id = w.turn_id AND step = w.step AND tool_call_id = w.tool_call_id;
    IF NOT FOUND THEN
        INSERT INTO state.limit_calls (turn_id, step, tool_call_id, tool, limits, limit_key, priority)
        VALUES (w.turn_id, w.step, w.tool_call_id, w.tool, v_limits, coalesce(t.limit_key, ''), t.priority);
    ELSIF c.status = 'holding' THEN
        UPDATE state.limit_usage SET in_use = in_use - 1
         WHERE name = ANY (c.limits) AND (key = '' OR (key = c.limit_key AND c.limit_key <> '')) AND in_use > 0;
        UPDATE state.limit_calls SET status = 'waiting', granted_at = NULL, since = now()
         WHERE turn_id = c.turn_id AND step = c.step AND tool_call_id = c.tool_call_id;
    END IF;
    UPDATE state.turn_waiting_tools
       SET tries = coalesce(tries, '[]'::jsonb)
                   || jsonb_build_object('try', coalesce(jsonb_array_length(tries), 0) + 1, 'started_at', started_at,
                                         'ended_at', now(), 'error', p_error),
           started_at = NULL, warn_at = NULL, deadline_at = tw.flow_wait_deadline(v_limits)
     WHERE turn_id = w.turn_id AND step = w.step AND tool_call_id = w.tool_call_id;
    UPDATE state.turns x
       SET resume_deadline = (SELECT min(y.deadline_at) FROM state.turn_waiting_tools y
                               WHERE y.turn_id = x.turn_id AND y.step = x.step AND y.wait_status = 'waiting')
     WHERE x.turn_id = t.turn_id;
    v_pub := tw.flow_grant(v_locked);
    PERFORM pg_notify('tw_due', 'limit');
    RETURN v_pub;
END $$;

-- The deadline of a limited call while it waits: its limits' shortest max_wait_seconds, or none (a century: the
-- turn's deadline ends it first; a finite time keeps the due-time arithmetic finite).
CREATE OR REPLACE FUNCTION tw.flow_wait_deadline(p_limits text[])
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT coalesce(now() + make_interval(secs => min(max_wait_seconds) FILTER (WHERE max_wait_seconds > 0)),
                    now() + interval '100 years')
      FROM state.limits WHERE name = ANY (p_limits)
$$;

-- ---- the limits themselves

-- Check one limit's settings; raises 22023 with what is wrong.
CREATE OR REPLACE FUNCTION tw.flow_check(p_name text, p_max_concurrent integer, p_rate_n integer,
                                         p_rate_seconds numeric, p_burst integer, p_max_wait_seconds numeric)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT tw.name_ok(p_name) THEN
        RAISE EXCEPTION 'a limit name is 1 to 64 of A-Z a-z 0-9 _ -, not %', coalesce(quote_literal(left(p_name, 80)), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_max_concurrent IS NULL OR p_max_concurrent < 0 OR p_max_concurrent > 1000000 THEN
        RAISE EXCEPTION 'max_concurrent must be 0 (no cap) to 1000000' USING ERRCODE = '22023';
    END IF;
    IF (p_rate_n IS NULL) <> (p_rate_seconds IS NULL) THEN
        RAISE EXCEPTION 'a rate needs both its count and its seconds' USING ERRCODE = '22023';
    END IF;
    IF p_rate_n IS NOT NULL AND (p_rate_n < 1 OR p_rate_n > 1000000 OR p_rate_seconds <= 0
                                 OR p_rate_seconds > 86400) THEN
        RAISE EXCEPTION 'a rate is 1 to 1000000 starts per more than 0 to 86400 seconds' USING ERRCODE = '22023';
    END IF;
    IF p_burst IS NOT NULL AND (p_rate_n IS NULL OR p_burst < 1 OR p_burst > 1000000) THEN
        RAISE EXCEPTION 'burst is 1 to 1000000, and only with a rate' USING ERRCODE = '22023';
    END IF;
    IF p_max_wait_seconds IS NULL OR p_max_wait_seconds < 0 OR p_max_wait_seconds > 604800 THEN
        RAISE EXCEPTION 'max_wait_seconds must be 0 (the turn''s deadline) to 604800' USING ERRCODE = '22023';
    END IF;
END $$;

-- Write one limit (p_source 'ini' or 'sql') and grant what its new settings let start.
CREATE OR REPLACE FUNCTION tw.flow_put(p_name text, p_max_concurrent integer, p_rate_n integer,
                                       p_rate_seconds numeric, p_burst integer, p_per_key boolean,
                                       p_max_wait_seconds numeric, p_source text)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tw.flow_check(p_name, p_max_concurrent, p_rate_n, p_rate_seconds, p_burst, p_max_wait_seconds);
    INSERT INTO state.limits (name, max_concurrent, rate_n, rate_seconds, burst, per_key, max_wait_seconds, source)
    VALUES (p_name, p_max_concurrent, p_rate_n, p_rate_seconds, p_burst, coalesce(p_per_key, false),
            p_max_wait_seconds, p_source)
    ON CONFLICT (name) DO UPDATE
       SET max_concurrent = EXCLUDED.max_concurrent, rate_n = EXCLUDED.rate_n, rate_seconds = EXCLUDED.rate_seconds,
           burst = EXCLUDED.burst, per_key = EXCLUDED.per_key, max_wait_seconds = EXCLUDED.max_wait_seconds,
           source = CASE WHEN p_source = 'ini' THEN 'ini' ELSE state.limits.source END, updated_at = now()
     WHERE (state.limits.max_concurrent, state.limits.rate_n, state.limits.rate_seconds, state.limits.burst,
            state.limits.per_key, state.limits.max_wait_seconds, state.limits.source)
           IS DISTINCT FROM (EXCLUDED.max_concurrent, EXCLUDED.rate_n, EXCLUDED.rate_seconds, EXCLUDED.burst,
                             EXCLUDED.per_key, EXCLUDED.max_wait_seconds,
                             CASE WHEN p_source = 'ini' THEN 'ini' ELSE state.limits.source END);
    RETURN tw.flow_grant(tw.flow_lock(ARRAY[p_name]));
END $$;

-- Remove one limit: it no longer applies, its waiters are granted by what else they name. The limit and the
-- others its waiters and holders name are locked together, in name order. NULL when there is no such limit.
CREATE OR REPLACE FUNCTION tw.flow_drop(p_name text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_locked text[];
BEGIN
    v_locked := tw.flow_lock(ARRAY[p_name] || ARRAY(SELECT DISTINCT n FROM state.limit_calls c, unnest(c.limits) n
                                                     WHERE c.limits @> ARRAY[p_name]));
    IF NOT p_name = ANY (v_locked) THEN
        RETURN NULL;
    END IF;
    DELETE FROM state.limits WHERE name = p_name;
    -- Its usage goes now when nothing holds it; else with the last holder (tw.flow_release).
    DELETE FROM state.limit_usage u WHERE u.name = p_name
       AND NOT EXISTS (SELECT 1 FROM state.limit_usage y WHERE y.name = p_name AND y.in_use > 0);
    -- Its waiters: as their other limits allow, or at once when they name no other that exists.
    RETURN tw.flow_grant(array_remove(v_locked, p_name)) || tw.flow_grant_orphans();
END $$;

-- Waiters none of whose limits exist (all removed): they start at once.
CREATE OR REPLACE FUNCTION tw.flow_grant_orphans()
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    c     state.limit_calls;
    v_pub jsonb := '[]'::jsonb;
BEGIN
    FOR c IN SELECT * FROM state.limit_calls w
              WHERE w.status = 'waiting' AND NOT EXISTS (SELECT 1 FROM state.limits l WHERE l.name = ANY (w.limits))
              ORDER BY w.seq FOR UPDATE SKIP LOCKED LOOP
        CONTINUE WHEN c.agent IS NOT NULL AND tw.flow_turn_ready(c.turn_id, c.ledger_id) <> 'ok';
        UPDATE state.limit_calls SET status = 'holding', granted_at = now()
         WHERE turn_id = c.turn_id AND step = c.step AND tool_call_id = c.tool_call_id;
        IF c.agent IS NOT NULL THEN
            v_pub := v_pub || tw.flow_turn_start(c.turn_id, c.agent, c.ledger_id);
            CONTINUE;
        END IF;
        PERFORM tw.flow_call_message(c.turn_id, c.step, c.tool_call_id);
        v_pub := v_pub || tw.doorbell('tool', c.tool, 'tool.call');
    END LOOP;
    RETURN v_pub;
END $$;

-- The INI's limits, from a worker at start and after a reload: [{"name","max_concurrent","rate_n","rate_seconds",
-- "burst","per_key","max_wait_seconds"}]. Each is written (a limit of the same name set at run time is the INI's
-- again); an INI limit the list lacks is removed. Returns the doorbells to ring.
CREATE OR REPLACE FUNCTION tw.sync_limits(p_limits jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r     record;
    v_pub jsonb := '[]'::jsonb;
BEGIN
    FOR r IN SELECT * FROM jsonb_to_recordset(p_limits)
                 AS x (name text, max_concurrent integer, rate_n integer, rate_seconds numeric, burst integer,
                       per_key boolean, max_wait_seconds numeric)
              ORDER BY x.name LOOP
        v_pub := v_pub || tw.flow_put(r.name, coalesce(r.max_concurrent, 0), r.rate_n, r.rate_seconds, r.burst,
                                      r.per_key, coalesce(r.max_wait_seconds, 0), 'ini');
    END LOOP;
    FOR r IN SELECT name FROM state.limits
              WHERE source = 'ini' AND NOT name IN (SELECT x ->> 'name' FROM jsonb_array_elements(p_limits) x)
              ORDER BY name LOOP
        v_pub := v_pub || coalesce(tw.flow_drop(r.name), '[]'::jsonb);
    END LOOP;
    RETURN v_pub;
END $$;

-- SQL API (client role): set a limit at run time. A limit of the INI keeps what is set here until the next
-- reload or start of a worker.
CREATE OR REPLACE FUNCTION tw.set_limit(p_name text, p_max_concurrent integer DEFAULT 0, p_rate_n integer DEFAULT NULL,
                                        p_rate_seconds numeric DEFAULT NULL, p_burst integer DEFAULT NULL,
                                        p_per_key boolean DEFAULT false, p_max_wait_seconds numeric DEFAULT 0)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_pub jsonb;
BEGIN
    v_pub := tw.flow_put(p_name, p_max_concurrent, p_rate_n, p_rate_seconds, p_burst, p_per_key, p_max_wait_seconds,
                         'sql');
    PERFORM tw.durable_answer();
    PERFORM tw.api_publish(v_pub);
    RETURN tw.limit_show(p_name);
END $$;

-- SQL API (client role): remove a limit; true when there was one.
CREATE OR REPLACE FUNCTION tw.remove_limit(p_name text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_pub jsonb;
BEGIN
    IF NOT tw.name_ok(p_name) THEN
        RAISE EXCEPTION 'a limit name is 1 to 64 of A-Z a-z 0-9 _ -' USING ERRCODE = '22023';
    END IF;
    v_pub := tw.flow_drop(p_name);
    IF v_pub IS NULL THEN
        RETURN false;
    END IF;
    PERFORM tw.durable_answer();
    PERFORM tw.api_publish(v_pub);
    RETURN true;
END $$;

-- One limit as `turnwatch limits show` gives it: its settings, in use, waiting, tokens now, paused until, and
-- by key (the keys in use or waiting). NULL when there is no such limit.
CREATE OR REPLACE FUNCTION tw.limit_show(p_name text)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
               'name', l.name, 'max_concurrent', l.max_concurrent, 'rate_n', l.rate_n,
               'rate_seconds', l.rate_seconds, 'burst', coalesce(l.burst, l.rate_n), 'per_key', l.per_key,
               'max_wait_seconds', l.max_wait_seconds, 'source', l.source,
               'in_use', (SELECT count(*) FROM state.limit_calls c WHERE c.status = 'holding' AND c.limits @> ARRAY[l.name::text]),
               'waiting', (SELECT count(*) FROM state.limit_calls c WHERE c.status = 'waiting' AND c.limits @> ARRAY[l.name::text]),
               'tokens', CASE WHEN l.rate_n IS NOT NULL AND NOT l.per_key
                              THEN round(tw.flow_tokens(l, (SELECT u FROM state.limit_usage u
                                                             WHERE u.name = l.name AND u.key = ''))::numeric, 3) END,
               'paused_until', CASE WHEN l.paused_until > now() THEN l.paused_until END,
               'oldest_wait_seconds', (SELECT round(extract(epoch FROM now() - min(c.since)), 3) FROM state.limit_calls c
                                        WHERE c.status = 'waiting' AND c.limits @> ARRAY[l.name::text]),
               'keys', (SELECT coalesce(jsonb_agg(jsonb_build_object('key', k.limit_key, 'in_use', k.h, 'waiting', k.w)
                                                  ORDER BY k.limit_key), '[]'::jsonb)
                          FROM (SELECT c.limit_key, count(*) FILTER (WHERE c.status = 'holding') AS h,
                                       count(*) FILTER (WHERE c.status = 'waiting') AS w
                                  FROM state.limit_calls c WHERE c.limits @> ARRAY[l.name::text] AND c.limit_key <> ''
                                 GROUP BY c.limit_key) k),
               'updated_at', l.updated_at)
      FROM state.limits l WHERE l.name = p_name
$$;

-- Every limit, by name (`turnwatch limits list`).
CREATE OR REPLACE FUNCTION tw.limits_list()
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(tw.limit_show(name) ORDER BY name), '[]'::jsonb) FROM state.limits
$$;

-- ---- metrics

-- The upper bounds (seconds) of turnwatch_limit_wait_seconds' buckets.
CREATE OR REPLACE FUNCTION tw.flow_wait_bounds()
RETURNS double precision[] LANGUAGE sql IMMUTABLE AS $$
    SELECT '{0.001,0.005,0.01,0.05,0.1,0.5,1,5,10,30,60,300,1800}'::double precision[]
$$;

-- The metrics of flow control, for a PMO's /metrics (common/metrics.c): per limit (the first 1000 by name), the
-- calls holding it and waiting for it, and how long the calls granted waited (cumulative buckets, as the
-- Prometheus histogram turnwatch_limit_wait_seconds has them).
CREATE OR REPLACE FUNCTION tw.limits_metrics()
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'limit', l.name,
               'in_use', (SELECT count(*) FROM state.limit_calls c WHERE c.status = 'holding' AND c.limits @> ARRAY[l.name::text]),
               'waiting', (SELECT count(*) FROM state.limit_calls c WHERE c.status = 'waiting' AND c.limits @> ARRAY[l.name::text]),
               'bounds', to_jsonb(tw.flow_wait_bounds()),
               'buckets', (SELECT jsonb_agg((SELECT coalesce(sum(coalesce(u.wait_buckets[j], 0)), 0)
                                               FROM generate_series(1, i) j) ORDER BY i)
                             FROM generate_series(1, cardinality(tw.flow_wait_bounds()) + 1) i),
               'sum', coalesce(u.wait_sum, 0), 'count', coalesce(u.wait_count, 0)) ORDER BY l.name), '[]'::jsonb)
      FROM (SELECT * FROM state.limits ORDER BY name LIMIT 1000) l
      LEFT JOIN state.limit_usage u ON u.name = l.name AND u.key = ''
$$;
