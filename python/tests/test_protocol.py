"""The program side of the protocol without servers: the example agent and tool and the scripted test agent run as
processes, fed through their stdin and read from their stdout exactly as the worker does (exec: one document, EOF;
serve: TURNWATCH_MODE=serve, one line each), and the reply builders called directly."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from typing import List, Optional

import pytest

from conftest import EXAMPLES, PROGRAMS, program_env
from turnwatch import agent

MIB = 1_048_576
# {"complete":{"output":""}} and the newline: a done("x" * n) reply line is n + 27 bytes.
DONE_OVERHEAD = len(b'{"complete":{"output":""}}\n')


def step_doc(inp: object, step: int = 0, state: object = None, results: Optional[list] = None, **more: object) -> dict:
    return {"turn_id": "7d3c51f4-8e57-4bd6-9a0e-2b1f3f0c9a10", "agent": "a-1", "profile": "scripted",
            "channel_id": "ch", "epoch": 3, "step": step, "attempt": 1, "depth": 0, "input": inp, "state": state,
            "tool_results": results or [], **more}


def run_exec(program: str, doc: object) -> subprocess.CompletedProcess:
    """One exec-mode run: the document on stdin, then EOF."""
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return subprocess.run([sys.executable, program], input=data, capture_output=True, timeout=60,
                          env=program_env())


def run_serve(program: str, lines: List[bytes]) -> subprocess.CompletedProcess:
    """One serve-mode process given these lines, then EOF."""
    return subprocess.run([sys.executable, program], input=b"".join(lines), capture_output=True, timeout=60,
                          env=program_env(TURNWATCH_MODE="serve"))


def replies(out: bytes) -> List[dict]:
    assert out.endswith(b"\n"), out[-200:]
    return [json.loads(line) for line in out.split(b"\n")[:-1]]


def line(doc: object) -> bytes:
    return json.dumps(doc).encode() + b"\n"


AGENT = str(EXAMPLES / "research_agent.py")
TOOL = str(EXAMPLES / "lookup_tool.py")
SCRIPTED = str(PROGRAMS / "scripted_agent.py")


# ---- the example agent and tool ----------------------------------------------------------------------------------


def test_example_agent_exec_step0_calls_the_tool() -> None:
    r = run_exec(AGENT, step_doc({"terms": ["epoch", "nope"]}))
    assert r.returncode == 0, r.stderr
    assert replies(r.stdout) == [{"tool_calls": [{"id": "t0", "tool": "lookup", "args": {"term": "epoch"}},
                                                 {"id": "t1", "tool": "lookup", "args": {"term": "nope"}}],
                                  "wait": "all", "state": {"terms": ["epoch", "nope"]}}]


def test_example_agent_exec_step1_reads_the_results() -> None:
    results = [{"tool_call_id": "t0", "tool": "lookup", "status": "ok", "output": {"definition": "d0", "pid": 9}},
               {"tool_call_id": "t1", "tool": "lookup", "status": "error",
                "error": {"code": "not_found", "message": "no entry for 'nope'"}}]
    r = run_exec(AGENT, step_doc({"terms": ["epoch", "nope"]}, step=1, state={"terms": ["epoch", "nope"]},
                                 results=results))
    assert r.returncode == 0, r.stderr
    [rep] = replies(r.stdout)
    out = rep["complete"]["output"]
    assert out["answer"] == {"epoch": "d0"}
    assert out["missing"] == {"nope": "error: not_found: no entry for 'nope'"}
    assert out["tool_pids"] == [9]


def test_example_tool_exec_and_serve() -> None:
    r = run_exec(TOOL, {"tool_call_id": "c1", "tool": "lookup", "args": {"term": "Epoch"}, "turn_id": "t"})
    assert r.returncode == 0, r.stderr
    [rep] = replies(r.stdout)
    assert rep["output"]["term"] == "epoch" and "fencing" in rep["output"]["definition"]
    r = run_serve(TOOL, [line({"tool_call_id": "a", "tool": "lookup", "args": {"term": "turn"}}),
                         b"not json\n",
                         line({"tool_call_id": "b", "tool": "lookup", "args": {"term": "zzz"}}),
                         line({"tool_call_id": "c", "tool": "lookup", "args": {}}),
                         line({"tool_call_id": "d", "tool": "lookup", "args": {"term": "inbox"}})])
    assert r.returncode == 0, r.stderr
    a, bad, b, c, d = replies(r.stdout)
    assert a["output"]["term"] == "turn" and d["output"]["term"] == "inbox"
    assert a["output"]["pid"] == d["output"]["pid"]  # one process served them all
    assert bad["error"]["code"] == "bad_input" and "not JSON" in bad["error"]["message"]
    assert b == {"error": {"code": "not_found", "message": "no entry for 'zzz'"}}  # a ToolError's own code
    assert c == {"error": {"code": "tool_exception", "message": "KeyError: 'term'"}}
    assert b"Traceback" in r.stderr and b"KeyError" in r.stderr


def test_example_agent_serve_many_steps_one_process() -> None:
    docs = [step_doc({"terms": ["epoch"]}), step_doc({"terms": []}), step_doc({"terms": ["turn", "inbox"]})]
    r = run_serve(AGENT, [line(d) for d in docs])
    assert r.returncode == 0, r.stderr
    a, b, c = replies(r.stdout)
    assert [x["id"] for x in a["tool_calls"]] == ["t0"]
    assert b == {"fail": {"error": "the input names no terms to look up", "code": "no_terms"}}
    assert [x["args"]["term"] for x in c["tool_calls"]] == ["turn", "inbox"]


# ---- the protocol rules, through the scripted agent ------------------------------------------------------------


def test_exception_fails_the_step_and_serve_goes_on() -> None:
    r = run_serve(SCRIPTED, [line(step_doc({"do": "echo"})), line(step_doc({"do": "raise", "message": "boom 42"})),
                             line(step_doc({"do": "echo"}))])
    assert r.returncode == 0, r.stderr
    before, failed, after = replies(r.stdout)
    pid = before["complete"]["output"]["pid"]
    assert failed == {"fail": {"error": f"RuntimeError: boom 42 (pid {pid})", "code": "agent_exception"}}
    assert after["complete"]["output"]["pid"] == pid and after["complete"]["output"]["served"] == 3
    assert b"Traceback" in r.stderr and b"RuntimeError: boom 42" in r.stderr


def test_exception_in_exec_mode_exits_0_with_a_fail() -> None:
    r = run_exec(SCRIPTED, step_doc({"do": "raise", "message": "exec boom"}))
    assert r.returncode == 0
    [rep] = replies(r.stdout)
    assert rep["fail"]["code"] == "agent_exception" and rep["fail"]["error"].startswith("RuntimeError: exec boom")


def test_reply_of_exactly_1_mib_is_written_one_byte_more_is_not() -> None:
    n = MIB - DONE_OVERHEAD
    r = run_serve(SCRIPTED, [line(step_doc({"do": "big", "n": n})), line(step_doc({"do": "big", "n": n + 1})),
                             line(step_doc({"do": "echo"}))])
    assert r.returncode == 0, r.stderr
    first, second, third = r.stdout.split(b"\n")[:3]
    assert len(first) + 1 == MIB and json.loads(first)["complete"]["output"] == "x" * n
    rep = json.loads(second)
    assert rep["fail"]["code"] == "reply_too_large"
    assert f"{MIB + 1} bytes" in rep["fail"]["error"] and "1 MiB" in rep["fail"]["error"]
    assert json.loads(third)["complete"]["output"]["served"] == 3
    # Exec mode: the same rule.
    r = run_exec(SCRIPTED, step_doc({"do": "big", "n": n + 1}))
    assert r.returncode == 0 and replies(r.stdout)[0]["fail"]["code"] == "reply_too_large"


def test_unserialisable_output_is_agent_exception() -> None:
    r = run_exec(SCRIPTED, step_doc({"do": "unjson"}))
    [rep] = replies(r.stdout)
    assert rep["fail"]["code"] == "agent_exception"
    assert "not JSON-serialisable" in rep["fail"]["error"] and "set" in rep["fail"]["error"]


def test_bad_input_in_serve_mode_replies_and_goes_on() -> None:
    r = run_serve(SCRIPTED, [b"{not json\n", b"\n", b"[1, 2]\n", line(step_doc({"do": "echo"}))])
    assert r.returncode == 0, r.stderr
    bad, not_object, ok = replies(r.stdout)  # the blank line is no request and gets no reply
    assert bad["fail"]["code"] == "bad_input" and "not JSON" in bad["fail"]["error"]
    assert not_object["fail"]["code"] == "bad_input" and "not an object" in not_object["fail"]["error"]
    assert ok["complete"]["output"]["served"] == 1


def test_print_in_a_step_goes_to_stderr_not_into_the_replies() -> None:
    r = run_serve(SCRIPTED, [line(step_doc({"do": "print"})), line(step_doc({"do": "echo"}))])
    assert r.returncode == 0, r.stderr
    a, b = replies(r.stdout)  # exactly two lines, both replies
    assert a["complete"]["output"]["printed"] is True and b["complete"]["output"]["served"] == 2
    assert b"print() in a step" in r.stderr
    assert b"a child process writing to its stdout" in r.stderr
    assert b"os.write(1, ...)" in r.stderr


def test_step_document_fields_reach_the_agent() -> None:
    r = run_exec(SCRIPTED, step_doc({"do": "echo"}, deadline_at="2030-01-02T03:04:05.5+00:00", attempt=2))
    out = replies(r.stdout)[0]["complete"]["output"]
    assert out["deadline"] == "2030-01-02T03:04:05.500000+00:00"
    assert out["attempt"] == 2 and out["profile"] == "scripted" and out["agent"] == "a-1"
    assert out["mode"] == "exec"


def test_fail_with_its_code() -> None:
    r = run_exec(SCRIPTED, step_doc({"do": "fail", "code": "quota_exceeded", "message": "no more credit"}))
    assert replies(r.stdout) == [{"fail": {"error": "no more credit", "code": "quota_exceeded"}}]
    r = run_exec(SCRIPTED, step_doc({"do": "fail", "code": "Bad-Code", "message": "x"}))
    [rep] = replies(r.stdout)
    assert rep["fail"]["code"] == "agent_exception" and "[a-z0-9_]{1,64}" in rep["fail"]["error"]


# ---- the reply builders and the step object, in process --------------------------------------------------------


def test_done_fail_call_documents() -> None:
    assert agent.done({"a": 1}).document == {"complete": {"output": {"a": 1}}}
    assert agent.done().document == {"complete": {"output": None}}
    assert agent.fail("e_1", "words").document == {"fail": {"error": "words", "code": "e_1"}}
    rep = agent.call([agent.Call("search", {"q": 1}, timeout_seconds=20), {"tool": "fetch", "id": "c1"},
                      {"tool": "search", "args": {"q": 2}}], wait=2, state={"k": [1]})
    assert rep.kind == "tool_calls"
    assert rep.document == {"tool_calls": [{"id": "c2", "tool": "search", "args": {"q": 1}, "timeout_seconds": 20},
                                           {"id": "c1", "tool": "fetch", "args": {}},
                                           {"id": "c3", "tool": "search", "args": {"q": 2}}],
                            "wait": 2, "state": {"k": [1]}}


@pytest.mark.parametrize("calls,wait,why", [
    ([], "all", "1 to 256 tool calls"),
    ([{"tool": "a"}] * 257, "all", "1 to 256 tool calls"),
    ([{"tool": "a", "id": "x"}, {"tool": "b", "id": "x"}], "all", "used twice"),
    ([{"tool": "a"}], 2, "wait must be"),
    ([{"tool": "a"}], True, "wait must be"),
    ([{"tool": "a"}], "some", "wait must be"),
    ([{"tool": "no spaces"}], "all", "the tool must be a name"),
    ([{"tool": "a", "args": [1]}], "all", "args must be a JSON object"),
    ([{"tool": "a", "timeout_seconds": 0}], "all", "timeout_seconds must be"),
    ([{"tool": "a", "timeout_seconds": 1.5}], "all", "timeout_seconds must be"),
    ([{"tool": "a", "id": ""}], "all", "an id must be"),
    ([{"tool": "a", "id": "a\nb"}], "all", "an id must be"),
    ([{"tool": "a", "wat": 1}], "all", "unknown keys"),
])
def test_call_refuses_what_the_worker_would(calls: list, wait: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        agent.call(calls, wait=wait)  # type: ignore[arg-type]


def test_call_wants_a_list() -> None:
    with pytest.raises(TypeError, match="list of calls"):
        agent.call(agent.Call("a"))  # type: ignore[arg-type]


def test_handle_step_reads_the_document() -> None:
    seen = []

    def fn(s: agent.Step) -> agent.Reply:
        seen.append(s)
        return agent.done(s.result("c1").output)

    doc = step_doc({"q": 1}, step=2, state={"s": 1}, deadline_at="2030-01-02T03:04:05Z",
                   results=[{"tool_call_id": "c1", "tool": "t", "status": "ok", "output": [1]},
                            {"tool_call_id": "c2", "tool": "t", "status": "timeout",
                             "error": {"code": "tool_timeout", "message": "too slow"}}])
    out = agent.handle_step(fn, json.dumps(doc).encode())
    assert json.loads(out) == {"complete": {"output": [1]}}
    s = seen[0]
    assert (s.input, s.state, s.step, s.attempt, s.epoch, s.channel_id) == ({"q": 1}, {"s": 1}, 2, 1, 3, "ch")
    assert s.turn_id == doc["turn_id"] and s.agent == "a-1" and s.profile == "scripted"
    assert s.deadline == datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert s.results[1].status == "timeout" and not s.results[1].ok
    assert (s.results[1].code, s.results[1].message) == ("tool_timeout", "too slow")
    assert s.raw == doc
    # Without deadline_at (a worker older than docs/python.md), no deadline.
    agent.handle_step(fn, json.dumps(step_doc({}, results=doc["tool_results"])).encode())
    assert seen[1].deadline is None


def test_handle_step_wrong_return_and_nan() -> None:
    out = json.loads(agent.handle_step(lambda s: {"complete": {}}, json.dumps(step_doc({})).encode()))
    assert out["fail"]["code"] == "agent_exception" and "return turnwatch.agent.done" in out["fail"]["error"]
    out = json.loads(agent.handle_step(lambda s: agent.done(float("nan")), json.dumps(step_doc({})).encode()))
    assert out["fail"]["code"] == "agent_exception" and "not JSON-serialisable" in out["fail"]["error"]


def test_reply_is_one_line_whatever_the_strings_hold() -> None:
    text = "line1\nline2\r\u2028\u0000\t\"\\ é 😀"
    out = agent.handle_step(lambda s: agent.done({"t": text, "k\nk": 1}), json.dumps(step_doc({})).encode())
    assert b"\n" not in out and b"\r" not in out
    assert json.loads(out) == {"complete": {"output": {"t": text, "k\nk": 1}}}


def test_handle_call_tool_error_and_exception() -> None:
    doc = json.dumps({"tool_call_id": "c9", "tool": "t", "args": {"x": 2}, "turn_id": "u"}).encode()
    assert json.loads(agent.handle_call(lambda c: {"y": c.args["x"] * 2, "id": c.tool_call_id}, doc)) == {
        "output": {"y": 4, "id": "c9"}}
    assert json.loads(agent.handle_call(lambda c: None, doc)) == {"output": None}

    def refuse(c: agent.ToolCall) -> object:
        raise agent.ToolError("rate_limited", "try later")

    assert json.loads(agent.handle_call(refuse, doc)) == {"error": {"code": "rate_limited", "message": "try later"}}

    def broken(c: agent.ToolCall) -> object:
        return 1 / 0

    assert json.loads(agent.handle_call(broken, doc)) == {
        "error": {"code": "tool_exception", "message": "ZeroDivisionError: division by zero"}}
    big = json.loads(agent.handle_call(lambda c: "x" * MIB, doc))
    assert big["error"]["code"] == "reply_too_large"
    with pytest.raises(ValueError):
        agent.ToolError("Not OK", "x")


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no words")


def _raiser(e: BaseException):  # type: ignore[no-untyped-def]
    def fn(_: object) -> object:
        raise e
    return fn


@pytest.mark.parametrize("exc,words", [(_Unprintable(), "_Unprintable"), (SystemExit(3), "SystemExit: 3"),
                                       (KeyboardInterrupt(), "KeyboardInterrupt")])
def test_any_exception_fails_the_step_not_the_process(exc: BaseException, words: str) -> None:
    out = json.loads(agent.handle_step(_raiser(exc), json.dumps(step_doc({})).encode()))
    assert out["fail"]["code"] == "agent_exception" and words in out["fail"]["error"], out
    doc = json.dumps({"tool_call_id": "c1", "tool": "t", "args": {}, "turn_id": "u"}).encode()
    out = json.loads(agent.handle_call(_raiser(exc), doc))
    assert out["error"]["code"] == "tool_exception" and words in out["error"]["message"], out


@pytest.mark.parametrize("n", [2**63, -2**63 - 1, 2**70, 10**400], ids=["2^63", "-2^63-1", "2^70", "10^400"])
def test_integer_beyond_64_bits_is_not_sent(n: int) -> None:
    for value in (n, {"a": [1, {"b": n}]}):
        out = json.loads(agent.handle_step(lambda s: agent.done(value), json.dumps(step_doc({})).encode()))
        assert out["fail"]["code"] == "agent_exception" and "beyond 64 bits" in out["fail"]["error"], out
        doc = json.dumps({"tool_call_id": "c1", "tool": "t", "args": {}, "turn_id": "u"}).encode()
        out = json.loads(agent.handle_call(lambda c: value, doc))
        assert out["error"]["code"] == "tool_exception" and "beyond 64 bits" in out["error"]["message"], out


def test_integers_within_64_bits_and_long_digit_strings_are_sent() -> None:
    value = {"max": 2**63 - 1, "min": -2**63, "s": "1" * 40, "f": 1e300, "t": True}
    out = json.loads(agent.handle_step(lambda s: agent.done(value), json.dumps(step_doc({})).encode()))
    assert out == {"complete": {"output": value}}


def test_deeply_nested_request_is_bad_input() -> None:
    deep = "[" * 3000 + "]" * 3000
    out = json.loads(agent.handle_step(lambda s: agent.done(1),
                                       ('{"turn_id": "u", "step": 0, "input": ' + deep + "}").encode()))
    assert out["fail"]["code"] == "bad_input" and "nested too deeply" in out["fail"]["error"], out
    out = json.loads(agent.handle_call(lambda c: 1, ('{"tool_call_id": "c1", "args": {"x": ' + deep + "}}").encode()))
    assert out["error"]["code"] == "bad_input" and "nested too deeply" in out["error"]["message"], out


def test_serve_process_lives_through_every_kind_of_bad_step() -> None:
    lines = [line(step_doc({"do": d, "n": str(2**70)})) for d in ("unprintable", "exit", "interrupt", "bigint")]
    lines.insert(2, b'{"turn_id": "u", "input": ' + b"[" * 3000 + b"]" * 3000 + b"}\n")
    r = run_serve(SCRIPTED, lines + [line(step_doc({"do": "echo"}))])
    assert r.returncode == 0, r.stderr[-2000:]
    got = replies(r.stdout)
    assert [next(iter(x)) for x in got] == ["fail"] * 5 + ["complete"], got
    assert [x["fail"]["code"] for x in got[:5]] == ["agent_exception", "agent_exception", "bad_input",
                                                     "agent_exception", "agent_exception"], got


def test_readme_agent_runs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The complete agent of docs/python.md, as printed there."""
    readme = (EXAMPLES.parents[1] / "docs" / "python.md").read_text()
    section = readme[readme.index("\n## Python\n"):]
    code = section[section.index("```python\n") + len("```python\n"):section.index("\n```\n")]
    assert "agent.run(step)" in code and len(code.splitlines()) <= 25
    program = tmp_path / "readme_agent.py"
    program.write_text(code + "\n")
    r = run_exec(str(program), step_doc({"terms": ["epoch", "nope"]}))
    assert r.returncode == 0, r.stderr
    [rep] = replies(r.stdout)
    assert [c["args"] for c in rep["tool_calls"]] == [{"term": "epoch"}, {"term": "nope"}]
    results = [{"tool_call_id": "t0", "tool": "lookup", "status": "ok", "output": {"definition": "d0"}},
               {"tool_call_id": "t1", "tool": "lookup", "status": "error",
                "error": {"code": "not_found", "message": "m"}}]
    r = run_exec(str(program), step_doc({}, step=1, state=rep["state"], results=results))
    assert replies(r.stdout) == [{"complete": {"output": {"answer": {"epoch": "d0"},
                                                          "missing": {"nope": "error: not_found: m"}}}}]
    r = run_exec(str(program), step_doc({}))
    assert replies(r.stdout)[0]["fail"]["code"] == "no_terms"


def test_unreadable_deadline_is_none_not_a_failure(capfd: pytest.CaptureFixture[str]) -> None:
    seen = []
    for bad in ("next tuesday", 12):
        out = agent.handle_step(lambda s: seen.append(s.deadline) or agent.done(1),
                                json.dumps(step_doc({}, deadline_at=bad)).encode())
        assert json.loads(out) == {"complete": {"output": 1}}
    assert seen == [None, None]
    assert "deadline_at is not an ISO 8601 time" in capfd.readouterr().err
