// The library's test agent: its input says what each step does (typescript/tests).
//   echo: done({pid, served, attempt, step, deadline, mode, profile, agent, input}); raise: throw an Error;
//   unprintable: throw an Error whose message getter throws; exit: process.exit(3); throwstring: throw a string;
//   bigint: done({n: BigInt(input.n)}); wide: done({n: 2 ** 64}); nul: done("a\u0000b"); lone: done("\ud800");
//   cyclic: done(a cycle); deep: done(input.levels nested arrays); big: done("x".repeat(input.n));
//   print: console.log in the step; stray: a timer that throws after the reply; nap: 200 ms, then echo;
//   fail: fail(code, message);
//   call: step 0 call(input.calls, {wait, state}), step 1 done with the results.
import { call, done, fail, run } from "../../src/index.js";

let served = 0;

function facts(step) {
  return { pid: process.pid, served, attempt: step.attempt, step: step.step,
    deadline: step.deadline ? step.deadline.toISOString() : null, mode: process.env.TURNWATCH_MODE || "exec",
    profile: step.profile, agent: step.agent };
}

run(async (step) => {
  served++;
  const inp = step.input ?? {};
  switch (inp.do) {
    case "echo":
      return done({ ...facts(step), input: inp });
    case "raise":
      throw new Error(`${inp.message} (pid ${process.pid})`);
    case "unprintable": {
      const e = new Error("x");
      Object.defineProperty(e, "message", { get() { throw new Error("this exception has no words"); } });
      throw e;
    }
    case "exit":
      process.exit(3);
      break;
    case "throwstring":
      throw "a bare string";
    case "bigint":
      return done({ ...facts(step), n: BigInt(inp.n) });
    case "wide":
      return done({ n: 2 ** 64 });
    case "nul":
      return done({ s: "a\u0000b" });
    case "lone":
      return done({ s: "\ud800" });
    case "cyclic": {
      const a = { b: null };
      a.b = a;
      return done(a);
    }
    case "deep": {
      let v = [];
      for (let i = 1; i < inp.levels; i++) v = [v];
      return done(v);
    }
    case "big":
      return done("x".repeat(inp.n));
    case "print":
      console.log("scripted_agent: console.log in a step");
      process.stdout.write("scripted_agent: process.stdout.write in a step\n");
      return done({ ...facts(step), printed: true });
    case "stray":
      setTimeout(() => {
        throw new Error("a timer's exception after the reply");
      }, 10);
      Promise.reject(new Error("a promise nobody awaited"));
      return done({ ...facts(step), stray: true });
    case "nap": // a step that takes 200 ms: a timer set 10 ms into an earlier step fires before it ends
      await new Promise((r) => setTimeout(r, 200));
      return done({ ...facts(step), napped: true });
    case "fail":
      return fail(inp.code, inp.message);
    case "call":
      if (step.step === 0) return call(inp.calls, { wait: inp.wait ?? "all", state: { asked: inp.calls.length } });
      if (inp.then === "fail") return fail("told_to_fail", `step ${step.step} was told to fail`);
      return done({ ...facts(step), state: step.state,
        results: step.results.map((r) => ({ tool_call_id: r.toolCallId, tool: r.tool, status: r.status,
          output: r.output, code: r.code, message: r.message })) });
    default:
      return fail("unknown_do", `scripted_agent does not know do=${JSON.stringify(inp.do)}`);
  }
});
