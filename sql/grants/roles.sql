-- Who may do what (docs/security.md): the three group roles and what each may do. Applied by every
-- `turnwatch migrate`, last, in the transaction of the code set (sql/fn, sql/rules): when the code set is made
-- anew its functions start closed, and this opens them again before the transaction commits, so no client ever
-- sees them closed. Idempotent. The role that runs migrate owns every object and keeps every right.
--
-- turnwatch_daemon    the PMO and the workers: every function of tw, and reads and writes the tables of state
-- turnwatch_client    the SQL API and what the CLI's client commands call (the writes below), and the readers
-- turnwatch_observer  the readers below only
--
-- The functions granted to clients and observers run as their owner (SECURITY DEFINER) with a fixed search_path,
-- so that a caller's own schemas, functions and operators cannot change what they do; nobody but the daemons
-- and the owner reads or writes a table of state directly.

-- The group roles, NOLOGIN: a deployment grants them to its login roles. Roles belong to the cluster, not to the
-- database: two migrates at once (here the advisory lock orders them; in two databases of one cluster nothing
-- does) may both find a role missing, and the second to create it is told it exists (42710, or 23505 from the
-- catalog's unique index once the first commits) and goes on.
DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['turnwatch_daemon', 'turnwatch_client', 'turnwatch_observer'] LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = v_role);
        BEGIN
            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', v_role);
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN
                NULL;
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'turnwatch migrate creates the role % once, and role % may not create roles', v_role,
                    current_user
                    USING ERRCODE = '42501',
                          HINT = 'Give it CREATEROLE, or let a superuser create the three roles first: CREATE ROLE '
                                 'turnwatch_daemon NOLOGIN; CREATE ROLE turnwatch_client NOLOGIN; CREATE ROLE '
                                 'turnwatch_observer NOLOGIN;';
        END;
    END LOOP;
END $$;

-- PUBLIC gets nothing in state and tw, not even PostgreSQL's default EXECUTE on a function; and a function this
-- role creates later, anywhere in this database, starts closed (a default privilege that IN SCHEMA could only
-- add to, not take away).
REVOKE ALL ON SCHEMA state, tw FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA state, tw FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA state, tw FROM PUBLIC;
REVOKE ALL ON ALL ROUTINES IN SCHEMA state, tw FROM PUBLIC;
ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON ROUTINES FROM PUBLIC;

-- Clients and observers reach no table: taken back in case an operator granted more by hand.
REVOKE ALL ON ALL TABLES IN SCHEMA state FROM turnwatch_client, turnwatch_observer;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA state FROM turnwatch_client, turnwatch_observer;
REVOKE ALL ON SCHEMA state FROM turnwatch_client, turnwatch_observer;
GRANT USAGE ON SCHEMA tw TO turnwatch_client, turnwatch_observer;

-- The daemons: every function of tw; the tables of state, read and written (the migrations' own two read only),
-- and their sequences; a table or sequence a schema migration adds is theirs from its creation on.
GRANT USAGE ON SCHEMA state, tw TO turnwatch_daemon;
GRANT EXECUTE ON ALL ROUTINES IN SCHEMA tw TO turnwatch_daemon;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA state TO turnwatch_daemon;
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON state.schema_migrations, state.code_version FROM turnwatch_daemon;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA state TO turnwatch_daemon;
ALTER DEFAULT PRIVILEGES IN SCHEMA state GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO turnwatch_daemon;
ALTER DEFAULT PRIVILEGES IN SCHEMA state GRANT USAGE ON SEQUENCES TO turnwatch_daemon;

-- The client's and the observer's functions: SECURITY DEFINER with search_path fixed to pg_catalog (then pg_temp,
-- which is never searched for functions or operators then), every overload of each name. Each one, and all it
-- calls, names our tables and functions with their schema. Altered only when not so already (an ALTER
-- FUNCTION invalidates the plans of every session that uses it).
--  - writes, for clients: what the SQL API and the CLI's client commands call (README "Security"): submit,
--    cancel, tool results, the roster, a dead letter's replay, the profiles of the CLI's own configuration (a
--    submit may publish them too). Each checks its own input: a function whose checks live in its caller
--    (tw.deliver_posted_result, behind tw.post_tool_result_ex) is never granted, nor marking events published
--    (tw.outbox_mark_published: the publisher's act; a client that could would hide any event it wrote). A
--    client's events are published by the PMOs' relay. tests/test_roles.c keeps the reviewed list;
--  - readers, for observers and clients: turns, their history, trees and tool calls, the roster and the
--    profiles, the daemons, the dead letters, the console's pages.
DO $$
DECLARE
    v_writes  text[] := ARRAY['submit_turn', 'submit_turns', 'submit_turn_ex', 'post_tool_result',
                              'post_tool_result_ex', 'cancel_turn', 'cancel_turn_ex', 'add_agent', 'retire_agent',
                              'replay_turn', 'publish_profiles', 'turn_wait', 'set_limit', 'remove_limit',
                              'add_schedule', 'remove_schedule'];
    v_readers text[] := ARRAY['turn_outcome', 'turn_show', 'turn_history', 'turn_tree', 'turns_list', 'agent_info',
                              'agents_list', 'profiles', 'daemons', 'dead_letters', 'console_turns', 'console_turn',
                              'timeouts_suggest', 'limit_show', 'limits_list', 'schedule_show', 'schedules_list'];
    f         record;
BEGIN
    -- A function granted by an earlier release (or by hand) that is no longer on the lists is taken back.
    FOR f IN
        SELECT p.oid::regprocedure AS sig
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'tw'::regnamespace AND NOT (p.proname = ANY (v_writes || v_readers))
           AND (pg_catalog.has_function_privilege('turnwatch_client', p.oid, 'EXECUTE')
                OR pg_catalog.has_function_privilege('turnwatch_observer', p.oid, 'EXECUTE'))
    LOOP
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM turnwatch_client, turnwatch_observer', f.sig);
    END LOOP;
    FOR f IN
        SELECT p.oid::regprocedure AS sig, p.proname, p.prosecdef,
               coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false) AS fixed
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'tw'::regnamespace AND p.proname = ANY (v_writes || v_readers)
         ORDER BY p.proname, p.oid
    LOOP
        IF NOT f.prosecdef OR NOT f.fixed THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, pg_temp',
                                      f.sig);
        END IF;
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO turnwatch_client', f.sig);
        IF f.proname = ANY (v_readers) THEN
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO turnwatch_observer', f.sig);
        END IF;
    END LOOP;
END $$;
