-- Suggested timeouts (docs/python.md, `turnwatch timeouts suggest`): how long the steps of a profile and the calls
-- of a tool took in the last days, from the newest runs backwards. The CLI adds the timeout in force (it has the
-- configuration) and the suggestion.
--
-- Each profile and each tool reads at most p_sample runs, the newest that ended in the window, through an index
-- on when they ended (0016_timeouts.sql): the cost is bounded by the sample, not by the length of the history.

-- The steps of one profile that ended since p_since: a step runs from a history row to `running` to the next row
-- of its turn (found through turn_history_turn_idx). ok: the program replied with a result or tool calls;
-- timed_out: it outlived step_timeout_seconds (the turn failed, or went back to pending for its next attempt,
-- with that code). Steps cut short by a cancel or the turn's deadline say nothing about how long a step takes
-- and are left out. NULL when there are none.
CREATE OR REPLACE FUNCTION tw.timeouts_steps(p_profile text, p_since timestamptz, p_sample integer)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    WITH e AS (
        SELECT h.turn_id, h.id, h.at, h.to_status, h.reason
          FROM state.turn_history h
         WHERE h.profile = p_profile AND h.from_status = 'running' AND h.to_status <> 'running'
           AND h.at >= p_since
         ORDER BY h.at DESC
         LIMIT p_sample + 1),
    s AS (
        SELECT extract(epoch FROM e.at - b.at)::float8 AS secs,
               e.to_status IN ('suspended', 'done') AS ok,
               (e.to_status = 'failed' AND e.reason LIKE 'step\_timeout%')
                   OR (e.to_status = 'pending' AND e.reason LIKE 'retry after step\_timeout%') AS timed_out
          FROM (SELECT * FROM e ORDER BY e.at DESC LIMIT p_sample) e
          CROSS JOIN LATERAL (SELECT p.at FROM state.turn_history p
                               WHERE p.turn_id = e.turn_id AND p.id < e.id
                               ORDER BY p.id DESC LIMIT 1) b
         WHERE e.to_status NOT IN ('cancelled', 'timeout'))
    SELECT CASE WHEN count(*) > 0 THEN jsonb_build_object(
               'profile', p_profile, 'count', count(*),
               'sampled', (SELECT count(*) FROM e) > p_sample,
               'p50_seconds', round(percentile_cont(0.5) WITHIN GROUP (ORDER BY secs)::numeric, 3),
               'p95_seconds', round(percentile_cont(0.95) WITHIN GROUP (ORDER BY secs)::numeric, 3),
               'p99_seconds', round(percentile_cont(0.99) WITHIN GROUP (ORDER BY secs)::numeric, 3),
               'max_seconds', round(max(secs)::numeric, 3),
               'timed_out', count(*) FILTER (WHERE timed_out),
               'ok', count(*) FILTER (WHERE ok),
               'ok_p99_seconds', round((percentile_cont(0.99) WITHIN GROUP (ORDER BY secs)
                                           FILTER (WHERE ok))::numeric, 3)) END
      FROM s
$$;

-- The calls of one tool that settled since p_since: from when a program took the call (or, for an external or
-- delegating call, when it was made) to its result. ok: an ok result; timed_out: a timeout result (the program
-- outlived its timeout, or the wait of rule 2.2 ended). Cancelled calls are left out. by_source: how many calls
-- had their timeout from the call itself, the tool's section, the agent's or the global default. NULL when there
-- are none.
CREATE OR REPLACE FUNCTION tw.timeouts_calls(p_tool text, p_since timestamptz, p_sample integer)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    WITH c AS (
        SELECT w.settled_at, coalesce(w.started_at, w.created_at) AS began_at, w.result_status, w.timeout_source
          FROM state.turn_waiting_tools w
         WHERE w.tool = p_tool AND w.settled_at IS NOT NULL AND w.settled_at >= p_since
         ORDER BY w.settled_at DESC
         LIMIT p_sample + 1),
    s AS (
        SELECT greatest(extract(epoch FROM c.settled_at - c.began_at), 0)::float8 AS secs,
               c.result_status = 'ok' AS ok, c.result_status = 'timeout' AS timed_out,
               coalesce(c.timeout_source, 'unknown') AS source
          FROM (SELECT * FROM c ORDER BY c.settled_at DESC LIMIT p_sample) c
         WHERE c.result_status IS DISTINCT FROM 'cancelled')
    SELECT CASE WHEN count(*) > 0 THEN jsonb_build_object(
               'tool', p_tool, 'count', count(*),
               'sampled', (SELECT count(*) FROM c) > p_sample,
               'p50_seconds', round(percentile_cont(0.5) WITHIN GROUP (ORDER BY secs)::numeric, 3),
               'p95_seconds', round(percentile_cont(0.95) WITHIN GROUP (ORDER BY secs)::numeric, 3),
               'p99_seconds', round(percentile_cont(0.99) WITHIN GROUP (ORDER BY secs)::numeric, 3),
               'max_seconds', round(max(secs)::numeric, 3),
               'timed_out', count(*) FILTER (WHERE timed_out),
               'ok', count(*) FILTER (WHERE ok),
               'ok_p99_seconds', round((percentile_cont(0.99) WITHIN GROUP (ORDER BY secs)
                                           FILTER (WHERE ok))::numeric, 3),
               'by_source', (SELECT jsonb_object_agg(x.source, x.n)
                               FROM (SELECT s2.source, count(*) AS n FROM s s2 GROUP BY s2.source) x)) END
      FROM s
$$;

-- `turnwatch timeouts suggest [--profile P] [--tool T] [--days N]`: {"now", "since", "days", "sample",
-- "profiles": [tw.timeouts_steps ...], "tools": [tw.timeouts_calls ...]}, each list in name order and holding only
-- names with runs in the window. With p_profile only that profile (and no tools unless p_tool is given), with
-- p_tool only that tool; with neither, every profile and tool that has runs, each found by skipping through its
-- index one name at a time (at most 1,000 of each). Bad input: SQLSTATE 22023.
CREATE OR REPLACE FUNCTION tw.timeouts_suggest(p_profile text DEFAULT NULL, p_tool text DEFAULT NULL,
                                               p_days integer DEFAULT 7, p_sample integer DEFAULT 10000)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_since    timestamptz;
    v_profiles text[];
    v_tools    text[];
BEGIN
    IF p_profile IS NOT NULL THEN
        PERFORM tw.check_name('profile', p_profile);
    END IF;
    IF p_tool IS NOT NULL THEN
        PERFORM tw.check_name('tool', p_tool);
    END IF;
    IF p_days IS NULL OR p_days NOT BETWEEN 1 AND 3650 THEN
        RAISE EXCEPTION 'days must be a whole number from 1 to 3650, not %', coalesce(p_days::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_sample IS NULL OR p_sample NOT BETWEEN 100 AND 1000000 THEN
        RAISE EXCEPTION 'sample must be a whole number from 100 to 1000000, not %', coalesce(p_sample::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    v_since := now() - make_interval(days => p_days);
    IF p_profile IS NOT NULL THEN
        v_profiles := ARRAY[p_profile];
    ELSIF p_tool IS NULL THEN
        v_profiles := ARRAY(
            WITH RECURSIVE p(profile) AS (
                (SELECT h.profile FROM state.turn_history h
                  WHERE h.from_status = 'running' AND h.to_status <> 'running' AND h.profile IS NOT NULL
                  ORDER BY h.profile LIMIT 1)
                UNION ALL
                SELECT (SELECT h.profile FROM state.turn_history h
                         WHERE h.from_status = 'running' AND h.to_status <> 'running' AND h.profile > p.profile
                         ORDER BY h.profile LIMIT 1)
                  FROM p WHERE p.profile IS NOT NULL)
            SELECT p.profile FROM p WHERE p.profile IS NOT NULL LIMIT 1000);
    END IF;
    IF p_tool IS NOT NULL THEN
        v_tools := ARRAY[p_tool];
    ELSIF p_profile IS NULL THEN
        v_tools := ARRAY(
            WITH RECURSIVE t(tool) AS (
                (SELECT w.tool FROM state.turn_waiting_tools w WHERE w.settled_at IS NOT NULL
                  ORDER BY w.tool LIMIT 1)
                UNION ALL
                SELECT (SELECT w.tool FROM state.turn_waiting_tools w
                         WHERE w.settled_at IS NOT NULL AND w.tool > t.tool ORDER BY w.tool LIMIT 1)
                  FROM t WHERE t.tool IS NOT NULL)
            SELECT t.tool FROM t WHERE t.tool IS NOT NULL LIMIT 1000);
    END IF;
    RETURN jsonb_build_object(
        'now', now(), 'since', v_since, 'days', p_days, 'sample', p_sample,
        'profiles', coalesce((SELECT jsonb_agg(x.j ORDER BY x.name)
                                FROM (SELECT n AS name, tw.timeouts_steps(n, v_since, p_sample) AS j
                                        FROM unnest(v_profiles) n) x
                               WHERE x.j IS NOT NULL), '[]'::jsonb),
        'tools', coalesce((SELECT jsonb_agg(x.j ORDER BY x.name)
                             FROM (SELECT n AS name, tw.timeouts_calls(n, v_since, p_sample) AS j
                                     FROM unnest(v_tools) n) x
                            WHERE x.j IS NOT NULL), '[]'::jsonb));
END $$;
