-- Issue 23: the turns of one delegation tree are bounded ([worker] max_tree_turns), and a large tree is
-- cancelled in bounded batches rather than in one transaction. The functions are in sql/fn/delegation.sql
-- (tw.tree_lock, tw.delegate, tw.cancel_children) and sql/rules/tree_cancel.sql (tw.wd_tree_cancels).

-- Every turn knows the root of its tree (NULL: it is a root), copied from its parent when a child is created,
-- so that a delegating step finds its tree's counter without walking up.
ALTER TABLE state.turns ADD COLUMN IF NOT EXISTS root_turn_id uuid;

-- One row per tree that has delegated: how many turns it has made, the root included. A step that delegates
-- locks its tree's row before anything else (see the lock order in sql/README.md), so the steps of one
-- tree count their children one after the other and the bound is exact. A separate row, not a column of the
-- root turn, and no foreign key (its check would lock the root's row): a lock on it, taken first, never waits
-- behind the root's own agent and turn rows.
CREATE TABLE IF NOT EXISTS state.turn_trees (
    root_turn_id uuid PRIMARY KEY,
    turns        integer NOT NULL DEFAULT 1,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- Child turns still to be cancelled: a turn whose children (of its steps up to max_step) could not all be
-- cancelled in the transaction that ended it or settled their calls, because that transaction had cancelled
-- as many turns as one batch may (tw.cancel_batch). The PMO's rule tree_cancel takes it up at once and
-- cancels the rest in batches, one transaction each. Written and read only by a transaction that holds the
-- turn's row, so it needs no lock order of its own.
CREATE TABLE IF NOT EXISTS state.tree_cancels (
    turn_id      uuid PRIMARY KEY REFERENCES state.turns (turn_id),
    max_step     integer NOT NULL,
    message      text NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS tree_cancels_requested_idx ON state.tree_cancels (requested_at);

-- Trees already open when this migration runs: their turns learn their root, and the tree its count.
WITH RECURSIVE tree (turn_id, root) AS (
    SELECT r.turn_id, r.turn_id FROM state.turns r
     WHERE r.parent_turn_id IS NULL AND r.status IN ('pending', 'dispatched', 'running', 'suspended')
       AND EXISTS (SELECT 1 FROM state.turns c WHERE c.parent_turn_id = r.turn_id)
    UNION ALL
    SELECT c.turn_id, tree.root FROM state.turns c JOIN tree ON c.parent_turn_id = tree.turn_id
), counted AS (
    INSERT INTO state.turn_trees (root_turn_id, turns)
    SELECT root, count(*) FROM tree GROUP BY root
    ON CONFLICT DO NOTHING
)
UPDATE state.turns t SET root_turn_id = tree.root FROM tree
 WHERE t.turn_id = tree.turn_id AND tree.turn_id <> tree.root;
