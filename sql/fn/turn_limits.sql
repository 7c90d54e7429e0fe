-- Flow control for turns (docs/flow-control.md): a turn of a profile with limits ([agent.P] limits) holds them
-- from its dispatch until it suspends or ends, and asks again when it resumes. It waits in state.limit_calls as
-- a row of its own (step -1, tool_call_id '', agent set), granted by tw.flow_grant in the same order as calls.
--
-- A turn that waits to be dispatched is pending, its place in its agent's queue parked (ready_at a century
-- ahead), so that no dispatch takes it; its grant un-parks and dispatches it (tw.dispatch) in the grant's own
-- transaction. A suspended turn that waits to resume has its resume ledger entry held back (processing, no
-- worker, its lease a century ahead); its grant lets the entry go and rings the agent's doorbell. Every move of a
-- limited turn out of dispatched or running (suspended, back to pending, ended) gives its limits back and grants
-- the next waiters in the statement that moves it (tw.flow_moves_release, from the move).
--
-- Lock order: as for calls (sql/fn/limits.sql): the turn's agent and turn rows, then the limits' rows. A grant
-- that holds limits takes a waiting turn's rows with SKIP LOCKED, or leaves it to rule limit_grants.

-- A century ahead: a parked queue place, a held-back ledger entry (finite, for the due-time arithmetic).
CREATE OR REPLACE FUNCTION tw.flow_parked()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT now() + interval '100 years'
$$;

-- The limit a waiter with limits p_limits and key p_key waits for: the first by name that is paused, full or out
-- of tokens now; else the first it names.
CREATE OR REPLACE FUNCTION tw.flow_blocking(p_limits text[], p_key text)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT l.name::text FROM state.limits l
           LEFT JOIN state.limit_usage u ON u.name = l.name AND u.key = CASE WHEN l.per_key THEN p_key ELSE '' END
          WHERE l.name = ANY (p_limits)
            AND (l.paused_until > now() OR (l.max_concurrent > 0 AND coalesce(u.in_use, 0) >= l.max_concurrent)
                 OR tw.flow_tokens(l, u) < 1)
          ORDER BY l.name LIMIT 1),
        (SELECT min(n) FROM unnest(p_limits) n))
$$;

-- Whether the waiter of turn p_turn (resuming with ledger entry p_ledger, or NULL) can start now (tw.flow_grant, holding its limits): 'ok', 'skip' (not now: another
-- event will ask again) or 'retry' (a row it needs is held by another transaction: rule limit_grants soon).
-- A turn waiting for its dispatch starts only when its agent is idle and it is the head of its agent's queue;
-- an agent that is busy has the turn's place un-parked, so that its next dispatch takes the turn and asks again.
CREATE OR REPLACE FUNCTION tw.flow_turn_ready(p_turn uuid, p_ledger bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    t state.turns;
    a state.agents;
BEGIN
    SELECT * INTO t FROM state.turns WHERE turn_id = p_turn FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN CASE WHEN EXISTS (SELECT 1 FROM state.turns WHERE turn_id = p_turn) THEN 'retry' ELSE 'skip' END;
    END IF;
    IF p_ledger IS NOT NULL THEN
        RETURN CASE WHEN t.status = 'suspended' THEN 'ok' ELSE 'skip' END;
    END IF;
    IF t.status <> 'pending' THEN
        RETURN 'skip';
    END IF;
    IF current_setting('tw.flow_dispatching', true) = p_turn::text THEN
        RETURN 'ok';  -- this transaction is dispatching it (tw.flow_dispatch)
    END IF;
    SELECT * INTO a FROM state.agents WHERE agent = t.agent FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 'retry';
    END IF;
    IF a.status <> 'idle'
       OR EXISTS (SELECT 1 FROM state.turn_queue q WHERE q.agent = t.agent AND q.seq < t.seq
                                                     AND (q.ready_at IS NULL OR q.ready_at <= now())) THEN
        PERFORM tw.turn_place_park(t, false);
        RETURN 'skip';
    END IF;
    RETURN 'ok';
END $$;

-- The waiter of turn p_turn (agent p_agent, ledger entry p_ledger or NULL) was granted (tw.flow_grant took its slots and marked it holding): a held-back resume goes to the
-- workers, a parked turn is dispatched. Returns the doorbells and events to publish.
CREATE OR REPLACE FUNCTION tw.flow_turn_start(p_turn uuid, p_agent text, p_ledger bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    t         state.turns;
    v_profile text;
BEGIN
    IF p_ledger IS NOT NULL THEN
        UPDATE state.turn_resume_ledger SET status = 'pending', lease_expires_at = NULL, updated_at = now()
         WHERE ledger_id = p_ledger AND status = 'processing' AND claimed_by IS NULL
        RETURNING profile INTO v_profile;
        RETURN CASE WHEN FOUND THEN tw.doorbell('agent', p_agent, 'resume', v_profile) ELSE '[]'::jsonb END;
    END IF;
    IF current_setting('tw.flow_dispatching', true) = p_turn::text THEN
        RETURN '[]'::jsonb;  -- its own dispatch goes on (tw.flow_dispatch)
    END IF;
    SELECT * INTO t FROM state.turns WHERE turn_id = p_turn;  -- locked by tw.flow_turn_ready
    IF NOT FOUND OR NOT tw.turn_place_park(t, false) THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN tw.flow_dispatch(p_agent);
END $$;

-- Ask for turn t's limits p_limits; the caller holds its agent and turn rows. Grants it when nothing else waits for
-- those limits and they have room (the waiters already there go first). Returns whether it holds them now.
CREATE OR REPLACE FUNCTION tw.flow_turn_ask_(t state.turns, p_limits text[], p_ledger bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_locked text[];
    v_status text;
BEGIN
    INSERT INTO state.limit_calls (turn_id, step, tool_call_id, tool, limits, limit_key, priority, agent, ledger_id)
    VALUES (t.turn_id, -1, '', '', p_limits, coalesce(t.limit_key, ''), t.priority, t.agent, p_ledger)
    ON CONFLICT (turn_id, step, tool_call_id) DO NOTHING;
    SELECT status INTO v_status FROM state.limit_calls WHERE turn_id = t.turn_id AND step = -1 AND tool_call_id = '';
    IF v_status = 'holding' THEN
        RETURN true;
    END IF;
    IF t.flow_limits IS DISTINCT FROM p_limits THEN
        UPDATE state.turns SET flow_limits = p_limits WHERE turn_id = t.turn_id;
    END IF;
    v_locked := tw.flow_lock(p_limits);
    IF NOT EXISTS (SELECT 1 FROM state.limit_calls w
                    WHERE w.status = 'waiting' AND w.limits && v_locked AND w.turn_id <> t.turn_id) THEN
        PERFORM tw.api_publish(tw.flow_grant(v_locked));
        SELECT status INTO v_status FROM state.limit_calls
         WHERE turn_id = t.turn_id AND step = -1 AND tool_call_id = '';
        IF v_status = 'holding' THEN
            RETURN true;
        END IF;
    END IF;
    UPDATE state.limit_calls SET blocked = tw.flow_blocking(limits, limit_key)
     WHERE turn_id = t.turn_id AND step = -1 AND tool_call_id = '';
    PERFORM pg_notify('tw_due', 'limit');  -- its max_wait_seconds (rule limit_grants)
    RETURN false;
END $$;

-- Dispatch idle agent p_agent (the caller holds its row) whose queue head is a turn of a profile with limits
-- (tw.next_turns leaves those here): the turn asks for its limits and, when it holds them, is dispatched by
-- tw.next_turns as any other (p_asked); else its place in the queue is parked until its grant
-- (tw.flow_turn_start) and it waits, pending with the reason waiting_limit:NAME. Lock order: the agent (the
-- caller's), the turn, then its queue place and the limits' rows. Returns what to publish.
CREATE OR REPLACE FUNCTION tw.flow_dispatch(p_agent text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    t       state.turns;
    v_next  uuid;
    v_lims  text[];
    v_holds boolean;
BEGIN
    SELECT q.turn_id, p.limits INTO v_next, v_lims
      FROM state.turn_queue q LEFT JOIN state.profiles p ON p.profile = q.profile
     WHERE q.agent = p_agent AND (q.ready_at IS NULL OR q.ready_at <= now())
     ORDER BY q.seq LIMIT 1;
    IF v_next IS NULL THEN
        RETURN '[]'::jsonb;
    END IF;
    SELECT * INTO t FROM state.turns WHERE turn_id = v_next AND status = 'pending' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN '[]'::jsonb;  -- ended meanwhile: its place goes with its end
    END IF;
    IF v_lims IS NOT NULL THEN
        PERFORM set_config('tw.flow_dispatching', t.turn_id::text, true);
        v_holds := tw.flow_turn_ask_(t, v_lims, NULL);
        PERFORM set_config('tw.flow_dispatching', '', true);
        IF NOT v_holds THEN
            PERFORM tw.turn_place_park(t, true);
            RETURN '[]'::jsonb;
        END IF;
    END IF;
    RETURN tw.next_turns(ARRAY[p_agent], ARRAY[NULL::uuid], NULL, NULL, true) -> 'publish';
END $$;

-- tw.next_turns' hook: the agents p_agents (the caller holds their rows and made them idle) have a turn of a
-- limited profile at the head of their queue: each is dispatched on its own (tw.flow_dispatch, which asks).
CREATE OR REPLACE FUNCTION tw.flow_next_turns(p_agents text[])
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_agent text;
    v_pub   jsonb := '[]'::jsonb;
BEGIN
    FOREACH v_agent IN ARRAY p_agents LOOP
        v_pub := v_pub || tw.flow_dispatch(v_agent);
    END LOOP;
    RETURN v_pub;
END $$;

-- tw.consume_result's hook: limited turn t (the caller holds its row) resumes with ledger entry p_ledger: the
-- entry is held back until the turn has its limits again.
CREATE OR REPLACE FUNCTION tw.flow_turn_resume(t state.turns, p_ledger bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE state.turn_resume_ledger SET status = 'processing', lease_expires_at = tw.flow_parked()
     WHERE ledger_id = p_ledger;
    DELETE FROM state.limit_calls WHERE turn_id = t.turn_id AND step = -1 AND tool_call_id = '' AND status = 'waiting';
    PERFORM tw.flow_turn_ask_(t, t.flow_limits, p_ledger);
END $$;

-- The move's hook (tw.turn_move, tw.turns_move_set, before they write the rows): the limited turns among p_rows
-- (the rows as they are to be; flow_limits as their callers read them, holding them) that move out of dispatched or
-- running, or end while they wait, give their limits back, the next waiters granted and rung (NOTIFY tw_ring). A
-- call from the move rather than a trigger on state.turns, which cost every turn, limited or not, at each of its
-- moves (~190k instructions a lone turn, docs/performance.md).
CREATE OR REPLACE FUNCTION tw.flow_moves_release(p_rows state.turns[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tw.api_publish(tw.flow_release(o.turn_id, -1, ''))
       FROM unnest(p_rows) r JOIN state.turns o ON o.turn_id = r.turn_id
      WHERE r.flow_limits IS NOT NULL AND r.status NOT IN ('dispatched', 'running') AND o.flow_limits IS NOT NULL
        AND o.status IS DISTINCT FROM r.status
      ORDER BY o.turn_id;
END $$;

-- The workers' [agent.P] limits, with the INI's limits (tw_flow_limits_publish): {"P": ["a", "b"] | null, ...}
-- for every profile of the configuration. Returns [] (nothing to ring: a waiting turn keeps what it asked for).
CREATE OR REPLACE FUNCTION tw.sync_profile_limits(p_profiles jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    UPDATE state.profiles p
       SET limits = CASE WHEN jsonb_typeof(x.value) = 'array' AND jsonb_array_length(x.value) > 0
                         THEN ARRAY(SELECT jsonb_array_elements_text(x.value)) END
      FROM jsonb_each(coalesce(p_profiles, '{}'::jsonb)) x
     WHERE p.profile = x.key
       AND p.limits IS DISTINCT FROM CASE WHEN jsonb_typeof(x.value) = 'array' AND jsonb_array_length(x.value) > 0
                                          THEN ARRAY(SELECT jsonb_array_elements_text(x.value)) END;
    RETURN '[]'::jsonb;
END $$;

-- ---- waits in the history

-- Trigger: a waiter stops waiting (granted, or gone without its limits) after waiting since an earlier
-- transaction: a row of its turn's history says from when to when (the moment of the grant, in the transaction
-- that makes it), and for which limit.
CREATE OR REPLACE FUNCTION tw.limit_calls_waited()
RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_limit text := coalesce(OLD.blocked, OLD.limits[1]);
BEGIN
    INSERT INTO state.turn_history (at, turn_id, from_status, to_status, turn_epoch, attempt, actor, reason, profile,
                                    waited_from, wait_limit, tool_call_id)
    SELECT clock_timestamp(), t.turn_id, t.status, t.status, t.turn_epoch, t.attempt, tw.actor(),
           format('%s waited %s s for limit %s%s',
                  CASE WHEN OLD.agent IS NULL THEN format('tool call %s (%s)', OLD.tool_call_id, OLD.tool)
                       WHEN OLD.ledger_id IS NOT NULL THEN 'the resume' ELSE 'the turn' END,
                  round(extract(epoch FROM clock_timestamp() - OLD.since)::numeric, 3), v_limit,
                  CASE WHEN TG_OP = 'DELETE' THEN ', and ended without it' ELSE '' END),
           t.profile, OLD.since, v_limit, nullif(OLD.tool_call_id, '')
      FROM state.turns t WHERE t.turn_id = OLD.turn_id;
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER limit_calls_granted AFTER UPDATE OF status ON state.limit_calls
    FOR EACH ROW WHEN (OLD.status = 'waiting' AND NEW.status = 'holding' AND OLD.since < now())
    EXECUTE FUNCTION tw.limit_calls_waited();

CREATE OR REPLACE TRIGGER limit_calls_gone AFTER DELETE ON state.limit_calls
    FOR EACH ROW WHEN (OLD.status = 'waiting' AND OLD.since < now())
    EXECUTE FUNCTION tw.limit_calls_waited();

-- The reason a pending or suspended turn waits for its limits ('waiting_limit:NAME'), or NULL.
CREATE OR REPLACE FUNCTION tw.flow_turn_reason(p_turn uuid)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT 'waiting_limit:' || coalesce(c.blocked, c.limits[1]) FROM state.limit_calls c
     WHERE c.turn_id = p_turn AND c.step = -1 AND c.tool_call_id = '' AND c.status = 'waiting'
$$;
