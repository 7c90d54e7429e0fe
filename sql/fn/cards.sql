-- Cards: what an agent's turn leaves behind. One builder per card kind's content, inlined by the set-based
-- statements that write many at once and called by the one-row paths; a field added to a card is one change here.

-- task.deliverable of a turn that completed: the agent's output.
CREATE OR REPLACE FUNCTION tw.card_done(p_output jsonb)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('partial', false, 'output', p_output)
$$;

-- task.deliverable of a turn ended by force (a watchdog, a deadline, a cancel): the fallback, partial, with what
-- the turn had when it ended: the status it was in, its step, the agent's last state and the step's tool results.
CREATE OR REPLACE FUNCTION tw.card_fallback(p_final text, p_reason text, p_message text, p_was text, p_step integer,
                                            p_last_state jsonb, p_tool_results jsonb)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('partial', true, 'fallback', true, 'status', p_final, 'reason', p_reason,
                              'message', p_message, 'status_before', p_was, 'step', p_step,
                              'last_state', p_last_state, 'tool_results', p_tool_results)
$$;
