// turnwatch: the TypeScript library (docs/typescript.md). The agent and tool side (run, runTool, done, fail,
// call, ToolError, RateLimited) needs nothing but Node; Client loads the npm package `pg` when it first connects.

export { MAX_REPLY_BYTES, RateLimited, Reply, Step, ToolCall, ToolError, ToolResult, call, done, exceptionText, fail,
  handleCall, handleStep, run, runTool } from "./agent.js";
export { Client, NOTIFY_CHANNEL, Outcome, TERMINAL_STATUSES } from "./client.js";
export { BAD_INPUT, TimeoutError, TurnwatchError } from "./errors.js";
export { MAX_DEPTH } from "./json.js";
export { DOC_MAX, ERROR_CODES, NAME_MAX, TIMEOUT_MAX, TURN_TIMEOUT_MAX } from "./registry.js";
