-- Timeout policies (docs/timeouts.md): a profile's policy, retries, timeout details, failed steps.

-- The policy of a profile (an [agent.NAME] section; every agent of the roster bound to it shares it), or the shipped defaults when no daemon published one.
CREATE OR REPLACE FUNCTION tw.policy(p_profile text)
RETURNS state.policies LANGUAGE plpgsql STABLE AS $$
DECLARE
    p state.policies;
BEGIN
    SELECT * INTO p FROM state.policies WHERE profile = p_profile;
    IF NOT FOUND THEN
        p := tw.policy_default(p_profile);  -- common/registry.h, generated into registry.sql
    END IF;
    RETURN p;
END $$;

-- A daemon publishes the policies of its configuration's agents when it connects:
-- [{"profile","max_attempts","retry_on":[...],"retry_backoff_seconds","retry_backoff_max_seconds",
-- "queue_timeout_seconds","warn_at_percent","tool_timeout_seconds","step_timeout_seconds"}]. A row changes only
-- when a value does (the last daemon to start with a different configuration wins); the queue budgets and
-- warning times of the turns of a changed profile that wait or run are set again, so a turn submitted before
-- any daemon published its policy, or before the policy changed, has the one in force. Returns the profiles
-- changed.
CREATE OR REPLACE FUNCTION tw.publish_policies(p_policies jsonb, p_by text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_changed text[];
    v_t       state.turns;
    v_n       integer := 0;
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
    -- The pending turns of those profiles (the queue) and their agents' active ones, locked in the lock
    -- order of every path (agents by name, then turns); a warning already sent is not planned again. Taking the
    -- agents waits for a submit in flight (it holds its agent FOR SHARE, or has just inserted it: every profile
    -- is an agent of its name), so its turn is updated here or was queued under the new policy.
    INSERT INTO state.agents (agent, profile) SELECT a, a FROM unnest(v_changed) a ORDER BY a ON CONFLICT DO NOTHING;
    PERFORM 1 FROM state.agents WHERE agent = ANY (v_changed) ORDER BY agent FOR UPDATE;
    PERFORM 1 FROM state.turns
     WHERE turn_id IN (SELECT turn_id FROM state.turn_queue WHERE profile = ANY (v_changed)
                       UNION ALL
                       SELECT active_agent_turn_id FROM state.agents
                        WHERE agent = ANY (v_changed) AND active_agent_turn_id IS NOT NULL)
     ORDER BY turn_id FOR UPDATE;
    FOR v_t IN
    UPDATE state.turns t
       SET queue_deadline_at = CASE WHEN p.queue_timeout_seconds > 0 AND t.status IN ('pending', 'dispatched')
                                    THEN coalesce(t.retry_at, tw.turn_start_at(t))
                                         + make_interval(secs => p.queue_timeout_seconds) END,
           queue_warn_at = CASE WHEN p.queue_timeout_seconds > 0 AND p.warn_at_percent > 0
                                     AND t.status IN ('pending', 'dispatched')
                                     AND NOT EXISTS (SELECT 1 FROM state.turn_warnings x
                                                      WHERE x.turn_id = t.turn_id AND x.kind = 'queue'
                                                        AND x.attempt = t.attempt)
                                THEN coalesce(t.retry_at, tw.turn_start_at(t))
                                     + make_interval(secs => p.queue_timeout_seconds * p.warn_at_percent / 100.0)
                           END,
           deadline_warn_at = CASE WHEN t.deadline_at IS NOT NULL AND p.warn_at_percent > 0
                                        AND NOT EXISTS (SELECT 1 FROM state.turn_warnings x
                                                         WHERE x.turn_id = t.turn_id AND x.kind = 'turn_deadline')
                                   THEN t.deadline_at
                                        - make_interval(secs => tw.turn_deadline_seconds(t)
                                                                * (100 - p.warn_at_percent) / 100.0)
                              END
      FROM state.policies p
     WHERE p.profile = t.profile
       AND t.turn_id IN (SELECT turn_id FROM state.turn_queue WHERE profile = ANY (v_changed)
                         UNION ALL
                         SELECT active_agent_turn_id FROM state.agents
                          WHERE agent = ANY (v_changed) AND active_agent_turn_id IS NOT NULL)
    RETURNING t.*
    LOOP
        PERFORM tw.turns_move(ARRAY[v_t], true);  -- its timers as its columns now say
        v_n := v_n + 1;
    END LOOP;
    IF v_n > 0 THEN
        PERFORM pg_notify('tw_due', 'policy');
    END IF;
    RETURN cardinality(v_changed);
END $$;

-- The wait before the attempt after p_attempt: retry_backoff_seconds doubled per attempt, capped at
-- retry_backoff_max_seconds, then +-20 % jitter (never above the cap), in seconds.
CREATE OR REPLACE FUNCTION tw.retry_delay(p_attempt integer, p_base integer, p_max integer)
RETURNS double precision LANGUAGE sql VOLATILE AS $$
    SELECT least(b * (0.8 + 0.4 * random()), p_max::double precision)
      FROM (SELECT least(p_base * power(2::double precision, least(greatest(p_attempt, 1) - 1, 60)),
                         p_max::double precision) AS b) x
$$;

-- What a turn's end with error p_code becomes: 'retry' (another attempt), 'dead_letter' (it could have been
-- retried, but its attempts, or its deadline, are used up) or 'fail' (final by policy: max_attempts = 1, a code
-- not in retry_on, a cancel, the turn's own deadline).
CREATE OR REPLACE FUNCTION tw.end_policy(t state.turns, p_code text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
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

-- The `timeout` object of the events of a turn that ends (or is retried) with error p_code, NULL when the code
-- is not a timeout: {"kind","limit_seconds","elapsed_seconds","attempt","policy"}. p_given may carry
-- limit_seconds and elapsed_seconds (the worker's step timer); 2.5/2.6 pass their limit in the transaction
-- setting tw.timeout_limit; the others come from the turn.
CREATE OR REPLACE FUNCTION tw.timeout_detail(t state.turns, p_code text, p_policy text, p_given jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_kind  text := tw.error_timeout_kind(p_code);  -- common/registry.h
    v_since timestamptz;
    v_limit numeric;
BEGIN
    IF v_kind IS NULL THEN
        RETURN NULL;
    END IF;
    v_since := CASE v_kind WHEN 'turn_deadline' THEN tw.turn_start_at(t)
                           WHEN 'queue' THEN coalesce(t.retry_at, tw.turn_start_at(t)) ELSE t.updated_at END;
    v_limit := coalesce((p_given ->> 'limit_seconds')::numeric,
                        CASE v_kind WHEN 'turn_deadline' THEN tw.turn_deadline_seconds(t)
                                    WHEN 'queue' THEN extract(epoch FROM t.queue_deadline_at - v_since)
                                    WHEN 'step_timeout' THEN (tw.policy(t.profile)).step_timeout_seconds
                                    ELSE nullif(current_setting('tw.timeout_limit', true), '')::numeric END);
    RETURN jsonb_strip_nulls(jsonb_build_object(
        'kind', v_kind, 'limit_seconds', round(v_limit, 3),
        'elapsed_seconds', round(coalesce((p_given ->> 'elapsed_seconds')::numeric,
                                          extract(epoch FROM now() - v_since)), 3),
        'attempt', t.attempt, 'policy', coalesce(p_policy, tw.end_policy(t, p_code))));
END $$;

-- A turn ending with p_code: when its policy says retry, it goes back to `pending` for its next attempt, in the
-- caller's transaction: the work of this attempt is closed, the agent's epoch moves (and with p_idle the agent
-- goes idle and on to its next turn: the forced ends; without it the caller, apply_step, does that), the turn
-- gets attempt + 1, a fresh step numbering, retry_at = now + backoff and its queue budget again; the state event
-- idle (with the error and its timeout details) and evt.agent.<agent>.retry are written, and no fallback card
-- and no task event. Returns what to publish, or NULL when the turn is not retried (the caller ends it). The
-- caller holds the turn row (and the agent row, when the turn is the agent's active one).
CREATE OR REPLACE FUNCTION tw.retry_turn(t state.turns, p_code text, p_message text, p_idle boolean,
                                         p_given jsonb DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
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
    PERFORM tw.close_turn_work(ARRAY[t.turn_id], 'retried');
    IF t.status = 'pending' THEN
        v_epoch := NULL;  -- never dispatched: no agent holds it
    ELSIF p_idle THEN
        v_epoch := tw.agent_idle(t.agent, t.turn_id, true);
    ELSE
        UPDATE state.agents SET turn_epoch = turn_epoch + 1, updated_at = now()
         WHERE agent = t.agent AND active_agent_turn_id = t.turn_id
        RETURNING turn_epoch INTO v_epoch;
    END IF;
    SELECT * INTO t FROM state.turns WHERE turn_id = t.turn_id;  -- as the closing of its work left it
    t.status := 'pending';
    t.turn_epoch := coalesce(v_epoch, t.turn_epoch);
    t.attempt := t.attempt + 1;
    t.step := t.step + 1;
    t.step_base := t.step;
    t.agent_state := NULL;
    t.wait_mode := NULL;
    t.wait_count := NULL;
    t.resume_deadline := NULL;
    t.dispatched_at := NULL;
    t.started_at := NULL;
    t.suspended_at := NULL;
    t.rerung_at := NULL;
    t.error := NULL;
    t.error_message := NULL;
    t.timeout_detail := NULL;
    t.retry_at := v_at;
    t.retry_due_at := v_at;
    t.queue_deadline_at := CASE WHEN p.queue_timeout_seconds > 0
                                THEN v_at + make_interval(secs => p.queue_timeout_seconds) END;
    t.queue_warn_at := CASE WHEN p.queue_timeout_seconds > 0 AND p.warn_at_percent > 0
                            THEN v_at + make_interval(secs => p.queue_timeout_seconds * p.warn_at_percent / 100.0)
                       END;
    t.updated_at := now();
    t := tw.turn_move(t);
    PERFORM tw.history_reason(t.turn_id, t.attempt, false,
                              format('retry after %s%s', p_code, coalesce(': ' || p_message, '')));
    -- The PMO dispatches it at retry_at: tell it the next due time moved (transactional, no NATS needed).
    PERFORM pg_notify('tw_due', 'retry');
    IF v_epoch IS NOT NULL THEN
        v_pub := tw.emit('state', tw.ev_subject(t.agent, 'state'),
                         tw.ev_state(t.agent, t.profile, 'idle', t.turn_id, v_epoch, p_code, v_det),
                         t.turn_id, v_epoch);
    END IF;
    v_pub := v_pub || tw.emit('retry', tw.ev_subject(t.agent, 'retry'),
                              tw.ev_retry(t, p.max_attempts, p_code, p_message, v_at, v_det),
                              t.turn_id, t.turn_epoch);
    IF p_idle AND v_epoch IS NOT NULL THEN
        v_pub := v_pub || tw.dispatch_next(t.agent);
    END IF;
    RETURN v_pub;
END $$;

-- A step that failed (apply_step's `fail` reply, including the worker's step_timeout and agent_exit): a retry,
-- or the final `failed` with its events. The caller holds the agent and turn rows and dispatches afterwards.
CREATE OR REPLACE FUNCTION tw.step_failed(t state.turns, p_fail jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_code text := coalesce(p_fail ->> 'error', 'agent_failed');
    v_pub  jsonb := tw.retry_turn(t, v_code, p_fail ->> 'message', false, p_fail -> 'timeout');
BEGIN
    IF v_pub IS NOT NULL THEN
        RETURN v_pub;
    END IF;
    SELECT * INTO t FROM state.turns WHERE turn_id = t.turn_id;  -- as tw.retry_turn left it
    t.timeout_detail := tw.timeout_detail(t, v_code, NULL, p_fail -> 'timeout');
    t.status := 'failed';
    t.error := v_code;
    t.error_message := p_fail ->> 'message';
    t.ended_at := now();
    t.updated_at := now();
    t := tw.turn_move(t);
    RETURN tw.agent_state_event(t.agent, t.profile, 'idle', t.turn_id, t.turn_epoch, t.error) || tw.task_event(t);
END $$;
