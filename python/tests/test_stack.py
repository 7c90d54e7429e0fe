"""The library against the real stack (conftest.Stack): agents and tools written with it run by turnwatch-worker in
exec and serve mode, and turnwatch.Client on the database the daemons use."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from datetime import datetime
from typing import Any

import psycopg
import pytest

import turnwatch
from conftest import Stack, wait_until

MIB = 1_048_576
DONE_OVERHEAD = len(b'{"complete":{"output":""}}\n')
WAIT = 90  # seconds: generous; a turn here takes well under one


def submit_wait(client: turnwatch.Client, agent: str, inp: object, **kw: Any) -> turnwatch.Outcome:
    tid = client.submit(agent, f"py-{uuid.uuid4().hex[:8]}", inp, **kw)
    return client.wait(tid, WAIT)


def status_of(client: turnwatch.Client, tid: str) -> str:
    return client.outcome(tid).status


# ---- agents and tools written with the library --------------------------------------------------------------------


@pytest.mark.parametrize("agent,tool", [("research", "lookup"), ("research_serve", "lookup_serve"),
                                        ("research", "lookup_serve"), ("research_serve", "lookup")])
def test_example_agent_and_tool(client: turnwatch.Client, agent: str, tool: str) -> None:
    out = submit_wait(client, agent, {"terms": ["epoch", "watchdog", "nope"], "tool": tool})
    assert out.status == "done", out
    assert out.output["answer"]["epoch"].startswith("a per-agent fencing counter")
    assert out.output["answer"]["watchdog"].startswith("a rule that ends")
    assert out.output["missing"] == {"nope": "error: not_found: no entry for 'nope'"}
    assert out.error is None and out.attempt == 1
    assert out.output["tool_pids"] and out.output["agent_pid"] not in out.output["tool_pids"]


def test_serve_agent_keeps_its_process(client: turnwatch.Client) -> None:
    a = submit_wait(client, "research_serve", {"terms": ["turn"]})
    b = submit_wait(client, "research_serve", {"terms": ["inbox"]})
    assert a.status == b.status == "done"
    assert a.output["agent_pid"] == b.output["agent_pid"]
    assert b.output["steps_served"] > a.output["steps_served"]


@pytest.mark.parametrize("agent", ["scripted", "scripted_exec"])
def test_raising_agent_fails_its_step_and_serve_goes_on(client: turnwatch.Client, agent: str) -> None:
    before = submit_wait(client, agent, {"do": "echo"})
    failed = submit_wait(client, agent, {"do": "raise", "message": "boom from the test"})
    after = submit_wait(client, agent, {"do": "echo"})
    assert before.status == after.status == "done", (before, after)
    assert failed.status == "failed", failed
    assert failed.error == "agent_exception", failed  # the library's code, which the worker honours
    assert "RuntimeError: boom from the test" in failed.error_message, failed
    if agent == "scripted":  # serve mode: the process that raised served the next turn
        pid = before.output["pid"]
        assert f"(pid {pid})" in failed.error_message
        assert after.output["pid"] == pid and after.output["served"] == before.output["served"] + 2


def test_raising_agent_error_code(client: turnwatch.Client) -> None:
    out = submit_wait(client, "scripted", {"do": "raise", "message": "coded"})
    assert out.error == "agent_exception", out


def test_step_deadline_reaches_the_agent(client: turnwatch.Client) -> None:
    out = submit_wait(client, "scripted", {"do": "echo"})
    assert out.output["deadline"] is not None, out
    deadline = datetime.fromisoformat(out.output["deadline"])
    assert deadline.tzinfo is not None, out  # a time on the database clock, with its offset
    assert out.ended_at is not None and deadline > out.ended_at, out  # the step ended well within its limit


def test_step_attempt_profile_and_mode(client: turnwatch.Client) -> None:
    serve = submit_wait(client, "scripted", {"do": "echo"})
    exec_ = submit_wait(client, "scripted_exec", {"do": "echo"})
    assert (serve.output["mode"], exec_.output["mode"]) == ("serve", "exec")
    assert serve.output["attempt"] == exec_.output["attempt"] == 1
    assert serve.output["profile"] == "scripted" and exec_.output["profile"] == "scripted_exec"


@pytest.mark.parametrize("agent", ["scripted", "scripted_exec"])
def test_reply_size_rule_against_the_worker(client: turnwatch.Client, agent: str) -> None:
    before = submit_wait(client, agent, {"do": "echo"})
    n = MIB - DONE_OVERHEAD  # the reply line is exactly 1 MiB with its newline: the worker takes it
    ok = submit_wait(client, agent, {"do": "big", "n": n})
    assert ok.status == "done", ok
    assert ok.output == "x" * n
    over = submit_wait(client, agent, {"do": "big", "n": n + 1})  # one byte more: not written, a fail instead
    assert over.status == "failed", over
    assert over.error == "reply_too_large", over  # the library's code, which the worker honours
    assert f"{MIB + 1} bytes" in over.error_message and "1 MiB" in over.error_message, over
    after = submit_wait(client, agent, {"do": "echo"})
    assert before.status == after.status == "done"
    if agent == "scripted":  # the serve process wrote neither too much nor anything else: it is still the same
        assert after.output["pid"] == before.output["pid"]


def _deep_input(levels: int) -> str:
    return '{"do": "echo", "deep": ' + "[" * levels + "]" * levels + "}"


@pytest.mark.parametrize("do,error,words", [
    ("unprintable", "agent_exception", "Unprintable"),
    ("exit", "agent_exception", "SystemExit: 3"),
    ("interrupt", "agent_exception", "KeyboardInterrupt"),
    ("bigint", "agent_exception", "beyond 64 bits"),
    ("deep", "bad_input", "nested too deeply"),
])
def test_serve_process_survives_what_its_step_does(tw: Stack, client: turnwatch.Client, do: str, error: str,
                                                   words: str) -> None:
    before = submit_wait(client, "scripted", {"do": "echo"})
    if do == "deep":  # 3,000 levels: valid JSON the database takes, deeper than Python's json reads
        tid = str(tw.sql("SELECT tw.submit_turn(agent => 'scripted', channel => 'deep', input => %s::jsonb)",
                         _deep_input(3000))[0][0])
        bad = client.wait(tid, WAIT)
    else:
        bad = submit_wait(client, "scripted", {"do": do, "n": str(2**70)})
    after = submit_wait(client, "scripted", {"do": "echo"})
    assert before.status == after.status == "done", (before, after)
    assert bad.status == "failed", bad
    assert (bad.error, words in (bad.error_message or "")) == (error, True), bad
    assert after.output["pid"] == before.output["pid"], "the serve process was replaced"


def test_integers_within_64_bits_pass(client: turnwatch.Client) -> None:
    for n in (2**63 - 1, -2**63):
        out = submit_wait(client, "scripted", {"do": "bigint", "n": str(n)})
        assert out.status == "done" and out.output["n"] == n, out


def test_print_in_a_served_step_does_not_break_the_process(client: turnwatch.Client) -> None:
    a = submit_wait(client, "scripted", {"do": "print"})
    b = submit_wait(client, "scripted", {"do": "echo"})
    assert a.status == b.status == "done", (a, b)
    assert a.output["pid"] == b.output["pid"]


def test_tool_results_reach_the_agent(client: turnwatch.Client) -> None:
    out = submit_wait(client, "scripted", {"do": "call", "calls": [
        {"tool": "lookup", "args": {"term": "doorbell"}},
        {"tool": "lookup_serve", "args": {"term": "nothing"}, "id": "missing", "timeout_seconds": 20}]})
    assert out.status == "done", out
    r1, r2 = out.output["results"]
    assert (r1["tool_call_id"], r1["status"], r1["output"]["term"]) == ("c1", "ok", "doorbell")
    assert (r2["tool_call_id"], r2["status"], r2["code"]) == ("missing", "error", "not_found")
    assert out.output["state"] == {"asked": 2}


def test_flow_control_from_python(tw: Stack, client: turnwatch.Client) -> None:
    """Client.set_limit/limits/remove_limit, submit's limit_key and priority, and a tool's RateLimited: the call
    runs again after its pause, with the try in turn show."""
    lim = client.set_limit("py_lim", 2, rate=(10, 1), per_key=True, max_wait_seconds=60)
    assert (lim["name"], lim["max_concurrent"], lim["rate_n"], lim["per_key"]) == ("py_lim", 2, 10, True)
    assert [x["name"] for x in client.limits()] == ["py_lim"]
    marker = tw.dir / f"pushy-{uuid.uuid4().hex[:8]}"
    tid = client.submit("scripted", "py-flow", {"do": "call", "calls": [
        {"tool": "pushy", "args": {"marker": str(marker), "after": 0.3}}]}, limit_key="tenant-1", priority=3)
    out = client.wait(tid, WAIT)
    assert out.status == "done", out
    (r,) = out.output["results"]
    assert (r["status"], r["output"]["ok"]) == ("ok", True)
    shown = client.turn(tid)
    assert (shown["limit_key"], shown["priority"]) == ("tenant-1", 3)
    (call,) = shown["tool_calls"]
    assert call["limits"] == ["py_lim"]
    assert [t["error"]["code"] for t in call["tries"]] == ["rate_limited"]
    assert call["tries"][0]["error"]["retry_after_seconds"] == 0.3
    with pytest.raises(ValueError):
        turnwatch.RateLimited(-1)
    with pytest.raises(turnwatch.Error) as e:
        client.submit("scripted", "py-flow", {"do": "echo"}, priority=10)
    assert e.value.sqlstate == "22023"
    with pytest.raises(turnwatch.Error) as e:
        client.set_limit("bad name", 1)
    assert e.value.sqlstate == "22023"
    assert client.remove_limit("py_lim") is True
    assert client.remove_limit("py_lim") is False
    assert client.limits() == []


def test_schedules_from_python(tw: Stack, client: turnwatch.Client) -> None:
    """Client.add_schedule/schedules/remove_schedule: the schedule's document with its next fire times; a bad cron
    refused with 22023."""
    sc = client.add_schedule("py_sched", "scripted", "*/5 * * * *", input={"do": "echo"}, overlap="queue",
                             catchup="none")
    assert (sc["name"], sc["agent"], sc["cron"], sc["timezone"], sc["owner"]) == (
        "py_sched", "scripted", "*/5 * * * *", "UTC", "sql")
    assert (sc["overlap"], sc["catchup"], sc["input"]) == ("queue", "none", {"do": "echo"})
    assert len(sc["next_fires"]) == 5
    assert all(f.endswith("Z") and int(f[14:16]) % 5 == 0 for f in sc["next_fires"])
    assert [x["name"] for x in client.schedules()] == ["py_sched"]
    with pytest.raises(turnwatch.Error) as e:
        client.add_schedule("py_bad", "scripted", "every minute")
    assert e.value.sqlstate == "22023"
    assert client.remove_schedule("py_sched") is True
    assert client.remove_schedule("py_sched") is False
    assert client.schedules() == []


# ---- the client ----------------------------------------------------------------------------------------------------


def test_not_before_runs_the_turn_later(tw: Stack, client: turnwatch.Client) -> None:
    # A turn that runs later (docs/schedules.md): pending, reason scheduled, until its time on the database's clock;
    # its deadline counts from then.
    at = tw.sql("SELECT now() + interval '2 seconds'")[0][0]
    tid = client.submit("scripted", "py-later", {"do": "echo"}, not_before=at, timeout_seconds=30)
    shown = tw.sql("SELECT tw.turn_show(%s::uuid)", tid)[0][0]
    assert shown["status"] == "pending" and shown["pending_reason"] == "scheduled", shown
    assert tw.sql("SELECT not_before = %s AND deadline_at = not_before + interval '30 s' FROM state.turns"
                  " WHERE turn_id = %s::uuid", at, tid)[0][0] is True
    assert client.wait(tid, WAIT).status == "done"
    assert tw.sql("SELECT dispatched_at >= not_before FROM state.turns WHERE turn_id = %s::uuid", tid)[0][0] is True
    with pytest.raises(turnwatch.Error) as e:
        client.submit("scripted", "py-later", {"do": "echo"}, not_before=datetime(2030, 1, 1))
    assert e.value.sqlstate == "22023" and "time zone aware" in e.value.reason, e.value


def test_wait_with_nats_stopped(tw: Stack, client: turnwatch.Client) -> None:
    tw.nats_stop()
    try:
        with pytest.raises(OSError):  # really stopped: nothing listens on its port
            socket.create_connection(("127.0.0.1", tw.nats_port), timeout=5).close()
        t0 = time.monotonic()
        tid = client.submit("scripted", "no-nats", {"do": "echo"})
        out = client.wait(tid, WAIT)
        assert out.status == "done", out
        assert out.output["input"] == {"do": "echo"}
        print(f"submit -> done with nats-server stopped: {time.monotonic() - t0:.2f} s")
    finally:
        tw.nats_start()


def test_wait_wakes_on_the_notification(tw: Stack, client: turnwatch.Client) -> None:
    # A turn suspended on an external tool; another connection cancels it and sends the notification the server
    # will send for turns being waited on. With the fallback poll at 10 minutes, only the notification can end
    # this wait long before its 60 s are up (it takes about the 1 s of the timer; without LISTEN, 60 s).
    tid = client.submit("scripted", "notify", {"do": "call", "calls": [{"tool": "ext", "id": "ask"}]})
    wait_until(lambda: status_of(client, tid) == "suspended", WAIT, "the turn to wait for its external call")

    def cancel_and_notify() -> None:
        with psycopg.connect(tw.dsn, autocommit=True) as c:
            with c.transaction():
                c.execute("SELECT tw.cancel_turn(%s::uuid)", (tid,))
                c.execute("SELECT pg_notify('tw_turn_end', %s)", (tid,))

    timer = threading.Timer(1.0, cancel_and_notify)
    timer.start()
    try:
        t0 = time.monotonic()
        out = client.wait(tid, 60, poll_seconds=600)
        woken = time.monotonic() - t0
        print(f"woken {woken:.2f} s into the wait")
        assert out.status == "cancelled" and out.error == "cancelled", out
        assert woken < 30, f"the wait ended {woken:.1f} s after it began: not by the notification"
    finally:
        timer.join()


def _end_by(tw: Stack, client: turnwatch.Client, how: str) -> tuple:
    """A turn that ends by `how` about a second after it is set up, and what starts that end (None: the turn's own
    deadline ends it): (turn id, the status it ends in, a function to run after the wait has begun)."""
    ext = {"do": "call", "calls": [{"tool": "ext", "id": "ask"}]}
    if how == "timeout":  # the turn deadline rule (a set-based end of every turn due at once)
        tid = client.submit("scripted", "end-timeout", ext, timeout_seconds=3)
    else:
        tid = client.submit("scripted", f"end-{how}", {**ext, "then": "fail"} if how == "failed" else ext)
    wait_until(lambda: status_of(client, tid) == "suspended", WAIT, "the turn to wait for its external call")

    def end() -> None:
        with turnwatch.Client(tw.dsn) as other:
            if how == "cancelled":
                assert other.cancel(tid) == "cancelled"
            else:  # the worker runs the next step and ends the turn done or failed
                assert other.post_tool_result(tid, "ask", "ok", {"answer": 1}) == "accepted"

    return tid, {"done": "done", "failed": "failed", "cancelled": "cancelled", "timeout": "timeout"}[how], \
        None if how == "timeout" else end


@pytest.mark.parametrize("how", ["done", "failed", "cancelled", "timeout"])
def test_wait_hears_every_end_at_once(tw: Stack, client: turnwatch.Client, how: str) -> None:
    # Every end sends NOTIFY tw_turn_end in its own transaction. With the safety poll at 10 minutes the wait can
    # return within its 40 s only through that notification; it reads the turn once at the start and once when its
    # notification comes (other turns' notifications do not make it read).
    tid, status, end = _end_by(tw, client, how)
    reads = []
    outcome = client.outcome

    def counted(turn: object) -> turnwatch.Outcome:
        reads.append(time.monotonic())
        return outcome(turn)

    client.outcome = counted  # type: ignore[method-assign]
    timer = threading.Timer(1.0, end) if end else None
    began = datetime.now().astimezone()
    if timer:
        timer.start()
    try:
        out = client.wait(tid, 40, poll_seconds=600)
        returned = datetime.now().astimezone()
    finally:
        if timer:
            timer.join()
        del client.outcome
    assert out.status == status, out
    assert out.ended_at is not None and out.ended_at > began, (out.ended_at, began)  # it ended during the wait
    late = (returned - out.ended_at).total_seconds()
    print(f"{how}: the wait returned {late * 1000:.1f} ms after ended_at, after {len(reads)} reads")
    assert len(reads) <= 3, f"the wait read the turn {len(reads)} times: it polled"
    # ended_at is the ending transaction's start on the database clock (same host). Generous for a loaded machine,
    # yet far below both the 10 minute poll here and the 0.5 s poll the library had before the notification.
    assert late < 2.0, f"the wait returned {late:.3f} s after the turn ended"


def test_wait_rides_out_a_postgresql_restart(tw: Stack, client: turnwatch.Client) -> None:
    tid = client.submit("scripted", "pg-restart", {"do": "call", "calls": [{"tool": "ext", "id": "ask"}]})
    wait_until(lambda: status_of(client, tid) == "suspended", WAIT, "the turn to wait for its external call")
    errors: list = []

    def restart_and_answer() -> None:
        try:
            tw.pg_restart()
            with turnwatch.Client(tw.dsn) as other:
                assert other.post_tool_result(tid, "ask", "ok", {"after": "restart"}) == "accepted"
        except BaseException as e:  # reported by the test below
            errors.append(e)

    t = threading.Thread(target=restart_and_answer)
    t.start()
    try:
        out = client.wait(tid, WAIT)  # its connection is ended by the restart: it connects again and goes on
    finally:
        t.join()
    assert not errors, errors
    assert out.status == "done", out
    assert out.output["results"][0]["output"] == {"after": "restart"}


def test_wait_times_out_while_the_turn_runs(client: turnwatch.Client) -> None:
    tid = client.submit("scripted", "timeout", {"do": "call", "calls": [{"tool": "ext", "id": "ask"}]})
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=tid):
        client.wait(tid, 0.5)
    assert time.monotonic() - t0 >= 0.5
    assert client.cancel(tid) == "cancelled"
    assert client.cancel(tid) == "already_ended"
    assert client.wait(tid, WAIT).status == "cancelled"


def test_submit_rolled_back_with_the_callers_transaction(tw: Stack, client: turnwatch.Client) -> None:
    class Rollback(Exception):
        pass

    with psycopg.connect(tw.dsn) as conn:
        with pytest.raises(Rollback):
            with conn.transaction():
                conn.execute("CREATE TABLE IF NOT EXISTS py_tickets (id serial PRIMARY KEY, turn uuid)")
                tid = client.submit("scripted", "rolled-back", {"do": "echo"}, conn=conn,
                                    idempotency_key="py-rolled-back")
                conn.execute("INSERT INTO py_tickets (turn) VALUES (%s)", (tid,))
                assert conn.execute("SELECT count(*) FROM state.turns WHERE turn_id = %s",
                                    (tid,)).fetchone()[0] == 1  # there, inside the transaction
                raise Rollback()
    assert tw.sql("SELECT count(*) FROM state.turns WHERE turn_id = %s OR idempotency_key = 'py-rolled-back'",
                  tid)[0][0] == 0
    with pytest.raises(turnwatch.Error) as e:
        client.outcome(tid)
    assert e.value.sqlstate == "22023"
    # Committed, the same code gives a turn that runs.
    with psycopg.connect(tw.dsn) as conn:
        with conn.transaction():
            tid = client.submit("scripted", "committed", {"do": "echo"}, conn=conn)
    assert client.wait(tid, WAIT).status == "done"


@pytest.mark.parametrize("call,words", [
    (lambda c: c.submit("no spaces!", "ch", {}), "invalid agent"),
    (lambda c: c.submit("no_such_agent_or_profile", "ch", {}), "unknown agent"),
    (lambda c: c.submit("scripted", "ch\n", {}), "invalid channel"),
    (lambda c: c.submit("scripted", "ch", {}, timeout_seconds=0), "timeout_seconds"),
    (lambda c: c.submit("scripted", "ch", {}, timeout_seconds=2**40), "timeout_seconds"),
    (lambda c: c.submit("scripted", "ch", {"x": "y" * (MIB + 70000)}), "the input document is"),
    (lambda c: c.submit("scripted", "ch", {"x": {1, 2}}), "not JSON-serialisable"),
    (lambda c: c.submit("py-other", "ch", {}, profile="no_such_profile"), "unknown profile"),
    (lambda c: c.wait("not-a-uuid", 1), "not a turn id"),
    (lambda c: c.wait(str(uuid.uuid4()), 1), "no turn"),
    (lambda c: c.turn(str(uuid.uuid4())), "no turn"),
    (lambda c: c.history(str(uuid.uuid4())), "no turn"),
    (lambda c: c.tree(str(uuid.uuid4())), "no turn"),
    (lambda c: c.post_tool_result(str(uuid.uuid4()), "c1", "maybe", {}), "status must be ok or error"),
    (lambda c: c.add_agent("py-a", "no_such_profile"), "unknown profile"),
    (lambda c: c.add_agent("py-a", "scripted", [1]), "must be a JSON object"),
    (lambda c: c.retire_agent("py-never-added"), "unknown agent"),
    (lambda c: c.submit("scripted", "ch", {"x": "\ud800"}), "lone surrogate"),
    (lambda c: c.submit("scripted", "ch", {"\udfff": 1}), "lone surrogate"),
    (lambda c: c.submit("scripted\ud800", "ch", {}), "lone surrogate"),
    (lambda c: c.submit("scripted", "ch", {}, idempotency_key="k\ud800"), "lone surrogate"),
    (lambda c: c.submit("scripted", "ch\x00", {}), "NUL"),
    (lambda c: c.submit("scripted", "ch", {"x": "a\x00b"}), "NUL"),
    (lambda c: c.submit("scripted", "ch", {"a\x00": 1}), "NUL"),
    (lambda c: c.submit("scripted", "ch", {"x": "\\\x00"}), "NUL"),
    (lambda c: c.post_tool_result(str(uuid.uuid4()), "c\x00", "ok", {}), "NUL"),
    (lambda c: c.post_tool_result(str(uuid.uuid4()), "c1", "ok", ["\ud800"]), "lone surrogate"),
    (lambda c: c.add_agent("py-a\x00", "scripted"), "NUL"),
    (lambda c: c.add_agent("py-a", "scripted", {"m": "\ud83d"}), "lone surrogate"),
    (lambda c: c.retire_agent("py-\ud800"), "lone surrogate"),
])
def test_bad_input_is_error_22023(client: turnwatch.Client, call: object, words: str) -> None:
    with pytest.raises(turnwatch.Error) as e:
        call(client)  # type: ignore[operator]
    assert e.value.sqlstate == "22023", e.value
    assert words in e.value.reason, e.value.reason


def test_text_that_only_looks_like_a_nul_is_fine(client: turnwatch.Client) -> None:
    inp = {"do": "echo", "x": "\\u0000", "y": "\\\\u0000", "\\u0000": "k"}  # backslashes, not NUL characters
    out = submit_wait(client, "scripted", inp)
    assert out.status == "done" and out.output["input"] == inp, out


def test_error_from_the_database_keeps_the_connection_usable(client: turnwatch.Client) -> None:
    with pytest.raises(turnwatch.Error):
        client.submit("no spaces!", "ch", {})
    assert client.wait(client.submit("scripted", "after-error", {"do": "echo"}), WAIT).status == "done"


def test_roster_calls(client: turnwatch.Client) -> None:
    name = f"py-{uuid.uuid4().hex[:10]}"
    assert client.add_agent(name, "scripted", {"customer": 7}) is True
    assert client.add_agent(name, "scripted") is False
    with pytest.raises(turnwatch.Error) as e:
        client.add_agent(name, "scripted_exec")
    assert e.value.sqlstate == "22023" and "bound to profile scripted" in e.value.reason
    out = submit_wait(client, name, {"do": "echo"})
    assert out.status == "done" and out.output["agent"] == name and out.output["profile"] == "scripted"
    assert (out.agent, out.profile) == (name, "scripted")
    assert client.retire_agent(name) is True
    assert client.retire_agent(name) is False
    with pytest.raises(turnwatch.Error) as e:
        client.submit(name, "ch", {"do": "echo"})
    assert e.value.sqlstate == "22023" and "agent_retired" in e.value.reason
    # submit with a profile adds the agent in the same transaction.
    other = f"py-{uuid.uuid4().hex[:10]}"
    assert submit_wait(client, other, {"do": "echo"}, profile="scripted_exec").output["mode"] == "exec"


def test_external_tool_result_turn_history_tree(tw: Stack, client: turnwatch.Client) -> None:
    tid = client.submit("scripted", "ext", {"do": "call", "calls": [{"tool": "ext", "id": "ask"}]}, timeout_seconds=600,
                        idempotency_key=f"py-ext-{uuid.uuid4().hex}")
    wait_until(lambda: status_of(client, tid) == "suspended", WAIT, "the turn to wait for its external call")
    shown = client.turn(tid)
    assert shown["status"] == "suspended" and shown["timeout_seconds"] == 600
    assert [(c["tool_call_id"], c["status"], c["external"]) for c in shown["tool_calls"]] == [("ask", "waiting", True)]
    assert client.post_tool_result(tid, "ask", "ok", {"answer": 42}) == "accepted"
    assert client.post_tool_result(tid, "ask", "ok", {"answer": 43}) != "accepted"
    out = client.wait(tid, WAIT)
    assert out.status == "done", out
    assert out.output["results"][0]["output"] == {"answer": 42}
    assert out.deliverable == {"partial": False, "output": out.output}
    assert out.ended_at is not None and out.epoch is not None
    # turn() is `turnwatch turn show --json`, to the key.
    assert client.turn(tid) == json.loads(tw.cli("turn", "show", tid, "--json").stdout)
    history = client.history(tid)
    assert [h["to"] for h in history][0] == "pending" and history[-1]["to"] == "done"
    assert "suspended" in [h["to"] for h in history]
    assert client.history(uuid.UUID(tid)) == history  # a uuid.UUID is a turn id too
    tree = client.tree(tid)
    assert tree["turn_id"] == tid and tree["status"] == "done" and tree["children"] == []


def test_same_idempotency_key_same_turn(client: turnwatch.Client) -> None:
    key = f"py-idem-{uuid.uuid4().hex}"
    a = client.submit("scripted", "idem", {"do": "echo"}, idempotency_key=key)
    b = client.submit("scripted", "idem", {"do": "echo"}, idempotency_key=key)
    assert a == b and str(uuid.UUID(a)) == a
    assert client.wait(a, WAIT).status == "done"


def test_connection_failure_is_an_error() -> None:
    with turnwatch.Client("postgresql://postgres@127.0.0.1:1/turnwatch?connect_timeout=5") as c:
        with pytest.raises(turnwatch.Error) as e:
            c.submit("scripted", "ch", {})
    assert e.value.sqlstate is None and e.value.reason
