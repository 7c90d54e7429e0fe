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

/* X(code, scope, status, retry, own, timeout_kind, meaning)
 *   status:       the final status a turn (or the result status a call) gets with this code
 *   retry:        1 when `retry_on` takes it by default (the shipped policy retries it)
 *   own:          1 when only turnwatch gives it: an agent's fail reply that claims it becomes agent_failed
 *   timeout_kind: the `timeout` object's kind when a clock ended the turn ("" when none) */
#define TW_ERROR_CODES(X)                                                                                    \
    X("step_timeout", TW_ERR_TURN, "failed", 1, 1, "step_timeout",                                           \
      "the agent program's step ran past its step_timeout_seconds and was stopped by the worker")            \
    X("agent_exit", TW_ERR_TURN, "failed", 1, 1, "",                                                         \
      "the agent program exited non-zero, was killed by a signal or could not be started")                   \
    X("timeout_reaped_by_watchdog", TW_ERR_TURN, "timeout", 1, 1, "heartbeat",                               \
      "the turn's worker stopped beating (rule 2.6): the turn was reaped")                                   \
    X("dispatch_timeout", TW_ERR_TURN, "timeout", 1, 1, "dispatch",                                          \
      "no worker claimed the dispatched turn within dispatched_timeout_seconds (rule 2.5)")                  \
    X("queue_timeout", TW_ERR_TURN, "timeout", 0, 1, "queue",                                                \
      "the turn waited pending longer than its profile's queue_timeout_seconds")                             \
    X("turn_deadline_exceeded", TW_ERR_TURN, "timeout", 0, 1, "turn_deadline",                               \
      "the turn ran past its own timeout_seconds (its deadline), counted from its submission")               \
    X("cancelled", TW_ERR_TURN, "cancelled", 0, 1, "",                                                       \
      "the turn was cancelled (turnwatch cancel, the SQL API, "                                              \
      "or its parent turn ended)")                                                                           \
    X("bad_output", TW_ERR_TURN, "failed", 0, 1, "",                                                         \
      "the program wrote something that is not a valid reply (not JSON, too large, no known reply kind)")    \
    X("bad_tool_call", TW_ERR_TURN, "failed", 0, 1, "",                                                      \
      "the agent asked for a tool call that cannot be made (unknown tool, bad id, bad timeout, too many)")   \
    X("resource_limit", TW_ERR_TURN, "failed", 0, 1, "",                                                     \
      "the program was stopped by one of its limits (memory_limit_mb, cpu_limit_seconds); the limit is "     \
      "named")                                                                                               \
    X("stopped", TW_ERR_TURN, "failed", 0, 1, "", "the worker stopped the program (it was shutting down)")   \
    X("agent_failed", TW_ERR_TURN, "failed", 0, 0, "",                                                       \
      "the agent replied fail without a code of its own (or with one it may not use)")                       \
    X("tool_timeout", TW_ERR_CALL, "timeout", 0, 1, "",                                                      \
      "the tool call got no result within its timeout (the tool program was stopped, or rule 2.2 reported "  \
      "it)")                                                                                                 \
    X("limit_timeout", TW_ERR_CALL, "error", 0, 1, "",                                                       \
      "the tool call waited longer than its limits' max_wait_seconds to start (flow control)")               \
    X("rate_limited", TW_ERR_CALL, "error", 0, 0, "",                                                        \
      "the tool said not now (retry_after_seconds): its limits were paused and the call ran again, up to "   \
      "rate_limited_retries times; this is the last try's answer")                                           \
    X("tool_failed", TW_ERR_CALL, "error", 0, 1, "",                                                         \
      "the tool program exited non-zero, was killed or could not be started")                                \
    X("tool_error", TW_ERR_CALL, "error", 0, 0, "",                                                          \
      "the tool reported an error without a valid code of its own")                                          \
    X("child_failed", TW_ERR_CALL, "error", 0, 1, "", "a delegated call's child turn ended failed")          \
    X("child_timeout", TW_ERR_CALL, "error", 0, 1, "", "a delegated call's child turn ended timeout")        \
    X("child_cancelled", TW_ERR_CALL, "error", 0, 1, "", "a delegated call's child turn was cancelled")      \
    X("delegation_limit", TW_ERR_CALL, "error", 0, 1, "",                                                    \
      "a delegated call was refused: the tree is at max_delegation_depth or max_tree_turns")                 \
    X("bad_args", TW_ERR_CALL, "error", 0, 1, "",                                                            \
      "a delegated call's args are unusable (agent, input, timeout)")                                        \
    X("agent_retired", TW_ERR_CALL, "error", 0, 1, "", "a delegated call named an agent that is retired")    \
    X("unknown_agent", TW_ERR_CALL, "error", 0, 1, "", "a delegated call named an agent the roster lacks")

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

#define TW_STR_(x) #x
#define TW_STR(x) TW_STR_(x)

#endif
