-- When each daemon's rules are next due, in ms from now on the database clock (null: nothing waits): one answer
-- from the due term that each rule file in sql/rules defines beside its action. Each term is one min() over an
-- index, so a daemon with nothing due, or 100,000 deadlines far away, pays one cheap query per wake-up.

CREATE OR REPLACE FUNCTION tw.worker_next_due(p_lease_s integer)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('2.1', tw.ms_until(tw.due_reclaim_inbox(p_lease_s)),
                              '2.2', tw.ms_until(tw.due_tool_timeouts()),
                              '2.3', tw.ms_until(tw.due_resume_leases()),
                              'warn', tw.ms_until(tw.due_tool_warnings()))
$$;

CREATE OR REPLACE FUNCTION tw.pmo_next_due(p_retry_s integer, p_timeout_s integer, p_reap_s integer,
                                           p_wakeup_s integer, p_skip_s integer, p_stale_s integer)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('2.4', tw.ms_until(tw.due_rering_dispatched(p_retry_s, p_stale_s)),
                              '2.5', tw.ms_until(tw.due_reap_dispatched(p_timeout_s, p_stale_s)),
                              '2.6', tw.ms_until(tw.due_reap_running(p_reap_s)),
                              '2.7', tw.ms_until(tw.due_rering_pending(p_wakeup_s, p_skip_s)),
                              'deadline', tw.ms_until(tw.due_turn_deadlines()),
                              'tree_cancel', tw.ms_until(tw.due_tree_cancels()),
                              'retry', tw.ms_until(tw.due_retries()),
                              'queue', tw.ms_until(tw.due_queue_timeouts()),
                              'warn', tw.ms_until(tw.due_pmo_warnings()))
$$;
