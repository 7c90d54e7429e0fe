-- MCP servers as tools (docs/mcp.md).

-- A call's progress, from the worker that runs it (an MCP notifications/progress; the worker writes the last one
-- at most once a second): p_fence is the call's job ({"turn_id","step","tool_call_id",...}), p_progress
-- {"progress", "total"?, "message"?}. Kept with the time it came while the call is still waited for; true when
-- it was. Nothing else moves: the call's liveness is its worker's heartbeat.
CREATE OR REPLACE FUNCTION tw.tool_progress(p_fence jsonb, p_progress jsonb)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF jsonb_typeof(p_progress) <> 'object' OR jsonb_typeof(p_progress -> 'progress') <> 'number'
       OR length(p_progress::text) > 4096 THEN
        RAISE EXCEPTION 'tool progress must be an object with a number "progress", under 4 KiB'
            USING ERRCODE = '22023';
    END IF;
    UPDATE state.turn_waiting_tools
       SET progress = jsonb_strip_nulls(jsonb_build_object(
               'progress', p_progress -> 'progress', 'total', p_progress -> 'total',
               'message', p_progress -> 'message', 'at', now()))
     WHERE turn_id = (p_fence ->> 'turn_id')::uuid AND step = (p_fence ->> 'step')::integer
       AND tool_call_id = p_fence ->> 'tool_call_id' AND wait_status = 'waiting'
       AND turn_epoch = (p_fence ->> 'epoch')::bigint;
    RETURN FOUND;
END $$;
