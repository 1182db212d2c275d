"""I1, the LangGraph saver: per-step overhead and storage next to LangGraph's own savers.

``python -m bench.integrations`` (PYTHONPATH=src) runs a graph whose one node appends a
400-character message to ``messages`` (``add_messages``) at every step, for ``--steps``
steps (default 1,000) in one invocation, with ``durability="sync"`` (each checkpoint is
written before the next step starts). In the same run and on the same machine:

* the graph without a checkpointer (the floor), then with ``SqliteSaver`` and
  ``StatekeepSaver`` on SQLite, ``PostgresSaver`` and ``StatekeepSaver`` on PostgreSQL;
* per-step overhead: (time with the saver - time of the floor of the same trial) / steps;
  the trials are interleaved (each trial runs every configuration once, in a rotated order)
  so that a slow spell of a shared machine hits every saver alike; the medians, minima and
  maxima over ``--trials`` are reported, and the ratio of the medians;
* bytes stored after the run: the SQLite file's growth, or the total size of the saver's
  PostgreSQL tables (indexes and TOAST included).

Results go to ``bench/results/integrations.json``.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypedDict

import sqlalchemy as sa
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from bench.workflow import postgres
from statekeep.integrations.langgraph import StatekeepSaver

MESSAGE = "m" * 400


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    n: int


def graph(checkpointer: Any, steps: int) -> Any:
    def step(state: State) -> dict[str, Any]:
        return {"messages": [AIMessage(MESSAGE)], "n": state["n"] + 1}

    g = StateGraph(State)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["n"] < steps else END)
    return g.compile(checkpointer=checkpointer)


def run(checkpointer: Any, steps: int) -> float:
    """Seconds for one invocation of ``steps`` steps on a fresh thread."""
    g = graph(checkpointer, steps)
    config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": steps + 10}
    start = time.perf_counter()
    # (durability applies only with a checkpointer; LangGraph refuses it without one)
    extra: dict[str, Any] = {} if checkpointer is None else {"durability": "sync"}
    out = g.invoke({"messages": [HumanMessage("go")], "n": 0}, config, **extra)
    elapsed = time.perf_counter() - start
    assert len(out["messages"]) == steps + 1
    return elapsed


SIZE = sa.text("SELECT pg_total_relation_size(CAST(:t AS regclass))")
Make = Callable[[], tuple[Any, Callable[[], int]]]


def pg_bytes(url: str, tables: list[str]) -> int:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        total = sum(
            int(
                conn.execute(
                    sa.text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": t}
                ).scalar_one()
            )
            for t in tables
        )
    engine.dispose()
    return total


@contextmanager
def fresh_pg(admin_url: str) -> Iterator[str]:
    import psycopg

    admin = sa.make_url(admin_url)
    name = f"bench_{uuid.uuid4().hex[:8]}"
    libpq = admin.set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield admin.set(database=name).render_as_string(False)


def measure_once(make: Make, steps: int) -> tuple[float, int]:
    """Seconds of one run on a fresh saver, and the bytes it stored."""
    saver, size = make()
    try:
        return run(saver, steps), size()
    finally:
        close = getattr(saver, "close", None) or getattr(getattr(saver, "conn", None), "close", None)
        if close is not None:
            close()


def interleaved(makers: dict[str, Make], steps: int, trials: int) -> dict[str, dict[str, list[float]]]:
    """Every configuration once per trial, the order rotated from trial to trial."""
    names = list(makers)
    out: dict[str, dict[str, list[float]]] = {n: {"seconds": [], "bytes": []} for n in names}
    for trial in range(trials):
        order = names[trial % len(names) :] + names[: trial % len(names)]
        for name in order:
            seconds, size = measure_once(makers[name], steps)
            out[name]["seconds"].append(seconds)
            out[name]["bytes"].append(size)
            print(f"  trial {trial + 1}  {name:28} {seconds:8.2f} s   {size / 1e6:9.2f} MB", flush=True)
    return out


def summarize(raw: dict[str, dict[str, list[float]]], steps: int) -> dict[str, Any]:
    """Per saver: median, min and max per-step overhead over the floor of the same trial; bytes."""
    floors = raw.pop("no checkpointer")["seconds"]
    out: dict[str, Any] = {"floor_seconds_median": statistics.median(floors)}
    for name, m in raw.items():
        overheads = [(s - f) / steps * 1000 for s, f in zip(m["seconds"], floors, strict=True)]
        out[name] = {
            "seconds_median": round(statistics.median(m["seconds"]), 3),
            "overhead_ms_per_step": round(statistics.median(overheads), 3),
            "overhead_ms_per_step_min": round(min(overheads), 3),
            "overhead_ms_per_step_max": round(max(overheads), 3),
            "overheads_ms_per_step": [round(o, 3) for o in overheads],
            "bytes": int(statistics.median(m["bytes"])),
            "bytes_per_step": round(statistics.median(m["bytes"]) / steps),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args(argv)
    steps, trials = args.steps, args.trials
    results: dict[str, Any] = {"steps": steps, "trials": trials, "message_chars": len(MESSAGE)}
    with tempfile.TemporaryDirectory() as tmp, postgres() as pg:
        print(f"{steps} steps, one 400-character message each (durability=sync), {trials} trials")

        def sqlite_saver() -> tuple[Any, Callable[[], int]]:
            from langgraph.checkpoint.sqlite import SqliteSaver

            path = Path(tmp) / f"lg-{uuid.uuid4().hex}.db"
            return SqliteSaver(sqlite3.connect(path, check_same_thread=False)), lambda: _file_bytes(path)

        def statekeep_sqlite() -> tuple[Any, Callable[[], int]]:
            path = Path(tmp) / f"sk-{uuid.uuid4().hex}.db"
            return StatekeepSaver(f"sqlite:///{path}"), lambda: _file_bytes(path)

        def postgres_saver() -> tuple[Any, Callable[[], int]]:
            from langgraph.checkpoint.postgres import PostgresSaver
            from psycopg import Connection
            from psycopg.rows import dict_row

            with fresh_pg(pg) as url:
                libpq = sa.make_url(url).set(drivername="postgresql").render_as_string(False)
                conn = Connection.connect(libpq, autocommit=True, prepare_threshold=0, row_factory=dict_row)
                saver = PostgresSaver(conn)
                saver.setup()
                tables = ["checkpoints", "checkpoint_blobs", "checkpoint_writes"]
                return saver, lambda: pg_bytes(url, tables)

        def statekeep_pg() -> tuple[Any, Callable[[], int]]:
            with fresh_pg(pg) as url:
                tables = [f"statekeep_langgraph.{t}" for t in ("checkpoints", "blobs", "writes")]
                return StatekeepSaver(url), lambda: pg_bytes(url, tables)

        savers: dict[str, Make] = {
            "no checkpointer": lambda: (None, lambda: 0),
            "sqlite/SqliteSaver": sqlite_saver,
            "sqlite/StatekeepSaver": statekeep_sqlite,
            "postgresql/PostgresSaver": postgres_saver,
            "postgresql/StatekeepSaver": statekeep_pg,
        }
        measured = summarize(interleaved(savers, steps, trials), steps)
    results["floor_seconds"] = measured.pop("floor_seconds_median")
    for backend, theirs in (("sqlite", "SqliteSaver"), ("postgresql", "PostgresSaver")):
        ours, ref = measured[f"{backend}/StatekeepSaver"], measured[f"{backend}/{theirs}"]
        results[f"{backend}_overhead_ratio"] = round(
            ours["overhead_ms_per_step"] / ref["overhead_ms_per_step"], 3
        )
        results[f"{backend}_bytes_ratio"] = round(ours["bytes"] / ref["bytes"], 4)
    results["savers"] = measured
    results["measured_at"] = datetime.now(UTC).isoformat()
    print("\nper-step overhead (ms) and bytes stored:")
    for name, m in measured.items():
        print(
            f"  {name:28} {m['overhead_ms_per_step']:8.3f} ms/step"
            f" (min {m['overhead_ms_per_step_min']:.3f}, max {m['overhead_ms_per_step_max']:.3f})"
            f"   {m['bytes'] / 1e6:9.2f} MB"
        )
    for key in (
        "sqlite_overhead_ratio",
        "sqlite_bytes_ratio",
        "postgresql_overhead_ratio",
        "postgresql_bytes_ratio",
    ):
        print(f"  {key}: {results[key]}")
    out = Path(__file__).parent / "results" / "integrations.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _file_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


if __name__ == "__main__":
    raise SystemExit(main())
