-- Suggested timeouts (docs/python.md, `turnwatch timeouts suggest`, sql/fn/timeouts.sql): how long steps and tool
-- calls took, read through two indexes on when they ended, so that the newest runs of one profile or one tool
-- are a range scan however long the history is.
--
-- A step is the time between a turn's history row to `running` and the next one, which ends it (from_status
-- 'running'). History rows learn their turn's profile (written by the history trigger from now on; the step ends
-- already there get it below), so that a profile's step ends are one range of the index. History rows are only
-- ever inserted: the index costs one entry per step, at its end.
ALTER TABLE state.turn_history ADD COLUMN IF NOT EXISTS profile text;
UPDATE state.turn_history h SET profile = t.profile
  FROM state.turns t
 WHERE t.turn_id = h.turn_id AND h.profile IS NULL AND h.from_status = 'running' AND h.to_status <> 'running';
CREATE INDEX IF NOT EXISTS turn_history_step_end_idx ON state.turn_history (profile, at)
    WHERE from_status = 'running' AND to_status <> 'running';

-- A tool call's duration ends when it settles. The update that settles a call changes wait_status, which other
-- indexes of the table name, so it writes index entries anyway: this index adds one of them, none at insert.
CREATE INDEX IF NOT EXISTS turn_waiting_tools_settled_idx ON state.turn_waiting_tools (tool, settled_at)
    WHERE settled_at IS NOT NULL;
