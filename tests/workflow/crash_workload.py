"""The workload of the crash tests, run in forked child processes that SIGKILL themselves.

Fault points (each fires only on new progress, never during replay):

* ``before_step``: just before the workflow asks for a step;
* ``inside_step``: inside a step function, after its execution was logged;
* ``tool_started``: inside a tool, after its effect, before the ledger marks it completed;
* ``before_commit``: a step's completion is written but its transaction not yet committed.

Effects are counted outside the database: append-only files (O_APPEND), one line each.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from statekeep.db import Database
from statekeep.workflow import Engine, LedgerEntry, Reconciliation, Registry, RunContext

from .conftest import append, lines
from .crash_shapes import POINTS, Faults

__all__ = ["POINTS", "Faults", "build", "child"]

STEPS = 4
#: New runs a child killed at a fault point starts: every point occurs at least
#: this often in them, so a child asked to die at its n-th (n <= 3) always does.
FRESH_RUNS = 5
#: New runs a child killed at a random time may start: more than it can finish
#: before the kill, so the workload is never used up, however fast the machine.
RANDOM_RUNS = 1000


def build(work: Path, faults: Faults, *, reconcile: bool) -> Registry:
    """The registry of the crash workload: 4 steps and one charge per run."""
    registry = Registry()
    effects, execs = work / "effects.log", work / "execs.log"

    def reconciler(call: LedgerEntry) -> Reconciliation:
        found = call.key in lines(effects)
        return Reconciliation(found, {"charged": call.args[0]} if found else None)

    @registry.tool("charge", reconciler=reconciler if reconcile else None)
    def charge(key: str, run: int) -> dict[str, int]:
        append(effects, key)
        faults.hit("tool_started")
        return {"charged": run}

    def work_step(run: int, seq: int) -> str:
        token = uuid.uuid4().hex
        append(execs, f"run-{run} {seq} {token}")
        faults.hit("inside_step")
        return token

    @registry.workflow("crashy", version=1)
    def crashy(ctx: RunContext, run: int) -> str:
        for s in range(STEPS):
            if not ctx.replaying:
                faults.hit("before_step")
            ctx.step(f"s{s}", work_step, run, ctx.seq + 1)
            if s == 1:
                ctx.call_tool(charge, run)
        return "done"

    return registry


def child(url: str, work: Path, point: str | None, n: int, reconcile: bool, new_runs: int) -> None:
    """Resume every unfinished run, then start ``new_runs`` new ones; die at the chosen fault."""
    faults = Faults(point, n)
    db = Database(url)
    faults.watch(db)

    engine = Engine(db, build(work, faults, reconcile=reconcile))
    crashy = engine.registry.get("crashy", 1)
    known = engine.store.list_runs(limit=1_000_000)
    for run in known:
        if not run.status.finished:
            engine.run(crashy, run.run_id, int(run.run_id.removeprefix("run-")))
    for i in range(len(known), len(known) + new_runs):
        engine.run(crashy, f"run-{i}", i)
