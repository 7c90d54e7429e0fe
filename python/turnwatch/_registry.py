"""turnwatch's own error codes and limits.

Generated from common/registry.h by tw-gen-registry: do not edit (a unit test
fails when this file differs from what the generator writes).
"""

#: code -> (scope, status, retried by default, only turnwatch gives it, meaning)
ERROR_CODES = {
    "step_timeout": ("turn", "failed", True, True,
        "the agent program's step ran past its step_timeout_seconds and was stopped by the worker"),
    "agent_exit": ("turn", "failed", True, True,
        "the agent program exited non-zero, was killed by a signal or could not be started"),
    "timeout_reaped_by_watchdog": ("turn", "timeout", True, True,
        "the turn's worker stopped beating (rule 2.6): the turn was reaped"),
    "dispatch_timeout": ("turn", "timeout", True, True,
        "no worker claimed the dispatched turn within dispatched_timeout_seconds (rule 2.5)"),
    "queue_timeout": ("turn", "timeout", False, True,
        "the turn waited pending longer than its profile's queue_timeout_seconds"),
    "turn_deadline_exceeded": ("turn", "timeout", False, True,
        "the turn ran past its own timeout_seconds (its deadline), counted from its submission"),
    "cancelled": ("turn", "cancelled", False, True,
        "the turn was cancelled (turnwatch cancel, the SQL API, or its parent turn ended)"),
    "bad_output": ("turn", "failed", False, True,
        "the program wrote something that is not a valid reply (not JSON, too large, no known reply kind)"),
    "bad_tool_call": ("turn", "failed", False, True,
        "the agent asked for a tool call that cannot be made (unknown tool, bad id, bad timeout, too many)"),
    "resource_limit": ("turn", "failed", False, True,
        "the program was stopped by one of its limits (memory_limit_mb, cpu_limit_seconds); the limit is named"),
    "stopped": ("turn", "failed", False, True,
        "the worker stopped the program (it was shutting down)"),
    "agent_failed": ("turn", "failed", False, False,
        "the agent replied fail without a code of its own (or with one it may not use)"),
    "tool_timeout": ("call", "timeout", False, True,
        "the tool call got no result within its timeout (the tool program was stopped, or rule 2.2 reported it)"),
    "limit_timeout": ("call", "error", False, True,
        "the tool call waited longer than its limits' max_wait_seconds to start (flow control)"),
    "rate_limited": ("call", "error", False, False,
        "the tool said not now (retry_after_seconds): its limits were paused and the call ran again, up to rate_limited_retries times; this is the last try's answer"),
    "tool_failed": ("call", "error", False, True,
        "the tool program exited non-zero, was killed or could not be started"),
    "tool_error": ("call", "error", False, False,
        "the tool reported an error without a valid code of its own"),
    "child_failed": ("call", "error", False, True,
        "a delegated call's child turn ended failed"),
    "child_timeout": ("call", "error", False, True,
        "a delegated call's child turn ended timeout"),
    "child_cancelled": ("call", "error", False, True,
        "a delegated call's child turn was cancelled"),
    "delegation_limit": ("call", "error", False, True,
        "a delegated call was refused: the tree is at max_delegation_depth or max_tree_turns"),
    "bad_args": ("call", "error", False, True,
        "a delegated call's args are unusable (agent, input, timeout)"),
    "agent_retired": ("call", "error", False, True,
        "a delegated call named an agent that is retired"),
    "unknown_agent": ("call", "error", False, True,
        "a delegated call named an agent the roster lacks"),
}

#: names: [A-Za-z0-9_-]{1,NAME_MAX}
NAME_MAX = 64
#: a JSON document from outside, bytes of compact JSON
DOC_MAX = 1048576
#: the longest clock a tool call may set, seconds
TIMEOUT_MAX = 604800
#: the longest deadline a turn may be given, seconds
TURN_TIMEOUT_MAX = 31536000
