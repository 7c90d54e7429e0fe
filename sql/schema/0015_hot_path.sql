-- The hot path (issue 24): a turn's row changes in place. No index of state.turns keys on a column that a
-- transition or a heartbeat changes (status, updated_at and the due times), so every update of a turn is a HOT
-- update that writes no index entry. What the dispatch and the rules need to find quickly lives in narrow tables
-- that are inserted and deleted as a turn moves:
--   state.turn_queue       a pending turn, in its agent's queue (FIFO by seq), until it is dispatched;
--   state.turn_dispatched  a dispatched turn waiting for a worker (rules 2.4 and 2.5);
--   state.turn_running     a running turn and its last heartbeat (rule 2.6);
--   state.turn_timers      a turn's deadline, queue budget, warnings and retry time, while they may still fire.
-- A suspended turn is found through its waiting calls (turn_waiting_tools_waiting_idx, rule 2.2).

CREATE TABLE IF NOT EXISTS state.turn_queue (
    agent    text NOT NULL,
    seq      bigint NOT NULL,                -- the turn's seq: FIFO per agent, a retried turn keeps its place
    turn_id  uuid NOT NULL,
    profile  text NOT NULL,
    ready_at timestamptz,                    -- a retried turn waits until its retry_at; NULL: ready
    PRIMARY KEY (agent, seq)
);

CREATE TABLE IF NOT EXISTS state.turn_dispatched (
    turn_id   uuid PRIMARY KEY,
    agent     text NOT NULL,
    profile   text NOT NULL,
    since     timestamptz NOT NULL DEFAULT now(),   -- dispatched then (what 2.4 and 2.5 count from)
    rerung_at timestamptz                           -- 2.4's last re-ring
);
CREATE INDEX IF NOT EXISTS turn_dispatched_profile_idx ON state.turn_dispatched (profile, since);
CREATE INDEX IF NOT EXISTS turn_dispatched_ring_idx ON state.turn_dispatched (profile, (coalesce(rerung_at, since)));

CREATE TABLE IF NOT EXISTS state.turn_running (
    turn_id uuid PRIMARY KEY,
    agent   text NOT NULL,
    profile text NOT NULL,
    beat_at timestamptz NOT NULL DEFAULT now()      -- its claim or its worker's last heartbeat for it (2.6)
);
CREATE INDEX IF NOT EXISTS turn_running_beat_idx ON state.turn_running (beat_at);

CREATE TABLE IF NOT EXISTS state.turn_timers (
    turn_id uuid NOT NULL,
    kind    text NOT NULL CHECK (kind IN ('deadline', 'deadline_warn', 'queue', 'queue_warn', 'retry')),
    due_at  timestamptz NOT NULL,
    PRIMARY KEY (turn_id, kind)
);
CREATE INDEX IF NOT EXISTS turn_timers_due_idx ON state.turn_timers (kind, due_at);

ALTER TABLE state.turn_queue SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,
                                  autovacuum_vacuum_cost_delay = 0);
ALTER TABLE state.turn_dispatched SET (autovacuum_vacuum_scale_factor = 0.02,
                                       autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE state.turn_running SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,
                                    autovacuum_vacuum_cost_delay = 0);
ALTER TABLE state.turn_timers SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,
                                   autovacuum_vacuum_cost_delay = 0);

-- Turns open at the upgrade.
INSERT INTO state.turn_queue (agent, seq, turn_id, profile, ready_at)
SELECT agent, seq, turn_id, profile, retry_at FROM state.turns WHERE status = 'pending'
ON CONFLICT DO NOTHING;
INSERT INTO state.turn_dispatched (turn_id, agent, profile, since, rerung_at)
SELECT turn_id, agent, profile, updated_at, rerung_at FROM state.turns WHERE status = 'dispatched'
ON CONFLICT DO NOTHING;
INSERT INTO state.turn_running (turn_id, agent, profile, beat_at)
SELECT turn_id, agent, profile, updated_at FROM state.turns WHERE status = 'running'
ON CONFLICT DO NOTHING;
INSERT INTO state.turn_timers (turn_id, kind, due_at)
SELECT turn_id, 'deadline', deadline_at FROM state.turns
 WHERE deadline_at IS NOT NULL AND status IN ('pending', 'dispatched', 'running', 'suspended')
UNION ALL
SELECT turn_id, 'deadline_warn', deadline_warn_at FROM state.turns
 WHERE deadline_warn_at IS NOT NULL AND status IN ('pending', 'dispatched', 'running', 'suspended')
UNION ALL
SELECT turn_id, 'queue', queue_deadline_at FROM state.turns
 WHERE queue_deadline_at IS NOT NULL AND status IN ('pending', 'dispatched')
UNION ALL
SELECT turn_id, 'queue_warn', queue_warn_at FROM state.turns
 WHERE queue_warn_at IS NOT NULL AND status IN ('pending', 'dispatched')
UNION ALL
SELECT turn_id, 'retry', retry_due_at FROM state.turns WHERE retry_due_at IS NOT NULL AND status = 'pending'
ON CONFLICT DO NOTHING;

-- Dead letters newest first across all agents: the history row of a turn's final failed or timeout end
-- (history rows are only ever inserted, so a partial index costs nothing at update time).
CREATE INDEX IF NOT EXISTS turn_history_dead_idx ON state.turn_history (at) WHERE to_status IN ('failed', 'timeout');

DROP INDEX IF EXISTS state.turns_pending_idx;
DROP INDEX IF EXISTS state.turns_resume_deadline_idx;
DROP INDEX IF EXISTS state.turns_deadline_idx;
DROP INDEX IF EXISTS state.turns_running_idx;
DROP INDEX IF EXISTS state.turns_dispatched_profile_idx;
DROP INDEX IF EXISTS state.turns_dispatched_profile_ring_idx;
DROP INDEX IF EXISTS state.turns_retry_due_idx;
DROP INDEX IF EXISTS state.turns_queue_deadline_idx;
DROP INDEX IF EXISTS state.turns_queue_warn_idx;
DROP INDEX IF EXISTS state.turns_deadline_warn_idx;
DROP INDEX IF EXISTS state.turns_dead_letter_idx;
-- Room on every page for a turn's next versions.
ALTER TABLE state.turns SET (fillfactor = 75);
