"""Crash workloads of every shape: the take-notes example of the docs, and workflows with
child runs, state built on earlier state, sleeps and event waits, driven by real workers.

Both run in forked processes that SIGKILL themselves at a fault point (each fires only
on new progress, never during replay):

* ``before_step``: just before the workflow asks for a step (and, in take-notes, after
  its last one, before the run finishes);
* ``inside_step``: inside a step function, before it returns;
* ``tool_started``: inside a tool, after its effect, before the ledger marks it completed;
* ``before_commit``: a journal entry is written, its transaction not yet committed.

Step executions and tool effects are counted outside the database, in one append-only
file (O_APPEND), a line each: ``exec <run>/<step> <token>`` and ``effect <key> <pid> <time>``.
What would explain a repeated effect goes to ``calls.log``: each worker's pid, each call's
start and each reconciler's verdict, with the process and the time.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import sqlalchemy as sa

from statekeep.db import Database
from statekeep.workflow import Engine, LedgerEntry, Reconciliation, Registry, RunContext, Worker
from statekeep.working import SQLWorkingStateStore, WorkingState

from .conftest import append, lines

POINTS = ("before_step", "inside_step", "tool_started", "before_commit")


class Faults:
    """Kill this process at the ``n``-th occurrence of ``point`` (never, when ``point`` is None)."""

    def __init__(self, point: str | None, n: int) -> None:
        self.point, self.n, self.seen = point, n, 0

    def hit(self, point: str) -> None:
        if point != self.point:
            return
        self.seen += 1
        if self.seen >= self.n:
            os.kill(os.getpid(), signal.SIGKILL)

    def watch(self, db: Database) -> None:
        """Fire ``before_commit`` when a transaction that wrote a journal entry is about to commit."""
        wrote = {"step": False}

        @sa.event.listens_for(db.engine, "before_cursor_execute")
        def _spot(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            head = statement.lstrip()[:80].upper()
            if head.startswith("INSERT INTO") and "STEPS" in head.split("(")[0]:
                wrote["step"] = True

        @sa.event.listens_for(db.engine, "commit")
        def _commit(conn: Any) -> None:
            if wrote["step"]:
                wrote["step"] = False
                self.hit("before_commit")


def log_to(path: Path) -> None:
    """Send this (forked) process's warnings to a file of its own."""
    logging.basicConfig(
        filename=path, level=logging.WARNING, force=True, format="%(levelname)s %(name)s: %(message)s"
    )


# --- the take-notes example of docs/workflow.md -----------------------------------------------------


class Notes(WorkingState):
    state_schema: ClassVar[str] = "guide.notes"
    lines: list[str] = []


#: Every fault position of one first run of take-notes: before each of its 6 steps and after the
#: last (7), inside each step (6), and between each step's completion and its commit (6).
NOTES_POSITIONS: tuple[tuple[str, int], ...] = (
    *(("before_step", n) for n in range(1, 8)),
    *(("inside_step", n) for n in range(1, 7)),
    *(("before_commit", n) for n in range(1, 7)),
)
NOTES_LINES = ["ducks #0", "ducks #1", "ducks #2"]


def take_notes_registry(faults: Faults) -> Registry:
    """The take-notes workflow of docs/workflow.md, line for line, with fault points around its steps."""
    registry = Registry()

    def probe(fn: Callable[..., Any]) -> Callable[..., Any]:
        def inside(*args: Any) -> Any:
            faults.hit("inside_step")
            return fn(*args)

        return inside

    def boundary(ctx: RunContext) -> None:
        if not ctx.replaying:
            faults.hit("before_step")

    @registry.workflow("take-notes", version=1, state=Notes)
    def take_notes(ctx: RunContext, topic: str) -> int:
        notes = ctx.state(Notes) or Notes()
        for i in range(3):
            boundary(ctx)
            line = ctx.step("write", probe(str.format), "{} #{}", topic, i)
            notes = Notes(lines=[*notes.lines, line])
            ctx.set_state(notes)
            ctx.set_cursor(i + 1)
            boundary(ctx)
            ctx.step("commit", probe(lambda: None))
        boundary(ctx)
        return len(notes.lines)

    return registry


def notes_engine(db: Database, state_db: Database, faults: Faults) -> tuple[Engine, SQLWorkingStateStore]:
    """An engine over ``db`` with its working state in ``state_db`` (the same Database, or not)."""
    faults.watch(db)
    states = SQLWorkingStateStore(state_db)
    return Engine(db, take_notes_registry(faults), state_store=states), states


def take_notes_child(url: str, state_url: str | None, run_id: str, point: str | None, n: int) -> None:
    """Start or resume one take-notes run; die at the chosen fault."""
    db = Database(url)
    engine, _ = notes_engine(db, db if state_url is None else Database(state_url), Faults(point, n))
    engine.run(engine.registry.get("take-notes", 1), run_id, "ducks")


# --- shapes: child runs, state built on earlier state, sleeps, event waits ---------------------------


class Tally(WorkingState):
    """State that depends on earlier state: each stateful step adds one to ``count`` and appends."""

    state_schema: ClassVar[str] = "crash.tally"
    count: int = 0
    items: list[Any] = []


#: The lease of the shape workers: long enough for heartbeats on a loaded machine, short enough
#: that the runs of a killed worker are taken up again soon.
LEASE = 2.0
NAP = 0.02
#: How long the child's tool takes before its effect. Long enough that a worker resuming the
#: parent inline (or its heartbeat) meets another worker still inside the call on the child.
SLOW_CALL = 0.3
PING_TIMEOUT = 0.03
#: (name, kind, carries a state version) of every journal entry of a parent and of its child.
PARENT_JOURNAL = [
    ("s0", "step", False),
    ("k0", "step", True),
    ("nap", "sleep", False),
    ("s1", "step", False),
    ("k1", "step", True),
    ("go", "event", False),
    ("ping", "event", False),
    ("leaf", "child", False),
    ("k2", "step", True),
]
CHILD_JOURNAL = [
    ("c0", "step", False),
    ("ck0", "step", True),
    ("charge", "tool", False),
    ("ck1", "step", True),
]


def child_id(run_id: str) -> str:
    return f"{run_id}.leaf"


def shapes_registry(work: Path, faults: Faults) -> Registry:
    """A parent that sleeps, waits for two events and runs a child with a tool call; both keep a Tally."""
    registry = Registry()
    actions = work / "actions.log"

    def reconciler(call: LedgerEntry) -> Reconciliation:
        found = any(line.split()[:2] == ["effect", call.key] for line in lines(actions))
        append(work / "calls.log", f"reconciled {call.key} {found} {os.getpid()} {time.time():.3f}")
        return Reconciliation(found, {"charged": call.args[0]} if found else None)

    @registry.tool("charge", reconciler=reconciler)
    def charge(key: str, n: int) -> dict[str, int]:
        append(work / "calls.log", f"started {key} {os.getpid()} {time.time():.3f}")
        time.sleep(SLOW_CALL)  # a slow provider: a worker is often inside the call when another looks
        append(actions, f"effect {key} {os.getpid()} {time.time():.3f}")
        faults.hit("tool_started")
        return {"charged": n}

    def execute(run_id: str, name: str) -> str:
        token = uuid.uuid4().hex
        append(actions, f"exec {run_id}/{name} {token}")
        faults.hit("inside_step")
        return token

    def step(ctx: RunContext, name: str) -> str:
        if not ctx.replaying:
            faults.hit("before_step")
        return ctx.step(name, execute, ctx.run_id, name)

    def keep(ctx: RunContext, tally: Tally, name: str, *new: Any) -> Tally:
        """Stage the next Tally (from the previous one) and commit it with a step of its own."""
        tally = Tally(count=tally.count + 1, items=[*tally.items, *new])
        ctx.set_state(tally)
        step(ctx, name)
        return tally

    @registry.workflow("leaf", version=1, state=Tally)
    def leaf(ctx: RunContext, n: int) -> dict[str, Any]:
        tally = ctx.state(Tally) or Tally()
        first = step(ctx, "c0")
        tally = keep(ctx, tally, "ck0", first)
        receipt = ctx.call_tool(charge, n)
        tally = keep(ctx, tally, "ck1", receipt)
        return tally.model_dump()

    @registry.workflow("shapes", version=1, state=Tally)
    def shapes(ctx: RunContext, n: int) -> dict[str, Any]:
        tally = ctx.state(Tally) or Tally()
        first = step(ctx, "s0")
        tally = keep(ctx, tally, "k0", first)
        ctx.sleep("nap", NAP)
        second = step(ctx, "s1")
        tally = keep(ctx, tally, "k1", second)
        go = ctx.wait_for_event("go")  # sent by the test, before or after the run waits
        ping = ctx.wait_for_event("ping", timeout=PING_TIMEOUT, default="no ping")
        kid = ctx.child(leaf, child_id(ctx.run_id), n)
        tally = keep(ctx, tally, "k2", go, ping, kid)
        return tally.model_dump()

    return registry


def shapes_worker(
    url: str, work: Path, owner: str, point: str | None, n: int, idle_exit: float | None
) -> None:
    """A worker process: drain runnable runs (until killed, or idle for ``idle_exit`` s)."""
    log_to(work / f"{owner}.log")
    append(work / "calls.log", f"worker {owner} {os.getpid()} {time.time():.3f}")
    faults = Faults(point, n)
    db = Database(url)
    faults.watch(db)
    engine = Engine(
        db, shapes_registry(work, faults), state_store=SQLWorkingStateStore(db), owner=owner, lease=LEASE
    )
    Worker(engine, poll=0.01, max_poll=0.05).run(idle_exit=idle_exit)
