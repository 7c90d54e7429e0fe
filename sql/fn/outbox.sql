-- The outbox relay: claiming events their writer did not publish, marking events published.

-- Claims events that nobody published: their writer died or lost NATS before it could, or is a SQL API client,
-- which leaves them to the relay (NOTIFY tw_outbox). A relay claims again at once while the answer says "more",
-- publishing and marking the batches it has while it claims the next, so that a backlog drains at the speed of
-- the database and NATS (issue 23). Only events older than p_min_age_ms are taken (their writer is given that
-- long to publish them itself), and they are leased for p_lease_s, so that several relays rarely publish the same
-- one twice. A batch of up to p_limit events takes, in this order:
--  * with p_newest > 0, what is unpublished among the p_newest newest events, newest first, up to half the batch:
--    the events a SQL API client has just committed, or whose writer's publish has just failed, never wait
--    behind an older flood;
--  * the rest in (xid, seq) order, from the cursor or from where this relay's previous claim stopped
--    (p_after_xid, p_after_seq), looking at no more than 4 * p_limit events.
-- First the cursor (state.outbox_cursor: every event below it is published) moves up over at most 4 * p_limit
-- published events, to the oldest one still unpublished, but never past the oldest transaction still running:
-- that transaction's events, once committed, will be at or above it. Each call thus looks at a bounded number
-- of rows however large the backlog, and no index needs published_at (its marks stay HOT updates).
-- Returns {"events": [{"event_id","subject","text"}...], "xid", "seq": where the next claim goes on (null: at the
-- cursor), "more": there may be more to claim at once, "newest": the newest events had more than their share}.
CREATE OR REPLACE FUNCTION tw.outbox_claim(p_min_age_ms integer, p_lease_s integer, p_limit integer,
                                           p_newest integer, p_after_xid xid8, p_after_seq bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_horizon  xid8 := pg_snapshot_xmin(pg_current_snapshot());
    v_window   integer := 4 * p_limit;
    v_before   timestamptz := now() - make_interval(secs => p_min_age_ms / 1000.0);
    v_lease    timestamptz := now() + make_interval(secs => p_lease_s);
    v_cur_xid  xid8;
    v_cur_seq  bigint;
    v_xid      xid8;
    v_seq      bigint;
    v_row      record;
    v_row_xid  xid8;
    v_row_seq  bigint;
    v_seen     integer := 0;
    v_open     boolean := false;
    v_more     boolean;
    v_newest   jsonb := '[]';
    v_n_newest integer := 0;
    v_want     integer;
    v_rows     tid[];
    v_n_picked integer := 0;
    v_old      jsonb := '[]';
    v_aged     integer := 0;
    v_n_aged   integer := 0;
BEGIN
    -- Not worth a WAL flush of its own (as the marks): lost in a crash of PostgreSQL, a lease or a cursor move
    -- only makes a relay claim those events again, under the same event ids.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT xid, seq INTO v_cur_xid, v_cur_seq FROM state.outbox_cursor;
    v_xid := v_cur_xid;
    v_seq := v_cur_seq;
    FOR v_row IN SELECT xid, seq, published_at IS NULL AS open FROM state.outbox
                  WHERE (xid, seq) >= (v_cur_xid, v_cur_seq) ORDER BY xid, seq LIMIT v_window LOOP
        v_seen := v_seen + 1;
        v_open := v_row.open;
        v_xid := v_row.xid;
        v_seq := v_row.seq + CASE WHEN v_open THEN 0 ELSE 1 END;
        EXIT WHEN v_open;
    END LOOP;
    IF NOT v_open AND v_seen < v_window THEN
        -- All there is, is published.
        v_xid := v_horizon;
        v_seq := 0;
    END IF;
    -- Every transaction below v_horizon has ended, so nothing can still appear below the new cursor.
    IF (v_xid, v_seq) > (v_horizon, 0::bigint) THEN
        v_xid := v_horizon;
        v_seq := 0;
    END IF;
    v_more := NOT v_open AND v_seen = v_window AND (v_xid, v_seq) < (v_horizon, 0::bigint);
    IF (v_xid, v_seq) > (v_cur_xid, v_cur_seq) THEN
        UPDATE state.outbox_cursor SET xid = v_xid, seq = v_seq WHERE (xid, seq) < (v_xid, v_seq);
        v_cur_xid := v_xid;
        v_cur_seq := v_seq;
    END IF;

    -- The newest events first. A data-modifying WITH must be the top-level statement, hence SELECT ... INTO.
    IF p_newest > 0 AND p_limit > 1 THEN
        -- Never below the cursor: everything there is published, and the walk stays short when little is not.
        SELECT xid, seq INTO v_xid, v_seq FROM state.outbox WHERE (xid, seq) >= (v_cur_xid, v_cur_seq)
         ORDER BY xid DESC, seq DESC OFFSET p_newest - 1 LIMIT 1;
        IF NOT FOUND OR (v_xid, v_seq) < (v_cur_xid, v_cur_seq) THEN
            v_xid := v_cur_xid;
            v_seq := v_cur_seq;
        END IF;
        WITH c AS (
            UPDATE state.outbox o SET relay_lease_until = v_lease
             WHERE event_id IN (SELECT event_id FROM state.outbox
                                 WHERE (xid, seq) >= (v_xid, v_seq) AND published_at IS NULL AND created_at < v_before
                                   AND (relay_lease_until IS NULL OR relay_lease_until < now())
                                 ORDER BY xid DESC, seq DESC LIMIT p_limit / 2 FOR UPDATE SKIP LOCKED)
            RETURNING o.xid, o.seq, o.event_id, o.subject, o.payload, o.created_at)
        SELECT coalesce(jsonb_agg(tw.ev_publish(event_id, subject, payload)
                                  ORDER BY xid DESC, seq DESC), '[]'::jsonb), count(*),
               count(*) FILTER (WHERE created_at < now() - interval '1 second')
          INTO v_newest, v_n_newest, v_aged
          FROM c;
    END IF;

    -- Then the oldest, from where the previous claim stopped if that is above the cursor.
    IF p_after_xid IS NOT NULL AND (p_after_xid, p_after_seq + 1) > (v_cur_xid, v_cur_seq) THEN
        v_xid := p_after_xid;
        v_seq := p_after_seq + 1;
    ELSE
        v_xid := v_cur_xid;
        v_seq := v_cur_seq;
    END IF;
    v_want := p_limit - v_n_newest;
    -- The next events in that order, at most v_window of them looked at; what another relay holds is skipped.
    SELECT array_agg(ctid), count(*), (array_agg(xid ORDER BY xid DESC, seq DESC))[1],
           (array_agg(seq ORDER BY xid DESC, seq DESC))[1]
      INTO v_rows, v_n_picked, v_row_xid, v_row_seq
      FROM (SELECT ctid, xid, seq
              FROM (SELECT ctid, xid, seq, published_at, created_at, relay_lease_until FROM state.outbox
                     WHERE (xid, seq) >= (v_xid, v_seq) ORDER BY xid, seq LIMIT v_window) w
             WHERE published_at IS NULL AND created_at < v_before
               AND (relay_lease_until IS NULL OR relay_lease_until < now())
             ORDER BY xid, seq LIMIT v_want) e;
    IF v_n_picked > 0 THEN
        -- By ctid, a third of the cost of finding them again by event_id. A row changed since (published, or
        -- leased by another relay) is not found at its old place, and is rightly left alone; whatever row is
        -- locked there is checked again, so only an unpublished, unleased event is ever claimed.
        WITH c AS (
            UPDATE state.outbox o SET relay_lease_until = v_lease
             WHERE ctid IN (SELECT ctid FROM state.outbox
                             WHERE ctid = ANY (v_rows) AND published_at IS NULL AND created_at < v_before
                               AND (relay_lease_until IS NULL OR relay_lease_until < now())
                               FOR UPDATE SKIP LOCKED)
            RETURNING o.xid, o.seq, o.event_id, o.subject, o.payload, o.created_at)
        SELECT coalesce(jsonb_agg(tw.ev_publish(event_id, subject, payload)
                                  ORDER BY xid, seq), '[]'::jsonb),
               count(*) FILTER (WHERE created_at < now() - interval '1 second')
          INTO v_old, v_n_aged
          FROM c;
    END IF;
    -- Where the next claim of this drain goes on: after the last event taken when the batch is full, else after
    -- the window when it was full; otherwise this drain is over and the next one starts at the cursor.
    IF v_n_picked < v_want THEN
        SELECT xid, seq INTO v_row_xid, v_row_seq FROM state.outbox
         WHERE (xid, seq) >= (v_xid, v_seq) ORDER BY xid, seq OFFSET v_window - 1 LIMIT 1;
    END IF;
    RETURN jsonb_build_object('events', v_newest || v_old, 'xid', v_row_xid::text, 'seq', v_row_seq,
                              'more', v_more OR v_row_xid IS NOT NULL,
                              'newest', v_n_newest > 0 AND v_n_newest = p_limit / 2,
                              -- Written over a second ago: left by a writer that died or lost NATS (the rest
                              -- are mostly SQL API clients', which leave their events to the relay).
                              'aged', v_aged + v_n_aged);
END
$$;

-- The claim of releases up to 2 (oldest first, from the cursor), for a PMO of that release during an upgrade.
CREATE OR REPLACE FUNCTION tw.outbox_claim(p_min_age_ms integer, p_lease_s integer, p_limit integer)
RETURNS jsonb LANGUAGE sql AS $$
    SELECT tw.outbox_claim(p_min_age_ms, p_lease_s, p_limit, 0, NULL, NULL) -> 'events'
$$;

CREATE OR REPLACE FUNCTION tw.outbox_mark_published(p_ids uuid[])
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    -- Not worth a WAL flush of its own: lost in a crash of PostgreSQL, a mark only makes the relay publish
    -- those events again, under the same event ids (at least once, as ever). Any later commit that waits for
    -- its flush makes this one durable too.
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE state.outbox SET published_at = now() WHERE event_id = ANY (p_ids) AND published_at IS NULL;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
