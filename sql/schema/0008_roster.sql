-- Agent roster and delegation (docs/roster.md). A profile is an [agent.NAME] section of the config: a
-- program with its timeouts and policies, published here by the daemons. An agent is a row of the roster, an id
-- bound to exactly one profile for its life; every profile is also an agent of its own name.
--
-- The profile is copied onto every row that work is found by (turns, agent inbox items, resume ledger entries):
-- an agent never changes profile, so the copy never goes stale, and a worker finds the work of the profiles it
-- serves through one index without reading the roster, however many agents it holds.

CREATE TABLE IF NOT EXISTS state.profiles (
    profile    state.name PRIMARY KEY,
    updated_at timestamptz NOT NULL DEFAULT now()        -- last published by a daemon (start, reload) or migrate
);

ALTER TABLE state.agents
    ADD COLUMN IF NOT EXISTS profile    text,
    ADD COLUMN IF NOT EXISTS created_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN IF NOT EXISTS retired_at timestamptz,      -- no new turns; those already submitted still run
    ADD COLUMN IF NOT EXISTS metadata   jsonb NOT NULL DEFAULT '{}';
UPDATE state.agents SET profile = agent WHERE profile IS NULL;
ALTER TABLE state.agents ALTER COLUMN profile SET NOT NULL;
ALTER TABLE state.agents ALTER COLUMN metadata SET STATISTICS 0;
-- 30 % full pages suited a table of a few busy rows; a roster of a million mostly idle agents would be three times
-- its size. 70 still leaves room for the updates of the few active agents on a page to stay HOT.
ALTER TABLE state.agents SET (fillfactor = 70);
INSERT INTO state.profiles (profile) SELECT DISTINCT profile FROM state.agents ON CONFLICT DO NOTHING;
-- `agents list --profile P` in id order; the primary key serves the list without a profile.
CREATE INDEX IF NOT EXISTS agents_profile_idx ON state.agents (profile, agent);

ALTER TABLE state.turns
    ADD COLUMN IF NOT EXISTS profile             text,
    ADD COLUMN IF NOT EXISTS depth               integer NOT NULL DEFAULT 0,  -- 0 submitted, 1 its children, ...
    ADD COLUMN IF NOT EXISTS parent_turn_id      uuid,
    ADD COLUMN IF NOT EXISTS parent_step         integer,
    ADD COLUMN IF NOT EXISTS parent_tool_call_id text;
UPDATE state.turns SET profile = agent WHERE profile IS NULL;
ALTER TABLE state.turns ALTER COLUMN profile SET NOT NULL;
CREATE INDEX IF NOT EXISTS turns_parent_idx ON state.turns (parent_turn_id) WHERE parent_turn_id IS NOT NULL;
-- 2.4 and 2.5 per profile: whether a turn waits for a busy worker or for nobody depends on its profile.
CREATE INDEX IF NOT EXISTS turns_dispatched_profile_idx ON state.turns (profile, updated_at)
    WHERE status = 'dispatched';
DROP INDEX IF EXISTS state.turns_dispatched_idx;
DROP INDEX IF EXISTS state.turns_dispatched_ring_idx;
CREATE INDEX IF NOT EXISTS turns_dispatched_profile_ring_idx
    ON state.turns (profile, (coalesce(rerung_at, updated_at))) WHERE status = 'dispatched';

-- For agent items: the target agent's profile. Tool items leave it NULL (their target is the tool).
ALTER TABLE state.agent_inbox ADD COLUMN IF NOT EXISTS profile text;
UPDATE state.agent_inbox SET profile = target
 WHERE target_kind = 'agent' AND profile IS NULL AND status IN ('pending', 'processing');
CREATE INDEX IF NOT EXISTS agent_inbox_pending_profile_idx ON state.agent_inbox (profile, inbox_id)
    WHERE status = 'pending' AND target_kind = 'agent';
-- A `turn` message carries its turn's seq: a worker starts ready turns in submit order across agents (an agent's
-- second turn, ready when its first ends, goes before a later submit of another agent that waited for a slot).
ALTER TABLE state.agent_inbox ADD COLUMN IF NOT EXISTS turn_seq bigint;
UPDATE state.agent_inbox i SET turn_seq = t.seq FROM state.turns t
 WHERE t.turn_id = i.turn_id AND i.message_type = 'turn' AND i.status IN ('pending', 'processing');
CREATE INDEX IF NOT EXISTS agent_inbox_pending_turn_idx ON state.agent_inbox (profile, turn_seq)
    WHERE status = 'pending' AND target_kind = 'agent' AND message_type = 'turn';

ALTER TABLE state.turn_resume_ledger ADD COLUMN IF NOT EXISTS profile text;
UPDATE state.turn_resume_ledger SET profile = agent WHERE profile IS NULL;
ALTER TABLE state.turn_resume_ledger ALTER COLUMN profile SET NOT NULL;
DROP INDEX IF EXISTS state.turn_resume_ledger_pending_idx;
CREATE INDEX IF NOT EXISTS turn_resume_ledger_pending_profile_idx ON state.turn_resume_ledger (profile, ledger_id)
    WHERE status = 'pending';

-- A delegating call's child turn (section 14).
ALTER TABLE state.turn_waiting_tools ADD COLUMN IF NOT EXISTS child_turn_id uuid;

-- A worker's capacity, for 2.4, 2.5 and 2.7: since when it has had a free slot (NULL: every slot busy, or it
-- takes no new work). Written by the worker when that changes, lazily when a slot frees (see worker/capacity.c).
ALTER TABLE state.daemons
    ADD COLUMN IF NOT EXISTS slots      integer,
    ADD COLUMN IF NOT EXISTS free_since timestamptz;
