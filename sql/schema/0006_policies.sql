-- Release 2, docs/timeouts.md: timeout policies. Retries (attempt, retry_at), dead letters and replay
-- (replay_of), the queue budget, warnings before a deadline, timeout details, per-call timeout sources and the
-- turn history. The functions are in sql/fn/policy.sql, history.sql, dead_letters.sql and sql/rules.

-- Per-agent policies, published by the daemons from their configuration when they connect (the SQL that ends
-- a turn, in whichever daemon or client, needs them). Keyed by profile: today every agent is its own profile.
-- An agent with no row has the shipped defaults (tw.policy).
CREATE TABLE IF NOT EXISTS state.policies (
    profile                   state.name PRIMARY KEY,
    max_attempts              integer NOT NULL DEFAULT 1 CHECK (max_attempts >= 1),
    retry_on                  text[] NOT NULL
        DEFAULT '{step_timeout,agent_exit,timeout_reaped_by_watchdog,dispatch_timeout}',
    retry_backoff_seconds     integer NOT NULL DEFAULT 1 CHECK (retry_backoff_seconds >= 1),
    retry_backoff_max_seconds integer NOT NULL DEFAULT 300 CHECK (retry_backoff_max_seconds >= 1),
    queue_timeout_seconds     integer NOT NULL DEFAULT 0 CHECK (queue_timeout_seconds >= 0),
    warn_at_percent           integer NOT NULL DEFAULT 80 CHECK (warn_at_percent BETWEEN 0 AND 99),
    tool_timeout_seconds      integer NOT NULL DEFAULT 30 CHECK (tool_timeout_seconds >= 1),
    step_timeout_seconds      integer,
    updated_at                timestamptz NOT NULL DEFAULT now(),
    updated_by                text
);

ALTER TABLE state.turns
    ADD COLUMN IF NOT EXISTS attempt           integer NOT NULL DEFAULT 1,
    ADD COLUMN IF NOT EXISTS step_base         integer NOT NULL DEFAULT 0,  -- the first step of this attempt
    ADD COLUMN IF NOT EXISTS retry_at          timestamptz,                 -- this attempt may start then
    ADD COLUMN IF NOT EXISTS retry_due_at      timestamptz,                 -- the PMO dispatches it then (once)
    ADD COLUMN IF NOT EXISTS replay_of         uuid,
    ADD COLUMN IF NOT EXISTS queue_deadline_at timestamptz,                 -- queue_timeout_seconds of this attempt
    ADD COLUMN IF NOT EXISTS queue_warn_at     timestamptz,
    ADD COLUMN IF NOT EXISTS deadline_warn_at  timestamptz,                 -- warn_at_percent of the turn deadline
    ADD COLUMN IF NOT EXISTS timeout_detail    jsonb;                       -- the `timeout` object of its events

-- Only turns that wait for a retry, have a queue budget or a deadline warning are in these indexes: a turn with
-- none of them costs no index entry here.
CREATE INDEX IF NOT EXISTS turns_retry_due_idx ON state.turns (retry_due_at)
    WHERE retry_due_at IS NOT NULL AND status = 'pending';
CREATE INDEX IF NOT EXISTS turns_queue_deadline_idx ON state.turns (queue_deadline_at)
    WHERE queue_deadline_at IS NOT NULL AND status IN ('pending', 'dispatched');
CREATE INDEX IF NOT EXISTS turns_queue_warn_idx ON state.turns (queue_warn_at)
    WHERE queue_warn_at IS NOT NULL AND status IN ('pending', 'dispatched');
CREATE INDEX IF NOT EXISTS turns_deadline_warn_idx ON state.turns (deadline_warn_at)
    WHERE deadline_warn_at IS NOT NULL AND status IN ('pending', 'dispatched', 'running', 'suspended');
-- Dead letters: the turns whose last attempt ended failed or timeout, newest first.
CREATE INDEX IF NOT EXISTS turns_dead_letter_idx ON state.turns (ended_at) WHERE status IN ('failed', 'timeout');
CREATE INDEX IF NOT EXISTS turns_replay_of_idx ON state.turns (replay_of) WHERE replay_of IS NOT NULL;

-- Each call's effective timeout says where it came from (call, tool, agent, global), and when to warn.
ALTER TABLE state.turn_waiting_tools
    ADD COLUMN IF NOT EXISTS timeout_source text,
    ADD COLUMN IF NOT EXISTS warn_at        timestamptz;
CREATE INDEX IF NOT EXISTS turn_waiting_tools_warn_idx ON state.turn_waiting_tools (warn_at)
    WHERE warn_at IS NOT NULL AND wait_status = 'waiting';

-- One warning per deadline: the key says which (a turn's deadline, one attempt's queue budget, one run of a
-- step, one tool call). No foreign key: its check would lock the turn row, which the tool-call warning rule
-- must never wait for while it holds a waiting call (deliver_result takes them in the other order).
CREATE TABLE IF NOT EXISTS state.turn_warnings (
    turn_id         uuid NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('turn_deadline', 'step_timeout', 'tool_call', 'queue')),
    attempt         integer NOT NULL,
    step            integer NOT NULL DEFAULT -1,
    tool_call_id    text NOT NULL DEFAULT '',
    turn_epoch      bigint,
    limit_seconds   numeric NOT NULL,
    elapsed_seconds numeric NOT NULL,
    due_at          timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (turn_id, kind, attempt, step, tool_call_id)
);

-- Every transition of a turn, written in the transaction that made it (a trigger on state.turns, and the
-- reclaims, which move a turn's work but not its status). actor: the daemon id (host:pid) or `cli` (the
-- session setting tw.actor), `sql` for another client.
-- No primary key: every read is by turn (the one index), and each row written costs one index entry.
CREATE TABLE IF NOT EXISTS state.turn_history (
    id          bigint GENERATED ALWAYS AS IDENTITY,
    turn_id     uuid NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    from_status text,
    to_status   text NOT NULL,
    turn_epoch  bigint,
    attempt     integer NOT NULL,
    actor       text NOT NULL,
    reason      text
);
CREATE INDEX IF NOT EXISTS turn_history_turn_idx ON state.turn_history (turn_id, id);
ALTER TABLE state.turn_history SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

-- Retry and warning events go through the outbox like the others.
ALTER DOMAIN state.event_kind DROP CONSTRAINT IF EXISTS event_kind_check;
ALTER DOMAIN state.event_kind ADD CONSTRAINT event_kind_check
    CHECK (VALUE IN ('state', 'task', 'retry', 'warning'));
