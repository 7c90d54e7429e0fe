#!/usr/bin/python3
"""scripted_agent.py -- the library's test agent: its input says what each step does.

Input {"do": ...}:
  "echo"      done({"pid", "served", "attempt", "deadline", "mode", "input"})
  "raise"     raise RuntimeError(input["message"] + " (pid N)")
  "big"       done("x" * input["n"]): a reply line of input["n"] + 27 bytes with its newline
  "unjson"    done({"a set": {1, 2}}): not JSON-serialisable
  "fail"      fail(input["code"], input["message"])
  "print"     print() and write to descriptor 1 from a child process, then echo
  "call"      step 0: call(input["calls"], wait=input.get("wait", "all"), state={"asked": ...}); step 1: done with
              the results as dicts, the state and the pid (with input["then"] == "fail": fail("told_to_fail", ...))
  "unprintable"  raise an exception whose __str__ raises
  "exit"      sys.exit(input.get("code", 3))
  "interrupt" raise KeyboardInterrupt
  "bigint"    done({"n": input["n"] as a Python int}): input["n"] is its decimal text, e.g. str(2**70)
Every output carries the pid of the process, so a test can see that one serve process served several turns.
"""
import os
import subprocess
import sys

from turnwatch import agent

served = 0


class Unprintable(Exception):
    """An exception that cannot be turned into text."""

    def __str__(self) -> str:
        raise RuntimeError("this exception has no words")


def facts(step: agent.Step) -> dict:
    return {"pid": os.getpid(), "served": served, "attempt": step.attempt, "step": step.step,
            "deadline": step.deadline.isoformat() if step.deadline else None,
            "mode": os.environ.get("TURNWATCH_MODE", "exec"), "profile": step.profile, "agent": step.agent}


def scripted(step: agent.Step) -> agent.Reply:
    global served
    served += 1
    inp = step.input
    do = inp.get("do")
    if do == "echo":
        return agent.done({**facts(step), "input": inp})
    if do == "raise":
        raise RuntimeError(f"{inp['message']} (pid {os.getpid()})")
    if do == "big":
        return agent.done("x" * inp["n"])
    if do == "unjson":
        return agent.done({"a set": {1, 2}})
    if do == "fail":
        return agent.fail(inp["code"], inp["message"])
    if do == "print":
        print("scripted_agent: print() in a step")
        subprocess.run(["/bin/echo", "scripted_agent: a child process writing to its stdout"], check=True)
        os.write(1, b"scripted_agent: os.write(1, ...)\n")
        return agent.done({**facts(step), "printed": True})
    if do == "unprintable":
        raise Unprintable()
    if do == "exit":
        sys.exit(inp.get("code", 3))
    if do == "interrupt":
        raise KeyboardInterrupt()
    if do == "bigint":
        return agent.done({**facts(step), "n": int(inp["n"])})
    if do == "call":
        if step.step == 0:
            return agent.call(inp["calls"], wait=inp.get("wait", "all"), state={"asked": len(inp["calls"])})
        if inp.get("then") == "fail":
            return agent.fail("told_to_fail", f"step {step.step} was told to fail")
        return agent.done({**facts(step), "state": step.state,
                           "results": [{"tool_call_id": r.tool_call_id, "tool": r.tool, "status": r.status,
                                        "output": r.output, "code": r.code, "message": r.message}
                                       for r in step.results]})
    return agent.fail("unknown_do", f"scripted_agent does not know do={do!r}")


if __name__ == "__main__":
    print(f"scripted_agent: pid {os.getpid()} started", file=sys.stderr, flush=True)
    agent.run(scripted)
