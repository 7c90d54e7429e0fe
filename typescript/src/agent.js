// The program side of the agent and tool protocol (docs/protocol.md and docs/typescript.md): run() for an agent,
// runTool() for a tool, in exec mode (one document on stdin, one reply on stdout) and serve mode
// (TURNWATCH_MODE=serve: one document per line, one reply line each, until stdin ends). A mistake in the program
// fails one step with a clear message, never the process. Needs nothing but Node (no npm package).

import { DOC_MAX } from "./registry.js";
import { JsonError, MAX_DEPTH, loneSurrogate, maxDepth, show, stringify } from "./json.js";

/** The largest reply line the worker accepts, its newline included (1 MiB). */
export const MAX_REPLY_BYTES = DOC_MAX;

const CODE_RE = /^[a-z0-9_]{1,64}$/;
const NAME_RE = /^[A-Za-z0-9_-]{1,64}$/;
// eslint-disable-next-line no-control-regex
const CONTROL_RE = /[\x00-\x1f\x7f]/;
const MAX_CALLS = 256;
const MAX_CALL_TIMEOUT = 604800;
const MAX_MESSAGE = 4000; // characters of an error message we write; the worker keeps fewer still

function checkCode(code) {
  if (typeof code !== "string" || !CODE_RE.test(code))
    throw new RangeError(`an error code must match [a-z0-9_]{1,64}, not ${show(code)}`);
  return code;
}

/** A message as text that is valid Unicode (a lone surrogate written as \udXXX) and no longer than a log line. */
function clean(message) {
  let s;
  try {
    s = typeof message === "string" ? message : String(message);
  } catch {
    s = "<a message that cannot be turned into text>";
  }
  if (s.length > MAX_MESSAGE) s = s.slice(0, MAX_MESSAGE) + "...";
  s = s.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16)}`);
  return s.replace(/\u0000/g, "\\u0000");
}

function log(text) {
  try {
    process.stderr.write(`turnwatch.agent: ${text}\n`);
  } catch {
    // stderr gone: nothing to tell
  }
}

// ---- replies ------------------------------------------------------------------------------------------------------

/** What an agent's fn returns: made by done(), fail() or call(), never by hand. */
export class Reply {
  constructor(document) {
    /** The reply object as the worker reads it, e.g. {"complete": {"output": ...}}. */
    this.document = document;
    Object.freeze(this);
  }

  /** "complete", "fail" or "tool_calls". */
  get kind() {
    return Object.keys(this.document)[0];
  }
}

/** The turn is complete; output becomes its deliverable ({"complete": {"output": output}}). */
export function done(output = null) {
  return new Reply({ complete: { output: output === undefined ? null : output } });
}

/** The step fails with error code ([a-z0-9_]{1,64}, RangeError otherwise) and message in words. */
export function fail(code, message) {
  checkCode(code);
  return new Reply({ fail: { error: clean(message), code } });
}

const CALL_KEYS = new Set(["id", "tool", "args", "timeoutSeconds", "timeout_seconds"]);

function callDocument(c, pos) {
  if (c === null || typeof c !== "object" || Array.isArray(c))
    throw new TypeError(`tool call ${pos} is ${show(c)}; give an object {tool, args, id, timeoutSeconds}`);
  const unknown = Object.keys(c).filter((k) => !CALL_KEYS.has(k));
  if (unknown.length)
    throw new RangeError(`tool call ${pos}: unknown keys ${unknown.sort().join(", ")} (allowed: id, tool, args, ` +
      "timeoutSeconds)");
  const { tool, id } = c;
  if (typeof tool !== "string" || !NAME_RE.test(tool))
    throw new RangeError(`tool call ${pos}: the tool must be a name of [A-Za-z0-9_-]{1,64}, not ${show(tool)}`);
  let args = c.args === undefined || c.args === null ? {} : c.args;
  if (typeof args !== "object" || Array.isArray(args))
    throw new RangeError(`tool call ${pos} (${tool}): args must be a JSON object, not ${show(args)}`);
  const t = c.timeoutSeconds ?? c.timeout_seconds;
  if (t !== undefined && t !== null && !(Number.isInteger(t) && t >= 1 && t <= MAX_CALL_TIMEOUT))
    throw new RangeError(`tool call ${pos} (${tool}): timeoutSeconds must be a whole number from 1 to ` +
      `${MAX_CALL_TIMEOUT}, not ${show(t)}`);
  if (id !== undefined && id !== null) {
    const bytes = typeof id === "string" ? Buffer.byteLength(id, "utf8") : 0;
    if (typeof id !== "string" || bytes < 1 || bytes > 256 || CONTROL_RE.test(id))
      throw new RangeError(`tool call ${pos} (${tool}): an id must be 1 to 256 bytes without control characters, ` +
        `not ${show(id)}`);
  }
  return { id: id ?? null, tool, args: { ...args }, timeout: t ?? null };
}

/**
 * Suspend the turn on tool calls; the next step gets their results in step.results. calls: 1 to 256 objects
 * {tool, args, id, timeoutSeconds}; ids c1, c2, ... by position when not given. wait: "all" (default), "any" or a
 * number n. state comes back unchanged as step.state. Throws TypeError or RangeError for what the worker refuses.
 */
export function call(calls, { wait = "all", state = null } = {}) {
  if (!Array.isArray(calls)) throw new TypeError("call() takes an array of calls; wrap a single call in an array");
  const items = calls.map((c, pos) => callDocument(c, pos));
  if (items.length < 1 || items.length > MAX_CALLS)
    throw new RangeError(`call() needs 1 to ${MAX_CALLS} tool calls, not ${items.length}`);
  const used = new Set(items.filter((d) => d.id !== null).map((d) => d.id));
  if (used.size !== items.filter((d) => d.id !== null).length)
    throw new RangeError("call(): a tool call id is used twice in one step");
  let n = 0;
  for (const d of items) {
    if (d.id !== null) continue;
    do n++;
    while (used.has(`c${n}`));
    d.id = `c${n}`;
    used.add(d.id);
  }
  if (!(wait === "all" || wait === "any" || (Number.isInteger(wait) && wait >= 1 && wait <= items.length)))
    throw new RangeError(`call(): wait must be "all", "any" or a number from 1 to ${items.length}, not ${show(wait)}`);
  const ordered = items.map((d) => ({
    id: d.id, tool: d.tool, args: d.args, ...(d.timeout !== null ? { timeout_seconds: d.timeout } : {}),
  }));
  return new Reply({ tool_calls: ordered, wait, state: state === undefined ? null : state });
}

/** Throw it in a tool's fn to answer {"error": {"code": code, "message": message}}. */
export class ToolError extends Error {
  constructor(code, message) {
    checkCode(code);
    super(`${code}: ${message}`);
    this.name = "ToolError";
    this.code = code;
    this.toolMessage = clean(message);
  }
}

/**
 * Throw it in a tool's fn when what the tool calls said "not now": the call answers {"error": {"code":
 * "rate_limited", "retry_after_seconds": retryAfter}}; turnwatch pauses the tool's limits for that long and runs the
 * call again (docs/flow-control.md). retryAfter: seconds, 0 to 3600 (RangeError otherwise).
 */
export class RateLimited extends ToolError {
  constructor(retryAfter, message = "rate limited") {
    if (typeof retryAfter !== "number" || !Number.isFinite(retryAfter) || retryAfter < 0 || retryAfter > 3600)
      throw new RangeError(`retryAfter must be a number of seconds from 0 to 3600, not ${show(retryAfter)}`);
    super("rate_limited", message);
    this.name = "RateLimited";
    this.retryAfter = retryAfter;
  }
}

// ---- requests ------------------------------------------------------------------------------------------------------

class BadInput extends Error {}

function text(doc, key, env) {
  let v = doc[key];
  if ((v === undefined || v === null || v === "") && env) v = process.env[env];
  return v === undefined || v === null ? "" : typeof v === "string" ? v : String(v);
}

function parseTime(value) {
  if (value === undefined || value === null) return null;
  if (typeof value === "string") {
    const ms = Date.parse(value);
    if (!Number.isNaN(ms)) return new Date(ms);
  }
  log(`deadline_at is not an ISO 8601 time (${show(value)}): step.deadline is null`);
  return null;
}

/** The result of one tool call of the previous step. */
export class ToolResult {
  constructor(d) {
    if (d === null || typeof d !== "object" || Array.isArray(d))
      throw new BadInput("a tool_results entry is not a JSON object");
    this.toolCallId = text(d, "tool_call_id");
    this.tool = text(d, "tool");
    /** "ok", "error", "timeout" or "cancelled" */
    this.status = text(d, "status");
    this.output = d.output === undefined ? null : d.output;
    this.error = d.error === undefined ? null : d.error;
    Object.freeze(this);
  }

  get ok() {
    return this.status === "ok";
  }

  get code() {
    return this.error && typeof this.error === "object" ? this.error.code ?? null : null;
  }

  get message() {
    return this.error && typeof this.error === "object" ? this.error.message ?? null : null;
  }
}

/** One step of a turn: the step document read into properties. */
export class Step {
  constructor(doc) {
    const results = doc.tool_results ?? [];
    if (!Array.isArray(results)) throw new BadInput("tool_results is not a JSON array");
    this.input = doc.input === undefined ? null : doc.input;
    this.state = doc.state === undefined ? null : doc.state;
    this.results = Object.freeze(results.map((r) => new ToolResult(r)));
    this.turnId = text(doc, "turn_id", "TURNWATCH_TURN_ID");
    this.agent = text(doc, "agent", "TURNWATCH_AGENT");
    this.profile = text(doc, "profile", "TURNWATCH_PROFILE") || this.agent;
    this.channelId = doc.channel_id ?? null;
    this.epoch = doc.epoch ?? null;
    this.step = doc.step || 0;
    this.attempt = doc.attempt || 1;
    this.deadline = parseTime(doc.deadline_at);
    this.depth = doc.depth || 0;
    this.raw = doc;
    Object.freeze(this);
  }

  /** The result of the call with this id; throws RangeError when the previous step made no such call. */
  result(toolCallId) {
    const r = this.results.find((x) => x.toolCallId === toolCallId);
    if (!r) throw new RangeError(`no result for tool call ${show(toolCallId)}`);
    return r;
  }
}

/** One call of a tool: the tool call document read into properties. */
export class ToolCall {
  constructor(doc) {
    const args = doc.args ?? {};
    if (typeof args !== "object" || Array.isArray(args)) throw new BadInput("args is not a JSON object");
    this.toolCallId = text(doc, "tool_call_id", "TURNWATCH_TOOL_CALL_ID");
    this.tool = text(doc, "tool");
    this.args = args;
    this.turnId = text(doc, "turn_id", "TURNWATCH_TURN_ID");
    this.raw = doc;
    Object.freeze(this);
  }
}

const decoder = new TextDecoder("utf-8", { fatal: true });

function load(data, what) {
  let s = data;
  if (typeof data !== "string") {
    try {
      s = decoder.decode(data);
    } catch {
      throw new BadInput(`the ${what} is not JSON: it is not UTF-8 text`);
    }
  }
  const depth = maxDepth(s);
  if (depth > MAX_DEPTH)
    throw new BadInput(`the ${what} is nested too deeply (${depth} levels; the library reads at most ${MAX_DEPTH})`);
  let doc;
  try {
    doc = JSON.parse(s);
  } catch (e) {
    throw new BadInput(`the ${what} is not JSON: ${e instanceof Error ? e.message : "unreadable"}`);
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc))
    throw new BadInput(`the ${what} is JSON but not an object`);
  return doc;
}

// ---- encoding ------------------------------------------------------------------------------------------------------

/** "Name: message" of anything thrown, even when reading its name or message throws. */
export function exceptionText(e) {
  let name;
  let message;
  try {
    if (e instanceof Error) {
      name = String(e.name || (e.constructor && e.constructor.name) || "Error");
    } else {
      name = e === null ? "null" : typeof e === "object" ? (e.constructor && e.constructor.name) || "Object" : typeof e;
    }
  } catch (inner) {
    name = "an exception";
  }
  try {
    message = e instanceof Error ? String(e.message) : typeof e === "object" && e !== null ? JSON.stringify(e) : String(e);
  } catch (inner) {
    let why = "an exception";
    try {
      why = inner instanceof Error ? inner.name : typeof inner;
    } catch {
      // keep "an exception"
    }
    message = `<its message raised ${why}>`;
  }
  if (typeof message !== "string") message = "<no message>";
  return message ? `${name}: ${message}` : name;
}

function printStack(e) {
  try {
    const stack = e instanceof Error ? e.stack : undefined;
    if (typeof stack === "string") process.stderr.write(stack + "\n");
  } catch {
    // a stack that cannot be read is not worth the process
  }
}

function agentFail(code, message) {
  return JSON.stringify({ fail: { error: clean(message), code } });
}

function toolError(code, message) {
  return JSON.stringify({ error: { code, message: clean(message) } });
}

function encode(value, what, onError, excCode) {
  let line;
  try {
    line = stringify(value);
  } catch (e) {
    const msg = e instanceof JsonError
      ? e.kind === "json" ? `the ${what} is not JSON-serialisable: ${e.message}` : `the ${what} cannot be sent: ${e.message}`
      : `the ${what} is not JSON-serialisable: ${exceptionText(e)}`;
    log(msg);
    return onError(excCode, msg);
  }
  const bytes = Buffer.byteLength(line, "utf8") + 1;
  if (bytes > MAX_REPLY_BYTES) {
    const msg = `the ${what} is ${bytes} bytes as a reply line, more than the ${MAX_REPLY_BYTES} bytes (1 MiB) ` +
      "the worker accepts; it was not written";
    log(msg);
    return onError("reply_too_large", msg);
  }
  return line;
}

/**
 * One agent request: the step document (a Buffer or string) in, the reply line out (no newline). Never throws or
 * rejects for what fn does; used by run(), and by tests that drive an agent without pipes.
 */
export async function handleStep(fn, data) {
  let step;
  try {
    step = new Step(load(data, "step document"));
  } catch (e) {
    if (!(e instanceof BadInput)) throw e;
    log(`bad input: ${e.message}`);
    return agentFail("bad_input", e.message);
  }
  let reply;
  try {
    reply = await fn(step);
    if (!(reply instanceof Reply))
      throw new TypeError(`the agent returned ${show(reply)}; return done(...), fail(...) or call(...)`);
  } catch (e) {
    log(`step ${step.step} of turn ${step.turnId || "-"} threw; it fails with agent_exception`);
    printStack(e);
    return agentFail("agent_exception", exceptionText(e));
  }
  return encode(reply.document, "reply", agentFail, "agent_exception");
}

/** One tool request: the call document in, the reply line out (no newline). Never throws for what fn does. */
export async function handleCall(fn, data) {
  let tc;
  try {
    tc = new ToolCall(load(data, "tool call document"));
  } catch (e) {
    if (!(e instanceof BadInput)) throw e;
    log(`bad input: ${e.message}`);
    return toolError("bad_input", e.message);
  }
  let output;
  try {
    output = await fn(tc);
  } catch (e) {
    if (e instanceof ToolError) {
      log(`call ${tc.toolCallId || "-"} of turn ${tc.turnId || "-"}: ${e.code}: ${e.toolMessage}`);
      if (e instanceof RateLimited)
        return JSON.stringify({ error: { code: e.code, message: e.toolMessage, retry_after_seconds: e.retryAfter } });
      return toolError(e.code, e.toolMessage);
    }
    log(`call ${tc.toolCallId || "-"} of turn ${tc.turnId || "-"} threw; it fails with tool_exception`);
    printStack(e);
    return toolError("tool_exception", exceptionText(e));
  }
  return encode({ output: output === undefined ? null : output }, "tool's output", toolError, "tool_exception");
}

// ---- the loop ------------------------------------------------------------------------------------------------------

class ExitInStep extends Error {
  constructor(code) {
    super(`process.exit(${code === undefined ? "" : show(code)}) was called`);
    this.name = "ProcessExit";
  }
}

function serveMode(mode) {
  const m = mode ?? process.env.TURNWATCH_MODE ?? "exec";
  if (m !== "exec" && m !== "serve") throw new RangeError(`mode must be exec or serve, not ${show(m)}`);
  return m === "serve";
}

/**
 * Takes stdout for the protocol alone: replies are written with stdout's own write, while process.stdout.write (and
 * so console.log) goes to stderr, the worker's log. process.exit() in a step throws instead (the step fails), and an
 * exception outside any step (a timer's, a promise nobody awaited) is logged, not the end of the process.
 */
function takeStreams() {
  const out = process.stdout;
  const write = out.write.bind(out);
  out.write = (chunk, encoding, cb) => process.stderr.write(chunk, encoding, cb);
  const realExit = process.exit.bind(process);
  process.exit = (code) => {
    throw new ExitInStep(code);
  };
  const stray = (e) => {
    log(`an exception outside any step was ignored: ${exceptionText(e)}`);
    printStack(e);
  };
  process.on("uncaughtException", stray);
  process.on("unhandledRejection", stray);
  const reply = (line) => new Promise((resolve) => {
    write(line + "\n", () => resolve());
  });
  return { reply, exit: realExit };
}

async function loop(handle, serve) {
  const { reply, exit } = takeStreams();
  const stdin = process.stdin;
  if (!serve) {
    const chunks = [];
    for await (const chunk of stdin) chunks.push(chunk);
    await reply(await handle(Buffer.concat(chunks)));
    exit(0);
    return;
  }
  let pending = [];
  for await (const chunk of stdin) {
    let start = 0;
    let nl;
    while ((nl = chunk.indexOf(10, start)) >= 0) {
      pending.push(chunk.subarray(start, nl));
      const line = Buffer.concat(pending);
      pending = [];
      start = nl + 1;
      if (line.toString("latin1").trim() === "") continue; // no request, so no reply
      await reply(await handle(line));
    }
    if (start < chunk.length) pending.push(chunk.subarray(start));
  }
  exit(0); // EOF: the worker replaces or stops this process
}

/**
 * Run an agent: fn(step) (it may be async) for each step document, its reply written. mode: "exec" or "serve", by
 * default from TURNWATCH_MODE. The process exits 0 when stdin ends (exec: after its one reply).
 */
export function run(fn, { mode } = {}) {
  const serve = serveMode(mode);
  return loop((data) => handleStep(fn, data), serve);
}

/** Run a tool: fn(call) (it may be async) for each tool call document; what it returns is the output. */
export function runTool(fn, { mode } = {}) {
  const serve = serveMode(mode);
  return loop((data) => handleCall(fn, data), serve);
}

export { loneSurrogate };
