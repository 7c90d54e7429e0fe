// @ts-check
// examples/ts-agent/agent.mjs: a turnwatch agent written with the TypeScript library (docs/typescript.md). It asks
// the tool mcp_echo (an MCP server's echo tool, [tool.mcp_echo] in tools/run-local) to echo its input's message and
// finishes with what came back. Run it with Debian's node: `exec = /usr/bin/node /path/to/agent.mjs`, in exec or
// serve mode. Type-checked by tsc against the library's declarations (typescript/tests/types.test.js).
import { call, done, fail, run } from "../../typescript/src/index.js";

/** @param {import("../../typescript/src/index.js").Step} step */
async function step(step) {
  const input = /** @type {{message?: unknown}} */ (step.input ?? {});
  if (step.step === 0) {
    const message = typeof input.message === "string" ? input.message : "hello from TypeScript";
    return call([{ tool: "mcp_echo", args: { message }, id: "echo" }], { state: { message } });
  }
  const r = step.result("echo");
  if (!r.ok) return fail("mcp_echo_failed", `mcp_echo ${r.status}: ${r.code}: ${r.message}`);
  const out = /** @type {{content?: Array<{type: string, text?: string}>}} */ (r.output ?? {});
  const text = (out.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("");
  return done({ sent: step.state?.message ?? null, echo: text, result: r.output });
}

run(step);
