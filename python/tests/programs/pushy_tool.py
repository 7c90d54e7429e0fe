#!/usr/bin/python3
"""pushy_tool.py -- a test tool: the first call with args {"marker": PATH} finds no file at PATH, makes it and raises
turnwatch.RateLimited(args["after"]); a call that finds the file answers {"ok": true, "pid"}."""
import os

import turnwatch
from turnwatch import agent


def pushy(call: agent.ToolCall) -> dict:
    marker = call.args["marker"]
    if not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write("rate limited once\n")
        raise turnwatch.RateLimited(call.args.get("after", 0.5))
    return {"ok": True, "pid": os.getpid()}


if __name__ == "__main__":
    agent.run_tool(pushy)
