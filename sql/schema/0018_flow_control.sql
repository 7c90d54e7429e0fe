-- Flow control (docs/flow-control.md): limits on how many tool calls run at once and how fast they start, across
-- every worker. The functions are in sql/fn/limits.sql; the due grants in sql/rules/limit_grants.sql.

-- The limits: from the INI ([limit.NAME], source 'ini', written by the workers at start and reload) or set at run
-- time (tw.set_limit, source 'sql'). A limit a call names that has no row here does not apply.
CREATE TABLE IF NOT EXISTS state.limits (
    name             state.name PRIMARY KEY,
    max_concurrent   integer NOT NULL DEFAULT 0 CHECK (max_concurrent >= 0),   -- 0: no cap
    rate_n           integer CHECK (rate_n >= 1),                              -- rate_n tokens per rate_seconds
    rate_seconds     numeric CHECK (rate_seconds > 0),
    burst            integer CHECK (burst >= 1),                               -- NULL: rate_n
    per_key          boolean NOT NULL DEFAULT false,
    max_wait_seconds numeric NOT NULL DEFAULT 0 CHECK (max_wait_seconds >= 0), -- 0: the turn's deadline bounds it
    source           text NOT NULL DEFAULT 'sql' CHECK (source IN ('ini', 'sql')),
    paused_until     timestamptz,                                              -- a tool's pushback
    next_grant_at    timestamptz,    -- a waiter waits for a token or a pause's end: rule limit_grants runs then
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_n IS NULL) = (rate_seconds IS NULL))
);
CREATE INDEX IF NOT EXISTS limits_next_grant_idx ON state.limits (next_grant_at) WHERE next_grant_at IS NOT NULL;

-- What a limit has in use, by key: key '' is the limit as a whole (its holders, and its tokens unless per_key);
-- a turn's limit_key has its own row (its holders and tokens when per_key, its last grant for round robin).
-- Changed only by a transaction that holds the limit's row in state.limits.
CREATE TABLE IF NOT EXISTS state.limit_usage (
    name          text NOT NULL,
    key           text NOT NULL,
    in_use        integer NOT NULL DEFAULT 0 CHECK (in_use >= 0),
    tokens        double precision,
    refilled_at   timestamptz,
    last_grant_at timestamptz,
    -- On key '': how long the calls granted waited (turnwatch_limit_wait_seconds, tw.limits_metrics): their
    -- count, sum and count per bucket of tw.flow_wait_bounds() (the last: above them all).
    wait_count    bigint NOT NULL DEFAULT 0,
    wait_sum      double precision NOT NULL DEFAULT 0,
    wait_buckets  bigint[],
    PRIMARY KEY (name, key)
);

-- A tool call of a tool with limits, from the step that made it until it settles: waiting (waiting_limit: not
-- claimable, no tool.call message yet), then holding (its tool.call message written).
CREATE TABLE IF NOT EXISTS state.limit_calls (
    seq          bigserial NOT NULL,
    turn_id      uuid NOT NULL,
    step         integer NOT NULL,
    tool_call_id text NOT NULL,
    tool         text NOT NULL,
    limits       text[] NOT NULL,
    limit_key    text NOT NULL DEFAULT '',
    priority     integer NOT NULL DEFAULT 0,
    status       text NOT NULL DEFAULT 'waiting' CHECK (status IN ('waiting', 'holding')),
    since        timestamptz NOT NULL DEFAULT now(),
    granted_at   timestamptz,
    PRIMARY KEY (turn_id, step, tool_call_id)
);
CREATE INDEX IF NOT EXISTS limit_calls_waiting_idx ON state.limit_calls USING gin (limits) WHERE status = 'waiting';
CREATE INDEX IF NOT EXISTS limit_calls_holding_idx ON state.limit_calls USING gin (limits) WHERE status = 'holding';

-- A limited call says which limits (NULL: its tool has none, and nothing of this costs it anything) and how long
-- it may run once started: its 2.2 deadline is set when it starts, not when it is made.
-- Pushback: a call whose tool said rate_limited runs again, at most rl_max times (NULL: 3); tries keeps the
-- tries before the last ({"try","started_at","ended_at","error"}).
ALTER TABLE state.turn_waiting_tools
    ADD COLUMN IF NOT EXISTS limits       text[],
    ADD COLUMN IF NOT EXISTS wait_seconds integer,
    ADD COLUMN IF NOT EXISTS warn_seconds double precision,
    ADD COLUMN IF NOT EXISTS rl_max       integer,
    ADD COLUMN IF NOT EXISTS tries        jsonb;

-- A turn's key for per-key limits and fairness, and its priority (0..9, higher first); its calls and its child
-- turns inherit both.
ALTER TABLE state.turns
    ADD COLUMN IF NOT EXISTS limit_key text,
    ADD COLUMN IF NOT EXISTS priority  smallint NOT NULL DEFAULT 0;
