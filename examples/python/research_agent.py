#!/usr/bin/python3
"""research_agent.py -- an agent written with turnwatch.agent: it looks up each term of its input with a tool,
all at once, then answers with what was found.

Input: {"terms": ["epoch", "watchdog"], "tool": "lookup"} ("tool" is optional: the [tool.NAME] to call).
Step 0 calls the tool once per term (ids t0, t1, ...; wait all) and keeps the terms in its state; step 1 gets
the results and completes with {"answer": {term: definition}, "missing": {term: why}, "agent_pid",
"steps_served", "tool_pids"}. Works in exec and serve mode alike: in serve mode one process serves many steps, and
steps_served counts them.

Config (PYTHONPATH must reach the turnwatch package when it is not installed):
    [agent.research]
    exec = /usr/bin/python3 /path/to/examples/python/research_agent.py
    mode = serve            ; or exec, the default
"""
import os

from turnwatch import agent

served = 0


def research(step: agent.Step) -> agent.Reply:
    global served
    served += 1
    if step.step == 0:
        terms = step.input.get("terms") or []
        if not terms:
            return agent.fail("no_terms", "the input names no terms to look up")
        tool = step.input.get("tool", "lookup")
        return agent.call([agent.Call(tool, {"term": t}, id=f"t{i}") for i, t in enumerate(terms)],
                          state={"terms": terms})
    answer, missing, tool_pids = {}, {}, set()
    for i, term in enumerate(step.state["terms"]):
        r = step.result(f"t{i}")
        if r.ok:
            answer[term] = r.output["definition"]
            tool_pids.add(r.output["pid"])
        else:
            missing[term] = f"{r.status}: {r.code}: {r.message}"
    return agent.done({"answer": answer, "missing": missing, "agent_pid": os.getpid(), "steps_served": served,
                       "tool_pids": sorted(tool_pids)})


if __name__ == "__main__":
    agent.run(research)
