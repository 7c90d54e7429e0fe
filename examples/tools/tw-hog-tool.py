#!/usr/bin/env python3
"""tw-hog-tool.py -- a tool (and agent) that uses up what it is asked to, for the tests of the limits on
programs (README "Security"): python3, standard library only, exec and serve mode.

args.what picks what it uses up:
    memory  allocates args.mb MiB in pieces of 1 MiB that it writes to (a MemoryError at the memory limit ends
            it with status 1, as any Python program would)
    cpu     a busy loop for args.seconds of CPU time (for ever when absent)
    files   opens /dev/null args.n times and says how many it had open
    procs   starts args.n child processes that wait, and says how many it started
    id      its uid, gid, supplementary groups, NoNewPrivs and HOME
    ok      nothing
A failure (too many open files, no more processes) is said on stderr and ends the program with status 1. As a
tool it gets {"tool_call_id", "tool", "args", ...} and replies {"output": ...}; as an agent it gets a step
document, takes its input as the args and replies {"complete": {"output": ...}}.
"""
import json
import os
import sys


def cpu_seconds():
    t = os.times()
    return t.user + t.system


def memory(args):
    pieces = []
    for _ in range(int(args.get("mb", 1))):
        pieces.append(b"x" * (1 << 20))  # written, so resident
    return {"mb": len(pieces)}


def cpu(args):
    limit = args.get("seconds")
    start = cpu_seconds()
    n = 0
    while limit is None or cpu_seconds() - start < limit:
        n += 1
    return {"loops": n}


def files(args):
    opened = []
    try:
        for _ in range(int(args.get("n", 1))):
            opened.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as e:
        sys.stderr.write("tw-hog-tool: open failed after %d files: %s\n" % (len(opened), e))
        sys.exit(1)
    n = len(opened)
    for fd in opened:
        os.close(fd)
    return {"opened": n}


def procs(args):
    r, w = os.pipe()
    children = []
    failed = None
    for _ in range(int(args.get("n", 1))):
        try:
            pid = os.fork()
        except OSError as e:
            failed = e
            break
        if pid == 0:
            os.close(w)
            os.read(r, 1)  # until the parent closes its end
            os._exit(0)
        children.append(pid)
    os.close(w)
    os.close(r)
    for pid in children:
        os.waitpid(pid, 0)
    if failed:
        sys.stderr.write("tw-hog-tool: fork failed after %d processes: %s\n" % (len(children), failed))
        sys.exit(1)
    return {"started": len(children)}


def ident(args):
    nnp = None
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("NoNewPrivs:"):
                nnp = int(line.split()[1])
    return {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "egid": os.getegid(),
            "groups": os.getgroups(), "no_new_privs": nnp, "home": os.environ.get("HOME")}


WHAT = {"memory": memory, "cpu": cpu, "files": files, "procs": procs, "id": ident, "ok": lambda args: {}}


def handle(doc):
    agent = "tool_call_id" not in doc
    args = (doc.get("input") if agent else doc.get("args")) or {}
    out = WHAT[args.get("what", "ok")](args)
    out["pid"] = os.getpid()
    return {"complete": {"output": out}} if agent else {"output": out}


def main():
    if os.environ.get("TURNWATCH_MODE") == "serve":
        for line in sys.stdin:
            sys.stdout.write(json.dumps(handle(json.loads(line))) + "\n")
            sys.stdout.flush()
    else:
        sys.stdout.write(json.dumps(handle(json.load(sys.stdin))) + "\n")


if __name__ == "__main__":
    main()
