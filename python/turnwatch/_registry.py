"""turnwatch's own error codes and limits.

Generated from common/registry.h by tw-gen-registry: do not edit (a unit test
fails when this file differs from what the generator writes).
"""

#: code -> (scope, status, retried by default, only turnwatch gives it, meaning)
ERROR_CODES = {
    "step_timeout": ("turn", "failed", True, True,
        "the step outlived `step_timeout_seconds` (the worker's timer: SIGTERM, then SIGKILL after `kill_grace_seconds`)"),
    "agent_exit": ("turn", "failed", True, True,
        "the agent program exited non-zero, was killed by a signal, or could not be started (the worker out of file descriptors, ...); the stderr tail is in the message"),
    "timeout_reaped_by_watchdog": ("turn", "failed", True, True,
        "the turn was `running` with no heartbeat for `active_reap_seconds` (rule 2.6)"),
    "dispatch_timeout": ("turn", "timeout", True, True,
        "the turn stayed `dispatched` longer than `dispatched_timeout_seconds`: no worker took it (rule 2.5)"),
    "agent_failed": ("turn", "failed", False, False,
        "the agent replied `fail` without a code of its own, or with one that was not taken (the message says why)"),
    "bad_output": ("turn", "failed", False, True,
        "the reply was not one valid reply object, or the program wrote more than 1 MiB; the message says what was wrong and quotes the start (a tool's: its reply was not `{\"output\": ...}` or `{\"error\": {\"code\", \"message\"}}`; an MCP tool's: its server's answer to the call was no valid JSON-RPC 2.0 answer, or its result no object with a `content` array)"),
    "bad_tool_call": ("turn", "failed", False, True,
        "a `tool_calls` reply named an unknown tool, repeated an id, or had an invalid `wait` or `timeout_seconds`"),
    "resource_limit": ("turn", "failed", False, True,
        "the program was stopped by `cpu_limit_seconds`, or ended badly at its `memory_limit_mb` (a tool's call ends `error` with it)"),
    "stopped": ("turn", "", False, True,
        "the worker stopped the program itself (its claim was lost, or a second SIGTERM at shutdown); the step is handed back and its result dropped, so a turn normally never ends with it"),
    "queue_timeout": ("turn", "timeout", False, True,
        "the turn (or its retry) was not running `queue_timeout_seconds` after it was queued"),
    "turn_deadline_exceeded": ("turn", "timeout", False, True,
        "the turn's own deadline (`submit --timeout`) passed; it covers every attempt"),
    "cancelled": ("turn", "cancelled", False, True,
        "`turnwatch cancel`, `tw.cancel_turn`, or the cancel of a parent turn reaching its children (a call: it no longer mattered, `wait` `any` or *n* was satisfied without it, or the turn ended)"),
    "tool_failed": ("call", "error", False, True,
        "the tool program exited non-zero or was killed (stderr tail in the message)"),
    "tool_timeout": ("call", "timeout", False, True,
        "the tool program outlived its timeout (the hierarchy: call, tool, agent, global), or rule 2.2 ended the turn's wait for it"),
    "tool_error": ("call", "error", False, False,
        "an external tool's result was posted with status `error` and an output that has no `code` of its own, or a tool's error had no valid code"),
    "child_failed": ("call", "error", False, True,
        "a delegating call's child turn ended `failed`; `child_turn_id` and `child_error` say which and why"),
    "child_timeout": ("call", "error", False, True,
        "a delegating call's child turn ended `timeout`"),
    "child_cancelled": ("call", "error", False, True,
        "a delegating call's child turn was cancelled"),
    "delegation_depth": ("call", "error", False, True,
        "the delegating turn is already at `max_delegation_depth`"),
    "delegation_limit": ("call", "error", False, True,
        "the tree has `max_tree_turns` turns already"),
    "unknown_agent": ("call", "error", False, True,
        "the call's `args.agent` names no usable agent of the tool's profile"),
    "agent_retired": ("call", "error", False, True,
        "the call's `args.agent` names a retired agent"),
    "bad_args": ("call", "error", False, True,
        "a delegating call's `args.timeout_seconds` is not a positive number"),
    "limit_timeout": ("call", "error", False, True,
        "the tool call waited longer than its limits' `max_wait_seconds` to start, or a turn of a profile with limits to be dispatched (then the turn ends `timeout`, by rule `limit_grants`) (flow control)"),
    "rate_limited": ("call", "error", False, False,
        "the tool said not now (`retry_after_seconds`): its limits were paused and the call ran again, up to `rate_limited_retries` times; this is the last try's answer"),
    "mcp_tool_error": ("call", "error", False, True,
        "an MCP tool's server answered the call with `isError: true` (the message is its text content), or with a JSON-RPC error (its code and message)"),
    "tool_exit": ("call", "error", False, True,
        "an MCP tool's server exited, closed its stdout, was stopped as wedged (no `ping` answer) or could not start while the call was in flight or waiting for it; a new server takes the next call"),
}

#: names: [A-Za-z0-9_-]{1,NAME_MAX}
NAME_MAX = 64
#: a JSON document from outside, bytes of compact JSON
DOC_MAX = 1048576
#: the longest clock a tool call may set, seconds
TIMEOUT_MAX = 604800
#: the longest deadline a turn may be given, seconds
TURN_TIMEOUT_MAX = 31536000
