"""W1b, the write path of one step: a workflow step and a runtime step next to their floors.

``python -m bench.steps`` (PYTHONPATH=src) measures, on SQLite and PostgreSQL, in one
database per backend and interleaved so that each sees the same machine load:

* **workflow step**: ``ctx.set_state(1 KB state)`` + ``ctx.step(...)`` returning a
  400-character message: its journal entry, its state version and the run's
  checkpoint. Floor: one raw transaction inserting a step row and a version row
  and updating a run row.
* **runtime step**: the runtime's observe step (``AgentSteps.observe``): it reads
  the agent's state, appends the tool-result event to the context (session
  counter + event row), and commits the state version and the journal entry. With
  the stores on one database these commit in one transaction ("joined"); the
  "separate" line opens the context store on its own connection pool, so the event
  commits first in a transaction of its own (how a step is written when the stores
  live in different databases). Floor: one raw transaction that updates a session
  counter, inserts an event row, a version row and a step row, and updates a run row.

Each figure is the median over ``--trials`` trials of the per-step median of
``--steps`` steps (min and max of the trial medians beside it). Results go to
``bench/results/steps.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.workflow import MESSAGE, BenchState, _state, postgres
from statekeep.context import SQLContextStore
from statekeep.db import Database
from statekeep.models import ModelResponse, ScriptedModel
from statekeep.runtime.agent import AgentState
from statekeep.runtime.steps import AgentSteps
from statekeep.workflow import Engine, Registry, RunContext
from statekeep.working import SQLWorkingStateStore

RESULTS = Path(__file__).parent / "results" / "steps.json"

meta = sa.MetaData()
f_sessions = sa.Table(
    "bench_f_sessions",
    meta,
    sa.Column("sid", sa.String(64), primary_key=True),
    sa.Column("last", sa.BigInteger),
)
f_events = sa.Table(
    "bench_f_events",
    meta,
    sa.Column("sid", sa.String(64), primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("payload", sa.Text),
    sa.Column("tokens", sa.Integer),
    sa.Column("key", sa.String(255)),
)
f_versions = sa.Table(
    "bench_f_versions",
    meta,
    sa.Column("rid", sa.String(64), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("state", sa.Text),
)
f_steps = sa.Table(
    "bench_f_steps",
    meta,
    sa.Column("rid", sa.String(64), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("name", sa.String(255)),
    sa.Column("output", sa.Text),
    sa.Column("finished_at", sa.DateTime(timezone=True)),
)
f_runs = sa.Table(
    "bench_f_runs",
    meta,
    sa.Column("rid", sa.String(64), primary_key=True),
    sa.Column("last_seq", sa.Integer),
    sa.Column("version", sa.Integer),
)


def floors(db: Database) -> tuple[Callable[[int], float], Callable[[int], float]]:
    """(workflow floor, runtime floor): each one raw transaction writing the same rows as the step."""
    meta.drop_all(db.engine)
    meta.create_all(db.engine)
    with db.begin() as conn:
        conn.execute(f_sessions.insert(), {"sid": "s", "last": 0})
        conn.execute(f_runs.insert(), [{"rid": "w", "last_seq": 0}, {"rid": "r", "last_seq": 0}])
    blob = _state(0).model_dump_json()
    bump = (
        f_sessions.update()
        .where(f_sessions.c.sid == "s")
        .values(last=f_sessions.c.last + 1)
        .returning(f_sessions.c.last)
    )
    checkpoint = f_runs.update().where(f_runs.c.rid == sa.bindparam("r"))
    checkpoint = checkpoint.values(last_seq=sa.bindparam("n"), version=sa.bindparam("n"))
    # every statement built once, as statekeep's hot paths are: no per-call statement building
    add_version, add_step, add_event = f_versions.insert(), f_steps.insert(), f_events.insert()

    def journal(conn: sa.Connection, rid: str, i: int) -> None:
        conn.execute(add_version, {"rid": rid, "version": i, "state": blob})
        row = {
            "rid": rid,
            "seq": i,
            "name": "turn",
            "output": json.dumps(MESSAGE),
            "finished_at": datetime.now(UTC),
        }
        conn.execute(add_step, row)
        conn.execute(checkpoint, {"r": rid, "n": i})

    counter = itertools.count(1)  # trials go on numbering: every row is new, as the steps' rows are

    def workflow(_: int) -> float:
        i = next(counter)
        t0 = time.perf_counter()
        with db.begin() as conn:
            journal(conn, "w", i)
        return time.perf_counter() - t0

    def runtime(_: int) -> float:
        i = next(counter)
        t0 = time.perf_counter()
        with db.begin() as conn:
            seq = conn.execute(bump).scalar_one()
            event = {"sid": "s", "seq": seq, "payload": MESSAGE, "tokens": 100, "key": f"k{i}"}
            conn.execute(add_event, event)
            journal(conn, "r", i)
        return time.perf_counter() - t0

    return workflow, runtime


def _registry(
    steps: AgentSteps, n: int, out: dict[str, list[float]], floor: Callable[[int], float]
) -> Registry:
    registry = Registry()

    @registry.workflow("wstep", version=1, state=BenchState)
    def wstep(ctx: RunContext) -> None:
        for i in range(n):
            out["floor"].append(floor(i))
            t0 = time.perf_counter()
            ctx.set_state(_state(i))
            ctx.step("turn", lambda: MESSAGE)
            out["step"].append(time.perf_counter() - t0)

    @registry.workflow("rstep", version=1, state=AgentState)
    def rstep(ctx: RunContext, owner: str, session: str) -> None:
        ctx.step(
            "begin", partial(steps.begin, ctx, AgentState(owner=owner, session_id=session, task="bench"))
        )
        call = {"id": "c", "name": "lookup", "arguments": {}}
        for i in range(n):
            out["floor"].append(floor(i))
            name = f"observe-{i}"
            t0 = time.perf_counter()
            ctx.step(name, partial(steps.observe, ctx, call, {"text": MESSAGE[:380]}, name))
            out["step"].append(time.perf_counter() - t0)

    return registry


def _summary(medians: list[float], floor_medians: list[float]) -> dict[str, float]:
    med, fmed = statistics.median(medians), statistics.median(floor_medians)
    return {
        "median_ms": med * 1e3,
        "min_ms": min(medians) * 1e3,
        "max_ms": max(medians) * 1e3,
        "floor_median_ms": fmed * 1e3,
        "ratio_to_floor": med / fmed,
    }


def measure(url: str, n: int, trials: int) -> dict[str, Any]:
    db = Database(url)
    states = SQLWorkingStateStore(db)
    joined = SQLContextStore(db)
    apart = SQLContextStore(Database(url))  # the same tables, another pool: no shared transaction
    joined.counter.count("")
    wfloor, rfloor = floors(db)
    kinds: dict[str, tuple[SQLContextStore, Callable[[int], float], str]] = {
        "workflow_step": (joined, wfloor, "wstep"),
        "runtime_step_joined": (joined, rfloor, "rstep"),
        "runtime_step_separate": (apart, rfloor, "rstep"),
    }
    results: dict[str, Any] = {}
    for kind, (context, floor, workflow) in kinds.items():
        medians: list[float] = []
        floor_medians: list[float] = []
        for trial in range(trials):
            out: dict[str, list[float]] = {"step": [], "floor": []}
            steps = AgentSteps(context, ScriptedModel([ModelResponse("unused")]), lambda: None)  # type: ignore[arg-type,return-value]
            engine = Engine(db, _registry(steps, n, out, floor), state_store=states)
            run_id = f"{kind}-{trial}"
            args = () if workflow == "wstep" else ("bench-owner", f"session-{run_id}")
            engine.run(engine.registry.get(workflow, 1), run_id, *args)
            medians.append(statistics.median(out["step"]))
            floor_medians.append(statistics.median(out["floor"]))
        results[kind] = _summary(medians, floor_medians)
    db.dispose()
    apart.close()
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.steps", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="steps per trial")
    parser.add_argument("--trials", type=int, default=5, help="trials per figure")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, postgres() as pg:
        for name, url in {"sqlite": f"sqlite:///{tmp}/steps.db", "postgresql": pg}.items():
            results[name] = measure(url, args.steps, args.trials)
            print(f"\n{name}")
            for kind, values in results[name].items():
                print(f"  {kind:24s} " + "  ".join(f"{k} {v:.3f}" for k, v in values.items()))
    results["cpu_count"] = os.cpu_count()
    results["data_folder"] = tempfile.gettempdir()  # TMPDIR=/dev/shm: memory-backed, no fsync
    results["steps"], results["trials"] = args.steps, args.trials
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
