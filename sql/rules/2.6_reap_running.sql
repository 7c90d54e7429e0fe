-- Rule 2.6 (PMO): a running turn whose worker stopped heartbeating is ended failed/timeout_reaped_by_watchdog,
-- with the output contract of a forced end (tw.wd_reap, shared with 2.5, in 2.5_reap_dispatched.sql).

CREATE OR REPLACE FUNCTION tw.wd_reap_running(p_after_s integer, p_limit integer)
RETURNS jsonb LANGUAGE sql AS $$
    SELECT tw.wd_reap('running', p_after_s, 'timeout_reaped_by_watchdog', 'failed', p_limit)
$$;

-- Due: the oldest heartbeat of a running turn plus active_reap_seconds (turn_running_beat_idx).
CREATE OR REPLACE FUNCTION tw.due_reap_running(p_reap_s integer)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT min(beat_at) + make_interval(secs => p_reap_s) FROM state.turn_running
$$;
