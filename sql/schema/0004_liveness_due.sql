-- Release 2, docs/watchdogs.md: daemon liveness, and indexes that make every watchdog rule's next due time
-- one index-backed min() (the daemons sleep until then instead of scanning on a fixed clock).

-- One row per daemon process. Its liveness is not this row but a session-level advisory lock that the daemon
-- holds on a connection of its own (key: tw.live_class(), daemon_no): when the session ends (exit, kill -9, a
-- host gone, found by TCP keepalives) the lock is released and any other daemon can take it, which is how it
-- learns, within a poll, that the daemon is gone. One lock per daemon, never one per item.
CREATE TABLE IF NOT EXISTS state.daemons (
    daemon_id    text PRIMARY KEY,                     -- host:pid, what claimed_by records
    daemon_no    integer GENERATED ALWAYS AS IDENTITY UNIQUE,   -- its liveness lock key
    kind         text NOT NULL CHECK (kind IN ('pmo', 'worker')),
    host         text NOT NULL,
    pid          integer NOT NULL,
    incarnation  text NOT NULL,                        -- random per process start: a reused host:pid is a new daemon
    info         jsonb NOT NULL DEFAULT '{}',          -- served agents and tools, intervals (for `turnwatch daemons`)
    started_at   timestamptz NOT NULL DEFAULT now(),
    locked_at    timestamptz NOT NULL DEFAULT now(),   -- last (re)registration, i.e. its session's start
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    gone_at      timestamptz,
    gone_reason  text
);
CREATE INDEX IF NOT EXISTS daemons_live_idx ON state.daemons (daemon_no) WHERE gone_at IS NULL;

-- Rule 2.4's re-ring spacing moves from the agent row to the turn, so that 2.4, 2.5 and 2.6 are driven by
-- partial indexes on turns. The agent row keeps no index but its key (its updates stay HOT); its
-- updated_at and the active turn's move together (dispatch, claim, heartbeat, suspend), so the turn's clock
-- is the agent's.
ALTER TABLE state.turns ADD COLUMN IF NOT EXISTS rerung_at timestamptz;
CREATE INDEX IF NOT EXISTS turns_dispatched_idx ON state.turns (updated_at) WHERE status = 'dispatched';
CREATE INDEX IF NOT EXISTS turns_dispatched_ring_idx ON state.turns ((coalesce(rerung_at, updated_at)))
    WHERE status = 'dispatched';
CREATE INDEX IF NOT EXISTS turns_running_idx ON state.turns (updated_at) WHERE status = 'running';

-- 2.7: the next re-ring of a pending item is due one interval after it was created or last rung; items with no
-- channel are skipped at created_at + pending_wakeup_skip_seconds.
DROP INDEX IF EXISTS state.agent_inbox_pending_age_idx;
CREATE INDEX IF NOT EXISTS agent_inbox_pending_ring_idx ON state.agent_inbox ((coalesce(rung_at, created_at)))
    WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS agent_inbox_pending_nochannel_idx ON state.agent_inbox (created_at)
    WHERE status = 'pending' AND channel_id IS NULL;
