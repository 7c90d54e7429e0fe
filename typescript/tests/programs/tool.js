// The library's test tool (typescript/tests): args {"do": ...}: "echo" answers {pid, args, mode}; "raise" throws;
// "tool_error" throws ToolError(args.code, args.message); "pushy": the first call with args.marker (a path) finds
// no file there, makes it and throws RateLimited(args.after); a call that finds the file answers {ok: true, pid}.
import { existsSync, writeFileSync } from "node:fs";
import { RateLimited, ToolError, runTool } from "../../src/index.js";

runTool(async (c) => {
  const a = c.args;
  if (a.do === "raise") throw new TypeError(`tool told to raise (pid ${process.pid})`);
  if (a.do === "tool_error") throw new ToolError(a.code, a.message);
  if (a.do === "pushy") {
    if (!existsSync(a.marker)) {
      writeFileSync(a.marker, "rate limited once\n");
      throw new RateLimited(a.after ?? 0.5);
    }
    return { ok: true, pid: process.pid };
  }
  await new Promise((r) => setTimeout(r, 1));
  return { pid: process.pid, args: a, mode: process.env.TURNWATCH_MODE || "exec", call: c.toolCallId };
});
