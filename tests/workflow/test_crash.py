"""Crash tests: real processes killed with SIGKILL at every fault point, then resumed by another.

Each backend gets 100+ kills: 80 at chosen fault points (before a step, inside one,
between a tool call's start and completion, between a completion and its commit)
and 20+ at random times from the parent. After each kill a new process resumes.
``STATEKEEP_CRASH_SCALE=n`` (``make crash``) multiplies the kills.
"""

from __future__ import annotations

import contextlib
import functools
import random
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from statekeep.db import Database
from statekeep.workflow import Engine, Run, RunStatus

from . import crash_workload as workload
from .conftest import crash_scale, fork, lines, tally_kills, wait

pytestmark = [pytest.mark.crash, pytest.mark.slow]


def crash_loop(
    url: str, work: Path, *, reconcile: bool, point_kills: int, random_kills: int, seed: int
) -> Counter[str]:
    """Kill children until the quotas are met; return kills per fault point.

    Every child starts new runs, so a child told to die at a fault point always
    reaches it, and one killed at random is always still working: a child that
    exits by itself is a failure, not a kill to retry.
    """
    rng = random.Random(seed)
    kills: Counter[str] = Counter()
    for attempt in range(1, 4 * (point_kills + random_kills)):
        if sum(kills.values()) >= point_kills + random_kills:
            break
        points_done = sum(kills[p] for p in workload.POINTS) >= point_kills
        if kills["random"] < random_kills and (attempt % 4 == 0 or points_done):
            pid = fork(lambda: workload.child(url, work, None, 0, reconcile, workload.RANDOM_RUNS))
            time.sleep(rng.uniform(0.02, 0.25))
            _kill(pid)
            code = wait(pid)  # it has more runs than it can finish: only the kill ends it
            assert code == -signal.SIGKILL, f"a child killed at random exited with {code}"
            kills["random"] += 1
            continue
        point = workload.POINTS[sum(kills[p] for p in workload.POINTS) % len(workload.POINTS)]
        n = rng.randint(1, 3)
        pid = fork(functools.partial(workload.child, url, work, point, n, reconcile, workload.FRESH_RUNS))
        code = wait(pid)
        assert code == -signal.SIGKILL, f"a child told to die at {point} #{n} exited with {code}"
        kills[point] += 1
    return kills


def _kill(pid: int) -> None:
    import os

    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def finish(url: str, work: Path, reconcile: bool) -> None:
    """A last, undisturbed process resumes every run."""
    assert wait(fork(lambda: workload.child(url, work, None, 0, reconcile, 0))) == 0


def all_runs(engine: Engine) -> list[Run]:
    """Every run the children started (each child adds new ones, so work never runs out)."""
    runs = engine.store.list_runs(limit=1_000_000)
    assert len(runs) >= 10, "the children must have started runs"
    return runs


def check_no_completed_step_ran_again(engine: Engine, work: Path) -> None:
    """The execution that produced a recorded output is the last execution of that step."""
    execs: dict[tuple[str, int], list[str]] = defaultdict(list)
    for line in lines(work / "execs.log"):
        run_id, seq, token = line.split()
        execs[(run_id, int(seq))].append(token)
    for run in all_runs(engine):
        for step in engine.store.steps(run.run_id):
            if step.kind == "step":
                assert execs[(step.run_id, step.seq)][-1] == step.value, (step.run_id, step.seq)


def prepare(url: str) -> Engine:
    engine = Engine(
        Database(url), workload.build(Path("/nonexistent"), workload.Faults(None, 0), reconcile=True)
    )
    engine.store.close()  # nothing pooled across fork
    return engine


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_invariants_1_and_3_survive_sigkill_with_a_reconciler(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """60 kills (50 at fault points, 10 random): all runs complete, no step re-runs, one charge each."""
    url = request.getfixturevalue(f"{backend}_url")
    engine = prepare(url)
    scale = crash_scale()
    kills = crash_loop(url, tmp_path, reconcile=True, point_kills=50 * scale, random_kills=10 * scale, seed=3)
    tally_kills(request, sum(kills.values()))
    assert sum(kills.values()) >= 60 * scale, kills
    assert all(kills[p] >= 5 * scale for p in workload.POINTS), kills
    finish(url, tmp_path, reconcile=True)
    runs = all_runs(engine)
    assert {r.status for r in runs} == {RunStatus.COMPLETED}
    check_no_completed_step_ran_again(engine, tmp_path)
    charges = Counter(lines(tmp_path / "effects.log"))
    assert sorted(charges) == sorted(f"{run.run_id}/3/0" for run in runs)
    assert set(charges.values()) == {1}
    engine.store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_invariant_3_ambiguous_calls_are_surfaced_never_repeated(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """No reconciler, 42 kills (30 at fault points, 12 random): no effect twice, ambiguity surfaced."""
    url = request.getfixturevalue(f"{backend}_url")
    engine = prepare(url)
    scale = crash_scale()
    kills = crash_loop(
        url, tmp_path, reconcile=False, point_kills=30 * scale, random_kills=12 * scale, seed=7
    )
    tally_kills(request, sum(kills.values()))
    assert sum(kills.values()) >= 42 * scale, kills
    assert kills["tool_started"] >= 1, kills
    finish(url, tmp_path, reconcile=False)
    check_no_completed_step_ran_again(engine, tmp_path)
    assert set(Counter(lines(tmp_path / "effects.log")).values()) <= {1}
    asks = {a.run_id: a for a in engine.store.approvals(kind="ambiguous")}
    assert asks, "a kill between a tool's start and completion must surface an ambiguous call"
    for run in all_runs(engine):
        if run.status is RunStatus.NEEDS_DECISION:
            assert asks[run.run_id].action == "charge"
            assert [c.status for c in engine.store.tool_calls(run.run_id)] == ["started"]
        else:
            assert run.status is RunStatus.COMPLETED
            assert [c.status for c in engine.store.tool_calls(run.run_id)] == ["completed"]
    engine.store.close()
