-- Cheaper writes on the per-turn path (measured with tools/bench and a callgrind count of one backend).

-- Most turns have no idempotency key. A plain UNIQUE constraint indexes their NULLs too, one more index entry
-- for every turn row version (insert and each status change). Only keyed turns need the index; submit_turn's
-- ON CONFLICT names the same predicate.
ALTER TABLE state.turns DROP CONSTRAINT IF EXISTS turns_idempotency_key_key;
CREATE UNIQUE INDEX IF NOT EXISTS turns_idempotency_idx ON state.turns (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- No query filters or joins on these documents, so their statistics serve nothing, yet ANALYZE of the queue
-- tables sorted a 30,000-row sample of each of them: most of autovacuum's CPU under load.
ALTER TABLE state.turns ALTER COLUMN input SET STATISTICS 0, ALTER COLUMN agent_state SET STATISTICS 0;
ALTER TABLE state.agent_inbox ALTER COLUMN payload SET STATISTICS 0;
ALTER TABLE state.cards ALTER COLUMN content SET STATISTICS 0;
ALTER TABLE state.turn_waiting_tools ALTER COLUMN args SET STATISTICS 0, ALTER COLUMN output SET STATISTICS 0,
    ALTER COLUMN error SET STATISTICS 0;
ALTER TABLE state.force_terminations ALTER COLUMN detail SET STATISTICS 0;
ALTER TABLE state.outbox ALTER COLUMN payload SET STATISTICS 0;

-- Publishing marks become HOT updates. The partial index on unpublished events named published_at, so every
-- mark (four per turn) wrote a new row version and index entries elsewhere; with no index on published_at and
-- room on the page the new version stays on its page with no index work. The relay finds what writers did not
-- publish from a cursor instead: every event is stamped with its transaction's id, and outbox_claim scans from
-- the cursor, which never passes an unpublished event nor a transaction that may still be running.
ALTER TABLE state.outbox ADD COLUMN IF NOT EXISTS xid xid8 NOT NULL DEFAULT pg_current_xact_id();
DROP INDEX IF EXISTS state.outbox_unpublished_idx;
CREATE INDEX IF NOT EXISTS outbox_xid_idx ON state.outbox (xid, seq);
ALTER TABLE state.outbox SET (fillfactor = 50);

CREATE TABLE IF NOT EXISTS state.outbox_cursor (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    xid xid8 NOT NULL                   -- every event below it is published
);
INSERT INTO state.outbox_cursor (xid)
SELECT coalesce((SELECT min(xid) FROM state.outbox WHERE published_at IS NULL), pg_current_xact_id())
ON CONFLICT DO NOTHING;
