"""turnwatch.agent: the program side of the agent and tool protocol (docs/protocol.md and docs/python.md).

An agent program::

    from turnwatch import agent

    def step(s: agent.Step) -> agent.Reply:
        if not s.results:                                   # first step: ask a tool
            return agent.call([agent.Call("lookup", {"q": s.input["question"]})], state={"asked": 1})
        r = s.results[0]
        if not r.ok:
            return agent.fail("lookup_failed", f"{r.code}: {r.message}")
        return agent.done({"answer": r.output})

    agent.run(step)

and a tool program::

    agent.run_tool(lambda call: {"found": call.args["q"].upper()})

The same program works in exec mode (one step document on stdin, one reply on stdout, exit 0) and in serve mode
(``TURNWATCH_MODE=serve``: one document per line, one reply line each, flushed, until stdin ends). The library
enforces the protocol's rules so that a mistake fails one step with a clear message instead of the process:

- an exception in ``fn`` becomes ``fail("agent_exception", "<Type>: <message>")`` (a tool's: the error
  ``tool_exception``, or the code of a raised ``ToolError``); its traceback goes to stderr (the worker's log). That
  holds for every exception: ``SystemExit`` (``sys.exit()``), ``KeyboardInterrupt`` and one whose ``__str__``
  raises too (its message then says so);
- a reply that is not JSON (a ``set``, ``NaN``, an object of your own) or holds an integer beyond 64 bits (the
  worker reads integers from -2**63 to 2**63-1) fails with ``agent_exception`` (tools: ``tool_exception``) saying
  why;
- a reply longer than 1 MiB (1,048,576 bytes with its newline, what the worker accepts) is not written: the step
  fails with ``reply_too_large`` instead;
- a request that is not a JSON object, or is nested deeper than Python's ``json`` reads (about 1,000 levels), fails
  with ``bad_input`` and the program goes on;
- a reply is always exactly one line; while ``run`` or ``run_tool`` runs, what the program itself prints (``print``,
  a child process writing to its stdout) goes to stderr, so it cannot corrupt the protocol stream.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, BinaryIO, Callable, Dict, Iterable, Mapping, Optional, Tuple, Union

from ._registry import DOC_MAX

__all__ = [
    "MAX_REPLY_BYTES",
    "Call",
    "Reply",
    "Step",
    "ToolCall",
    "ToolError",
    "RateLimited",
    "ToolResult",
    "call",
    "done",
    "fail",
    "handle_call",
    "handle_step",
    "run",
    "run_tool",
]

#: The largest reply line the worker accepts, its newline included (1 MiB: common/registry.h TW_DOC_MAX).
MAX_REPLY_BYTES = DOC_MAX

JSON = Any
"""Any value ``json.dumps`` accepts: dict, list, str, int, float, bool or None, nested."""

_CODE_RE = re.compile(r"[a-z0-9_]{1,64}")
_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_MAX_CALLS = 256
_MAX_CALL_TIMEOUT = 604_800
_MAX_MESSAGE = 4000  # characters of an error message we write; the worker keeps fewer still
# The integers the worker reads (jansson's json_int_t, 64 bits signed). A reply line without 19 digits in a row holds
# none beyond them; one with such a run (an integer, or digits in a string) has its value looked at.
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
_LONG_DIGITS_RE = re.compile(rb"[0-9]{19}")


def _check_code(code: str) -> str:
    if not isinstance(code, str) or not _CODE_RE.fullmatch(code):
        raise ValueError(f"an error code must match [a-z0-9_]{{1,64}}, not {code!r:.80}")
    return code


def _clean(message: str) -> str:
    """A message as text that encodes to UTF-8 (no lone surrogates), cut to a length a log line can hold."""
    if not isinstance(message, str):
        message = str(message)
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "..."
    return message.encode("utf-8", "backslashreplace").decode("utf-8")


def _log(text: str) -> None:
    """One line to stderr, which the worker copies to its log."""
    sys.stderr.write(f"turnwatch.agent: {text}\n")
    sys.stderr.flush()


# ---- replies ----------------------------------------------------------------------------------------------------


class Reply:
    """What an agent's ``fn`` returns: made by :func:`done`, :func:`fail` or :func:`call`, never by hand."""

    __slots__ = ("document",)

    def __init__(self, document: Dict[str, JSON]) -> None:
        #: The reply object as the worker reads it, e.g. ``{"complete": {"output": ...}}``.
        self.document = document

    @property
    def kind(self) -> str:
        """``complete``, ``fail`` or ``tool_calls``."""
        return next(iter(self.document))

    def __repr__(self) -> str:
        return f"Reply({self.document!r:.200})"


@dataclass(frozen=True)
class Call:
    """One tool call of a :func:`call` reply.

    ``id`` names the call in the next step's :attr:`Step.results` (1 to 256 bytes, no control characters, unique in
    the step); when it is None, :func:`call` gives it ``c1``, ``c2``, ... by position. ``timeout_seconds`` (1 to
    604,800) overrides the tool's configured timeout for this call.
    """

    tool: str
    args: Mapping[str, JSON] = field(default_factory=dict)
    id: Optional[str] = None
    timeout_seconds: Optional[int] = None


def done(output: JSON = None) -> Reply:
    """The turn is complete; ``output`` becomes its deliverable (``{"complete": {"output": output}}``)."""
    return Reply({"complete": {"output": output}})


def fail(code: str, message: str) -> Reply:
    """The step fails with error ``code`` (``[a-z0-9_]{1,64}``) and ``message`` in words.

    The reply is ``{"fail": {"error": message, "code": code}}``: a worker that knows the code (docs/python.md)
    makes it the turn's error; an older one ends the turn ``agent_failed`` with the message. The turn may be tried
    again when the agent's ``retry_on`` lists the code. Raises ValueError for a code that does not match.
    """
    _check_code(code)
    return Reply({"fail": {"error": _clean(message), "code": code}})


def _call_dict(c: Union[Call, Mapping[str, JSON]], pos: int) -> Dict[str, JSON]:
    if isinstance(c, Call):
        d: Dict[str, JSON] = {"tool": c.tool, "args": c.args, "id": c.id, "timeout_seconds": c.timeout_seconds}
    elif isinstance(c, Mapping):
        unknown = set(c) - {"id", "tool", "args", "timeout_seconds"}
        if unknown:
            raise ValueError(f"tool call {pos}: unknown keys {sorted(unknown)} (allowed: id, tool, args, "
                             "timeout_seconds)")
        d = {"tool": c.get("tool"), "args": c.get("args", {}), "id": c.get("id"),
             "timeout_seconds": c.get("timeout_seconds")}
    else:
        raise TypeError(f"tool call {pos} is a {type(c).__name__}; give a turnwatch.agent.Call or a dict")
    tool = d["tool"]
    if not isinstance(tool, str) or not _NAME_RE.fullmatch(tool):
        raise ValueError(f"tool call {pos}: the tool must be a name of [A-Za-z0-9_-]{{1,64}}, not {tool!r:.80}")
    if d["args"] is None:
        d["args"] = {}
    if not isinstance(d["args"], Mapping):
        raise ValueError(f"tool call {pos} ({tool}): args must be a JSON object (a dict), not "
                         f"{type(d['args']).__name__}")
    d["args"] = dict(d["args"])
    t = d["timeout_seconds"]
    if t is None:
        del d["timeout_seconds"]
    elif isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= _MAX_CALL_TIMEOUT:
        raise ValueError(f"tool call {pos} ({tool}): timeout_seconds must be a whole number from 1 to "
                         f"{_MAX_CALL_TIMEOUT}, not {t!r:.40}")
    i = d["id"]
    if i is not None and (not isinstance(i, str) or not 1 <= len(i.encode("utf-8", "surrogatepass")) <= 256
                          or _CONTROL_RE.search(i)):
        raise ValueError(f"tool call {pos} ({tool}): an id must be 1 to 256 bytes without control characters, "
                         f"not {i!r:.80}")
    return d


def call(calls: Iterable[Union[Call, Mapping[str, JSON]]], wait: Union[str, int] = "all",
         state: JSON = None) -> Reply:
    """Suspend the turn on tool calls; the next step gets their results in :attr:`Step.results`.

    ``calls``: 1 to 256 :class:`Call` objects or dicts with the same keys (``tool``, ``args``, ``id``,
    ``timeout_seconds``). ``wait``: ``"all"`` (the default), ``"any"``, or a number n (resume when n calls have
    settled; the others then read ``cancelled``). ``state`` comes back unchanged as :attr:`Step.state` of the next
    step. Raises ValueError or TypeError for calls the worker would refuse, before anything is written.
    """
    if isinstance(calls, (Call, Mapping)):
        raise TypeError("call() takes a list of calls; wrap a single call in a list")
    items = [_call_dict(c, pos) for pos, c in enumerate(calls)]
    if not 1 <= len(items) <= _MAX_CALLS:
        raise ValueError(f"call() needs 1 to {_MAX_CALLS} tool calls, not {len(items)}")
    used = {d["id"] for d in items if d["id"] is not None}
    if len(used) != sum(d["id"] is not None for d in items):
        raise ValueError("call(): a tool call id is used twice in one step")
    n = 0
    for d in items:
        if d["id"] is None:
            n += 1
            while f"c{n}" in used:
                n += 1
            d["id"] = f"c{n}"
            used.add(d["id"])
    if isinstance(wait, bool) or not (wait in ("all", "any") or (isinstance(wait, int) and 1 <= wait <= len(items))):
        raise ValueError(f'call(): wait must be "all", "any" or a number from 1 to {len(items)}, not {wait!r:.40}')
    ordered = [{"id": d["id"], "tool": d["tool"], "args": d["args"],
                **({"timeout_seconds": d["timeout_seconds"]} if "timeout_seconds" in d else {})} for d in items]
    return Reply({"tool_calls": ordered, "wait": wait, "state": state})


# ---- requests ---------------------------------------------------------------------------------------------------


class _BadInput(ValueError):
    """A request the library cannot read (not JSON, not an object, malformed parts)."""


def _parse_time(value: JSON) -> Optional[datetime]:
    """deadline_at as a datetime; one the library cannot read is logged and left out, never fails the step."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass
    _log(f"deadline_at is not an ISO 8601 time ({value!r:.80}): step.deadline is None")
    return None


def _text(doc: Dict[str, JSON], key: str, env: Optional[str] = None) -> str:
    """A member as text: the document's, else the environment variable's (exec mode has both), else ""."""
    v = doc.get(key)
    if (v is None or v == "") and env:
        v = os.environ.get(env)
    return "" if v is None else v if isinstance(v, str) else str(v)


@dataclass(frozen=True)
class ToolResult:
    """The result of one tool call of the previous step.

    ``status``: ``ok`` (``output`` is the tool's output), ``error`` or ``timeout`` (``error`` is ``{"code",
    "message"}``), ``cancelled`` (a ``wait`` of ``any`` or n resumed the turn before it settled).
    """

    tool_call_id: str
    tool: str
    status: str
    output: JSON = None
    error: Optional[Mapping[str, JSON]] = None

    @property
    def ok(self) -> bool:
        """True when the call succeeded."""
        return self.status == "ok"

    @property
    def code(self) -> Optional[str]:
        """The error code (``tool_timeout``, ``tool_failed``, the tool's own ...), or None."""
        return self.error.get("code") if isinstance(self.error, Mapping) else None

    @property
    def message(self) -> Optional[str]:
        """The error in words, or None."""
        return self.error.get("message") if isinstance(self.error, Mapping) else None

    @classmethod
    def from_document(cls, d: JSON) -> "ToolResult":
        """A result from its entry in a step document's ``tool_results``."""
        if not isinstance(d, dict):
            raise _BadInput("a tool_results entry is not a JSON object")
        return cls(tool_call_id=_text(d, "tool_call_id"), tool=_text(d, "tool"), status=_text(d, "status"),
                   output=d.get("output"), error=d.get("error"))


@dataclass(frozen=True)
class Step:
    """One step of a turn: the step document (docs/protocol.md and docs/python.md) read into attributes.

    ``input`` is the turn's input; ``state`` what the previous step's :func:`call` handed on (None in step 0);
    ``results`` the results of its tool calls, in call order. ``deadline`` is when this step's time limit ends
    (the database's clock, timezone-aware), or None when the worker does not say. ``raw`` is the whole document.
    """

    input: JSON
    state: JSON
    results: Tuple[ToolResult, ...]
    turn_id: str
    agent: str
    profile: str
    channel_id: Optional[str]
    epoch: Optional[int]
    step: int
    attempt: int
    deadline: Optional[datetime]
    depth: int
    raw: Dict[str, JSON] = field(repr=False)

    def result(self, tool_call_id: str) -> ToolResult:
        """The result of the call with this id; KeyError when the previous step made no such call."""
        for r in self.results:
            if r.tool_call_id == tool_call_id:
                return r
        raise KeyError(tool_call_id)

    @classmethod
    def from_document(cls, doc: Dict[str, JSON]) -> "Step":
        """A step from its document (a dict parsed from JSON). Raises ValueError for a malformed one."""
        results = doc.get("tool_results") or []
        if not isinstance(results, list):
            raise _BadInput("tool_results is not a JSON array")
        agent_id = _text(doc, "agent", "TURNWATCH_AGENT")
        return cls(input=doc.get("input"), state=doc.get("state"),
                   results=tuple(ToolResult.from_document(r) for r in results),
                   turn_id=_text(doc, "turn_id", "TURNWATCH_TURN_ID"), agent=agent_id,
                   profile=_text(doc, "profile", "TURNWATCH_PROFILE") or agent_id,
                   channel_id=doc.get("channel_id"), epoch=doc.get("epoch"), step=doc.get("step") or 0,
                   attempt=doc.get("attempt") or 1, deadline=_parse_time(doc.get("deadline_at")),
                   depth=doc.get("depth") or 0, raw=doc)


@dataclass(frozen=True)
class ToolCall:
    """One call of a tool: the tool call document (docs/protocol.md) read into attributes."""

    tool_call_id: str
    tool: str
    args: Dict[str, JSON]
    turn_id: str
    raw: Dict[str, JSON] = field(repr=False)

    @classmethod
    def from_document(cls, doc: Dict[str, JSON]) -> "ToolCall":
        """A call from its document (a dict parsed from JSON). Raises ValueError for a malformed one."""
        args = doc.get("args")
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise _BadInput("args is not a JSON object")
        return cls(tool_call_id=_text(doc, "tool_call_id", "TURNWATCH_TOOL_CALL_ID"), tool=_text(doc, "tool"),
                   args=args, turn_id=_text(doc, "turn_id", "TURNWATCH_TURN_ID"), raw=doc)


class ToolError(Exception):
    """Raise it in a tool's ``fn`` to answer ``{"error": {"code": code, "message": message}}``.

    ``code`` must match ``[a-z0-9_]{1,64}`` (ValueError otherwise). Any other exception answers the code
    ``tool_exception``.
    """

    def __init__(self, code: str, message: str) -> None:
        self.code = _check_code(code)
        self.message = _clean(message)
        super().__init__(f"{code}: {message}")


class RateLimited(ToolError):
    """Raise it in a tool's ``fn`` when what the tool calls said "not now" (an HTTP 429 with Retry-After): the
    call answers ``{"error": {"code": "rate_limited", "retry_after_seconds": retry_after}}``. turnwatch pauses the
    tool's limits for that long, for every worker, and runs the call again then, up to the tool's
    ``rate_limited_retries`` times within the turn's deadline (docs/flow-control.md).
    """

    def __init__(self, retry_after: float, message: str = "rate limited") -> None:
        if isinstance(retry_after, bool) or not isinstance(retry_after, (int, float)) or not 0 <= retry_after <= 3600:
            raise ValueError(f"retry_after must be a number of seconds from 0 to 3600, not {retry_after!r:.40}")
        self.retry_after = float(retry_after)
        super().__init__("rate_limited", message)


# ---- encoding ---------------------------------------------------------------------------------------------------


def _dumps(value: JSON) -> bytes:
    """Compact JSON as UTF-8, on one line (json.dumps escapes every control character inside strings)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _agent_fail(code: str, message: str) -> bytes:
    return _dumps({"fail": {"error": _clean(message), "code": code}})


def _tool_error(code: str, message: str) -> bytes:
    return _dumps({"error": {"code": code, "message": _clean(message)}})


def _wide_int(value: JSON) -> Optional[Tuple[str, int]]:
    """The first integer in ``value`` that the worker cannot read (beyond 64 bits), with where it is, or None."""
    todo: list = [("", value)]
    while todo:
        where, v = todo.pop()
        if isinstance(v, int) and not isinstance(v, bool):
            if not _INT_MIN <= v <= _INT_MAX:
                return where or "the top", int(v)
        elif isinstance(v, dict):
            todo.extend((f"{where}.{k}", x) for k, x in reversed(list(v.items())))
        elif isinstance(v, (list, tuple)):
            todo.extend((f"{where}[{i}]", x) for i, x in reversed(list(enumerate(v))))
    return None


def _encode(value: JSON, what: str, on_error: Callable[[str, str], bytes], exc_code: str) -> bytes:
    """``value`` as one reply line (without its newline), or the error reply that says why it cannot be one."""
    try:
        line = _dumps(value)
        wide = _wide_int(value) if _LONG_DIGITS_RE.search(line) else None
    except BaseException as e:  # whatever the value's own methods raise, the step fails, not the process
        msg = f"the {what} is not JSON-serialisable: {_exception_text(e)}"
        _log(msg)
        return on_error(exc_code, msg)
    if wide is not None:
        where, n = wide
        digits = str(n)
        shown = digits if len(digits) <= 40 else f"{digits[:20]}...({len(digits)} digits)"
        msg = (f"the {what} holds the integer {shown} (at {where}), beyond 64 bits: the worker reads integers from "
               f"{_INT_MIN} to {_INT_MAX}; send a larger one as a string")
        _log(msg)
        return on_error(exc_code, msg)
    if len(line) + 1 > MAX_REPLY_BYTES:
        msg = (f"the {what} is {len(line) + 1} bytes as a reply line, more than the {MAX_REPLY_BYTES} bytes "
               "(1 MiB) the worker accepts; it was not written")
        _log(msg)
        return on_error("reply_too_large", msg)
    return line


def _exception_text(e: BaseException) -> str:
    """``Type: message`` (``Type`` alone when the message is empty), even for an exception whose ``__str__`` raises."""
    name = type(e).__name__
    try:
        text = str(e)
    except BaseException as inner:  # noqa: B036 -- its words are not worth the process
        try:
            why = type(inner).__name__
        except BaseException:  # noqa: B036
            why = "an exception"
        text = f"<its __str__ raised {why}>"
    if not isinstance(text, str):
        text = "<its __str__ returned no text>"
    return f"{name}: {text}" if text else name


def _print_traceback() -> None:
    """The traceback of the exception being handled to stderr (the worker's log), never raising."""
    try:
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
    except Exception:
        pass


def _load(data: bytes, what: str) -> Dict[str, JSON]:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise _BadInput(f"the {what} is not JSON: {e}") from None
    except RecursionError:
        raise _BadInput(f"the {what} is nested too deeply for Python's json to read (RecursionError beyond about "
                        f"{sys.getrecursionlimit()} levels)") from None
    if not isinstance(doc, dict):
        raise _BadInput(f"the {what} is JSON but not an object")
    return doc


def handle_step(fn: Callable[[Step], Reply], data: bytes) -> bytes:
    """One agent request: the step document's bytes in, the reply line's bytes out (no newline). Never raises for
    what ``fn`` does; used by :func:`run`, and by tests that drive an agent without pipes."""
    try:
        step = Step.from_document(_load(data, "step document"))
    except _BadInput as e:
        _log(f"bad input: {e}")
        return _agent_fail("bad_input", f"{e}")
    try:
        reply = fn(step)
        if not isinstance(reply, Reply):
            raise TypeError(f"the agent returned {type(reply).__name__}; return turnwatch.agent.done(...), "
                            "fail(...) or call(...)")
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: they fail the step, not the process
        _log(f"step {step.step} of turn {step.turn_id or '-'} raised {type(e).__name__}; it fails with agent_exception")
        _print_traceback()
        return _agent_fail("agent_exception", _exception_text(e))
    return _encode(reply.document, "reply", _agent_fail, "agent_exception")


def handle_call(fn: Callable[[ToolCall], JSON], data: bytes) -> bytes:
    """One tool request: the call document's bytes in, the reply line's bytes out (no newline). Never raises for
    what ``fn`` does; used by :func:`run_tool`."""
    try:
        tc = ToolCall.from_document(_load(data, "tool call document"))
    except _BadInput as e:
        _log(f"bad input: {e}")
        return _tool_error("bad_input", f"{e}")
    try:
        output = fn(tc)
    except ToolError as e:
        _log(f"call {tc.tool_call_id or '-'} of turn {tc.turn_id or '-'}: {e.code}: {e.message}")
        if isinstance(e, RateLimited):
            return _dumps({"error": {"code": e.code, "message": e.message, "retry_after_seconds": e.retry_after}})
        return _tool_error(e.code, e.message)
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: they fail the call, not the process
        _log(f"call {tc.tool_call_id or '-'} of turn {tc.turn_id or '-'} raised {type(e).__name__}; it fails with "
             "tool_exception")
        _print_traceback()
        return _tool_error("tool_exception", _exception_text(e))
    return _encode({"output": output}, "tool's output", _tool_error, "tool_exception")


# ---- the loop ---------------------------------------------------------------------------------------------------


def _serve_mode(mode: Optional[str]) -> bool:
    m = mode if mode is not None else os.environ.get("TURNWATCH_MODE", "exec")
    if m not in ("exec", "serve"):
        raise ValueError(f"mode must be exec or serve, not {m!r:.40}")
    return m == "serve"


def _protocol_streams() -> Tuple[BinaryIO, BinaryIO]:
    """Takes the process's stdin and stdout for the protocol alone: replies go to a private copy of descriptor 1,
    which then points at stderr (so ``print`` and child processes write to the worker's log, never into the reply
    stream), and descriptor 0 reads /dev/null from then on (requests are read from a private copy)."""
    sys.stdout.flush()
    out_fd = os.dup(1)
    in_fd = os.dup(0)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # print() lines reach the log as they are printed
    return os.fdopen(in_fd, "rb"), os.fdopen(out_fd, "wb")


def _loop(handle: Callable[[bytes], bytes], serve: bool, inp: BinaryIO, out: BinaryIO) -> None:
    if not serve:
        out.write(handle(inp.read()) + b"\n")
        out.flush()
        return
    while True:
        line = inp.readline()
        if not line:
            return  # EOF: the worker replaces or stops this process
        if not line.strip():
            continue  # not a request: no reply, or the worker would read one it did not ask for
        out.write(handle(line) + b"\n")
        out.flush()


def run(fn: Callable[[Step], Reply], *, mode: Optional[str] = None) -> None:
    """Run an agent: call ``fn`` for each step document and write its reply.

    ``mode``: ``exec`` (one step, then return) or ``serve`` (steps until stdin ends); by default from the
    environment (``TURNWATCH_MODE=serve`` as the worker sets it in serve mode, else exec). Returns when done; the
    program then exits 0, as the protocol wants.
    """
    serve = _serve_mode(mode)
    inp, out = _protocol_streams()
    _loop(lambda data: handle_step(fn, data), serve, inp, out)


def run_tool(fn: Callable[[ToolCall], JSON], *, mode: Optional[str] = None) -> None:
    """Run a tool: call ``fn`` for each tool call document; its return value is the output (any JSON value).

    A :class:`ToolError` answers its code and message; any other exception ``tool_exception``. ``mode`` as for
    :func:`run`.
    """
    serve = _serve_mode(mode)
    inp, out = _protocol_streams()
    _loop(lambda data: handle_call(fn, data), serve, inp, out)
