-- Schedules (PMO): each schedule's tick fires at its time (docs/schedules.md).

-- The schedules whose next_fire_at has come (schedules_next_fire_idx), up to p_limit, locked without waiting (a
-- schedule another PMO holds is that PMO's tick): one tick each per run. A tick fires one turn (idempotency key
-- schedule:NAME:<tick UTC>, in this transaction) or is recorded as skipped: overlap (the last turn has not ended,
-- overlap skip), catchup (missed while no PMO ran: reached more than tw.schedule_on_time() after its time, and
-- catchup none, or older than catchup_window_seconds, or with catchup last not the latest missed), error (the
-- submit was refused). Every tick is a row of state.schedule_ticks, whose primary key makes it once-only, and one
-- evt.schedule.<name>.tick event; next_fire_at moves on with a compare-and-set. A schedule with more ticks due
-- (a catch-up) is due again at once.
CREATE OR REPLACE FUNCTION tw.wd_schedule_ticks(p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r       record;
    v_late  interval := tw.schedule_on_time();
    v_names text[] := '{}';
    v_ticks timestamptz[] := '{}';
    v_nexts timestamptz[] := '{}';
    v_skips text[] := '{}';
    v_turns uuid[];
    v_errs  text[];
    v_turn  uuid;
    v_skip  text;
    v_res   jsonb;
    v_pub   jsonb := '[]'::jsonb;
    v_log   jsonb;
    f       record;  -- the ticks that fire: their place in the arrays above and their turns' fields
    v_i     integer;
BEGIN
    FOR r IN
        WITH due AS MATERIALIZED (
            SELECT s.*, (SELECT t.status IN ('pending', 'dispatched', 'running', 'suspended')
                           FROM state.turns t WHERE t.turn_id = s.last_turn_id) AS last_going
              FROM state.schedules s
             WHERE s.next_fire_at <= now()
             ORDER BY s.next_fire_at, s.name LIMIT p_limit FOR UPDATE OF s SKIP LOCKED
        ), nx AS MATERIALIZED (
            -- The tick after each: once per distinct cron, time zone and tick (a call costs ~90 us, and
            -- schedules on one boundary often share their expression: every hour, weekdays at nine).
            SELECT x.cron, x.timezone, x.next_fire_at, tw.cron_next(x.cron, x.timezone, x.next_fire_at) AS following
              FROM (SELECT DISTINCT due.cron, due.timezone, due.next_fire_at FROM due) x
        )
        SELECT due.*, due.next_fire_at AS tick, nx.following
          FROM due JOIN nx ON nx.cron = due.cron AND nx.timezone = due.timezone AND nx.next_fire_at = due.next_fire_at
         ORDER BY due.next_fire_at, due.name
    LOOP
        v_skip := CASE WHEN now() - r.tick < v_late THEN NULL
                       WHEN r.catchup = 'none' THEN 'catchup'
                       WHEN now() - r.tick > make_interval(secs => r.catchup_window_seconds) THEN 'catchup'
                       WHEN r.catchup = 'last' AND r.following <= now() - v_late THEN 'catchup'
                  END;
        IF v_skip IS NULL AND coalesce(r.last_going, false) THEN
            IF r.overlap = 'skip' THEN
                v_skip := 'overlap';
            ELSIF r.overlap = 'cancel_previous' THEN
                -- As a watchdog ends a turn: its agent row taken without waiting (lock order, and two PMOs
                -- cancelling for agents the other holds never wait for each other). A busy agent: this tick
                -- waits for the next run, the schedule unchanged.
                v_res := tw.end_turn(r.last_turn_id, 'cancelled', 'cancelled',
                                     format('cancelled by schedule %s: its next tick came', r.name), false);
                IF v_res IS NULL AND EXISTS (SELECT 1 FROM state.turns t WHERE t.turn_id = r.last_turn_id
                                                AND t.status IN ('pending', 'dispatched', 'running', 'suspended')) THEN
                    CONTINUE;
                END IF;
                v_pub := v_pub || coalesce(v_res, '[]'::jsonb);
            END IF;
        END IF;
        v_names := v_names || r.name::text;
        v_ticks := v_ticks || r.tick;
        v_nexts := v_nexts || r.following;
        v_skips := v_skips || v_skip;
    END LOOP;
    IF cardinality(v_names) = 0 THEN
        RETURN jsonb_build_object('actions', '[]'::jsonb, 'publish', v_pub);
    END IF;
    v_turns := array_fill(NULL::uuid, ARRAY[cardinality(v_names)]);
    v_errs := array_fill(NULL::text, ARRAY[cardinality(v_names)]);
    -- The ticks that fire, from their schedules' rows (held since the loop), submitted together: one set-based
    -- submit, not a subtransaction a tick (hundreds of them in one transaction would also overflow every
    -- snapshot's subtransaction cache). When the set is refused (an agent retired or not in the roster, say), tick
    -- by tick, each refusal that tick's error.
    SELECT array_agg(b.ord ORDER BY b.ord) AS at, array_agg(s.agent ORDER BY b.ord) AS agent,
           array_agg(coalesce(s.channel, 'schedule:' || s.name) ORDER BY b.ord) AS chan,
           array_agg(s.input ORDER BY b.ord) AS input, array_agg(s.timeout_seconds ORDER BY b.ord) AS tmo,
           array_agg('schedule:' || s.name || ':' || to_char(b.tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                     ORDER BY b.ord) AS key,
           array_agg(s.profile ORDER BY b.ord) AS prof, array_agg(s.limit_key ORDER BY b.ord) AS lkey
      INTO f
      FROM unnest(v_names, v_ticks, v_skips) WITH ORDINALITY b (name, tick, skipped, ord)
      JOIN state.schedules s ON s.name = b.name
     WHERE b.skipped IS NULL;
    IF f.at IS NOT NULL THEN
        BEGIN
            SELECT array_agg(coalesce(s.turn_id, v_turns[g.ord]) ORDER BY g.ord) INTO v_turns
              FROM generate_series(1, cardinality(v_names)) g (ord)
              LEFT JOIN tw.submit_set('schedule_ticks', f.agent, f.chan, f.input, f.tmo, f.key, NULL, f.prof, NULL,
                                      f.lkey) s ON f.at[s.ord] = g.ord;
        EXCEPTION WHEN OTHERS THEN
            FOR v_i IN 1 .. cardinality(f.at) LOOP
                BEGIN
                    SELECT x.turn_id INTO v_turn
                      FROM tw.submit_turn_ex(f.agent[v_i], f.chan[v_i], f.input[v_i], f.tmo[v_i], f.key[v_i], NULL,
                                             f.prof[v_i], NULL, f.lkey[v_i]) x;
                    v_turns[f.at[v_i]] := v_turn;
                EXCEPTION WHEN OTHERS THEN
                    v_skips[f.at[v_i]] := 'error';
                    v_errs[f.at[v_i]] := SQLERRM;
                END;
            END LOOP;
        END;
    END IF;
    -- The ticks, their events and the schedules moved on, for the whole batch at once.
    WITH b AS (
        SELECT * FROM unnest(v_names, v_ticks, v_nexts, v_turns, v_skips, v_errs)
                   AS b (name, tick, nxt, turn_id, skipped, error)
    ), tick AS (
        INSERT INTO state.schedule_ticks (schedule, tick_at, turn_id, skipped, error)
        SELECT b.name, b.tick, b.turn_id, b.skipped, b.error FROM b
        ON CONFLICT (schedule, tick_at) DO NOTHING
        RETURNING schedule, tick_at
    ), moved AS (
        UPDATE state.schedules s
           SET next_fire_at = b.nxt, last_turn_id = coalesce(b.turn_id, s.last_turn_id)
          FROM b
         WHERE s.name = b.name AND s.next_fire_at = b.tick
        RETURNING s.name
    ), ev AS (
        SELECT b.*, gen_random_uuid() AS event_id
          FROM b JOIN moved ON moved.name = b.name JOIN tick ON tick.schedule = b.name AND tick.tick_at = b.tick
    ), ev2 AS (
        SELECT ev.*, tw.ev_payload(tw.ev_schedule_tick(ev.name, ev.tick, ev.turn_id, ev.skipped, ev.error),
                                   ev.event_id) AS payload
          FROM ev
    ), out AS (
        INSERT INTO state.outbox (event_id, kind, subject, payload)
        SELECT ev2.event_id, 'schedule_tick', tw.ev_schedule_subject(ev2.name), ev2.payload FROM ev2
    )
    SELECT v_pub || coalesce(jsonb_agg(tw.ev_publish(ev2.event_id, tw.ev_schedule_subject(ev2.name), ev2.payload)),
                             '[]'::jsonb),
           coalesce(jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
               'action', CASE WHEN ev2.turn_id IS NOT NULL THEN 'schedule_fire' ELSE 'schedule_skip' END,
               'schedule', ev2.name, 'tick_at', ev2.tick, 'turn_id', ev2.turn_id, 'skipped', ev2.skipped,
               'due', ev2.tick, 'lateness_ms', tw.lateness_ms(ev2.tick)))), '[]'::jsonb)
      INTO v_pub, v_log FROM ev2;
    RETURN jsonb_build_object('actions', v_log, 'publish', v_pub);
END $$;

-- Due: the earliest next_fire_at (schedules_next_fire_idx).
CREATE OR REPLACE FUNCTION tw.due_schedule_ticks()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT min(next_fire_at) FROM state.schedules WHERE next_fire_at IS NOT NULL
$$;
