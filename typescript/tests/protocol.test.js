// The program side without servers: the test programs run as processes, fed and read as the worker does.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { call, done, fail, handleCall, handleStep, RateLimited, ToolError } from "../src/index.js";

const AGENT = new URL("./programs/scripted_agent.js", import.meta.url).pathname;
const TOOL = new URL("./programs/tool.js", import.meta.url).pathname;
const MIB = 1048576;
const DONE_OVERHEAD = Buffer.byteLength('{"complete":{"output":""}}\n');

function stepDoc(input, more = {}) {
  return { turn_id: "7d3c51f4-8e57-4bd6-9a0e-2b1f3f0c9a10", agent: "a-1", profile: "p", channel_id: "ch", epoch: 3,
    step: 0, attempt: 1, input, state: null, tool_results: [], ...more };
}

function runProgram(program, input, mode) {
  const env = { ...process.env };
  delete env.TURNWATCH_MODE;
  if (mode === "serve") env.TURNWATCH_MODE = "serve";
  const r = spawnSync(process.execPath, [program], { input, env, maxBuffer: 64 * MIB, timeout: 60000 });
  assert.equal(r.status, 0, r.stderr.toString());
  const out = r.stdout.toString();
  assert.ok(out.endsWith("\n"), out.slice(-200));
  return { replies: out.split("\n").slice(0, -1).map((l) => JSON.parse(l)), stderr: r.stderr.toString(), raw: out };
}

const line = (d) => JSON.stringify(d) + "\n";

test("exec mode: one document, one reply, exit 0", () => {
  const { replies } = runProgram(AGENT, JSON.stringify(stepDoc({ do: "echo" }, { deadline_at: "2030-01-02T03:04:05.5+00:00", attempt: 2 })));
  assert.equal(replies.length, 1);
  const o = replies[0].complete.output;
  assert.equal(o.mode, "exec");
  assert.equal(o.deadline, "2030-01-02T03:04:05.500Z");
  assert.equal(o.attempt, 2);
  assert.equal(o.profile, "p");
});

test("serve mode lives through every kind of bad step and bad request", () => {
  const deep = '{"input": ' + "[".repeat(3000) + "]".repeat(3000) + "}\n";
  const docs = ["raise", "unprintable", "exit", "throwstring", "wide", "nul", "lone", "cyclic"]
    .map((d) => line(stepDoc({ do: d, message: "boom" })));
  const input = line(stepDoc({ do: "echo" })) + docs.join("") + deep + "{not json\n\n[1, 2]\n" +
    line(stepDoc({ do: "bigint", n: String(2n ** 70n) })) + line(stepDoc({ do: "echo" }));
  const { replies, stderr } = runProgram(AGENT, input, "serve");
  assert.equal(replies.length, 14, JSON.stringify(replies));
  const pid = replies[0].complete.output.pid;
  const codes = replies.slice(1, 13).map((r) => r.fail?.code);
  assert.deepEqual(codes, ["agent_exception", "agent_exception", "agent_exception", "agent_exception",
    "agent_exception", "agent_exception", "agent_exception", "agent_exception", "bad_input", "bad_input", "bad_input",
    "agent_exception"]);
  const words = replies.slice(1, 13).map((r) => r.fail.error);
  assert.match(words[0], /^Error: boom \(pid \d+\)$/);
  assert.match(words[1], /its message raised/);
  assert.match(words[2], /process\.exit\(3\)/);
  assert.match(words[3], /a bare string/);
  assert.match(words[4], /beyond 64 bits/);
  assert.match(words[5], /NUL character/);
  assert.match(words[6], /lone surrogate/);
  assert.match(words[7], /circular/);
  assert.match(words[8], /nested too deeply/);
  assert.match(words[9], /not JSON/);
  assert.match(words[10], /not an object/);
  assert.match(words[11], /1180591620717411303424 .*beyond 64 bits/);
  assert.equal(replies[13].complete.output.pid, pid);
  assert.equal(replies[13].complete.output.served, 11); // the bad requests never reached fn
  assert.match(stderr, /Error: boom/);
});

test("a reply of exactly 1 MiB is written, one byte more is not", () => {
  const n = MIB - DONE_OVERHEAD;
  const { replies, raw } = runProgram(AGENT, line(stepDoc({ do: "big", n })) + line(stepDoc({ do: "big", n: n + 1 })) +
    line(stepDoc({ do: "echo" })), "serve");
  assert.equal(raw.indexOf("\n") + 1, MIB);
  assert.equal(replies[1].fail.code, "reply_too_large");
  assert.match(replies[1].fail.error, new RegExp(`${MIB + 1} bytes`));
  assert.ok(replies[2].complete);
});

test("console.log in a step goes to stderr, not into the replies; stray exceptions are logged", async () => {
  const { replies, stderr } = runProgram(AGENT, line(stepDoc({ do: "print" })) + line(stepDoc({ do: "stray" })) +
    line(stepDoc({ do: "nap" })) + line(stepDoc({ do: "echo" })), "serve");
  assert.equal(replies.length, 4);
  assert.ok(replies[1].complete.output.stray && replies[2].complete.output.napped);
  assert.equal(replies[3].complete.output.pid, replies[0].complete.output.pid);
  assert.equal(replies[3].complete.output.served, 4);
  assert.match(stderr, /console\.log in a step/);
  assert.match(stderr, /process\.stdout\.write in a step/);
  assert.match(stderr, /an exception outside any step was ignored: Error: a promise nobody awaited/);
  assert.match(stderr, /an exception outside any step was ignored: Error: a timer's exception after the reply/);
});

test("a tool in exec and serve mode: output, ToolError, RateLimited, an exception", () => {
  let r = runProgram(TOOL, JSON.stringify({ tool_call_id: "c1", tool: "t", args: { x: 1 }, turn_id: "u" }));
  assert.deepEqual(r.replies[0].output.args, { x: 1 });
  r = runProgram(TOOL, [
    line({ tool_call_id: "a", args: { x: 1 } }), "nope\n",
    line({ tool_call_id: "b", args: { do: "tool_error", code: "not_found", message: "no entry" } }),
    line({ tool_call_id: "c", args: { do: "raise" } }),
    line({ tool_call_id: "d", args: { do: "pushy", marker: "/", after: 1.5 } }),
    line({ tool_call_id: "e", args: {} })].join(""), "serve");
  const [a, bad, b, c, d, e] = r.replies;
  assert.equal(a.output.pid, e.output.pid);
  assert.equal(bad.error.code, "bad_input");
  assert.deepEqual(b, { error: { code: "not_found", message: "no entry" } });
  assert.equal(c.error.code, "tool_exception");
  assert.match(c.error.message, /^TypeError: tool told to raise/);
  assert.deepEqual(d, { output: { ok: true, pid: a.output.pid } }); // "/" exists: no rate limit
});

test("the reply builders refuse what the worker would", async () => {
  assert.deepEqual(done({ a: 1 }).document, { complete: { output: { a: 1 } } });
  assert.deepEqual(fail("e_1", "w").document, { fail: { error: "w", code: "e_1" } });
  assert.deepEqual(call([{ tool: "s", args: { q: 1 }, timeoutSeconds: 20 }, { tool: "f", id: "c1" }, { tool: "s" }],
    { wait: 2, state: { k: 1 } }).document, { tool_calls: [
    { id: "c2", tool: "s", args: { q: 1 }, timeout_seconds: 20 }, { id: "c1", tool: "f", args: {} },
    { id: "c3", tool: "s", args: {} }], wait: 2, state: { k: 1 } });
  for (const [calls, wait, why] of [[[], "all", /1 to 256/], [[{ tool: "a", id: "x" }, { tool: "b", id: "x" }], "all", /used twice/],
    [[{ tool: "a" }], 2, /wait must be/], [[{ tool: "no spaces" }], "all", /a name/], [[{ tool: "a", args: [1] }], "all", /JSON object/],
    [[{ tool: "a", timeoutSeconds: 0 }], "all", /timeoutSeconds/], [[{ tool: "a", id: "a\nb" }], "all", /an id must be/],
    [[{ tool: "a", wat: 1 }], "all", /unknown keys/]])
    assert.throws(() => call(calls, { wait }), why);
  assert.throws(() => call({ tool: "a" }), /array/);
  assert.throws(() => fail("Bad-Code", "x"), /\[a-z0-9_\]/);
  assert.throws(() => new RateLimited(-1), RangeError);
  assert.throws(() => new ToolError("Not OK", "x"), RangeError);
  const rl = JSON.parse(await handleCall(() => { throw new RateLimited(2.5, "slow down"); }, JSON.stringify({ args: {} })));
  assert.deepEqual(rl, { error: { code: "rate_limited", message: "slow down", retry_after_seconds: 2.5 } });
  const wrong = JSON.parse(await handleStep(() => ({ complete: {} }), JSON.stringify(stepDoc({}))));
  assert.equal(wrong.fail.code, "agent_exception");
  const nan = JSON.parse(await handleStep(() => done(NaN), JSON.stringify(stepDoc({}))));
  assert.match(nan.fail.error, /not JSON-serialisable/);
  const ok = JSON.parse(await handleStep(() => done({ max: 2n ** 63n - 1n, min: -(2n ** 63n), s: "1".repeat(40), f: 1e300 }),
    JSON.stringify(stepDoc({}))));
  assert.deepEqual(ok, { complete: { output: { max: 9223372036854775807, min: -9223372036854775808, s: "1".repeat(40), f: 1e300 } } });
});
