"""conftest.py -- a throwaway turnwatch stack for the library's tests, started once per session when a test needs it.

PostgreSQL (initdb as the `postgres` user through runuser when we are root, as tests/fixture.c and
tools/lib/servers.sh do; trust auth, fsync off) and nats-server on free ports in a temp dir /tmp/twpy-*, then
`turnwatch migrate`, turnwatch-pmo and turnwatch-worker from the build dir: TW_BUILD_DIR (tests/meson.build sets
it), else <source>/build-test. The worker runs the Python programs with this interpreter and PYTHONPATH set to
<source>/python (the worker hands its environment to the programs it starts). Everything is stopped and the temp
dir removed after the session (TW_PY_KEEP=1 keeps it, with the logs).

Tests that need no servers (test_protocol.py) never start it.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import pytest

SOURCE = Path(os.environ.get("TW_SOURCE_DIR") or Path(__file__).resolve().parents[2])
BUILD = Path(os.environ.get("TW_BUILD_DIR") or SOURCE / "build-test")
PYTHON_DIR = SOURCE / "python"
EXAMPLES = SOURCE / "examples" / "python"
PROGRAMS = Path(__file__).resolve().parent / "programs"
# The package under test is the one in this source tree, not one installed elsewhere.
sys.path.insert(0, str(PYTHON_DIR))

import turnwatch  # noqa: E402


def program_env(**extra: str) -> Dict[str, str]:
    """The environment for a program written with the library: this one, with the package on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PYTHON_DIR) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("TURNWATCH_MODE", None)
    env.update(extra)
    return env


def wait_until(pred: Callable[[], object], timeout: float, what: str, every: float = 0.05) -> object:
    """Polls pred until it returns something true; fails the test after timeout seconds (generous, never tight)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def _free_port() -> int:
    """A free TCP port below the ephemeral range, so that nats-server can be restarted on it (as servers.sh)."""
    lo = 32768
    try:
        lo = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    lo = lo if lo > 11000 else 32768
    for _ in range(200):
        port = random.randrange(10000, lo)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free TCP port")


def _pg_bindir() -> str:
    dirs = [d for d in glob.glob("/usr/lib/postgresql/*/bin") if os.access(os.path.join(d, "initdb"), os.X_OK)]
    if dirs:
        return max(dirs, key=lambda d: int("".join(c for c in d if c.isdigit()) or 0))
    initdb = shutil.which("initdb")
    if not initdb:
        raise RuntimeError("PostgreSQL server binaries not found (is the postgresql package installed?)")
    return os.path.dirname(initdb)


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"({path} unreadable)"


class Stack:
    """PostgreSQL, nats-server and both daemons, with the INI that connects them."""

    def __init__(self) -> None:
        for b in (self.pmo_bin, self.worker_bin, self.cli_bin):
            if not os.access(b, os.X_OK):
                raise RuntimeError(f"{b} is not built (TW_BUILD_DIR={BUILD})")
        self.dir = Path(tempfile.mkdtemp(prefix="twpy-"))
        self.dir.chmod(0o755)  # the postgres user must reach pg/
        self.procs: Dict[str, subprocess.Popen] = {}
        self.pg_bin = _pg_bindir()
        self.pg_dir = self.dir / "pg"
        self.pg_port = 0
        self.nats_port = 0
        self.nats: Optional[subprocess.Popen] = None
        self.ini = self.dir / "turnwatch.ini"

    pmo_bin = BUILD / "pmo" / "turnwatch-pmo"
    worker_bin = BUILD / "worker" / "turnwatch-worker"
    cli_bin = BUILD / "tools" / "turnwatch"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/turnwatch"

    # ---- PostgreSQL ----------------------------------------------------------------------------------------------

    def _as_pg(self, argv: List[str]) -> subprocess.CompletedProcess:
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--"] + argv
        return subprocess.run(argv, cwd=self.pg_dir, capture_output=True, text=True, timeout=120)

    def pg_start(self) -> None:
        self.pg_dir.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.pg_dir, "postgres", "postgres")
        self.pg_dir.chmod(0o700)
        data = self.pg_dir / "data"
        r = self._as_pg([f"{self.pg_bin}/initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync",
                         "--no-locale", "-E", "UTF8"])
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed: {r.stdout}{r.stderr}")
        self.pg_port = _free_port()
        with open(data / "postgresql.conf", "a") as f:
            f.write(f"\n# turnwatch python tests (python/tests/conftest.py)\nport = {self.pg_port}\n"
                    f"listen_addresses = '127.0.0.1'\nunix_socket_directories = '{self.pg_dir}'\n"
                    "fsync = off\nfull_page_writes = off\nmax_connections = 100\n")
        r = self._as_pg([f"{self.pg_bin}/pg_ctl", "-D", str(data), "-l", str(self.pg_dir / "postgres.log"), "-w",
                         "-t", "60", "start"])
        if r.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not start: {r.stderr}\n{_tail(self.pg_dir / 'postgres.log')}")
        import psycopg

        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres", autocommit=True) as c:
            c.execute("CREATE DATABASE turnwatch")

    def pg_restart(self) -> None:
        """pg_ctl restart -m fast: every session is ended, the server comes back on the same port."""
        r = self._as_pg([f"{self.pg_bin}/pg_ctl", "-D", str(self.pg_dir / "data"), "-l",
                         str(self.pg_dir / "postgres.log"), "-m", "fast", "-w", "-t", "60", "restart"])
        if r.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not restart: {r.stderr}\n{_tail(self.pg_dir / 'postgres.log')}")

    def pg_stop(self) -> None:
        if (self.pg_dir / "data" / "postmaster.pid").exists():
            self._as_pg([f"{self.pg_bin}/pg_ctl", "-D", str(self.pg_dir / "data"), "-m", "immediate", "-w", "stop"])

    def sql(self, query: str, *params: object) -> list:
        """Rows of a query on a connection of its own (for checks the client does not offer)."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as c:
            return c.execute(query, params).fetchall()

    # ---- nats-server ---------------------------------------------------------------------------------------------

    def nats_start(self) -> None:
        binary = shutil.which("nats-server") or next(
            (p for p in ("/usr/sbin/nats-server", "/usr/bin/nats-server") if os.access(p, os.X_OK)), None)
        if not binary:
            raise RuntimeError("nats-server not found (is the nats-server package installed?)")
        if not self.nats_port:
            self.nats_port = _free_port()
        log = open(self.dir / "nats.log", "ab")
        self.nats = subprocess.Popen([binary, "-a", "127.0.0.1", "-p", str(self.nats_port)], stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.nats_port), timeout=1).close()
                return
            except OSError:
                if self.nats.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nats-server did not start:\n{_tail(self.dir / 'nats.log')}")
                time.sleep(0.05)

    def nats_stop(self) -> None:
        if self.nats and self.nats.poll() is None:
            self.nats.send_signal(signal.SIGINT)
            try:
                self.nats.wait(10)
            except subprocess.TimeoutExpired:
                self.nats.kill()
                self.nats.wait()
        self.nats = None

    # ---- turnwatch -----------------------------------------------------------------------------------------------

    def write_config(self) -> None:
        py = sys.executable
        programs = {
            "agent.research": (f"{py} {EXAMPLES}/research_agent.py", "exec"),
            "agent.research_serve": (f"{py} {EXAMPLES}/research_agent.py", "serve"),
            "agent.scripted": (f"{py} {PROGRAMS}/scripted_agent.py", "serve"),
            "agent.scripted_exec": (f"{py} {PROGRAMS}/scripted_agent.py", "exec"),
            "tool.lookup": (f"{py} {EXAMPLES}/lookup_tool.py", "exec"),
            "tool.lookup_serve": (f"{py} {EXAMPLES}/lookup_tool.py", "serve"),
            "tool.pushy": (f"{py} {PROGRAMS}/pushy_tool.py", "exec"),
        }
        lines = [
            "; written by python/tests/conftest.py",
            "[postgres]", f"dsn = {self.dsn}",
            "[nats]", f"url = nats://127.0.0.1:{self.nats_port}",
            "[pmo]", "watchdog_interval_seconds = 1", "dispatched_retry_seconds = 2", "dispatched_timeout_seconds = 6",
            "pending_wakeup_seconds = 2", "pending_wakeup_skip_seconds = 10", "active_reap_seconds = 10",
            "[worker]", "inbox_processing_timeout_seconds = 10", "watchdog_interval_seconds = 1",
            "suspend_timeout_seconds = 30", "heartbeat_seconds = 1", "concurrency = 4", "agents = *",
        ]
        for section, (exec_line, mode) in programs.items():
            lines += [f"[{section}]", f"exec = {exec_line}", f"mode = {mode}"]
            lines += (["step_timeout_seconds = 30", "kill_grace_seconds = 1"] if section.startswith("agent.")
                      else ["external = false", "timeout_seconds = 30", "suspend_timeout_seconds = 30"])
            if section == "tool.pushy":  # flow control: its calls hold py_lim, set at run time (test_stack.py)
                lines += ["limits = py_lim"]
        lines += ["[tool.ext]", "external = true", "timeout_seconds = 60", "suspend_timeout_seconds = 60"]
        self.ini.write_text("\n".join(lines) + "\n")

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run([str(self.cli_bin), "-c", str(self.ini), *args], capture_output=True, text=True,
                           timeout=60)
        if check and r.returncode != 0:
            raise RuntimeError(f"turnwatch {' '.join(args)} exited {r.returncode}: {r.stderr}")
        return r

    def start_daemon(self, name: str, binary: Path) -> None:
        log = open(self.dir / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen([str(binary), "-c", str(self.ini)], stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=program_env())
        log.close()

    def dead_daemons(self) -> List[str]:
        """What went wrong with the daemons, with their log tails; empty while both run."""
        return [f"{name} exited {p.returncode}:\n{_tail(self.dir / f'{name}.log')}"
                for name, p in self.procs.items() if p.poll() is not None]

    def start(self) -> None:
        self.pg_start()
        self.nats_start()
        self.write_config()
        self.cli("migrate")
        self.start_daemon("pmo", self.pmo_bin)
        self.start_daemon("worker", self.worker_bin)
        wait_until(lambda: self.dead_daemons() or self.sql(
            "SELECT count(DISTINCT kind) FROM state.daemons WHERE gone_at IS NULL")[0][0] == 2, 60,
                   "turnwatch-pmo and turnwatch-worker to register")
        if self.dead_daemons():
            raise RuntimeError("\n".join(self.dead_daemons()))

    def stop(self) -> List[str]:
        """Stops everything; returns what went wrong with the daemons: docs/overview.md wants exit 0 on SIGTERM
        (and their sanitizers end them otherwise when they find a leak or a fault)."""
        bad = self.dead_daemons()
        running = {name: p for name, p in self.procs.items() if p.poll() is None}
        for p in running.values():
            p.send_signal(signal.SIGCONT)
            p.terminate()
        for name, p in running.items():
            try:
                if p.wait(15) != 0:
                    bad.append(f"{name} exited {p.returncode} on SIGTERM:\n{_tail(self.dir / f'{name}.log')}")
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                bad.append(f"{name} did not stop within 15 s of SIGTERM")
        self.nats_stop()
        self.pg_stop()
        if os.environ.get("TW_PY_KEEP", "0") not in ("", "0"):
            print(f"conftest: kept {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
        return bad


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    """The session's stack, started on first use."""
    # meson test ends a test that outlived its timeout with SIGTERM: go through pytest's teardown then, so that
    # the servers are stopped and the temp dir removed.
    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, on_term)
    s = Stack()
    bad: List[str] = []
    try:
        s.start()
        yield s
    finally:
        bad = s.stop()
        signal.signal(signal.SIGTERM, old)
    assert not bad, "\n".join(bad)


@pytest.fixture
def tw(stack: Stack) -> Iterator[Stack]:
    """The stack, checked after the test: both daemons must still be running."""
    yield stack
    dead = stack.dead_daemons()
    assert not dead, "\n".join(dead)


@pytest.fixture
def client(tw: Stack) -> Iterator["turnwatch.Client"]:
    """A turnwatch.Client on the stack's database, closed after the test."""
    with turnwatch.Client(tw.dsn) as c:
        yield c
