-- Flow control for turns and waits in the history (docs/flow-control.md). The functions are in
-- sql/fn/turn_limits.sql.

-- A profile's limits ([agent.P] limits = a, b), written by the workers at start and reload with the INI's limits
-- (tw.sync_profile_limits). NULL: none, and its turns pay nothing for flow control.
ALTER TABLE state.profiles ADD COLUMN IF NOT EXISTS limits text[];

-- A turn of a limited profile has a row of its own in state.limit_calls (step -1, tool_call_id ''): agent is its
-- agent (NULL on a tool call's row), ledger_id the resume ledger entry it waits to release (NULL: it waits to be
-- dispatched). blocked is the limit a waiter was found waiting for (the reason waiting_limit:NAME).
ALTER TABLE state.limit_calls
    ADD COLUMN IF NOT EXISTS agent     text,
    ADD COLUMN IF NOT EXISTS ledger_id bigint,
    ADD COLUMN IF NOT EXISTS blocked   text;

-- The limits a turn asked for at its dispatch (its profile's then): set for its life, so that its resumes ask
-- again and its moves out of running give them back (trigger turns_flow_release). NULL: an unlimited turn.
ALTER TABLE state.turns ADD COLUMN IF NOT EXISTS flow_limits text[];

-- A wait for limits in a turn's history: a row from_status = to_status (the turn's status when the wait ended)
-- whose waited_from .. at is the wait, wait_limit the limit it waited for, tool_call_id the call that waited
-- (NULL: the turn itself).
ALTER TABLE state.turn_history
    ADD COLUMN IF NOT EXISTS waited_from  timestamptz,
    ADD COLUMN IF NOT EXISTS wait_limit   text,
    ADD COLUMN IF NOT EXISTS tool_call_id text;
