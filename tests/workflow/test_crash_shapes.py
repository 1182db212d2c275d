"""Crash tests of issue 12 (parts 2 and 4): replayed state, and workflows of every shape.

* The take-notes example of docs/workflow.md, SIGKILLed before, inside and at the commit of
  each of its steps (19 positions), then killed again at a random point of its resume,
  then resumed: always 3 lines, and exactly one working-state version per committed
  ``set_state``, on both backends, with the stores sharing a database or not.
* Runs with a child run and a tool call, a sleep, two event waits and state that depends
  on earlier state, executed by 3 real worker processes killed at fault points and at
  random times, replaced, until every run completes (40 kills per backend by default).

``STATEKEEP_CRASH_SCALE=n`` (``make crash``) multiplies the kills.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from statekeep.db import Database
from statekeep.errors import RunFinishedError
from statekeep.workflow import Engine, RunStatus, StepRecord
from statekeep.working import SQLWorkingStateStore

from . import crash_shapes as shapes
from .conftest import crash_scale, fork, lines, tally_kills, wait

pytestmark = [pytest.mark.crash, pytest.mark.slow]

LIVE = [s for s in RunStatus if not s.finished]
#: where a resume of take-notes may be killed too (take-notes calls no tool)
RESUME_POINTS = [p for p in shapes.POINTS if p != "tool_started"]


# --- part 2: take-notes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "layout"), [("sqlite", "shared"), ("postgres", "shared"), ("sqlite", "separate")]
)
def test_take_notes_killed_anywhere_ends_with_three_lines_and_three_versions(
    backend: str, layout: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The docs' example, killed at each of 19 positions (and again while resuming): 3 lines, 3 versions.

    ``separate``: the working state in a SQLite file of its own; a version written just
    before a completion that never committed may stay behind, unreferenced (at most one
    per kill between the two), never seen by the run.
    """
    url = request.getfixturevalue(f"{backend}_url")
    state_url = None if layout == "shared" else f"sqlite:///{tmp_path / 'states.db'}"
    rng = random.Random(12)
    kills = 0
    for r in range(crash_scale()):
        for i, position in enumerate(shapes.NOTES_POSITIONS):
            run_id = f"notes-{r}-{i}"
            again = (rng.choice(RESUME_POINTS), rng.randint(1, 4))
            at_commit = 0
            for k, (point, n) in enumerate([position, again]):
                child = functools.partial(shapes.take_notes_child, url, state_url, run_id, point, n)
                code = wait(fork(child))
                if k == 0:  # a first run always reaches its position
                    assert code == -signal.SIGKILL, f"a run told to die at {point} #{n} exited with {code}"
                else:  # a resume may finish before its fault point
                    assert code in (0, -signal.SIGKILL), f"a resume told to die at {point} #{n}: {code}"
                kills += code == -signal.SIGKILL
                at_commit += code == -signal.SIGKILL and point == "before_commit"
            resume = functools.partial(shapes.take_notes_child, url, state_url, run_id, None, 0)
            assert wait(fork(resume)) == 0
            check_take_notes(url, state_url, run_id, orphans_allowed=0 if state_url is None else at_commit)
    tally_kills(request, kills)
    assert kills >= len(shapes.NOTES_POSITIONS) * crash_scale()


def check_take_notes(url: str, state_url: str | None, run_id: str, *, orphans_allowed: int) -> None:
    db = Database(url)
    state_db = db if state_url is None else Database(state_url)
    engine, states = shapes.notes_engine(db, state_db, shapes.Faults(None, 0))
    try:
        run = engine.store.get(run_id)
        assert (run.status, run.output) == (RunStatus.COMPLETED, 3), (run.status, run.error)
        journal = engine.store.steps(run_id)
        assert [(s.name, s.kind) for s in journal] == [("write", "step"), ("commit", "step")] * 3
        assert [s.value for s in journal if s.name == "write"] == shapes.NOTES_LINES
        assert [s.cursor for s in journal] == [None, 1, None, 2, None, 3]
        # exactly the three set_state calls that committed produced a version, each its own
        pointers = [s.state_version for s in journal]
        assert pointers[0::2] == [None, None, None], pointers
        referenced = [v for v in pointers if v is not None]
        assert referenced == sorted(set(referenced)), pointers
        versions = {v.version: v for v in states.versions(run_id)}
        assert set(referenced) <= set(versions), (pointers, sorted(versions))
        for k, version in enumerate(referenced, start=1):
            assert states.load(run_id, shapes.Notes, version=version).lines == shapes.NOTES_LINES[:k]
        orphans = sorted(set(versions) - set(referenced))
        assert len(orphans) <= orphans_allowed, (pointers, sorted(versions))
        for version in orphans:  # a completion that never committed: the same state, written again
            got = states.load(run_id, shapes.Notes, version=version).lines
            assert got, version
            assert got == shapes.NOTES_LINES[: len(got)], got
        if state_url is None:
            assert referenced == [1, 2, 3]
        assert states.load(run_id, shapes.Notes).lines == shapes.NOTES_LINES
        checkpoint = engine.store.checkpoint(run_id)
        assert (checkpoint.state_version, checkpoint.cursor) == (referenced[-1], 3)
    finally:
        db.dispose()
        state_db.dispose()


# --- part 4: workflows of every shape under killed workers --------------------------------------------

WORKERS = 3


class Crew:
    """The worker processes of one test: spawned, killed, reaped; every kill is counted."""

    def __init__(self, url: str, work: Path, db: Database) -> None:
        self.url, self.work, self.db = url, work, db
        self.kills: Counter[str] = Counter()
        self.live: dict[int, tuple[str | None, float, str]] = {}  # pid -> (point, kill time, owner)
        self.spawned = self.point_workers = 0

    def spawn(self, point: str | None, n: int, lifetime: float, idle_exit: float | None = None) -> None:
        self.db.dispose()  # nothing pooled across fork
        self.spawned += 1
        owner = f"w{self.spawned}"
        pid = fork(lambda: shapes.shapes_worker(self.url, self.work, owner, point, n, idle_exit))
        self.live[pid] = (point, time.monotonic() + lifetime, owner)

    def reap(self) -> None:
        """Count the workers that died at their fault point; kill those whose time is up."""
        for pid, (point, kill_at, owner) in list(self.live.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done and time.monotonic() >= kill_at:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                done, status = os.waitpid(pid, 0)
                point = None  # killed at a random time, whatever its fault point was
            if not done:
                continue
            del self.live[pid]
            code = os.waitstatus_to_exitcode(status)
            log = self.work / f"{owner}.log"
            assert code == -signal.SIGKILL, f"worker {owner} exited with {code}: {lines(log)[-20:]}"
            self.kills[point or "random"] += 1

    def kill_all(self) -> None:
        """Kill every worker still alive (each a kill at a random time)."""
        for pid, (point, _, owner) in list(self.live.items()):
            self.live[pid] = (point, 0.0, owner)
        self.reap()


def drive_shapes(
    url: str, work: Path, db: Database, engine: Engine, *, point_kills: int, random_kills: int, seed: int
) -> Counter[str]:
    """Start runs and send their events while workers are killed and replaced; return kills by kind."""
    rng = random.Random(seed)
    crew = Crew(url, work, db)
    shaped = engine.registry.get("shapes", 1)
    started = 0
    go_due: dict[str, float] = {}  # run id -> when the test sends it "go"
    deadline = time.monotonic() + 120 + 60 * (point_kills + random_kills) / 10
    try:
        while True:
            points = sum(crew.kills[p] for p in shapes.POINTS)
            randoms = crew.kills["random"]
            if points >= point_kills and randoms >= random_kills:
                break
            assert time.monotonic() < deadline, f"the kill quota was not met in time: {crew.kills}"
            live = engine.store.list_runs(status=LIVE, workflow="shapes", limit=1000)
            if len(live) < 8:  # work never runs out
                for _ in range(4):
                    engine.start(shaped, f"run-{started}", started)
                    go_due[f"run-{started}"] = time.monotonic() + rng.uniform(0.0, 0.4)
                    started += 1
            send_events(engine, go_due, rng)
            while len(crew.live) < WORKERS:
                if points < point_kills and (randoms >= random_kills or rng.random() < 0.6):
                    point = shapes.POINTS[crew.point_workers % len(shapes.POINTS)]
                    crew.point_workers += 1
                    crew.spawn(point, rng.randint(1, 2), lifetime=6.0)
                else:
                    crew.spawn(None, 0, lifetime=rng.uniform(0.15, 0.9))
            crew.reap()
            time.sleep(0.02)
    finally:
        crew.kill_all()
    for _ in range(3):  # then undisturbed workers finish every run
        send_events(engine, dict.fromkeys(go_due, 0.0), rng)
        go_due.clear()
        if not engine.store.list_runs(status=LIVE, limit=1):
            break
        db.dispose()
        pids = [
            fork(
                functools.partial(
                    shapes.shapes_worker, url, work, f"finisher{i}", None, 0, shapes.LEASE + 1.5
                )
            )
            for i in range(2)
        ]
        assert [wait(pid, timeout=300) for pid in pids] == [0, 0]
    return crew.kills


def send_events(engine: Engine, go_due: dict[str, float], rng: random.Random) -> None:
    """Send "go" to every run whose time has come (once), and "ping" to about a third of them."""
    now = time.monotonic()
    for run_id, due in list(go_due.items()):
        if due > now:
            continue
        del go_due[run_id]
        engine.store.send_event(run_id, "go", f"go-{run_id}")  # a run cannot finish without it
        if rng.random() < 0.35:
            with contextlib.suppress(RunFinishedError):
                engine.store.send_event(run_id, "ping", "pong")


def check_shapes(engine: Engine, states: SQLWorkingStateStore, work: Path) -> int:
    """Every invariant of every run; return how many parent runs there were."""
    runs = engine.store.list_runs(limit=1_000_000)
    status = {r.run_id: r.status.value for r in runs}
    stuck = [
        (r.run_id, r.status.value, r.error, r.waiting, status.get(shapes.child_id(r.run_id)))
        for r in runs
        if r.status is not RunStatus.COMPLETED
    ]
    assert not stuck, f"runs that did not complete (id, status, error, waiting, child): {stuck[:10]}"
    parents = [r for r in runs if r.workflow == "shapes"]
    assert len(runs) == 2 * len(parents)
    execs: dict[str, list[str]] = defaultdict(list)
    effects: Counter[str] = Counter()
    for line in lines(work / "actions.log"):
        kind, what, *token = line.split()
        if kind == "exec":
            execs[what].append(token[0])
        else:
            effects[what] += 1
    keys: list[str] = []
    for parent in parents:
        child = engine.store.get(shapes.child_id(parent.run_id))
        assert child.parent_id == parent.run_id
        journal, kid_journal = engine.store.steps(parent.run_id), engine.store.steps(child.run_id)
        check_journal(journal, shapes.PARENT_JOURNAL, execs)
        check_journal(kid_journal, shapes.CHILD_JOURNAL, execs)
        (call,) = engine.store.tool_calls(child.run_id)
        assert call.status == "completed", call
        keys.append(call.key)
        n = parent.input["args"][0]
        kid_items = [kid_journal[0].value, {"charged": n}]
        assert child.output == {"count": 2, "items": kid_items}
        go, ping = journal[5].value, journal[6].value
        assert go == {"received": True, "payload": f"go-{parent.run_id}"}, go
        ping_value = ping["payload"] if ping["received"] else "no ping"
        assert ping_value in ("pong", "no ping"), ping
        items = [journal[0].value, journal[3].value, go["payload"], ping_value, child.output]
        assert parent.output == {"count": 3, "items": items}
        check_versions(states, parent.run_id, [items[:1], items[:2], items])
        check_versions(states, child.run_id, [kid_items[:1], kid_items])
    # each tool effect exactly once per idempotency key
    assert sorted(effects) == sorted(keys)
    repeated = [k for k, c in effects.items() if c > 1]
    told = [line for line in lines(work / "calls.log") if line.split()[1] in repeated or "worker" in line]
    assert not repeated, (repeated, told)
    return len(parents)


def check_journal(
    journal: list[StepRecord], expected: list[tuple[str, str, bool]], execs: dict[str, list[str]]
) -> None:
    """The journal has the expected shape, and no step executed again after its completion committed."""
    run_id = journal[0].run_id
    assert [(s.name, s.kind) for s in journal] == [(n, k) for n, k, _ in expected], run_id
    stateful = [s.state_version for s, (_, _, keeps) in zip(journal, expected, strict=True) if keeps]
    stateless = [s.state_version for s, (_, _, keeps) in zip(journal, expected, strict=True) if not keeps]
    assert stateful == list(range(1, len(stateful) + 1)), (run_id, [s.state_version for s in journal])
    assert set(stateless) == {None}, (run_id, [s.state_version for s in journal])
    for step in journal:
        if step.kind == "step":
            runs_of_step = execs[f"{run_id}/{step.name}"]
            assert runs_of_step, (run_id, step.name)
            assert runs_of_step[-1] == step.value, (run_id, step.name, runs_of_step)


def check_versions(states: SQLWorkingStateStore, run_id: str, expected: list[list[Any]]) -> None:
    """One version per stateful step, each built on the one before: count k, the first items."""
    versions = states.versions(run_id)
    assert [v.version for v in versions] == list(range(1, len(expected) + 1)), (run_id, len(versions))
    for k, items in enumerate(expected, start=1):
        tally = states.load(run_id, shapes.Tally, version=k)
        assert (tally.count, tally.items) == (k, items), (run_id, k)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_shapes_survive_killed_workers(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """40 kills (24 at fault points, 16 at random times) of 3 workers: every run completes, exactly."""
    url = request.getfixturevalue(f"{backend}_url")
    db = Database(url)
    states = SQLWorkingStateStore(db)
    engine = Engine(db, shapes.shapes_registry(tmp_path, shapes.Faults(None, 0)), state_store=states)
    scale = crash_scale()
    try:
        kills = drive_shapes(
            url, tmp_path, db, engine, point_kills=24 * scale, random_kills=16 * scale, seed=4
        )
        tally_kills(request, sum(kills.values()))
        assert all(kills[p] >= 3 * scale for p in shapes.POINTS), kills
        assert check_shapes(engine, states, tmp_path) >= 8
    finally:
        db.dispose()
