-- MCP servers as tools (docs/mcp.md): the last progress an MCP tool's call reported
-- ({"progress", "total"?, "message"?, "at"}), written by the worker at most once a second (sql/fn/mcp.sql), shown
-- by `turnwatch turn show` and the console's timeline. NULL: none.
ALTER TABLE state.turn_waiting_tools ADD COLUMN IF NOT EXISTS progress jsonb;
