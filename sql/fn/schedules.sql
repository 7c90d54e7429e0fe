-- Recurring schedules (docs/schedules.md): the INI's and the run-time ones, and what the CLI shows of them. The
-- ticks are fired by the PMO's rule schedule_ticks (sql/rules/schedule_ticks.sql); the next fire time of a cron in
-- its time zone is tw.cron_next's (sql/fn/cron.sql).

-- A tick the rule reaches later than this after its time was missed (no PMO ran then): what happens to it is the
-- schedule's catchup. A tick reached sooner is on time and fires.
CREATE OR REPLACE FUNCTION tw.schedule_on_time()
RETURNS interval LANGUAGE sql IMMUTABLE AS $$
    SELECT interval '60 seconds'
$$;

-- Every check of a schedule's settings, for tw.add_schedule and the INI's alike (22023 with what is wrong).
CREATE OR REPLACE FUNCTION tw.schedule_check(p_name text, p_agent text, p_profile text, p_cron text,
                                             p_timezone text, p_channel text, p_input jsonb,
                                             p_timeout_seconds integer, p_limit_key text, p_overlap text,
                                             p_catchup text, p_catchup_window_seconds integer)
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_err text;
BEGIN
    PERFORM tw.check_name('schedule', p_name);
    PERFORM tw.check_name('agent', p_agent);
    IF p_profile IS NOT NULL THEN
        PERFORM tw.check_name('profile', p_profile);
    END IF;
    v_err := tw.cron_check(p_cron, p_timezone);
    IF v_err IS NOT NULL THEN
        RAISE EXCEPTION 'schedule %: %', p_name, v_err USING ERRCODE = '22023';
    END IF;
    PERFORM tw.check_ident('channel', p_channel);
    PERFORM tw.check_ident('limit key', p_limit_key);
    IF p_input IS NULL OR jsonb_typeof(p_input) <> 'object' THEN
        RAISE EXCEPTION 'schedule %: input must be a JSON object', p_name USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_input::text) > tw.doc_max_text() THEN
        RAISE EXCEPTION 'schedule %: the input document is % bytes; at most %', p_name, octet_length(p_input::text),
            tw.doc_max_text() USING ERRCODE = '22023';
    END IF;
    IF p_timeout_seconds IS NOT NULL AND p_timeout_seconds NOT BETWEEN 1 AND tw.limit_turn_timeout_max() THEN
        RAISE EXCEPTION 'schedule %: timeout_seconds must be from 1 to %, not %', p_name, tw.limit_turn_timeout_max(),
            p_timeout_seconds USING ERRCODE = '22023';
    END IF;
    IF p_overlap IS NULL OR p_overlap NOT IN ('skip', 'queue', 'cancel_previous') THEN
        RAISE EXCEPTION 'schedule %: overlap must be skip, queue or cancel_previous, not %', p_name,
            coalesce(p_overlap, 'NULL') USING ERRCODE = '22023';
    END IF;
    IF p_catchup IS NULL OR p_catchup NOT IN ('none', 'last', 'all') THEN
        RAISE EXCEPTION 'schedule %: catchup must be none, last or all, not %', p_name, coalesce(p_catchup, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_catchup_window_seconds IS NULL OR p_catchup_window_seconds NOT BETWEEN 0 AND tw.limit_turn_timeout_max() THEN
        RAISE EXCEPTION 'schedule %: catchup_window_seconds must be from 0 to %', p_name, tw.limit_turn_timeout_max()
            USING ERRCODE = '22023';
    END IF;
END $$;

-- Write one schedule (p_owner 'ini' or 'sql'). A new schedule, or one whose cron or time zone changed, fires next
-- at the cron's first time after now; the PMOs hear of it at commit (NOTIFY tw_due). Returns whether it changed.
CREATE OR REPLACE FUNCTION tw.schedule_put(p_name text, p_agent text, p_profile text, p_cron text, p_timezone text,
                                           p_channel text, p_input jsonb, p_timeout_seconds integer,
                                           p_limit_key text, p_overlap text, p_catchup text,
                                           p_catchup_window_seconds integer, p_owner text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_old state.schedules;
    v_next timestamptz;
BEGIN
    PERFORM tw.schedule_check(p_name, p_agent, p_profile, p_cron, p_timezone, p_channel, p_input, p_timeout_seconds,
                              p_limit_key, p_overlap, p_catchup, p_catchup_window_seconds);
    SELECT * INTO v_old FROM state.schedules s WHERE s.name = p_name FOR UPDATE;
    IF FOUND AND v_old.owner = 'ini' AND p_owner = 'sql' THEN
        RAISE EXCEPTION 'schedule % belongs to the configuration file ([schedule.%]); change it there', p_name, p_name
            USING ERRCODE = '22023';
    END IF;
    IF FOUND AND (v_old.agent, v_old.profile, v_old.cron, v_old.timezone, v_old.channel, v_old.input,
                  v_old.timeout_seconds, v_old.limit_key, v_old.overlap, v_old.catchup,
                  v_old.catchup_window_seconds, v_old.owner)
                 IS NOT DISTINCT FROM (p_agent, p_profile, p_cron, p_timezone, p_channel, p_input, p_timeout_seconds,
                                       p_limit_key, p_overlap, p_catchup, p_catchup_window_seconds, p_owner) THEN
        RETURN false;
    END IF;
    v_next := CASE WHEN FOUND AND (v_old.cron, v_old.timezone) = (p_cron, p_timezone) THEN v_old.next_fire_at
                   ELSE tw.cron_next(p_cron, p_timezone, now()) END;
    INSERT INTO state.schedules AS s (name, agent, profile, cron, timezone, channel, input, timeout_seconds,
                                      limit_key, overlap, catchup, catchup_window_seconds, owner, next_fire_at)
    VALUES (p_name, p_agent, p_profile, p_cron, p_timezone, p_channel, p_input, p_timeout_seconds, p_limit_key,
            p_overlap, p_catchup, p_catchup_window_seconds, p_owner, v_next)
    ON CONFLICT (name) DO UPDATE
       SET agent = EXCLUDED.agent, profile = EXCLUDED.profile, cron = EXCLUDED.cron, timezone = EXCLUDED.timezone,
           channel = EXCLUDED.channel, input = EXCLUDED.input, timeout_seconds = EXCLUDED.timeout_seconds,
           limit_key = EXCLUDED.limit_key, overlap = EXCLUDED.overlap, catchup = EXCLUDED.catchup,
           catchup_window_seconds = EXCLUDED.catchup_window_seconds, owner = EXCLUDED.owner,
           next_fire_at = EXCLUDED.next_fire_at, updated_at = now();
    IF v_next IS DISTINCT FROM v_old.next_fire_at THEN
        PERFORM pg_notify('tw_due', 'schedule_ticks');
    END IF;
    RETURN true;
END $$;

-- The INI's schedules, from a PMO at start and after a reload: [{"name","agent","profile","cron","timezone",
-- "channel","input","timeout_seconds","limit_key","overlap","catchup","catchup_window_seconds"}]. Each is written
-- (a run-time schedule of the same name becomes the INI's); an INI schedule the list lacks is removed. Returns how
-- many changed.
CREATE OR REPLACE FUNCTION tw.sync_schedules(p_schedules jsonb)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    r   record;
    v_n integer := 0;
BEGIN
    FOR r IN SELECT * FROM jsonb_to_recordset(p_schedules)
                 AS x (name text, agent text, profile text, cron text, timezone text, channel text, input jsonb,
                       timeout_seconds integer, limit_key text, overlap text, catchup text,
                       catchup_window_seconds integer)
              ORDER BY x.name LOOP
        IF tw.schedule_put(r.name, r.agent, r.profile, r.cron, coalesce(r.timezone, 'UTC'), r.channel,
                           coalesce(r.input, '{}'::jsonb), r.timeout_seconds, r.limit_key,
                           coalesce(r.overlap, 'skip'), coalesce(r.catchup, 'last'),
                           coalesce(r.catchup_window_seconds, 3600), 'ini') THEN
            v_n := v_n + 1;
        END IF;
    END LOOP;
    WITH gone AS (
        DELETE FROM state.schedules s
         WHERE s.owner = 'ini' AND NOT s.name IN (SELECT x ->> 'name' FROM jsonb_array_elements(p_schedules) x)
        RETURNING 1)
    SELECT v_n + count(*) INTO v_n FROM gone;
    RETURN v_n;
END $$;

-- SQL API (client role): add or change a run-time schedule; returns its document (tw.schedule_show). A name the
-- INI owns is refused.
CREATE OR REPLACE FUNCTION tw.add_schedule(p_name text, p_agent text, p_cron text, p_timezone text DEFAULT 'UTC',
                                           p_channel text DEFAULT NULL, p_input jsonb DEFAULT '{}',
                                           p_timeout_seconds integer DEFAULT NULL, p_limit_key text DEFAULT NULL,
                                           p_overlap text DEFAULT 'skip', p_catchup text DEFAULT 'last',
                                           p_catchup_window_seconds integer DEFAULT 3600)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tw.schedule_put(p_name, p_agent, NULL, p_cron, coalesce(p_timezone, 'UTC'), p_channel, p_input,
                            p_timeout_seconds, p_limit_key, p_overlap, p_catchup, p_catchup_window_seconds, 'sql');
    PERFORM tw.durable_answer();
    RETURN tw.schedule_show(p_name);
END $$;

-- SQL API (client role): remove a run-time schedule (its ticks go with it); true when there was one. One the INI
-- owns is refused (it would be back at the next reload).
CREATE OR REPLACE FUNCTION tw.remove_schedule(p_name text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_owner text;
BEGIN
    PERFORM tw.check_name('schedule', p_name);
    SELECT owner INTO v_owner FROM state.schedules WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_owner = 'ini' THEN
        RAISE EXCEPTION 'schedule % belongs to the configuration file ([schedule.%]); remove it there', p_name, p_name
            USING ERRCODE = '22023';
    END IF;
    DELETE FROM state.schedules WHERE name = p_name;
    PERFORM tw.durable_answer();
    RETURN true;
END $$;

-- The next p_n fire times of a schedule from p_from (p_from itself first when given).
CREATE OR REPLACE FUNCTION tw.schedule_fires(p_cron text, p_timezone text, p_from timestamptz, p_n integer)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    WITH RECURSIVE f (at, i) AS (
        SELECT coalesce(p_from, tw.cron_next(p_cron, p_timezone, now())), 1
        UNION ALL
        SELECT tw.cron_next(p_cron, p_timezone, f.at), f.i + 1 FROM f WHERE f.i < p_n AND f.at IS NOT NULL)
    SELECT coalesce(jsonb_agg(to_char(f.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') ORDER BY f.i), '[]')
      FROM f WHERE f.at IS NOT NULL
$$;

-- One schedule as `turnwatch schedules show` gives it: its settings, the next 5 fire times in UTC, the last 10
-- turns it fired (with their status) and its last 10 skipped ticks. NULL when there is no such schedule.
CREATE OR REPLACE FUNCTION tw.schedule_show(p_name text)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
               'name', s.name, 'agent', s.agent, 'profile', s.profile, 'cron', s.cron, 'timezone', s.timezone,
               'channel', s.channel, 'input', s.input, 'timeout_seconds', s.timeout_seconds,
               'limit_key', s.limit_key, 'overlap', s.overlap, 'catchup', s.catchup,
               'catchup_window_seconds', s.catchup_window_seconds, 'owner', s.owner,
               'next_fire_at', s.next_fire_at, 'last_turn_id', s.last_turn_id,
               'next_fires', tw.schedule_fires(s.cron, s.timezone, s.next_fire_at, 5),
               'last_turns', (SELECT coalesce(jsonb_agg(jsonb_build_object('tick_at', k.tick_at, 'turn_id', k.turn_id,
                                                                           'status', t.status, 'at', k.at)
                                                        ORDER BY k.tick_at DESC), '[]'::jsonb)
                                FROM (SELECT * FROM state.schedule_ticks k WHERE k.schedule = s.name
                                         AND k.turn_id IS NOT NULL ORDER BY k.tick_at DESC LIMIT 10) k
                                LEFT JOIN state.turns t ON t.turn_id = k.turn_id),
               'skipped', (SELECT coalesce(jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
                                                         'tick_at', k.tick_at, 'skipped', k.skipped, 'error', k.error,
                                                         'at', k.at)) ORDER BY k.tick_at DESC), '[]'::jsonb)
                             FROM (SELECT * FROM state.schedule_ticks k WHERE k.schedule = s.name
                                      AND k.skipped IS NOT NULL ORDER BY k.tick_at DESC LIMIT 10) k),
               'updated_at', s.updated_at)
      FROM state.schedules s WHERE s.name = p_name
$$;

-- Every schedule, by name (`turnwatch schedules list`): its settings, next fire time and last turn.
CREATE OR REPLACE FUNCTION tw.schedules_list()
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'name', s.name, 'agent', s.agent, 'cron', s.cron, 'timezone', s.timezone, 'overlap', s.overlap,
               'catchup', s.catchup, 'owner', s.owner, 'next_fire_at', s.next_fire_at,
               'last_turn_id', s.last_turn_id,
               'last_turn_status', (SELECT t.status FROM state.turns t WHERE t.turn_id = s.last_turn_id))
           ORDER BY s.name), '[]'::jsonb)
      FROM state.schedules s
$$;
