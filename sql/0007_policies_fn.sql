-- migrate: repeatable (re-applied by `turnwatch migrate` whenever this text changes: CREATE OR REPLACE only;
-- a function whose signature or return type changes is dropped explicitly first).
-- Timeout policies (contract section 11): what a turn's end becomes under its agent's policy (a retry or a
-- final end, and the `timeout` details of its events), the retry, queue and warning rules fired at their due
-- times, dead letters and replay, and the turn history. The state machine in 0002 calls tw.retry_turn and
-- tw.step_failed where a turn ends; everything else is here.

-- Who is acting: the session setting tw.actor, which the daemons set to their id (host:pid) and the CLI to
-- `cli` on every connection; any other client is `sql`.
CREATE OR REPLACE FUNCTION tw.actor()
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('tw.actor', true), ''), 'sql')
$$;

-- Policies ----------------------------------------------------------------------------------------------

-- The policy of a profile (an [agent.NAME] section; every agent of the roster bound to it shares it), or the shipped defaults when no daemon published one.
CREATE OR REPLACE FUNCTION tw.policy(p_profile text)
RETURNS state.policies LANGUAGE plpgsql STABLE AS $$
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
                                        - make_interval(secs => tw.turn_deadline_seconds(t)
                                                                * (100 - p.warn_at_percent) / 100.0)
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

-- Retry ---------------------------------------------------------------------------------------------------

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
    UPDATE state.turns
       SET status = 'failed', error = v_code, error_message = p_fail ->> 'message', ended_at = now(),
           updated_at = now(), timeout_detail = tw.timeout_detail(t, v_code, NULL, p_fail -> 'timeout')
     WHERE turn_id = t.turn_id
    RETURNING * INTO t;
    RETURN tw.agent_state_event(t.agent, t.profile, 'idle', t.turn_id, t.turn_epoch, t.error) || tw.task_event(t);
END $$;

-- The PMO's retry rule: at retry_at an idle agent takes its retried turn (dispatch_next; a busy agent takes it
-- when its current turn ends). Once per retry: retry_due_at is cleared. Lock order: the agent (in
-- dispatch_next), then the turn.
CREATE OR REPLACE FUNCTION tw.wd_retry_due(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
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

-- Queue budget ---------------------------------------------------------------------------------------------

-- A turn not yet running queue_timeout_seconds after it was queued (submitted, or its retry_at) ends
-- timeout/queue_timeout (or is retried, if queue_timeout is in retry_on). Checked again under the locks, in
-- lock order (agent, then turn), like 2.5.
CREATE OR REPLACE FUNCTION tw.wd_queue_timeouts(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
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

-- Warnings ------------------------------------------------------------------------------------------------

-- One warning, once per deadline (the key of state.turn_warnings): evt.agent.<agent>.warning with kind, the
-- deadline's length, how much of it has passed and when it falls due. Returns what to publish ([] when this
-- deadline was warned of already).
CREATE OR REPLACE FUNCTION tw.warn(t state.turns, p_kind text, p_attempt integer, p_step integer, p_call text,
                                   p_limit numeric, p_elapsed numeric, p_due timestamptz)
RETURNS jsonb LANGUAGE plpgsql AS $$
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

-- The PMO's warnings: turn deadlines (--timeout) and queue budgets at warn_at_percent. The turn row alone is
-- locked (never the agent after it), and its warning time cleared: once each.
CREATE OR REPLACE FUNCTION tw.wd_pmo_warnings(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
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
            v_res := tw.warn(t, 'turn_deadline', 0, -1, NULL, tw.turn_deadline_seconds(t),
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

-- The worker's warnings: waiting tool calls at warn_at_percent of their 2.2 deadline. The waiting row is
-- locked (SKIP LOCKED), the turn only read: nothing here ever waits for a lock.
CREATE OR REPLACE FUNCTION tw.wd_tool_warnings(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
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

-- A step's warning, from the worker that runs it (the step timeout is its timer): p_fence is the step's job
-- ({"fence","id","token","turn_id","epoch","step"}); nothing when the step is no longer this worker's.
CREATE OR REPLACE FUNCTION tw.warn_step(p_fence jsonb, p_limit numeric, p_elapsed numeric)
RETURNS jsonb LANGUAGE plpgsql AS $$
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

-- When the rules above are next due, in ms from now (merged into tw.pmo_next_due / tw.worker_next_due).
CREATE OR REPLACE FUNCTION tw.pmo_policy_next_due()
RETURNS jsonb LANGUAGE sql STABLE AS $$
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

CREATE OR REPLACE FUNCTION tw.worker_policy_next_due()
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'warn', tw.ms_until((SELECT min(warn_at) FROM state.turn_waiting_tools
                              WHERE warn_at IS NOT NULL AND wait_status = 'waiting')))
$$;

-- Dead letters and replay ----------------------------------------------------------------------------------

-- The turns whose last attempt ended failed or timeout, newest first, with how often each was replayed.
CREATE OR REPLACE FUNCTION tw.dead_letters(p_agent text DEFAULT NULL, p_limit integer DEFAULT 100)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(to_jsonb(x) ORDER BY x.ended_at DESC, x.turn_id), '[]'::jsonb)
      FROM (SELECT t.turn_id, t.agent, t.channel_id, t.status, t.error, t.error_message, t.attempt,
                   (tw.policy(t.profile)).max_attempts, t.created_at, t.ended_at, t.replay_of, t.timeout_detail,
                   (SELECT count(*) FROM state.turns r WHERE r.replay_of = t.turn_id) AS replays
              FROM state.turns t
             WHERE t.status IN ('failed', 'timeout') AND (p_agent IS NULL OR t.agent = p_agent)
             ORDER BY t.ended_at DESC LIMIT p_limit) x
$$;

-- Replay a dead letter: a new turn with the same agent, channel, box, input and --timeout, replay_of = the old
-- one. Without p_again a turn that was replayed already gives its first replay back (created false), so a
-- repeated command does not run it twice.
CREATE OR REPLACE FUNCTION tw.replay_turn(p_turn uuid, p_again boolean DEFAULT false)
RETURNS TABLE (turn_id uuid, created boolean) LANGUAGE plpgsql AS $$
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
            PERFORM tw.durable_answer();
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

-- History -------------------------------------------------------------------------------------------------

-- Trigger: one history row per status (or attempt) change of a turn and at its creation. The reason is the
-- transaction setting tw.reason when the change set one (a retry, a replay), else what the change was.
CREATE OR REPLACE FUNCTION tw.turns_history()
RETURNS trigger LANGUAGE plpgsql AS $$
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

-- Trigger: what a new turn's policy fixes when it is queued (the queue budget, the warning before its deadline).
CREATE OR REPLACE FUNCTION tw.turns_queued()
RETURNS trigger LANGUAGE plpgsql AS $$
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
                                - make_interval(secs => tw.turn_deadline_seconds(NEW)
                                                        * (100 - p.warn_at_percent) / 100.0);
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER turns_queued BEFORE INSERT ON state.turns
    FOR EACH ROW EXECUTE FUNCTION tw.turns_queued();
CREATE OR REPLACE TRIGGER turns_history_insert AFTER INSERT ON state.turns
    FOR EACH ROW EXECUTE FUNCTION tw.turns_history();
CREATE OR REPLACE TRIGGER turns_history_update AFTER UPDATE OF status, attempt ON state.turns
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.attempt IS DISTINCT FROM NEW.attempt)
    EXECUTE FUNCTION tw.turns_history();

-- A reclaim hands a turn's step to another worker without changing its status: it is written to the history
-- here (agent steps only; p_item is the reclaimed inbox item or ledger entry as the reclaim logs it).
CREATE OR REPLACE FUNCTION tw.note_reclaim(p_item jsonb, p_why text)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO state.turn_history (turn_id, from_status, to_status, turn_epoch, attempt, actor, reason)
    SELECT t.turn_id, t.status, t.status, t.turn_epoch, t.attempt, tw.actor(),
           format('reclaimed: %s; step %s goes to another worker', p_why, (p_item ->> 'step')::integer - t.step_base)
      FROM state.turns t
     WHERE t.turn_id = (p_item ->> 'turn_id')::uuid AND coalesce(p_item ->> 'target_kind', 'agent') = 'agent'
$$;

-- `turnwatch turn history ID`: every transition in order.
CREATE OR REPLACE FUNCTION tw.turn_history(p_turn uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('at', h.at, 'from', h.from_status, 'to', h.to_status,
                                                 'turn_epoch', h.turn_epoch, 'attempt', h.attempt,
                                                 'actor', h.actor, 'reason', h.reason) ORDER BY h.id),
                    '[]'::jsonb)
      FROM state.turn_history h
     WHERE h.turn_id = p_turn
$$;
