-- Who waits for a turn's end (tw.turn_wait): the end's transaction notifies tw_turn_end only for a turn that has
-- waiters, so that the many ends nobody waits for do not notify (a transaction that notifies holds a cluster-wide
-- lock through its commit: notifying ones cannot commit together). Unlogged: a waiter registers again whenever it
-- reads the turn (after a reconnect, a failover), and a row lives only until the turn ends, which deletes it.
CREATE UNLOGGED TABLE state.turn_waiters (
    turn_id uuid        NOT NULL,
    pid     integer     NOT NULL,
    since   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (turn_id, pid)
);
