-- Flow control (docs/flow-control.md): the waiters of the limits in the order they are granted in, so that a
-- release reads the next few of each key instead of every waiter (tw.flow_grant, tw.flow_waiter_keys). A limit
-- with 10,000 waiters cost each release about 100 ms without it, the limit's row held all that time.
CREATE INDEX IF NOT EXISTS limit_calls_queue_idx ON state.limit_calls (priority, limit_key, seq) WHERE status = 'waiting';

-- The turns that wait for their limits, for their max_wait_seconds (tw.flow_turn_waits): few among the calls.
CREATE INDEX IF NOT EXISTS limit_calls_turns_idx ON state.limit_calls (turn_id) WHERE status = 'waiting' AND agent IS NOT NULL;
