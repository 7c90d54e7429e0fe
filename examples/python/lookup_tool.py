#!/usr/bin/python3
"""lookup_tool.py -- a tool written with turnwatch.agent: looks a term up in a small glossary.

Call document args: {"term": "watchdog"}. Output: {"term", "definition", "pid"}. An unknown term answers the error
not_found (a ToolError); a call without a term raises KeyError, which the library turns into tool_exception.
Works in exec and serve mode alike (the library reads TURNWATCH_MODE).

Config (PYTHONPATH must reach the turnwatch package when it is not installed):
    [tool.lookup]
    exec = /usr/bin/python3 /path/to/examples/python/lookup_tool.py
    mode = serve            ; or exec, the default
"""
import os

from turnwatch import agent

GLOSSARY = {
    "turn": "one unit of work for one agent: an input, steps, tool calls, a deliverable",
    "epoch": "a per-agent fencing counter; work stamped with an older one has no effect",
    "watchdog": "a rule that ends or requeues work whose owner went quiet, on the database clock",
    "doorbell": "a NATS message that only says: look at your inbox",
    "inbox": "the queue of messages for agents and tools, in PostgreSQL, the source of truth",
}


def lookup(call: agent.ToolCall) -> dict:
    term = call.args["term"].strip().lower()
    if term not in GLOSSARY:
        raise agent.ToolError("not_found", f"no entry for {term!r}")
    return {"term": term, "definition": GLOSSARY[term], "pid": os.getpid()}


if __name__ == "__main__":
    agent.run_tool(lookup)
