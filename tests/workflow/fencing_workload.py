"""The workload of the child-fencing tests: a parent, its child, and a tool that does not deduplicate.

Each worker process is an *actor* with a name (``A``, ``B``, ``C``, ``W``...; also its
engine's owner) and may be told what to do at named points of the workload:

* ``before_child``: in the parent, after its first step committed, before ``ctx.child``;
* ``in:k0``: inside the child's first step (the child run exists and is held);
* ``tool:before`` / ``tool:after``: inside the child's tool, before / after its effect.

Actions: ``stop`` (SIGSTOP itself, as a GC pause or a frozen VM would; the test sends
SIGCONT), ``kill`` (SIGKILL itself) and ``block`` (wait, heartbeating, until the test
creates the file ``release``). A process stops only between two database transactions
of its threads: a heartbeat frozen mid-transaction would hold SQLite's write lock (or a
row lock) for the whole pause, which is not what these tests are about.

Everything an actor does outside the database goes to one append-only file, in order:
``<actor> exec <run>/<step> <token>``, ``<actor> effect <key> -``, ``<actor> stop <point> -``...
The value a step returns is ``<actor>:<token>``, so the journal tells who ran it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from statekeep.db import Database
from statekeep.workflow import Engine, Registry, RunContext, Worker

from .conftest import append, lines

LEASE = 1.0
PARENT = "parent-1"


def child_of(run_id: str) -> str:
    """The id a parent gives its child."""
    return f"{run_id}.kid"


CHILD = child_of(PARENT)


@dataclass(frozen=True)
class Action:
    """One line of the actions file."""

    actor: str
    kind: str
    what: str
    token: str


def actions(work: Path) -> list[Action]:
    return [Action(*line.split()) for line in lines(work / "actions.log")]


class _Quiet:
    """Lets this process stop itself only when none of its threads is inside a transaction."""

    def __init__(self) -> None:
        self.gate = threading.Lock()  # held while stopped: a new transaction waits before BEGIN
        self.idle = threading.Condition()
        self.active = 0

    def watch(self, db: Database) -> None:
        sa.event.listen(db.engine, "begin", self._begin, insert=True)  # before SQLite's BEGIN IMMEDIATE
        sa.event.listen(db.engine, "commit", self._end)
        sa.event.listen(db.engine, "rollback", self._end)

    def _begin(self, conn: Any) -> None:
        with self.gate, self.idle:
            self.active += 1

    def _end(self, conn: Any) -> None:
        with self.idle:
            self.active = max(0, self.active - 1)
            self.idle.notify_all()

    def stop(self) -> None:
        with self.gate:
            with self.idle:
                self.idle.wait_for(lambda: self.active == 0, timeout=10)
            os.kill(os.getpid(), signal.SIGSTOP)


@dataclass
class Actor:
    """This process: its name and what it does at each named point (each fires once)."""

    name: str = "test"
    plan: dict[str, str] = field(default_factory=dict)
    work: Path = Path("/nonexistent")
    quiet: _Quiet = field(default_factory=_Quiet)

    def note(self, kind: str, what: str, token: str = "-") -> None:
        append(self.work / "actions.log", f"{self.name} {kind} {what} {token}")

    def at(self, point: str) -> None:
        action = self.plan.pop(point, None)
        if action is None:
            return
        self.note(action, point)
        if action == "stop":
            self.quiet.stop()
        elif action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "block":
            deadline = time.monotonic() + 60
            while not (self.work / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.01)


ME = Actor()


def build(*, parent: bool = True) -> Registry:
    """The child workflow (and, unless ``parent`` is False, the parent that runs it)."""
    registry = Registry()

    def mark(run_id: str, name: str) -> str:
        token = f"{ME.name}:{uuid.uuid4().hex[:12]}"
        ME.note("exec", f"{run_id}/{name}", token)
        ME.at(f"in:{name}")
        return token

    @registry.tool("send")  # no reconciler: the provider neither deduplicates on the key nor can be asked
    def send(key: str, n: int) -> dict[str, str]:
        ME.at("tool:before")
        ME.note("effect", key)
        ME.at("tool:after")
        return {"sent": key}

    @registry.workflow("kid", version=1)
    def kid(ctx: RunContext, gated: bool) -> list[Any]:
        first = ctx.step("k0", mark, ctx.run_id, "k0")
        go = ctx.wait_for_event("go") if gated else None  # the test decides when the child goes on
        receipt = ctx.call_tool(send, 7)
        return [first, go, receipt["sent"]]

    if parent:

        @registry.workflow("parent", version=1)
        def parent_workflow(ctx: RunContext, gated: bool) -> list[Any]:
            ctx.step("p0", mark, ctx.run_id, "p0")
            ME.at("before_child")
            out = ctx.child(kid, child_of(ctx.run_id), gated)
            ctx.step("p1", mark, ctx.run_id, "p1")
            return out

    return registry


def _become(name: str, url: str, work: Path, plan: dict[str, str], *, parent: bool = True) -> Engine:
    ME.name, ME.work, ME.plan = name, work, dict(plan)
    logging.basicConfig(
        filename=work / f"{name}.log",
        level=logging.WARNING,
        force=True,
        format="%(levelname)s %(name)s: %(message)s",
    )
    db = Database(url)
    ME.quiet.watch(db)
    return Engine(db, build(parent=parent), owner=name, lease=LEASE)


def worker(
    name: str,
    url: str,
    work: Path,
    plan: dict[str, str],
    *,
    once: bool = False,
    idle_exit: float = 1.0,
    parent: bool = True,
    poll: float = 0.02,
) -> None:
    """A worker process: one claim (``once``) or a loop until idle for ``idle_exit`` seconds.

    ``parent=False``: its registry has only the child workflow, so it claims only children.
    """
    w = Worker(_become(name, url, work, plan, parent=parent), poll=poll, max_poll=5 * poll)
    if once:
        w.run_once()
    else:
        w.run(idle_exit=idle_exit)


def resume(name: str, url: str, work: Path, run_id: str) -> None:
    """A process that resumes ``run_id`` inline (an explicit takeover: ``Engine.resume``)."""
    _become(name, url, work, {}).resume(run_id)


def refused(log: Path) -> bool:
    """Whether a process's log says one of its writes was refused by the fence (``LeaseLostError``)."""
    text = log.read_text() if log.exists() else ""
    return any(sign in text for sign in ("lease lost", "fenced", "LeaseLostError", "is stale"))
