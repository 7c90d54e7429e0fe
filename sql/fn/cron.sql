-- Cron expressions (docs/schedules.md): five fields, minute hour day-of-month month day-of-week, each `*`, `*/n`,
-- `a`, `a-b`, `a-b/n` or a comma list of them, with names of months and days (jan-dec, sun-sat, any case);
-- day-of-week 0 and 7 are Sunday. The fields' ranges and names are tw.cron_field_arrays(), generated from
-- common/registry.h as common/cron.c reads them; both give the same errors (tests/data/cron_cases.txt).
-- Fire times are computed in the schedule's time zone with PostgreSQL's time zone database.

-- One value of a field: digits, or one of its names; o_err when neither, or out of the field's range.
CREATE OR REPLACE FUNCTION tw.cron_value(p_field integer, p_name text, p_lo integer, p_hi integer, p_names text[],
                                         p_s text, OUT o_v integer, OUT o_err text)
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_s ~ '^[0-9]+$' THEN
        IF octet_length(p_s) <= 4 THEN
            o_v := p_s::integer;
        END IF;
        IF o_v IS NULL OR o_v NOT BETWEEN p_lo AND p_hi THEN
            o_v := NULL;
            o_err := format('cron field %s (%s) value %s out of range %s-%s', p_field, p_name, p_s, p_lo, p_hi);
        END IF;
        RETURN;
    END IF;
    IF octet_length(p_s) = 3 AND p_names IS NOT NULL THEN
        o_v := array_position(p_names, lower(p_s)) - 1 + p_lo;
    END IF;
    IF o_v IS NULL THEN
        o_err := format('cron field %s (%s): ''%s'' is not a number or a name', p_field, p_name, p_s);
    END IF;
END $$;

-- An expression's five sets of values as bit masks (bit v set: value v matches; day-of-week 7 as 0), whether
-- day-of-month and day-of-week start with `*` (when both do not, a day matches either), or o_err: what is wrong,
-- naming the field and its range. Expressions only, no statement: cheap per call.
CREATE OR REPLACE FUNCTION tw.cron_parse(p_cron text, OUT o_minutes bigint, OUT o_hours bigint,
                                         OUT o_doms bigint, OUT o_months bigint, OUT o_dows bigint,
                                         OUT o_dom_star boolean, OUT o_dow_star boolean, OUT o_err text)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_f      record;
    v_fields text[];
    v_lo     integer[];
    v_hi     integer[];
    v_names  text[];
    v_tok    text[];
    v_set    bigint;
    v_el     text;
    v_base   text;
    v_step   text;
    v_a      record;
    v_b      record;
    v_from   integer;
    v_to     integer;
    v_n      integer;
    i        integer;
    g        integer;
BEGIN
    IF octet_length(coalesce(p_cron, '')) > tw.cron_expr_max() THEN
        o_err := format('cron expression longer than %s characters', tw.cron_expr_max());
        RETURN;
    END IF;
    v_tok := CASE WHEN btrim(coalesce(p_cron, ''), E' \t') = '' THEN '{}'::text[]
                  ELSE regexp_split_to_array(btrim(p_cron, E' \t'), E'[ \t]+') END;
    IF cardinality(v_tok) <> 5 THEN
        o_err := format('cron expression has %s fields, not 5 (minute hour day-of-month month day-of-week)',
                        cardinality(v_tok));
        RETURN;
    END IF;
    v_f := tw.cron_field_arrays();
    v_fields := v_f.names;
    v_lo := v_f.lo;
    v_hi := v_f.hi;
    v_names := v_f.value_names;
    FOR i IN 1 .. 5 LOOP
        v_set := 0;
        FOREACH v_el IN ARRAY string_to_array(v_tok[i], ',') LOOP
            IF v_el = '' THEN
                o_err := format('cron field %s (%s): empty list element', i, v_fields[i]);
                RETURN;
            END IF;
            v_base := split_part(v_el, '/', 1);
            v_step := CASE WHEN strpos(v_el, '/') > 0 THEN substr(v_el, strpos(v_el, '/') + 1) END;
            IF v_base = '*' THEN
                v_from := v_lo[i];
                v_to := v_hi[i];
            ELSIF strpos(v_base, '-') > 0 THEN
                v_a := tw.cron_value(i, v_fields[i], v_lo[i], v_hi[i], string_to_array(nullif(v_names[i], ''), ' '),
                                     split_part(v_base, '-', 1));
                IF v_a.o_err IS NOT NULL THEN
                    o_err := v_a.o_err;
                    RETURN;
                END IF;
                v_b := tw.cron_value(i, v_fields[i], v_lo[i], v_hi[i], string_to_array(nullif(v_names[i], ''), ' '),
                                     substr(v_base, strpos(v_base, '-') + 1));
                IF v_b.o_err IS NOT NULL THEN
                    o_err := v_b.o_err;
                    RETURN;
                END IF;
                IF v_a.o_v > v_b.o_v THEN
                    o_err := format('cron field %s (%s) range %s is backwards', i, v_fields[i], v_base);
                    RETURN;
                END IF;
                v_from := v_a.o_v;
                v_to := v_b.o_v;
            ELSE
                v_a := tw.cron_value(i, v_fields[i], v_lo[i], v_hi[i], string_to_array(nullif(v_names[i], ''), ' '),
                                     v_base);
                IF v_a.o_err IS NOT NULL THEN
                    o_err := v_a.o_err;
                    RETURN;
                END IF;
                IF v_step IS NOT NULL THEN
                    o_err := format('cron field %s (%s): a step needs * or a range before it in ''%s''', i,
                                    v_fields[i], v_el);
                    RETURN;
                END IF;
                v_from := v_a.o_v;
                v_to := v_a.o_v;
            END IF;
            v_n := 1;
            IF v_step IS NOT NULL THEN
                v_n := CASE WHEN v_step ~ '^[0-9]{1,4}$' THEN v_step::integer END;
                IF v_n IS NULL OR v_n NOT BETWEEN 1 AND v_hi[i] THEN
                    o_err := format('cron field %s (%s) step ''%s'' is not a number from 1 to %s', i, v_fields[i],
                                    v_step, v_hi[i]);
                    RETURN;
                END IF;
            END IF;
            IF v_n = 1 THEN
                v_set := v_set | (((1::bigint << (v_to + 1)) - 1) & ~((1::bigint << v_from) - 1));
            ELSE
                FOR g IN v_from .. v_to BY v_n LOOP
                    v_set := v_set | (1::bigint << g);
                END LOOP;
            END IF;
        END LOOP;
        IF i = 5 THEN
            v_set := (v_set | (v_set >> 7)) & 127;  -- 7 is Sunday, 0
        END IF;
        CASE i
            WHEN 1 THEN o_minutes := v_set;
            WHEN 2 THEN o_hours := v_set;
            WHEN 3 THEN o_doms := v_set; o_dom_star := left(v_tok[3], 1) = '*';
            WHEN 4 THEN o_months := v_set;
            ELSE o_dows := v_set; o_dow_star := left(v_tok[5], 1) = '*';
        END CASE;
    END LOOP;
END $$;

-- The first value of p_mask after p_v, up to p_hi; NULL when none.
CREATE OR REPLACE FUNCTION tw.cron_after(p_mask bigint, p_v integer, p_hi integer)
RETURNS integer LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    FOR g IN p_v + 1 .. p_hi LOOP
        IF (p_mask >> g) & 1 = 1 THEN
            RETURN g;
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

-- The spelling PostgreSQL gives a time zone name it knows (Europe/Berlin for europe/berlin); an error for one it
-- does not. The SET clause puts the session's TimeZone back when it returns, or fails.
CREATE OR REPLACE FUNCTION tw.zone_spelling(p_timezone text)
RETURNS text LANGUAGE plpgsql STABLE SET timezone = 'UTC' AS $$
BEGIN
    PERFORM pg_catalog.set_config('timezone', p_timezone, true);
    RETURN pg_catalog.current_setting('timezone');
END $$;

-- NULL when p_cron is a valid cron expression and p_timezone an IANA time zone of PostgreSQL's database (exactly
-- as spelled there); otherwise the error ("cron field 2 (hour) value 25 out of range 0-23", "unknown time zone
-- X"). A name without "/" that has a digit (EST5EDT, or a POSIX rule such as UTC+3, which PostgreSQL would take)
-- is looked up in the list of zone names (pg_timezone_names, some tens of milliseconds); others are not.
CREATE OR REPLACE FUNCTION tw.cron_check(p_cron text, p_timezone text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_err text := (tw.cron_parse(p_cron)).o_err;
    v_ok  boolean := false;
BEGIN
    IF v_err IS NOT NULL THEN
        RETURN v_err;
    END IF;
    IF p_timezone ~ '^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$' THEN
        IF strpos(p_timezone, '/') = 0 AND p_timezone ~ '[0-9]' THEN
            v_ok := EXISTS (SELECT 1 FROM pg_catalog.pg_timezone_names z WHERE z.name = p_timezone);
        ELSE
            BEGIN
                v_ok := tw.zone_spelling(p_timezone) = p_timezone;
            EXCEPTION WHEN invalid_parameter_value THEN
                v_ok := false;
            END;
        END IF;
    END IF;
    IF NOT v_ok THEN
        RETURN format('unknown time zone %s', coalesce(p_timezone, ''));
    END IF;
    RETURN NULL;
END $$;

-- The first wall-clock minute at or after p_from that the parsed expression matches; NULL when none within 50
-- years (29 February of a day-of-week that never falls on it, 31 April, ...).
CREATE OR REPLACE FUNCTION tw.cron_match(p_minutes bigint, p_hours bigint, p_doms bigint, p_months bigint,
                                         p_dows bigint, p_dom_star boolean, p_dow_star boolean, p_from timestamp)
RETURNS timestamp LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v     timestamp := date_trunc('minute', p_from);
    v_end timestamp := p_from + interval '50 years';
    v_dom boolean;
    v_dow boolean;
    v_n   integer;
BEGIN
    WHILE v < v_end LOOP
        IF (p_months >> date_part('month', v)::integer) & 1 = 0 THEN
            v := date_trunc('month', v) + interval '1 month';
            CONTINUE;
        END IF;
        v_dom := (p_doms >> date_part('day', v)::integer) & 1 = 1;
        v_dow := (p_dows >> date_part('dow', v)::integer) & 1 = 1;
        IF NOT (CASE WHEN p_dom_star OR p_dow_star THEN v_dom AND v_dow ELSE v_dom OR v_dow END) THEN
            v := date_trunc('day', v) + interval '1 day';
            CONTINUE;
        END IF;
        IF (p_hours >> date_part('hour', v)::integer) & 1 = 0 THEN
            v_n := tw.cron_after(p_hours, date_part('hour', v)::integer, 23);
            v := CASE WHEN v_n IS NULL THEN date_trunc('day', v) + interval '1 day'
                      ELSE date_trunc('day', v) + make_interval(hours => v_n) END;
            CONTINUE;
        END IF;
        IF (p_minutes >> date_part('minute', v)::integer) & 1 = 0 THEN
            v_n := tw.cron_after(p_minutes, date_part('minute', v)::integer, 59);
            v := CASE WHEN v_n IS NULL THEN date_trunc('hour', v) + interval '1 hour'
                      ELSE date_trunc('hour', v) + make_interval(mins => v_n) END;
            CONTINUE;
        END IF;
        RETURN v;
    END LOOP;
    RETURN NULL;
END $$;

-- The first fire time of p_cron in time zone p_timezone strictly after p_after; NULL when it never fires.
-- Daylight saving: a wall-clock time that does not exist that day (spring forward) fires once, at the first
-- valid time after it (02:30 in Europe/Berlin on its spring-forward day: 03:00 local); one that happens twice
-- (fall back) fires at its first occurrence, and again at its second only when the hour field covers every hour
-- (so `0 * * * *` fires every real hour, `30 2 * * *` once). Immutable: it reads its arguments and
-- PostgreSQL's time zone database only (as AT TIME ZONE does).
CREATE OR REPLACE FUNCTION tw.cron_next(p_cron text, p_timezone text, p_after timestamptz)
RETURNS timestamptz LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    c        record := tw.cron_parse(p_cron);
    v_every  boolean;
    v_w      timestamp;
    v_u      timestamptz;
    v_offa   interval;
    v_offb   interval;
    v_x1     timestamptz;
    v_x2     timestamptz;
    v_first  timestamptz;
    v_second timestamptz;
    v_best   timestamptz;
    v_n      integer := 0;
BEGIN
    IF c.o_err IS NOT NULL THEN
        RAISE EXCEPTION '%', c.o_err USING ERRCODE = '22023';
    END IF;
    IF p_timezone IS NULL OR p_after IS NULL OR NOT isfinite(p_after) THEN
        RETURN NULL;
    END IF;
    v_every := c.o_hours = (1::bigint << 24) - 1;
    -- From the minute after p_after's wall-clock time; from 3 hours before it when the offset changes within 3
    -- hours of p_after (a wall-clock time before it may come again after it).
    v_w := date_trunc('minute', p_after AT TIME ZONE p_timezone) + interval '1 minute';
    IF ((p_after + interval '3 hours') AT TIME ZONE p_timezone) - ((p_after + interval '3 hours') AT TIME ZONE 'UTC')
       <> ((p_after - interval '3 hours') AT TIME ZONE p_timezone)
          - ((p_after - interval '3 hours') AT TIME ZONE 'UTC') THEN
        v_w := v_w - interval '3 hours 1 minute';
    END IF;
    LOOP
        v_n := v_n + 1;
        v_w := tw.cron_match(c.o_minutes, c.o_hours, c.o_doms, c.o_months, c.o_dows, c.o_dom_star, c.o_dow_star,
                              v_w);
        IF v_w IS NULL OR v_n > 100000 THEN
            RETURN v_best;
        END IF;
        -- The instants whose wall-clock time is v_w: under the offset 6 hours before and after.
        v_u := v_w AT TIME ZONE p_timezone;
        v_offa := ((v_u - interval '6 hours') AT TIME ZONE p_timezone)
                  - ((v_u - interval '6 hours') AT TIME ZONE 'UTC');
        v_offb := ((v_u + interval '6 hours') AT TIME ZONE p_timezone)
                  - ((v_u + interval '6 hours') AT TIME ZONE 'UTC');
        v_second := NULL;
        IF v_offa = v_offb THEN
            v_first := v_u;
        ELSE
            v_x1 := (v_w - v_offa) AT TIME ZONE 'UTC';
            v_x2 := (v_w - v_offb) AT TIME ZONE 'UTC';
            IF (v_x1 AT TIME ZONE p_timezone) = v_w AND (v_x2 AT TIME ZONE p_timezone) = v_w THEN
                v_first := least(v_x1, v_x2);
                v_second := greatest(v_x1, v_x2);
            ELSIF (v_x1 AT TIME ZONE p_timezone) = v_w THEN
                v_first := v_x1;
            ELSIF (v_x2 AT TIME ZONE p_timezone) = v_w THEN
                v_first := v_x2;
            ELSE
                -- In a gap: the transition, the first instant whose wall-clock time is past v_w.
                v_first := (SELECT min(x) FROM generate_series(least(v_x1, v_x2), greatest(v_x1, v_x2),
                                                               interval '1 minute') x
                             WHERE (x AT TIME ZONE p_timezone) > v_w);
            END IF;
        END IF;
        IF v_every AND v_second > p_after THEN
            v_best := least(v_best, v_second);
        END IF;
        IF v_first > p_after THEN
            RETURN least(v_best, v_first);
        END IF;
        v_w := v_w + interval '1 minute';
    END LOOP;
END $$;
