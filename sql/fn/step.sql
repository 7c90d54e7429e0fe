-- The step document (docs/protocol.md) and the job a worker runs for an agent step.

-- The results of a step's tool calls, in call order. A set-returning SQL function of one row, so that a
-- statement over many turns (tw.force_finish_set) has it inlined as a lateral join rather than calling a
-- function per row; tw.tool_results is the same for one step, planned once per session.
CREATE OR REPLACE FUNCTION tw.tool_results_of(p_turn uuid, p_step integer)
RETURNS TABLE (results jsonb) LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
               'tool_call_id', w.tool_call_id, 'tool', w.tool,
               'status', coalesce(w.result_status, CASE w.wait_status WHEN 'cancelled' THEN 'cancelled' END),
               'output', w.output, 'error', w.error)) ORDER BY w.call_index), '[]'::jsonb)
      FROM state.turn_waiting_tools w
     WHERE w.turn_id = p_turn AND w.step = p_step
$$;

CREATE OR REPLACE FUNCTION tw.tool_results(p_turn uuid, p_step integer)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT r.results FROM tw.tool_results_of(p_turn, p_step) r);
END
$$;

-- deadline_at (docs/python.md): when the step's time limit ends, on the database clock: its profile's
-- step_timeout_seconds (as the daemons published it) from now, the claim, or the turn's deadline (submit
-- --timeout) when that comes first; null when neither is known. The worker's timer starts a moment after the
-- claim, so the program has at least until then. No subquery in it: a SQL function with one is not inlined, and
-- was planned again for every statement that made a job (tw.policy is a plpgsql function, its plan kept).
CREATE OR REPLACE FUNCTION tw.step_document(t state.turns, p_step integer)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'turn_id', t.turn_id, 'agent', t.agent, 'profile', t.profile, 'channel_id', t.channel_id,
        'epoch', t.turn_epoch, 'depth', t.depth,
        'step', p_step - t.step_base, 'attempt', t.attempt, 'input', t.input,  -- steps count from 0 per attempt
        'deadline_at', least(now() + make_interval(secs => (tw.policy(t.profile)).step_timeout_seconds),
                             t.deadline_at),
        'state', CASE WHEN p_step = t.step_base THEN NULL ELSE t.agent_state END,
        'tool_results', CASE WHEN p_step = t.step_base THEN '[]'::jsonb
                             ELSE tw.tool_results(t.turn_id, p_step - 1) END)
$$;

-- The job a worker runs for an agent step: its fence (inbox claim or ledger lease) and the step document.
-- Documents travel as their text (as do tool calls' in tw.claim): the worker hands them to the program as
-- they are, so an input's 0.1 or 2^70 reaches the agent as written, and parsing never fails the claim.
CREATE OR REPLACE FUNCTION tw.step_job(p_fence text, p_id bigint, p_token bigint, t state.turns)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('kind', 'step', 'fence', p_fence, 'id', p_id, 'token', p_token,
                              'turn_id', t.turn_id, 'agent', t.agent, 'profile', t.profile,
                              'epoch', t.turn_epoch, 'step', t.step,
                              'doc', tw.step_document(t, t.step)::text)
$$;
