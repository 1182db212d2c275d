"""Workflow-store fixtures: engines over a fresh database on each backend, and forked processes."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from statekeep.db import Database
from statekeep.workflow import Engine, Registry

EngineFactory = Callable[..., Engine]


@pytest.fixture
def make_engine(database_url: str) -> Iterator[EngineFactory]:
    """Engines over one fresh database (SQLite or PostgreSQL), all disposed at the end."""
    made: list[Engine] = []

    def _make(registry: Registry, **kw: Any) -> Engine:
        engine = Engine(kw.pop("db", None) or database_url, registry, **kw)
        made.append(engine)
        return engine

    yield _make
    for engine in made:
        engine.store.close()


def fork(target: Callable[[], None]) -> int:
    """Run ``target`` in a forked child process (a real process); return its pid.

    The child exits with 0 on success, 1 on an exception, never running the
    parent's cleanup (``os._exit``), so pooled connections are not touched.
    """
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            target()
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    return pid


def wait(pid: int, timeout: float = 60.0) -> int:
    """Wait for a child; return its exit code, or minus the signal that killed it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"child {pid} did not finish within {timeout}s")


def lines(path: Path) -> list[str]:
    """The lines of an append-only effects file (empty when it does not exist)."""
    return path.read_text().splitlines() if path.exists() else []


def append(path: Path, line: str) -> None:
    """Append one line with O_APPEND, so concurrent processes never interleave within a line."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def fresh_db(url: str) -> Database:
    """A new Database (new engine, new pool) for a forked child."""
    return Database(url)


def wait_stopped(pid: int, timeout: float = 60.0) -> None:
    """Wait until a child stops itself (SIGSTOP); fail if it exits or dies instead."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
        if done and os.WIFSTOPPED(status):
            return
        if done:
            raise AssertionError(
                f"child {pid} ended ({os.waitstatus_to_exitcode(status)}) instead of stopping"
            )
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"child {pid} did not stop within {timeout}s")


# --- kill quotas -----------------------------------------------------------------------------------

#: ``STATEKEEP_CRASH_SCALE=n`` multiplies the kill quota of every crash test (``make crash`` sets 10).
SCALE_VARIABLE = "STATEKEEP_CRASH_SCALE"


def crash_scale() -> int:
    """The factor every crash test multiplies its kill quota by: 1 by default, at least 1."""
    raw = os.environ.get(SCALE_VARIABLE, "").strip() or "1"
    if not raw.isdigit() or int(raw) < 1:
        raise pytest.UsageError(f"{SCALE_VARIABLE} must be a whole number >= 1, not {raw!r}")
    return int(raw)


_KILLS: dict[str, int] = {}


def tally_kills(request: pytest.FixtureRequest, kills: int) -> None:
    """Count a test's SIGKILLs towards the total shown at the end of the session."""
    nodeid = request.node.nodeid
    _KILLS[nodeid] = _KILLS.get(nodeid, 0) + kills


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Report how many real processes the crash tests killed (the suite promises >= 200)."""
    if _KILLS:
        terminalreporter.write_sep("-", f"crash tests: {sum(_KILLS.values())} SIGKILLs")
        for nodeid, kills in sorted(_KILLS.items()):
            terminalreporter.write_line(f"{kills:6d}  {nodeid}")
