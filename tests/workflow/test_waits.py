"""Durable waits across processes, event timeouts, and retention through the engine.

The store's own wait, event and retention invariants are in the conformance suite.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from statekeep.db import Database
from statekeep.errors import InvalidInputError
from statekeep.workflow import Engine, Registry, RunContext, RunStatus, Worker
from statekeep.working import SQLWorkingStateStore, WorkingState

from .conftest import EngineFactory, append, fork, lines, wait


def waits_registry(effects: Path) -> Registry:
    registry = Registry()

    @registry.workflow("nap", version=1)
    def nap(ctx: RunContext, seconds: float) -> str:
        ctx.step("before", lambda: append(effects, f"{ctx.run_id} before"))
        ctx.sleep("nap", seconds)
        ctx.step("after", lambda: append(effects, f"{ctx.run_id} after"))
        return "rested"

    @registry.workflow("signal", version=1)
    def wait_signal(ctx: RunContext, timeout: float | None) -> Any:
        ctx.step("before", lambda: append(effects, f"{ctx.run_id} before"))
        payload = ctx.wait_for_event("go", timeout=timeout, default="timed out")
        ctx.step("after", lambda: append(effects, f"{ctx.run_id} after"))
        return payload

    return registry


def test_an_event_without_a_name_or_with_a_non_json_payload_is_refused(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    """send_event checks its input: a non-JSON payload or an empty name raises InvalidInputError."""
    engine = make_engine(waits_registry(tmp_path / "effects"))
    engine.start(engine.registry.get("signal", 1), "live", None)
    with pytest.raises(InvalidInputError, match="payload"):
        engine.store.send_event("live", "go", {1})
    with pytest.raises(InvalidInputError, match="name"):
        engine.store.send_event("live", "", 1)


def test_an_event_wait_times_out_with_the_default(make_engine: EngineFactory, tmp_path: Path) -> None:
    """With a timeout and no event, the run continues with the default once the timeout passes."""
    engine = make_engine(waits_registry(tmp_path / "effects"))
    assert engine.run(engine.registry.get("signal", 1), "r", 1.5).status is RunStatus.WAITING_FOR_EVENT
    time.sleep(1.55)
    assert engine.resume("r").output == "timed out"


def test_invariant_4_sleep_and_event_waits_survive_a_restart_of_every_worker(
    database_url: str, tmp_path: Path
) -> None:
    """Two workers park a sleeping and an event-waiting run, both are SIGKILLed; fresh workers finish both."""
    effects = tmp_path / "effects"

    def worker() -> None:
        engine = Engine(Database(database_url), waits_registry(effects), lease=1)
        Worker(engine, poll=0.02, max_poll=0.1).run()

    first = [fork(worker), fork(worker)]
    setup = Engine(Database(database_url), waits_registry(effects))
    setup.start(setup.registry.get("nap", 1), "sleeper", 3.0)  # parks long before it is due
    setup.start(setup.registry.get("signal", 1), "listener", None)
    deadline = time.monotonic() + 20
    while {setup.store.get(r).status for r in ("sleeper", "listener")} != {
        RunStatus.SLEEPING,
        RunStatus.WAITING_FOR_EVENT,
    }:
        assert time.monotonic() < deadline, "workers did not park the runs"
        time.sleep(0.02)
    for pid in first:
        os.kill(pid, signal.SIGKILL)
        assert wait(pid) == -signal.SIGKILL
    setup.store.send_event("listener", "go", "hello")
    second = [fork(worker), fork(worker)]
    while {setup.store.get(r).status for r in ("sleeper", "listener")} != {RunStatus.COMPLETED}:
        assert time.monotonic() < deadline + 10, "fresh workers did not finish the runs"
        time.sleep(0.05)
    for pid in second:
        os.kill(pid, signal.SIGTERM)
        wait(pid)
    assert setup.store.get("listener").output == "hello"
    assert sorted(lines(effects)) == ["listener after", "listener before", "sleeper after", "sleeper before"]
    setup.store.close()


def test_retention_needs_an_age_or_a_count(make_engine: EngineFactory, tmp_path: Path) -> None:
    """purge() with neither older_than nor keep_last raises InvalidInputError instead of deleting all."""
    engine = make_engine(waits_registry(tmp_path / "effects"))
    engine.run(engine.registry.get("nap", 1), "done", 0)
    with pytest.raises(InvalidInputError):
        engine.store.purge()
    assert [r.run_id for r in engine.store.list_runs()] == ["done"]


class Tally(WorkingState):
    state_schema = "tally"
    state_version = 1
    n: int = 0


@pytest.mark.parametrize("where", ["shared", "apart"])
def test_engine_purge_deletes_the_working_state_of_purged_runs_too(
    database_url: str, tmp_path: Path, where: str
) -> None:
    """Retention through the engine leaves no state version of a purged run, whichever database holds it."""
    registry = waits_registry(tmp_path / "effects")

    @registry.workflow("count", version=1)
    def count(ctx: RunContext, n: int) -> int:
        ctx.set_state(Tally(n=n))
        return ctx.step("done", lambda: n)

    db = Database(database_url)
    states = SQLWorkingStateStore(db if where == "shared" else f"sqlite:///{tmp_path / 'states.db'}")
    engine = Engine(db, registry, state_store=states)
    try:
        for i in range(3):
            engine.run(count, f"run-{i}", i)
        engine.run(registry.get("nap", 1), "sleeping", 3600)
        assert engine.purge(keep_last=1) == 2
        assert {r.run_id for r in engine.store.list_runs()} == {"run-2", "sleeping"}
        assert states.versions("run-0") == states.versions("run-1") == []
        assert states.load("run-2", Tally).n == 2
        assert engine.purge(keep_last=1) == 0
    finally:
        db.dispose()
        states.db.dispose()
