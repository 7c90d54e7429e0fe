#!/usr/bin/env python3
"""tw-serve-agent.py -- example of a serve-mode agent (docs/protocol.md) in Python, standard library only.

With `mode = serve` in its [agent.NAME] section the worker starts this program once per slot and keeps it, so
the imports and set-up below are paid once, not on every step. It reads one step document per line on stdin and
writes one reply line on stdout, flushed at once, until stdin ends. TURNWATCH_MODE=serve is in its environment;
the turn id, agent and epoch travel in each document. The same loop serves exec mode (one document, then EOF).

Each step completes with a word count of input.text (or its input echoed), the pid that served it and how many
steps this process has served. An exception in one step becomes a fail reply for that step: the worker expects
exactly one line per request, and a process that dies or writes something else is replaced.

Config:
    [agent.pyserve]
    exec = /usr/bin/python3 /path/to/tw-serve-agent.py
    mode = serve
"""
import json
import os
import sys
import time

STARTED_AT = time.time()  # a real agent loads its libraries and models here, once


def step(doc, served):
    inp = doc.get("input")
    text = inp.get("text") if isinstance(inp, dict) else None
    out = {"pid": os.getpid(), "served": served, "step": doc.get("step"),
           "process_started_at": STARTED_AT}
    if isinstance(text, str):
        out["words"] = len(text.split())
    else:
        out["echo"] = inp
    return {"complete": {"output": out}}


def main():
    mode = os.environ.get("TURNWATCH_MODE", "exec")
    print(f"tw-serve-agent.py: pid {os.getpid()} ready ({mode} mode)", file=sys.stderr, flush=True)
    served = 0
    while True:
        line = sys.stdin.readline()
        if not line:
            return 0  # EOF: the worker is replacing or stopping this process
        try:
            doc = json.loads(line)
            if not isinstance(doc, dict):
                raise ValueError("the step document is not a JSON object")
            served += 1
            reply = step(doc, served)
        except Exception as e:  # one bad step fails that step only
            reply = {"fail": {"error": f"{type(e).__name__}: {e}"}}
        # json.dumps escapes newlines inside strings: the reply is one line.
        sys.stdout.write(json.dumps(reply, separators=(",", ":")) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
