-- Cron expressions (docs/schedules.md): filled below.
CREATE OR REPLACE FUNCTION tw.cron_placeholder() RETURNS integer LANGUAGE sql IMMUTABLE AS $$ SELECT 1 $$;
