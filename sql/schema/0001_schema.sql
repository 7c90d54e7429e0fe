-- turnwatch schema: the inbox/state tables that are the source of truth.
-- Names follow the design of docs/overview.md.

CREATE SCHEMA IF NOT EXISTS state;

-- Value rules as domains rather than table CHECKs: a domain is checked when a value is assigned to its
-- column, while every table CHECK is evaluated again on each UPDATE of any column, and these rows are
-- updated several times per turn.
CREATE DOMAIN state.name AS text CHECK (VALUE ~ '^[A-Za-z0-9_-]{1,64}$');
CREATE DOMAIN state.agent_status AS text CHECK (VALUE IN ('idle', 'dispatched', 'running', 'suspended'));
CREATE DOMAIN state.turn_status AS text
    CHECK (VALUE IN ('pending', 'dispatched', 'running', 'suspended', 'done', 'failed', 'timeout', 'cancelled'));
CREATE DOMAIN state.inbox_status AS text CHECK (VALUE IN ('pending', 'processing', 'archived', 'skipped'));
CREATE DOMAIN state.target_kind AS text CHECK (VALUE IN ('agent', 'tool'));
CREATE DOMAIN state.wait_mode AS text CHECK (VALUE IN ('all', 'any', 'n'));
CREATE DOMAIN state.card_type AS text CHECK (VALUE IN ('tool.call', 'tool.result', 'task.deliverable'));
CREATE DOMAIN state.wait_status AS text CHECK (VALUE IN ('waiting', 'received', 'timeout', 'cancelled'));
CREATE DOMAIN state.result_status AS text CHECK (VALUE IN ('ok', 'error', 'timeout', 'cancelled'));
CREATE DOMAIN state.ledger_status AS text CHECK (VALUE IN ('pending', 'processing', 'done'));
CREATE DOMAIN state.event_kind AS text CHECK (VALUE IN ('state', 'task'));
CREATE DOMAIN state.positive_seconds AS integer CHECK (VALUE > 0);

-- Claim and lease tokens: every claim of an inbox item or resume ledger entry gets a fresh one, so a
-- worker that lost its claim can never commit with the token it remembers.
CREATE SEQUENCE state.claim_token_seq;

CREATE TABLE state.agents (
    agent                state.name PRIMARY KEY,
    status               state.agent_status NOT NULL DEFAULT 'idle',
    active_agent_turn_id uuid,
    active_channel_id    text,
    turn_epoch           bigint NOT NULL DEFAULT 0,
    updated_at           timestamptz NOT NULL DEFAULT now(),
    -- 2.4 re-ring spacing; kept apart from updated_at so that re-rings never delay 2.5.
    rerung_at            timestamptz,
    CHECK ((status = 'idle') = (active_agent_turn_id IS NULL))
);
-- No index but the primary key, and room on every page: each turn updates its agent's row several times
-- and every heartbeat touches updated_at, so these must stay HOT updates, or each lookup by name would walk
-- a growing chain of dead index entries. The watchdogs' scans of this small table need no index.
ALTER TABLE state.agents SET (fillfactor = 30);

CREATE TABLE state.turns (
    turn_id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    seq                 bigserial NOT NULL,              -- FIFO order per agent (served by turns_pending_idx)
    agent               state.name NOT NULL,
    channel_id          text NOT NULL,
    output_box_id       text,
    input               jsonb NOT NULL,
    idempotency_key     text UNIQUE,
    status              state.turn_status NOT NULL DEFAULT 'pending',
    turn_epoch          bigint,                          -- the agent epoch this turn was dispatched under
    step                integer NOT NULL DEFAULT 0,      -- the step running, or the last one run
    agent_state         jsonb,                           -- "state" of the last tool_calls reply
    wait_mode           state.wait_mode,
    wait_count          integer,
    resume_deadline     timestamptz,
    timeout_seconds     state.positive_seconds,
    deadline_at         timestamptz,                     -- absolute turn deadline (submit --timeout)
    error               text,                            -- a code: agent_failed, step_timeout, dispatch_timeout, ...
    error_message       text,                            -- the same in words a person can act on
    deliverable_card_id uuid,
    created_at          timestamptz NOT NULL DEFAULT now(),
    dispatched_at       timestamptz,
    started_at          timestamptz,
    suspended_at        timestamptz,
    ended_at            timestamptz,
    updated_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX turns_pending_idx ON state.turns (agent, seq) WHERE status = 'pending';
CREATE INDEX turns_resume_deadline_idx ON state.turns (resume_deadline) WHERE status = 'suspended';
CREATE INDEX turns_deadline_idx ON state.turns (deadline_at)
    WHERE deadline_at IS NOT NULL AND status IN ('pending', 'dispatched', 'running', 'suspended');
CREATE INDEX turns_agent_idx ON state.turns (agent, seq);

CREATE TABLE state.agent_inbox (
    inbox_id       bigserial PRIMARY KEY,
    target_kind    state.target_kind NOT NULL,
    target         state.name NOT NULL,
    message_type   text NOT NULL,                        -- turn, tool.call, tool.result, timeout
    turn_id        uuid,
    turn_epoch     bigint,
    step           integer,
    tool_call_id   text,
    channel_id     text,
    payload        jsonb NOT NULL DEFAULT '{}',
    status         state.inbox_status NOT NULL DEFAULT 'pending',
    created_at     timestamptz NOT NULL DEFAULT now(),
    processed_at   timestamptz,
    archived_at    timestamptz,
    claim_token    bigint,
    claimed_by     text,
    attempts       integer NOT NULL DEFAULT 0,
    outcome        text,                                 -- why it was archived: applied, stale, cancelled, ...
    watchdog_error text,
    watchdog_at    timestamptz,
    rung_at        timestamptz                           -- 2.7 re-ring spacing
);
CREATE INDEX agent_inbox_pending_idx ON state.agent_inbox (target_kind, target, inbox_id) WHERE status = 'pending';
CREATE INDEX agent_inbox_pending_age_idx ON state.agent_inbox (created_at) WHERE status = 'pending';
CREATE INDEX agent_inbox_processing_idx ON state.agent_inbox (processed_at) WHERE status = 'processing';
CREATE INDEX agent_inbox_turn_idx ON state.agent_inbox (turn_id);

CREATE TABLE state.cards (
    card_id       uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    card_type     state.card_type NOT NULL,
    turn_id       uuid NOT NULL REFERENCES state.turns (turn_id),
    agent         text NOT NULL,
    turn_epoch    bigint,
    step          integer,
    tool_call_id  text,
    output_box_id text,
    content       jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX cards_one_deliverable_idx ON state.cards (turn_id) WHERE card_type = 'task.deliverable';
CREATE UNIQUE INDEX cards_one_call_idx ON state.cards (turn_id, step, tool_call_id) WHERE card_type = 'tool.call';
CREATE UNIQUE INDEX cards_one_result_idx ON state.cards (turn_id, step, tool_call_id) WHERE card_type = 'tool.result';
CREATE INDEX cards_box_idx ON state.cards (output_box_id) WHERE output_box_id IS NOT NULL;

CREATE TABLE state.turn_waiting_tools (
    turn_id         uuid NOT NULL REFERENCES state.turns (turn_id),
    step            integer NOT NULL,
    tool_call_id    text NOT NULL,
    call_index      integer NOT NULL,                    -- call order within the step
    agent           text NOT NULL,
    tool            text NOT NULL,
    args            jsonb NOT NULL,
    timeout_seconds integer NOT NULL,
    external        boolean NOT NULL DEFAULT false,
    turn_epoch      bigint NOT NULL,
    wait_status     state.wait_status NOT NULL DEFAULT 'waiting',
    deadline_at     timestamptz NOT NULL,
    call_card_id    uuid,
    result_card_id  uuid,
    result_status   state.result_status,
    output          jsonb,
    error           jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    settled_at      timestamptz,
    PRIMARY KEY (turn_id, step, tool_call_id)
);
CREATE INDEX turn_waiting_tools_waiting_idx ON state.turn_waiting_tools (deadline_at) WHERE wait_status = 'waiting';

CREATE TABLE state.turn_resume_ledger (
    ledger_id        bigserial PRIMARY KEY,
    turn_id          uuid NOT NULL REFERENCES state.turns (turn_id),
    agent            text NOT NULL,
    turn_epoch       bigint NOT NULL,
    step             integer NOT NULL,                   -- the suspended step whose results resume the turn
    status           state.ledger_status NOT NULL DEFAULT 'pending',
    lease_token      bigint,
    lease_expires_at timestamptz,
    claimed_by       text,
    attempts         integer NOT NULL DEFAULT 0,
    outcome          text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (turn_id, step)
);
CREATE INDEX turn_resume_ledger_pending_idx ON state.turn_resume_ledger (agent, ledger_id) WHERE status = 'pending';
CREATE INDEX turn_resume_ledger_lease_idx ON state.turn_resume_ledger (lease_expires_at) WHERE status = 'processing';

CREATE TABLE state.force_terminations (
    id         bigserial PRIMARY KEY,
    turn_id    uuid NOT NULL REFERENCES state.turns (turn_id),
    agent      text NOT NULL,
    turn_epoch bigint,
    reason     text NOT NULL,
    detail     jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX force_terminations_turn_idx ON state.force_terminations (turn_id);

-- Events are written here in the same transaction as the state change they report, then published.
CREATE TABLE state.outbox (
    event_id          uuid PRIMARY KEY,
    seq               bigserial NOT NULL,
    kind              state.event_kind NOT NULL,
    subject           text NOT NULL,
    payload           jsonb NOT NULL,
    turn_id           uuid,
    turn_epoch        bigint,
    created_at        timestamptz NOT NULL DEFAULT now(),
    relay_lease_until timestamptz,
    published_at      timestamptz
);
-- The one final event of a turn.
CREATE UNIQUE INDEX outbox_one_task_event_idx ON state.outbox (turn_id) WHERE kind = 'task';
CREATE INDEX outbox_unpublished_idx ON state.outbox (seq) WHERE published_at IS NULL;

-- These are queue tables: rows change state several times within seconds. Vacuum and analyze them far
-- more eagerly than the defaults, so that dead index entries and stale statistics never make the claim
-- and dispatch queries scan what is already done.
ALTER TABLE state.agents SET (autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 500,
                              autovacuum_analyze_scale_factor = 0.05);
ALTER TABLE state.turns SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,
                             autovacuum_vacuum_cost_delay = 0);
ALTER TABLE state.agent_inbox SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,
                                   autovacuum_vacuum_cost_delay = 0);
ALTER TABLE state.turn_resume_ledger SET (autovacuum_vacuum_scale_factor = 0.02,
                                          autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE state.turn_waiting_tools SET (autovacuum_vacuum_scale_factor = 0.02,
                                          autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE state.outbox SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,
                              autovacuum_vacuum_cost_delay = 0);
