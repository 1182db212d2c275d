"""Lease heartbeats: one thread per engine beats every held run, never after the run is let go.

The real heartbeats against SQLite and PostgreSQL are exercised by the worker
tests (a frozen worker taken over, leases of 0.5 s); these check the scheduling.
"""

from __future__ import annotations

import itertools
import threading
import time
from datetime import UTC, datetime

import pytest

from statekeep.workflow import Run, RunStatus, leases
from statekeep.workflow.leases import Heartbeats


def _run(run_id: str) -> Run:
    stamp = datetime.now(UTC)
    return Run(
        run_id,
        "wf",
        1,
        RunStatus.RUNNING,
        {},
        None,
        None,
        None,
        stamp,
        stamp,
        None,
        1,
        "me",
        None,
        None,
        0,
        None,
    )


class Beats:
    def __init__(self, alive: bool = True) -> None:
        self.seen: list[tuple[str, float]] = []
        self.alive = alive
        self.lock = threading.Lock()

    def __call__(self, run: Run) -> bool:
        with self.lock:
            self.seen.append((run.run_id, time.monotonic()))
        return self.alive

    def of(self, run_id: str) -> list[float]:
        with self.lock:
            return [t for r, t in self.seen if r == run_id]


def test_every_held_run_is_beaten_each_interval_and_none_after_it_is_let_go() -> None:
    beats = Beats()
    hearts = Heartbeats(beats, lambda: 0.05)
    with hearts.held(_run("a")):
        with hearts.held(_run("b")):
            time.sleep(0.3)
        left = time.monotonic()
        time.sleep(0.2)
    a, b = beats.of("a"), beats.of("b")
    assert len(b) >= 2, b
    assert all(t <= left for t in b), "a run let go was beaten again"
    assert len(a) >= 4, a
    assert [round(y - x, 2) >= 0.03 for x, y in itertools.pairwise(a)] == [True] * (len(a) - 1)


def test_one_thread_serves_runs_one_after_another_and_ends_when_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leases, "IDLE_SECONDS", 0.2)
    hearts = Heartbeats(Beats(), lambda: 0.05)
    threads: set[threading.Thread] = set()
    for i in range(20):
        with hearts.held(_run(f"r{i}")):
            assert hearts._thread is not None
            threads.add(hearts._thread)
    assert len(threads) == 1, "a thread per run"
    (thread,) = threads
    thread.join(timeout=2)
    assert not thread.is_alive()
    with hearts.held(_run("later")):  # a new run after the idle end starts a new thread
        assert hearts._thread is not None
        assert hearts._thread.is_alive()


def test_a_run_taken_over_is_no_longer_beaten_and_errors_do_not_stop_the_others() -> None:
    lost = Beats(alive=False)
    hearts = Heartbeats(lost, lambda: 0.03)
    with hearts.held(_run("gone")):
        time.sleep(0.25)
    assert len(lost.of("gone")) == 1

    calls: list[str] = []

    def flaky(run: Run) -> bool:
        calls.append(run.run_id)
        if len(calls) % 2:
            raise OSError("database went away for a moment")
        return True

    hearts = Heartbeats(flaky, lambda: 0.03)
    with hearts.held(_run("kept")):
        time.sleep(0.3)
    assert len(calls) >= 3, calls
