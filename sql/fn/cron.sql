-- STUB: replaced by the cron engine (i37-cron)

CREATE OR REPLACE FUNCTION tw.cron_check(p_cron text, p_timezone text)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_timezone IS DISTINCT FROM 'UTC' THEN
        RETURN format('unknown time zone %s (this build knows UTC only)', coalesce(p_timezone, 'NULL'));
    END IF;
    IF p_cron IS NULL OR p_cron !~ '^(\*|\*/[0-9]{1,2}|[0-9]{1,2}) \* \* \* \*$' THEN
        RETURN format('cron %s: expected five fields (this build knows * * * * *, */N * * * * and M * * * *)',
                      coalesce(p_cron, 'NULL'));
    END IF;
    IF p_cron ~ '^[0-9]' AND split_part(p_cron, ' ', 1)::int > 59 THEN
        RETURN 'cron minute field: 0-59';
    END IF;
    IF p_cron ~ '^\*/' AND substr(split_part(p_cron, ' ', 1), 3)::int NOT BETWEEN 1 AND 59 THEN
        RETURN 'cron minute step: 1-59';
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION tw.cron_next(p_cron text, p_timezone text, p_after timestamptz)
RETURNS timestamptz LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_f    text := split_part(p_cron, ' ', 1);
    v_base timestamptz := date_trunc('minute', p_after AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    v_min  integer;
    v_step integer;
BEGIN
    IF tw.cron_check(p_cron, p_timezone) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    IF v_f = '*' THEN
        RETURN v_base + interval '1 minute';
    ELSIF v_f LIKE '*/%' THEN
        v_step := substr(v_f, 3)::int;
        v_min := extract(minute FROM v_base AT TIME ZONE 'UTC')::int;
        v_min := (v_min / v_step + 1) * v_step;
        IF v_min >= 60 THEN
            RETURN date_trunc('hour', v_base AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '1 hour';
        END IF;
        RETURN date_trunc('hour', v_base AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + make_interval(mins => v_min);
    END IF;
    v_min := v_f::int;
    v_base := date_trunc('hour', p_after AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + make_interval(mins => v_min);
    IF v_base <= p_after THEN
        v_base := v_base + interval '1 hour';
    END IF;
    RETURN v_base;
END $$;
