-- The relay's cursor also holds a place within a transaction's events (issue 23). A cancelled tree writes a
-- hundred thousand events in one transaction; a cursor of transaction ids alone cannot move into it, so every
-- claim scanned the part of that transaction already published, again and again. With (xid, seq) the cursor moves
-- through it as it is published, and tw.outbox_claim never looks at more than a few batches' worth of rows.
-- Every event below (xid, seq), in that order, is published; seq 0 is below every event of xid.
ALTER TABLE state.outbox_cursor ADD COLUMN IF NOT EXISTS seq bigint NOT NULL DEFAULT 0;
