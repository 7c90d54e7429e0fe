-- Turns across agents, newest first (the console's list): seq never changes, so the index costs no HOT update.
CREATE INDEX IF NOT EXISTS turns_seq_idx ON state.turns (seq);
