"""Replay is faithful: ``ctx.state()`` sees its own position, and a resume writes nothing no step produced.

A crash is a ``BaseException`` raised from inside a step (nothing records it);
another engine then resumes the run by id, as a new process would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar

import pytest

from statekeep.db import Database
from statekeep.workflow import Engine, Registry, RunContext, RunStatus
from statekeep.working import SQLWorkingStateStore, WorkingState


class Crash(BaseException):
    """Stands in for a process dying mid-step."""


class Notes(WorkingState):
    state_schema: ClassVar[str] = "guide.notes"
    lines: list[str] = []


def take_notes_registry(crash_at: Callable[[str, int], bool]) -> Registry:
    """The take-notes example of docs/workflow.md, with a hook that crashes inside a step."""
    registry = Registry()

    def write(topic: str, i: int) -> str:
        if crash_at("write", i):
            raise Crash
        return f"{topic} #{i}"

    def commit(i: int) -> None:
        if crash_at("commit", i):
            raise Crash

    @registry.workflow("take-notes", version=1, state=Notes)
    def take_notes(ctx: RunContext, topic: str) -> int:
        notes = ctx.state(Notes) or Notes()
        for i in range(3):
            line = ctx.step("write", write, topic, i)
            notes = Notes(lines=[*notes.lines, line])
            ctx.set_state(notes)
            ctx.set_cursor(i + 1)
            ctx.step("commit", commit, i)
        return len(notes.lines)

    return registry


@pytest.mark.parametrize("point", [(name, i) for i in range(3) for name in ("write", "commit")])
def test_take_notes_killed_inside_any_step_ends_with_three_lines(
    database_url: str, point: tuple[str, int]
) -> None:
    """Killed inside any step and resumed, take-notes has 3 lines and one state version per set_state."""
    fired: list[tuple[str, int]] = []

    def crash_at(name: str, i: int) -> bool:
        if (name, i) == point and not fired:
            fired.append(point)
            return True
        return False

    db = Database(database_url)
    states = SQLWorkingStateStore(db)
    registry = take_notes_registry(crash_at)
    with pytest.raises(Crash):
        Engine(db, registry, state_store=states).run(registry.get("take-notes", 1), "notes-1", "ducks")
    run = Engine(db, registry, state_store=states).resume("notes-1")
    assert run.status is RunStatus.COMPLETED
    assert run.output == 3
    assert states.load("notes-1", Notes).lines == ["ducks #0", "ducks #1", "ducks #2"]
    journal = Engine(db, registry).store.steps("notes-1")
    with_state = [s.state_version for s in journal if s.state_version is not None]
    assert [v.version for v in states.versions("notes-1")] == with_state == [1, 2, 3]
    db.dispose()


def test_a_resume_attaches_no_state_to_sleeps_children_or_stateless_steps(database_url: str) -> None:
    """State staged before replayed steps is dropped: a resume writes no version that no step produced."""
    registry = Registry()
    crash = {"armed": True}

    @registry.workflow("kid", version=1)
    def kid(ctx: RunContext) -> int:
        return int(ctx.step("k", lambda: 1))

    def boom() -> None:
        if crash["armed"]:
            crash["armed"] = False
            raise Crash

    @registry.workflow("mixed", version=1, state=Notes)
    def mixed(ctx: RunContext) -> str:
        ctx.set_state(Notes(lines=["a"]))
        ctx.step("with-state", lambda: None)
        ctx.set_state(Notes(lines=["a", "b"]))  # staged again on replay, before a replayed step
        ctx.sleep("nap", 0)
        ctx.child(kid, "mixed-kid")
        ctx.step("stateless", lambda: None)
        ctx.step("boom", boom)
        return "ok"

    db = Database(database_url)
    states = SQLWorkingStateStore(db)
    with pytest.raises(Crash):
        Engine(db, registry, state_store=states).run(mixed, "m")
    versions_before = [v.version for v in states.versions("m")]
    engine = Engine(db, registry, state_store=states)
    assert engine.resume("m").output == "ok"
    assert [v.version for v in states.versions("m")] == versions_before == [1, 2]
    carried = {s.name: s.state_version for s in engine.store.steps("m")}
    assert carried == {"with-state": 1, "nap": 2, "kid": None, "stateless": None, "boom": None}
    db.dispose()


def test_fast_forward_sees_the_latest_state(database_url: str) -> None:
    """After fast_forward(), ctx.state() is the run's latest committed version, not None."""
    registry = Registry()
    seen: list[list[str] | None] = []

    @registry.workflow("ff", version=1, state=Notes)
    def ff(ctx: RunContext) -> int:
        ctx.fast_forward()
        current = ctx.state(Notes)
        seen.append(None if current is None else current.lines)
        lines = [*(current.lines if current else []), "x"]
        ctx.set_state(Notes(lines=lines))
        ctx.step(f"s{ctx.seq + 1}", lambda: None)
        if len(lines) < 2:
            ctx.sleep(f"nap{ctx.seq + 1}", 0.01)
        return len(lines)

    db = Database(database_url)
    states = SQLWorkingStateStore(db)
    engine = Engine(db, registry, state_store=states)
    assert engine.run(ff, "f").status is RunStatus.SLEEPING
    time.sleep(0.02)
    assert engine.resume("f").output == 2
    assert seen == [None, ["x"]]
    db.dispose()
