/* The registry: turnwatch's own error codes and its limits, declared once. The C code reads this header; the
 * SQL functions (tw.error_code_*, tw.limit_*, tw.policy_default) and the Python library
 * (turnwatch/_registry.py) are generated from it at build time by common/gen_registry.c; docs/errors.md lists
 * the codes from the same table. Adding a code: one row below, then its place in the code that sets it
 * (docs/hacking.md). */
#ifndef TW_REGISTRY_H
#define TW_REGISTRY_H

/* ---- error codes
 * -------------------------------------------------------------------------------------------- */

/* What a code belongs to: a turn's error (its final status below), or a tool call's result (status error or
 * timeout as below; the agent sees it and goes on). */
#define TW_ERR_TURN "turn"
#define TW_ERR_CALL "call"

/* X(code, scope, status, retry, own, timeout_kind, set_by, meaning)
 *   status:       the final status a turn (or the result status a call) gets with this code ("": none, the
 *                 step is handed back)
 *   retry:        1 when `retry_on` takes it by default (the shipped policy retries it)
 *   own:          1 when only turnwatch gives it: an agent's fail reply that claims such a turn code becomes
 *                 agent_failed
 *   timeout_kind: the `timeout` object's kind when a clock ended the turn ("" when none)
 *   set_by:       who gives it (Markdown, for docs/errors.md)
 *   meaning:      one line (Markdown) */
/* clang-format off */
#define TW_ERROR_CODES(X) \
    X("step_timeout", TW_ERR_TURN, "failed", 1, 1, "step_timeout", "worker", "the step outlived `step_timeout_seconds` (the worker's timer: SIGTERM, then SIGKILL after `kill_grace_seconds`)") \
    X("agent_exit", TW_ERR_TURN, "failed", 1, 1, "", "worker", "the agent program exited non-zero, was killed by a signal, or could not be started (the worker out of file descriptors, ...); the stderr tail is in the message") \
    X("timeout_reaped_by_watchdog", TW_ERR_TURN, "failed", 1, 1, "heartbeat", "PMO (`sql/rules/2.6_reap_running.sql`)", "the turn was `running` with no heartbeat for `active_reap_seconds` (rule 2.6)") \
    X("dispatch_timeout", TW_ERR_TURN, "timeout", 1, 1, "dispatch", "PMO (`sql/rules/2.5_reap_dispatched.sql`)", "the turn stayed `dispatched` longer than `dispatched_timeout_seconds`: no worker took it (rule 2.5)") \
    X("agent_failed", TW_ERR_TURN, "failed", 0, 0, "", "worker (`worker/steps.c`, `tw.apply_step`)", "the agent replied `fail` without a code of its own, or with one that was not taken (the message says why)") \
    X("bad_output", TW_ERR_TURN, "failed", 0, 1, "", "worker", "the reply was not one valid reply object, or the program wrote more than 1 MiB; the message says what was wrong and quotes the start (a tool's: its reply was not `{\"output\": ...}` or `{\"error\": {\"code\", \"message\"}}`; an MCP tool's: its server's answer to the call was no valid JSON-RPC 2.0 answer, or its result no object with a `content` array)") \
    X("bad_tool_call", TW_ERR_TURN, "failed", 0, 1, "", "worker", "a `tool_calls` reply named an unknown tool, repeated an id, or had an invalid `wait` or `timeout_seconds`") \
    X("resource_limit", TW_ERR_TURN, "failed", 0, 1, "", "worker", "the program was stopped by `cpu_limit_seconds`, or ended badly at its `memory_limit_mb` (a tool's call ends `error` with it)") \
    X("stopped", TW_ERR_TURN, "", 0, 1, "", "worker", "the worker stopped the program itself (its claim was lost, or a second SIGTERM at shutdown); the step is handed back and its result dropped, so a turn normally never ends with it") \
    X("queue_timeout", TW_ERR_TURN, "timeout", 0, 1, "queue", "PMO (`sql/rules/queue_timeout.sql`)", "the turn (or its retry) was not running `queue_timeout_seconds` after it was queued") \
    X("turn_deadline_exceeded", TW_ERR_TURN, "timeout", 0, 1, "turn_deadline", "PMO (`sql/rules/turn_deadline.sql`)", "the turn's own deadline (`submit --timeout`) passed; it covers every attempt") \
    X("cancelled", TW_ERR_TURN, "cancelled", 0, 1, "", "the client's transaction; the PMO's `tree_cancel` for large trees", "`turnwatch cancel`, `tw.cancel_turn`, or the cancel of a parent turn reaching its children (a call: it no longer mattered, `wait` `any` or *n* was satisfied without it, or the turn ended)") \
    X("tool_failed", TW_ERR_CALL, "error", 0, 1, "", "worker", "the tool program exited non-zero or was killed (stderr tail in the message)") \
    X("tool_timeout", TW_ERR_CALL, "timeout", 0, 1, "", "worker; rule 2.2 (`sql/rules/2.2_tool_timeouts.sql`)", "the tool program outlived its timeout (the hierarchy: call, tool, agent, global), or rule 2.2 ended the turn's wait for it") \
    X("tool_error", TW_ERR_CALL, "error", 0, 0, "", "`tw.post_tool_result` (`sql/fn/tool_results.sql`), the worker", "an external tool's result was posted with status `error` and an output that has no `code` of its own, or a tool's error had no valid code") \
    X("child_failed", TW_ERR_CALL, "error", 0, 1, "", "the transaction that ended the child (`sql/fn/delegation.sql`)", "a delegating call's child turn ended `failed`; `child_turn_id` and `child_error` say which and why") \
    X("child_timeout", TW_ERR_CALL, "error", 0, 1, "", "the transaction that ended the child (`sql/fn/delegation.sql`)", "a delegating call's child turn ended `timeout`") \
    X("child_cancelled", TW_ERR_CALL, "error", 0, 1, "", "the transaction that ended the child (`sql/fn/delegation.sql`)", "a delegating call's child turn was cancelled") \
    X("delegation_depth", TW_ERR_CALL, "error", 0, 1, "", "`tw.delegate`", "the delegating turn is already at `max_delegation_depth`") \
    X("delegation_limit", TW_ERR_CALL, "error", 0, 1, "", "`tw.delegate`", "the tree has `max_tree_turns` turns already") \
    X("unknown_agent", TW_ERR_CALL, "error", 0, 1, "", "`tw.delegate`", "the call's `args.agent` names no usable agent of the tool's profile") \
    X("agent_retired", TW_ERR_CALL, "error", 0, 1, "", "`tw.delegate`", "the call's `args.agent` names a retired agent") \
    X("bad_args", TW_ERR_CALL, "error", 0, 1, "", "`tw.delegate`", "a delegating call's `args.timeout_seconds` is not a positive number") \
    X("limit_timeout", TW_ERR_CALL, "error", 0, 1, "", "rule 2.2 (`sql/rules/2.2_tool_timeouts.sql`)", "the tool call waited longer than its limits' `max_wait_seconds` to start, or a turn of a profile with limits to be dispatched (then the turn ends `timeout`, by rule `limit_grants`) (flow control)") \
    X("rate_limited", TW_ERR_CALL, "error", 0, 0, "", "the tool program", "the tool said not now (`retry_after_seconds`): its limits were paused and the call ran again, up to `rate_limited_retries` times; this is the last try's answer") \
    X("mcp_tool_error", TW_ERR_CALL, "error", 0, 1, "", "the worker (`worker/mcp.c`)", "an MCP tool's server answered the call with `isError: true` (the message is its text content), or with a JSON-RPC error (its code and message)") \
    X("tool_exit", TW_ERR_CALL, "error", 0, 1, "", "the worker (`worker/mcp_call.c`)", "an MCP tool's server exited, closed its stdout, was stopped as wedged (no `ping` answer) or could not start while the call was in flight or waiting for it; a new server takes the next call")
/* clang-format on */

/* ---- limits
 * ------------------------------------------------------------------------------------------------- */

/* Agent and tool names: [A-Za-z0-9_-]{1,TW_NAME_MAX}, one NATS subject token. */
#define TW_NAME_MAX 64
#define TW_NAME_PATTERN "^[A-Za-z0-9_-]{1,64}$"
/* Any JSON document accepted from outside (input, replies, tool output), in bytes of compact JSON. */
#define TW_DOC_MAX (1024 * 1024)
/* The same document as PostgreSQL's jsonb text form (spaces after ':' and ','), which the SQL API measures:
 * room for the added spaces of a 1 MiB compact document with an ordinary shape. */
#define TW_DOC_TEXT_MAX (TW_DOC_MAX + 65536)
/* An agent's metadata in the roster: a JSON object of at most this many bytes of compact JSON. */
#define TW_METADATA_MAX 65536
/* The longest clock a configuration key or a tool call may set (seconds: one week). */
#define TW_TIMEOUT_MAX_SEC 604800
/* The longest deadline a turn may be given (timeout_seconds: one year). */
#define TW_TURN_TIMEOUT_MAX_SEC 31536000

/* ---- policy defaults -------------------------------------------------------------------------------------
 */

/* The shipped timeout policy ([worker] and each [agent.NAME]); the SQL's fallback for a profile no daemon has
 * published is generated from these. TW_RETRY_ON_DEFAULT is generated from the codes' retry column
 * (registry_gen.h). */
#define TW_POLICY_MAX_ATTEMPTS 1
#define TW_POLICY_RETRY_BACKOFF_SEC 1
#define TW_POLICY_RETRY_BACKOFF_MAX_SEC 300
#define TW_POLICY_QUEUE_TIMEOUT_SEC 0
#define TW_POLICY_WARN_AT_PERCENT 80
#define TW_POLICY_TOOL_TIMEOUT_SEC 30

/* ---- cron expressions (docs/schedules.md)
 * ------------------------------------------------------------------------------ */

/* X(field, name, min, max, names): the five fields of a cron expression in their order, with the range of
 * their values and the names that stand for min, min + 1, ... ("" when none; three letters each, matched
 * case-insensitively). Day-of-week 7 is Sunday too. common/cron.c reads these, and the SQL's
 * tw.cron_field_arrays() is generated from them. */
/* clang-format off */
#define TW_CRON_FIELDS(X) \
    X(1, "minute", 0, 59, "") \
    X(2, "hour", 0, 23, "") \
    X(3, "day-of-month", 1, 31, "") \
    X(4, "month", 1, 12, "jan feb mar apr may jun jul aug sep oct nov dec") \
    X(5, "day-of-week", 0, 7, "sun mon tue wed thu fri sat")
/* clang-format on */
/* The longest cron expression accepted, in bytes. */
#define TW_CRON_EXPR_MAX 256

#define TW_STR_(x) #x
#define TW_STR(x) TW_STR_(x)

#endif
