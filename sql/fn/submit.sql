-- Submitting a turn (the SQL API of sections 12 and 14), and what its queueing fixes.

-- The one submit path (the CLI calls it too). Returns the turn and whether this call created it (false: the
-- idempotency key named an existing turn). An agent that does not exist is added in this transaction when a
-- profile is given (or when its own name is a profile: every profile is an agent of its name). p_known: the
-- profiles of the caller's own config (the CLI's), published here if no daemon has yet; looked at only when
-- the agent is new.
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

-- The SQL API (contract sections 12 and 14): callable in the caller's own transaction; the turn exists only if
-- that transaction commits, and the PMO hears of it through NOTIFY tw_turn at commit.
CREATE OR REPLACE FUNCTION tw.submit_turn(agent text, channel text, input jsonb, timeout_seconds integer DEFAULT NULL,
                                          idempotency_key text DEFAULT NULL, box text DEFAULT NULL,
                                          profile text DEFAULT NULL)
RETURNS uuid LANGUAGE sql AS $$
    SELECT turn_id FROM tw.submit_turn_ex($1, $2, $3, $4, $5, $6, $7)
$$;

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
