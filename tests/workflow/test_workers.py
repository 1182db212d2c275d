"""Many workers: leases, SKIP LOCKED / immediate-transaction claims, takeover and fencing."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from statekeep.db import Database
from statekeep.errors import InvalidInputError, LeaseLostError
from statekeep.workflow import Engine, Registry, Run, RunContext, RunStatus, Worker

from .conftest import EngineFactory, append, fork, lines, wait

RUNS, STEPS = 200, 3


def drain_registry(effects: Path) -> Registry:
    registry = Registry()

    @registry.workflow("drain", version=1)
    def drain(ctx: RunContext) -> int:
        for s in range(STEPS):

            def effect(s: int = s) -> None:
                append(effects, f"{ctx.run_id} {s} {os.getpid()}")

            ctx.step(f"s{s}", effect)
        return STEPS

    return registry


@pytest.mark.slow
def test_four_workers_drain_200_runs_executing_every_step_exactly_once(
    database_url: str, tmp_path: Path
) -> None:
    """4 worker processes share the runs: every run finishes and every step ran exactly once."""
    effects = tmp_path / "effects"
    setup = Engine(Database(database_url), drain_registry(effects))
    drain = setup.registry.get("drain", 1)
    for i in range(RUNS):
        setup.start(drain, f"run-{i}")
    setup.store.close()

    def worker() -> None:
        engine = Engine(Database(database_url), drain_registry(effects), lease=5)
        Worker(engine, poll=0.01, max_poll=0.05).run(idle_exit=1.0)

    pids = [fork(worker) for _ in range(4)]
    assert [wait(pid, timeout=180) for pid in pids] == [0, 0, 0, 0]
    runs = setup.store.list_runs()
    assert len(runs) == RUNS
    assert {r.status for r in runs} == {RunStatus.COMPLETED}
    executed = Counter(" ".join(line.split()[:2]) for line in lines(effects))
    assert len(executed) == RUNS * STEPS
    assert set(executed.values()) == {1}
    workers_used = {line.split()[2] for line in lines(effects)}
    assert len(workers_used) >= 2, "the runs were shared between workers"
    setup.store.close()


def test_a_frozen_worker_is_taken_over_and_then_fenced(database_url: str, tmp_path: Path) -> None:
    """A SIGSTOPped worker loses its lease; another finishes the run; the first's writes are refused later."""
    effects, outcome = tmp_path / "effects", tmp_path / "outcome"
    registry = Registry()

    def slow_step(marker: str) -> str:
        append(effects, f"{marker} {os.getpid()}")
        time.sleep(0.6 if marker == "first" else 0)
        return f"{marker} {os.getpid()}"

    @registry.workflow("slow", version=1)
    def slow(ctx: RunContext) -> str:
        return ctx.step("work", slow_step, "first" if not lines(effects) else "second")

    setup = Engine(Database(database_url), registry)
    setup.start(slow, "r")
    setup.store.close()

    def frozen() -> None:
        engine = Engine(Database(database_url), registry, lease=0.5)
        (run,) = engine.store.claim(engine.owner, engine.lease, 1, registry.runnable())
        try:
            engine.execute(run)
            append(outcome, "committed")
        except LeaseLostError as exc:
            append(outcome, f"fenced epoch {exc.epoch}")

    pid = fork(frozen)
    while not lines(effects):
        time.sleep(0.002)
    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.7)  # past the 0.5 s lease
    taker = Engine(Database(database_url), registry, lease=5)
    assert Worker(taker, poll=0.01).run_once() == 1
    done = taker.store.get("r")
    assert (done.status, done.epoch) == (RunStatus.COMPLETED, 2)
    os.kill(pid, signal.SIGCONT)
    assert wait(pid) == 0
    assert lines(outcome) == ["fenced epoch 1"]
    assert taker.store.steps("r")[0].value.startswith("second")
    assert taker.store.get("r").output.startswith("second")
    taker.store.close()


def test_idle_worker_backs_off_and_stops_on_request(make_engine: EngineFactory) -> None:
    """An idle worker's poll interval doubles up to max_poll, so it issues only a handful of claims."""
    engine = make_engine(Registry(), lease=1)
    claims = [0]
    original = engine.store.claim

    def counting(*args: Any, **kw: Any) -> list[Run]:
        claims[0] += 1
        return original(*args, **kw)

    engine.store.claim = counting  # type: ignore[method-assign]
    stop = threading.Event()
    thread = threading.Thread(target=Worker(engine, poll=0.01, max_poll=0.16).run, kwargs={"stop": stop})
    thread.start()
    time.sleep(1.0)
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert 4 <= claims[0] <= 12  # 10+20+40+80+160 ms, then every 160 ms


def test_worker_rejects_bad_settings(make_engine: EngineFactory) -> None:
    """Non-positive poll intervals or batch sizes raise InvalidInputError."""
    engine = make_engine(Registry())
    with pytest.raises(InvalidInputError):
        Worker(engine, poll=0)
    with pytest.raises(InvalidInputError):
        Worker(engine, batch=0)
    with pytest.raises(InvalidInputError):
        make_engine(Registry(), lease=0)


def test_unique_owner_ids(make_engine: EngineFactory) -> None:
    """Each engine gets its own lease owner id unless one is given."""
    a, b = make_engine(Registry()), make_engine(Registry(), owner=f"me-{uuid.uuid4().hex}")
    assert a.owner != b.owner
    assert b.owner.startswith("me-")
