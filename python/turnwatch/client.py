"""turnwatch.Client: submit turns and follow them through PostgreSQL alone (docs/operations.md, docs/roster.md and docs/python.md).

Every call goes to the SQL API (schema ``tw``); no NATS is needed on this side. ``wait`` hears a turn's end through
``LISTEN tw_turn_end``: the database notifies the end of a turn someone waits for (``tw.turn_wait`` registers the
waiter), with the turn id, in the transaction that ends it. The waiting client reads the turn again when its own turn's notification comes (and, as a safety net, every
``poll_seconds``), not on other turns' notifications.
"""

from __future__ import annotations

import json
import logging
import re
import select
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Dict, List, Optional, Set, Tuple, Union

import psycopg
from psycopg.rows import tuple_row

from .errors import Error

__all__ = ["Client", "Outcome", "TERMINAL_STATUSES"]

JSON = Any
TurnId = Union[str, uuid.UUID]

#: The statuses a turn ends in.
TERMINAL_STATUSES = frozenset({"done", "failed", "timeout", "cancelled"})

#: The channel the server notifies (payload: the turn id) when a turn ends, in the transaction that ends it.
NOTIFY_CHANNEL = "tw_turn_end"
#: How often wait() reads the turn under a role that may not register as its waiter (turnwatch_observer).
OBSERVER_POLL_SECONDS = 0.5

#: How often ``wait`` reads the turn when no notification came: only a safety net (a connection lost without a
#: word, a database older than the notification).
SAFETY_POLL_SECONDS = 5.0

# "\u0000" in json.dumps's text is a NUL character when the backslash before it is not itself escaped.
_JSON_NUL_RE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

_log = logging.getLogger("turnwatch")


def _error(e: psycopg.Error) -> Error:
    diag = e.diag
    reason = diag.message_primary or str(e).strip() or type(e).__name__
    return Error(reason, e.sqlstate, detail=diag.message_detail, hint=diag.message_hint)


def _turn_id(turn: TurnId) -> str:
    """A turn id in PostgreSQL's own text form (what a notification carries), or Error 22023."""
    if isinstance(turn, uuid.UUID):
        return str(turn)
    if isinstance(turn, str):
        try:
            return str(uuid.UUID(turn))
        except ValueError:
            pass
    raise Error.bad_input(f"{turn!r:.80} is not a turn id (a UUID)")


def _unicode_error(text: str, what: str) -> Optional[Error]:
    """Error 22023 when ``text`` cannot reach PostgreSQL: a NUL character, or a lone surrogate (not UTF-8)."""
    pos = text.find("\x00")
    if pos >= 0:
        return Error.bad_input(f"{what} contains a NUL character (U+0000) at position {pos}, which PostgreSQL "
                               "text cannot hold")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return Error.bad_input(f"{what} is not valid Unicode text: a lone surrogate "
                               f"(U+{ord(text[e.start]):04X}) at position {e.start}")
    return None


def _text(value: Optional[str], what: str) -> Optional[str]:
    """A text argument as it is, or Error 22023 for one PostgreSQL cannot take (NUL, lone surrogate)."""
    if isinstance(value, str):
        err = _unicode_error(value, what)
        if err is not None:
            raise err
    return value


def _json(value: JSON, what: str) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise Error.bad_input(f"{what} is not JSON-serialisable: {type(e).__name__}: {e}") from None
    err = _unicode_error(text, what)
    if err is None and _JSON_NUL_RE.search(text):
        err = Error.bad_input(f"{what} contains a NUL character (U+0000) in a string, which PostgreSQL's jsonb "
                              "cannot hold")
    if err is not None:
        raise err
    return text


def _time(value: Optional[str]) -> Optional[datetime]:
    return datetime.fromisoformat(value) if value else None


@dataclass(frozen=True)
class Outcome:
    """Where a turn stands (``Client.outcome``), or how it ended (``Client.wait``).

    ``output`` is the agent's output of a ``done`` turn (None otherwise). ``deliverable`` is the whole
    ``task.deliverable`` card: for a done turn ``{"partial": false, "output": ...}``; for one ended by a watchdog,
    its deadline or a cancel, the fallback card with the reason, the last state and the tool results.
    ``error``/``error_message``: the code (``agent_failed``, ``step_timeout``, ...) and the words.
    """

    turn_id: str
    agent: str
    profile: str
    status: str
    error: Optional[str]
    error_message: Optional[str]
    output: JSON
    deliverable: Optional[Dict[str, JSON]]
    epoch: Optional[int]
    attempt: int
    created_at: Optional[datetime]
    ended_at: Optional[datetime]

    @property
    def terminal(self) -> bool:
        """True once the turn has ended (done, failed, timeout or cancelled)."""
        return self.status in TERMINAL_STATUSES

    @property
    def ok(self) -> bool:
        """True when the turn ended done."""
        return self.status == "done"

    @classmethod
    def from_document(cls, d: Dict[str, JSON]) -> "Outcome":
        """An outcome from ``tw.turn_outcome``'s answer."""
        return cls(turn_id=str(d["turn_id"]), agent=d.get("agent", ""), profile=d.get("profile", ""),
                   status=d["status"], error=d.get("error"), error_message=d.get("error_message"),
                   output=d.get("output"), deliverable=d.get("deliverable"), epoch=d.get("turn_epoch"),
                   attempt=d.get("attempt") or 1, created_at=_time(d.get("created_at")),
                   ended_at=_time(d.get("ended_at")))


class Client:
    """A connection to turnwatch's database and the calls of its SQL API.

    ``dsn`` is a libpq connection string or URI. The client opens one connection when it is first needed, in
    autocommit mode, so each of its own calls is its own transaction; after a connection failure the next call
    connects again. A client is for one thread at a time. Use it as a context manager, or call :meth:`close`.

    Every failure raises :class:`turnwatch.Error` with the SQLSTATE and the reason; bad input (an unknown agent, a
    bad name, a document over 1 MiB, a turn id that is no UUID, input that is not JSON) is SQLSTATE 22023.

    The calls that write (``submit``, ``cancel``, ``post_tool_result``, ``add_agent``, ``retire_agent``) take
    ``conn``: a psycopg connection of the caller's, on which the call runs inside the caller's transaction
    (nothing is committed here: the turn exists only if that transaction commits).
    """

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: Optional[psycopg.Connection[Any]] = None
        self._listening = False
        self._waiting: Set[str] = set()
        self._heard: Set[str] = set()
        self._unregistered = False  # tw.turn_wait refused (an observer's role): no notification will come

    # ---- connection ----------------------------------------------------------------------------------------------

    def connection(self) -> "psycopg.Connection[Any]":
        """The client's own connection (autocommit), connecting when there is none or the last one broke."""
        if self._conn is not None and (self._conn.closed or self._conn.broken):
            self._drop()
        if self._conn is None:
            try:
                self._conn = psycopg.connect(self._dsn, autocommit=True)
            except psycopg.Error as e:
                raise _error(e) from e
            self._conn.add_notify_handler(self._notified)
            self._listening = False
        return self._conn

    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        self._drop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._listening = False
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def _notified(self, n: psycopg.Notify) -> None:
        if n.channel == NOTIFY_CHANNEL and n.payload in self._waiting:
            self._heard.add(n.payload)

    def _value(self, sql: str, params: Tuple[Any, ...], conn: Optional["psycopg.Connection[Any]"] = None) -> JSON:
        """The first column of the first row (None when there is none), on ``conn`` or the client's own."""
        c = conn if conn is not None else self.connection()
        if not isinstance(c, psycopg.Connection):
            raise TypeError(f"conn must be a psycopg.Connection, not {type(c).__name__}")
        try:
            with c.cursor(row_factory=tuple_row) as cur:
                row = cur.execute(sql, params).fetchone()
        except UnicodeError as e:  # an argument that is no UTF-8 text, refused before it was sent
            raise Error.bad_input(f"an argument is not valid Unicode text: {e}") from None
        except psycopg.Error as e:
            if e.sqlstate is None and isinstance(e, (psycopg.DataError, psycopg.ProgrammingError)):
                # refused by psycopg before it was sent: an argument it cannot pass (a NUL, a type it cannot adapt)
                raise Error.bad_input(f"an argument cannot be passed to PostgreSQL: {e}") from None
            if conn is None and (isinstance(e, psycopg.OperationalError) or self._conn is None or self._conn.broken):
                self._drop()  # the next call connects again
            raise _error(e) from e
        return row[0] if row else None

    def _listen(self) -> "psycopg.Connection[Any]":
        """The client's connection, listening on NOTIFY_CHANNEL."""
        c = self.connection()
        if not self._listening:
            try:
                c.execute(f"LISTEN {NOTIFY_CHANNEL}")
            except psycopg.Error as e:
                self._drop()
                raise _error(e) from e
            self._listening = True
        return c

    # ---- the SQL API ---------------------------------------------------------------------------------------------

    def submit(self, agent: str, channel: str, input: JSON, *, timeout_seconds: Optional[int] = None,
               idempotency_key: Optional[str] = None, profile: Optional[str] = None, box: Optional[str] = None,
               limit_key: Optional[str] = None, priority: int = 0, not_before: Optional[datetime] = None,
               conn: Optional["psycopg.Connection[Any]"] = None) -> str:
        """Submit a turn for ``agent`` (``tw.submit_turn``) and return its id.

        ``input`` is any JSON value (at most 1 MiB). ``timeout_seconds`` (1 to 31,536,000) sets the turn's deadline.
        ``idempotency_key``: the same key again returns the same turn. ``profile``: add ``agent`` to the roster,
        bound to this profile, if it does not exist (in the same transaction). ``box``: the output box of its
        cards. ``limit_key``: the key its tool calls and child turns count under in per-key limits and are served
        fairly by; ``priority`` (0 to 9): waiting for a limit, higher goes first (flow control). ``not_before``: a
        time zone aware ``datetime`` at which the turn runs (until then it waits ``pending``, reason ``scheduled``;
        its ``timeout_seconds`` counts from then). With ``conn``, the turn is submitted inside the caller's
        transaction and exists only if it commits.
        """
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
            raise Error.bad_input(f"priority must be a whole number from 0 to 9, not {priority!r:.40}")
        if timeout_seconds is not None and (isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, int)
                                            or not -2**31 <= timeout_seconds < 2**31):
            raise Error.bad_input(f"timeout_seconds must be a whole number from 1 to 31536000, not "
                                  f"{timeout_seconds!r:.40}")
        if not_before is not None and (not isinstance(not_before, datetime) or not_before.tzinfo is None
                                       or not_before.utcoffset() is None):
            raise Error.bad_input(f"not_before must be a time zone aware datetime, not {not_before!r:.60}")
        turn = self._value(
            "SELECT tw.submit_turn(agent => %s::text, channel => %s::text, input => %s::jsonb,"
            " timeout_seconds => %s::integer, idempotency_key => %s::text, box => %s::text, profile => %s::text,"
            " p_limit_key => %s::text, p_priority => %s::integer, p_not_before => %s::timestamptz)",
            (_text(agent, "the agent"), _text(channel, "the channel"), _json(input, "the input"), timeout_seconds,
             _text(idempotency_key, "the idempotency key"), _text(box, "the box"), _text(profile, "the profile"),
             _text(limit_key, "the limit key"), priority, not_before),
            conn)
        return str(turn)

    def outcome(self, turn: TurnId) -> Outcome:
        """Where the turn stands now (``tw.turn_outcome``); Error 22023 for an unknown turn."""
        tid = _turn_id(turn)
        d = self._value("SELECT tw.turn_outcome(%s::uuid)", (tid,))
        if d is None:
            raise Error.bad_input(f"no turn {tid}")
        return Outcome.from_document(d)

    def _outcome_waiting(self, tid: str) -> Outcome:
        """outcome() for wait(), once listening: ``tw.turn_wait`` registers this session as the turn's waiter, so
        that the transaction that ends the turn notifies ``tw_turn_end`` (ends nobody waits for do not)."""
        if self._unregistered:
            return self.outcome(tid)
        try:
            d = self._value("SELECT tw.turn_wait(%s::uuid)", (tid,))
        except Error as e:
            if e.sqlstate != "42501":
                raise
            # An observer may read but not register: wait() then reads the turn every OBSERVER_POLL_SECONDS.
            self._unregistered = True
            return self.outcome(tid)
        if d is None:
            raise Error.bad_input(f"no turn {tid}")
        return Outcome.from_document(d)

    def wait(self, turn: TurnId, timeout: Optional[float] = None, *,
             poll_seconds: float = SAFETY_POLL_SECONDS) -> Outcome:
        """Wait until the turn has ended and return its :class:`Outcome`.

        Raises ``TimeoutError`` when it has not ended after ``timeout`` seconds (None: wait as long as it takes;
        every turn ends, docs/watchdogs.md), and Error 22023 for an unknown turn. Needs PostgreSQL only: it listens
        on ``tw_turn_end``, which the database notifies with the turn id in the transaction that ends a turn that
        has a waiter (``tw.turn_wait`` registers this session as one), so it returns as soon as that commits. It
        reads the turn at the start, when its turn's notification comes (other turns' notifications are read off
        the connection without a query) and, as a safety net, every ``poll_seconds`` without one. While the database cannot be reached it tries again every second (at most
        ``poll_seconds``); if it still cannot when the time is up, it raises the Error of the last attempt.
        """
        tid = _turn_id(turn)
        deadline = None if timeout is None else time.monotonic() + timeout
        self._waiting.add(tid)
        outage = False
        try:
            while True:
                self._heard.discard(tid)
                try:
                    conn = self._listen()
                    out = self._outcome_waiting(tid)
                except Error as e:
                    if e.sqlstate is not None and not e.sqlstate.startswith(("08", "57")):
                        raise  # a real answer (22023: no such turn, 42501: not allowed), not an outage
                    self._drop()
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise
                    retry = min(poll_seconds, 1.0)
                    if not outage:
                        _log.warning("waiting for turn %s: %s; trying again every %s s", tid, e.reason, retry)
                        outage = True
                    time.sleep(retry if left is None else min(retry, left))
                    continue
                outage = False
                if out.terminal:
                    return out
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"turn {tid} is still {out.status} after {timeout} s")
                every = min(poll_seconds, OBSERVER_POLL_SECONDS) if self._unregistered else poll_seconds
                self._sleep(conn, tid, every if left is None else min(every, left))
        finally:
            self._waiting.discard(tid)
            self._heard.discard(tid)

    def _sleep(self, conn: "psycopg.Connection[Any]", tid: str, seconds: float) -> None:
        """Until the notification of ``tid``'s end, ``seconds`` or a broken connection, whichever comes first. The
        notifications of other turns are taken off the connection here, without a query."""
        until = time.monotonic() + seconds
        pgconn = conn.pgconn
        while tid not in self._heard:
            left = until - time.monotonic()
            if left <= 0:
                return
            try:
                ready, _, _ = select.select([conn.fileno()], [], [], left)
                if not ready:
                    return
                pgconn.consume_input()
                while True:
                    n = pgconn.notifies()
                    if n is None:
                        break
                    self._notified(psycopg.Notify(n.relname.decode("utf-8", "replace"),
                                                  n.extra.decode("utf-8", "replace"), n.be_pid))
                if pgconn.status != psycopg.pq.ConnStatus.OK:
                    raise psycopg.OperationalError("the connection was closed")
            except (OSError, ValueError, psycopg.Error):
                self._drop()  # the next read connects again (and listens again)
                return

    def cancel(self, turn: TurnId, *, conn: Optional["psycopg.Connection[Any]"] = None) -> str:
        """Cancel a turn that has not ended (``tw.cancel_turn``): ``cancelled``, ``already_ended`` or
        ``unknown_turn``."""
        return str(self._value("SELECT tw.cancel_turn(turn => %s::uuid)", (_turn_id(turn),), conn))

    def set_limit(self, name: str, max_concurrent: int = 0, *, rate: Optional[Tuple[int, float]] = None,
                  burst: Optional[int] = None, per_key: bool = False, max_wait_seconds: float = 0,
                  conn: Optional["psycopg.Connection[Any]"] = None) -> Dict[str, JSON]:
        """Set a limit of flow control at run time (``tw.set_limit``) and return it as ``limits show`` does.

        ``max_concurrent``: at most this many tool calls hold it at once (0: no cap); ``rate`` ``(n, seconds)``: at
        most n starts per that many seconds (a token bucket of ``burst``, default n); ``per_key``: the caps apply to
        each turn's ``limit_key`` separately; ``max_wait_seconds``: a call that waits longer to start ends
        ``error``/``limit_timeout`` (0: as its turn's deadline allows). Error 22023 for a bad value.
        """
        n, sec = rate if rate is not None else (None, None)
        d = self._value(
            "SELECT tw.set_limit(%s::text, %s::integer, %s::integer, %s::numeric, %s::integer, %s::boolean,"
            " %s::numeric)", (name, max_concurrent, n, sec, burst, per_key, max_wait_seconds), conn)
        return d if isinstance(d, dict) else {}

    def remove_limit(self, name: str, *, conn: Optional["psycopg.Connection[Any]"] = None) -> bool:
        """Remove a limit (``tw.remove_limit``): True when there was one."""
        return bool(self._value("SELECT tw.remove_limit(%s::text)", (name,), conn))

    def limits(self) -> List[Dict[str, JSON]]:
        """Every limit as ``turnwatch limits list --json`` gives it: settings, in use, waiting, tokens."""
        d = self._value("SELECT tw.limits_list()", ())
        return list(d) if isinstance(d, list) else []

    def add_schedule(self, name: str, agent: str, cron: str, timezone: str = "UTC", *, channel: Optional[str] = None,
                     input: JSON = None, timeout_seconds: Optional[int] = None, limit_key: Optional[str] = None,
                     overlap: str = "skip", catchup: str = "last", catchup_window_seconds: int = 3600,
                     conn: Optional["psycopg.Connection[Any]"] = None) -> Dict[str, JSON]:
        """Add (or change) a run-time schedule (``tw.add_schedule``) and return it as ``schedules show`` does: at
        each time of ``cron`` (five fields) in ``timezone``, one turn for ``agent`` with ``input`` (a JSON object,
        default ``{}``), exactly once whatever the number of PMOs (docs/schedules.md). ``overlap``: ``skip``,
        ``queue`` or ``cancel_previous``; ``catchup``: ``none``, ``last`` or ``all`` within
        ``catchup_window_seconds``. Error 22023 for a bad value, a bad cron or time zone, or a name of the INI.
        """
        d = self._value(
            "SELECT tw.add_schedule(%s::text, %s::text, %s::text, %s::text, %s::text, %s::jsonb, %s::integer,"
            " %s::text, %s::text, %s::text, %s::integer)",
            (name, agent, cron, timezone, channel, _json({} if input is None else input, "the input"),
             timeout_seconds, limit_key, overlap, catchup, catchup_window_seconds), conn)
        return d if isinstance(d, dict) else {}

    def remove_schedule(self, name: str, *, conn: Optional["psycopg.Connection[Any]"] = None) -> bool:
        """Remove a run-time schedule (``tw.remove_schedule``): True when there was one; it fires no more."""
        return bool(self._value("SELECT tw.remove_schedule(%s::text)", (name,), conn))

    def schedules(self) -> List[Dict[str, JSON]]:
        """Every schedule as ``turnwatch schedules list --json`` gives it."""
        d = self._value("SELECT tw.schedules_list()", ())
        return list(d) if isinstance(d, list) else []

    def post_tool_result(self, turn: TurnId, call: str, status: str = "ok", output: JSON = None, *,
                         conn: Optional["psycopg.Connection[Any]"] = None) -> str:
        """Post the result of an external tool call (``tw.post_tool_result``), as a tool program's would arrive.

        ``status`` ``ok`` with ``output`` the tool's output, or ``error`` with ``output`` ``{"code", "message"}``
        (a string is the message). Returns ``accepted``, or why not: ``unknown_turn``, ``unknown_call``, ``ended``,
        ``duplicate``, ``timed_out``, ``cancelled``, ``stale``.
        """
        return str(self._value(
            "SELECT tw.post_tool_result(turn => %s::uuid, call => %s::text, status => %s::text, output => %s::jsonb)",
            (_turn_id(turn), _text(call, "the call id"), _text(status, "the status"), _json(output, "the output")),
            conn))

    def turn(self, turn: TurnId) -> Dict[str, JSON]:
        """The turn as ``turnwatch turn show ID --json`` gives it (``tw.turn_show``): status, agent, profile,
        epoch, attempt, timestamps (ISO 8601 strings), error, deliverable card id, tool calls, warnings, forced ends,
        children. Error 22023 for an unknown turn."""
        tid = _turn_id(turn)
        d = self._value("SELECT tw.turn_show(%s::uuid)", (tid,))
        if d is None:
            raise Error.bad_input(f"no turn {tid}")
        return dict(d)

    def history(self, turn: TurnId) -> List[Dict[str, JSON]]:
        """Every transition of the turn in order (``tw.turn_history``): ``at``, ``from``, ``to``, ``turn_epoch``,
        ``attempt``, ``actor``, ``reason``. Error 22023 for an unknown turn."""
        tid = _turn_id(turn)
        rows = self._value("SELECT tw.turn_history(%s::uuid)", (tid,))
        if not rows:
            raise Error.bad_input(f"no turn {tid}")
        return list(rows)

    def tree(self, turn: TurnId) -> Dict[str, JSON]:
        """The delegation tree the turn belongs to, from its root (``tw.turn_tree``): each node's ``turn_id``,
        ``agent``, ``profile``, ``status``, ``error``, ``depth``, ``parent_tool_call_id`` and ``children``. Error
        22023 for an unknown turn."""
        tid = _turn_id(turn)
        d = self._value("SELECT tw.turn_tree(%s::uuid)", (tid,))
        if d is None:
            raise Error.bad_input(f"no turn {tid}")
        return dict(d)

    def add_agent(self, agent: str, profile: str, metadata: Optional[Dict[str, JSON]] = None, *,
                  conn: Optional["psycopg.Connection[Any]"] = None) -> bool:
        """Add an agent to the roster bound to ``profile`` (``tw.add_agent``): True when created, False when it
        exists bound to the same profile. ``metadata``: a JSON object of at most 64 KiB."""
        return bool(self._value("SELECT tw.add_agent(agent => %s::text, profile => %s::text, metadata => %s::jsonb)",
                                (_text(agent, "the agent"), _text(profile, "the profile"),
                                 None if metadata is None else _json(metadata, "the metadata")),
                                conn))

    def retire_agent(self, agent: str, *, conn: Optional["psycopg.Connection[Any]"] = None) -> bool:
        """Retire an agent (``tw.retire_agent``): it takes no new turns (a submit fails with ``agent_retired``);
        turns already submitted still run. True when it was active until now."""
        return bool(self._value("SELECT tw.retire_agent(agent => %s::text)", (_text(agent, "the agent"),), conn))
