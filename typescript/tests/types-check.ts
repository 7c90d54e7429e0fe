// Compiled by tsc --noEmit (tests/types.test.js): the declarations say what the library does. Never run.
import { Client, RateLimited, ToolError, TurnwatchError, call, done, fail, run, runTool } from "../src/index.js";
import type { Outcome, Reply, Step, ToolCall } from "../src/index.js";

async function agent(step: Step): Promise<Reply> {
  if (step.step === 0) return call([{ tool: "lookup", args: { q: step.input.q }, timeoutSeconds: 20 }], { wait: 1 });
  const r = step.result("c1");
  if (!r.ok) return fail("lookup_failed", `${r.code}: ${r.message}`);
  const d: Date | null = step.deadline;
  return done({ answer: r.output, attempt: step.attempt, deadline: d?.toISOString() ?? null });
}
run(agent, { mode: "serve" });
runTool((c: ToolCall) => {
  if (c.args.slow) throw new RateLimited(2);
  if (!c.args.q) throw new ToolError("no_query", "args.q is missing");
  return { found: String(c.args.q).toUpperCase() };
});

async function client(): Promise<void> {
  const tw = new Client("postgresql:///turnwatch");
  const id: string = await tw.submit("research", "ch", { q: 1 }, { timeoutSeconds: 60, priority: 3, limitKey: "k" });
  const out: Outcome = await tw.wait(id, 60_000);
  const status: string = out.status;
  const err: string | null = out.error;
  void [status, err, out.output];
  try {
    await tw.cancel(id);
  } catch (e) {
    if (e instanceof TurnwatchError) {
      const s: string | null = e.sqlstate;
      void s;
    }
  }
  await tw.addSchedule("nightly", "research", "0 3 * * *", { timezone: "UTC", input: {} });
  await tw.close();
}
void client;
