-- Small helpers: validation of what comes from outside, the database clock in milliseconds, who acts.

-- Validation of what comes from outside (docs/limits.md), for the SQL API as for the CLI: the same rules
-- as common/names.c, the errors SQLSTATE 22023. A name (agent, profile, limit, schedule): [A-Za-z0-9_-], 1 to 64
-- characters; an identifier (channel, box, idempotency or limit key): 1 to 256 bytes, no control characters, or
-- none at all. The predicates for set-based checks, the check_ functions to raise for one value.
CREATE OR REPLACE FUNCTION tw.name_ok(p_value text)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT p_value IS NOT NULL AND p_value ~ '^[A-Za-z0-9_-]{1,64}$'
$$;

CREATE OR REPLACE FUNCTION tw.ident_ok(p_value text)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT p_value IS NULL OR octet_length(p_value) BETWEEN 1 AND 256 AND p_value !~ '[\x01-\x1f\x7f]'
$$;

CREATE OR REPLACE FUNCTION tw.check_name(p_what text, p_value text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF NOT tw.name_ok(p_value) THEN
        RAISE EXCEPTION 'invalid % %: allowed are [A-Za-z0-9_-], 1 to 64 characters', p_what,
            coalesce(quote_literal(left(p_value, 80)), 'NULL') USING ERRCODE = '22023';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION tw.check_ident(p_what text, p_value text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF NOT tw.ident_ok(p_value) THEN
        RAISE EXCEPTION 'invalid %: 1 to 256 bytes, no control characters', p_what USING ERRCODE = '22023';
    END IF;
END $$;

-- Documents are limited to 1 MiB of compact JSON (the CLI measures what it sends). A jsonb value's text form
-- adds a space after every ':' and ',', so the SQL functions, which see only that form, allow it
-- tw.doc_max_text() bytes (common/registry.h TW_DOC_TEXT_MAX, generated into registry.sql).

-- The length in bytes of a jsonb value written as compact JSON, as a user writes it and as the CLI measures
-- it: its text form less the space PostgreSQL puts after every ':' and ',' between tokens (not those inside
-- strings, which the first alternative keeps as they are).
CREATE OR REPLACE FUNCTION tw.json_compact_length(p_doc jsonb)
RETURNS bigint LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT octet_length(regexp_replace(p_doc::text, '("(?:[^"\\]|\\.)*")|([:,]) ', '\1\2', 'g'))::bigint
$$;

-- A turn's own deadline in seconds, exactly as it applies (deadline_at was set in the transaction that created
-- the turn): a delegated child's args.timeout_seconds may have a fraction that the whole-second timeout_seconds
-- column rounds (issue 23: 1.4 s was reported as a "1 second deadline"). NULL without a deadline.
CREATE OR REPLACE FUNCTION tw.turn_deadline_seconds(t state.turns)
RETURNS numeric LANGUAGE sql IMMUTABLE AS $$
    SELECT extract(epoch FROM t.deadline_at - tw.turn_start_at(t))
$$;

-- Seconds for a message: up to milliseconds, no trailing zeros (1.4, 600, 0.25).
CREATE OR REPLACE FUNCTION tw.seconds_text(p_seconds numeric)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT rtrim(rtrim(round(p_seconds, 3)::text, '0'), '.')
$$;

-- Milliseconds from now (the database clock) until p_due, rounded up; negative when it is overdue (the daemon
-- tells a rule that could not act on an old due time from one that came due just now); NULL when nothing is
-- due.
CREATE OR REPLACE FUNCTION tw.ms_until(p_due timestamptz)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT ceil(extract(epoch FROM p_due - clock_timestamp()) * 1000)::bigint
$$;

CREATE OR REPLACE FUNCTION tw.lateness_ms(p_due timestamptz)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT round(extract(epoch FROM clock_timestamp() - p_due) * 1000)::bigint
$$;

-- Who is acting, as the turn history records it: the session setting tw.actor, which the daemons set to their
-- id (host:pid) and the CLI to `cli` on every connection; any other client is `sql`. Anyone may set the
-- setting, so a daemon's id is believed only from a daemon's session (tw.daemon_session): a client that sets
-- tw.actor to a daemon's id is recorded as `sql`, and `cli` is the only other name a client may give itself.
-- SQL, one expression: inlined into the statement that calls it (a history row's INSERT, once a row),
-- where a PL/pgSQL function was a call of its own each row; tw.daemon_session is asked only for a name other
-- than `cli`.
CREATE OR REPLACE FUNCTION tw.actor()
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN coalesce(current_setting('tw.actor', true), '') = '' THEN 'sql'
                WHEN current_setting('tw.actor', true) = 'cli' OR tw.daemon_session()
                    THEN current_setting('tw.actor', true)
                ELSE 'sql' END
$$;

-- The session is a daemon's: its login role is a member of turnwatch_daemon, or of the owner of schema tw (the
-- role that ran migrate, which may run the daemons too). session_user, not current_user: inside the clients'
-- SECURITY DEFINER functions current_user is the owner.
-- PL/pgSQL, not SQL: it runs for every history row a daemon writes, and a SQL function called from PL/pgSQL is
-- planned again at every call (159 us, twice per turn, measured with tools/bench --statements), where PL/pgSQL
-- keeps its plan for the session.
-- Two statements, not one OR: the first, with no subquery, is a simple expression that PL/pgSQL evaluates
-- without starting an executor, and answers for the daemons' role (and a superuser); with the subquery in it,
-- every call started one (~30k instructions a history row, callgrind).
CREATE OR REPLACE FUNCTION tw.daemon_session()
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF coalesce(pg_catalog.pg_has_role(session_user, pg_catalog.to_regrole('turnwatch_daemon'), 'MEMBER'), false) THEN
        RETURN true;
    END IF;
    RETURN pg_catalog.pg_has_role(session_user, (SELECT n.nspowner FROM pg_catalog.pg_namespace n
                                                  WHERE n.nspname = 'tw'), 'MEMBER');
END $$;

-- A list's limit as a client gives it: 1 to p_max rows (the CLI's --limit allows as much), else 22023.
CREATE OR REPLACE FUNCTION tw.check_limit(p_limit integer, p_max integer)
RETURNS integer LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND p_max THEN
        RAISE EXCEPTION 'limit must be a whole number from 1 to %, not %', p_max, coalesce(p_limit::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    RETURN p_limit;
END $$;

-- An answer that says a thing exists (a repeated idempotency key's turn, an agent already in the roster, a
-- result already posted) must be as durable as the thing (docs/high-availability.md): given only after a commit that
-- the synchronous standby confirmed. Such an answer often comes from a pure read, whose commit writes no WAL
-- and so waits for nothing: on a primary that is about to be demoted and rewound, the thing may exist there
-- only. This writes one small WAL record in the transaction (a transactional logical message, which also
-- takes a transaction id), so that its commit is flushed and waits for the standby like any write; and since
-- the thing committed before this transaction saw it, the standby then has it too. (pg_current_xact_id()
-- alone is not enough: a transaction with an id but no WAL of its own commits without waiting.)
CREATE OR REPLACE FUNCTION tw.durable_answer()
RETURNS void LANGUAGE sql AS $$
    SELECT pg_logical_emit_message(true, 'turnwatch', 'answer')
$$;
