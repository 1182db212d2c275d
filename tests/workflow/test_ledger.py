"""The tool-call ledger's input check and its lease; its invariants (keys, replay, reconcilers,
ambiguous calls) are in the conformance suite."""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from statekeep.errors import InvalidInputError
from statekeep.workflow import Registry, Run, RunContext, RunStatus

from .conftest import EngineFactory


def test_non_json_tool_arguments_are_refused_before_the_call(make_engine: EngineFactory) -> None:
    """Arguments that cannot be recorded exactly raise InvalidInputError; the tool never runs."""
    registry = Registry()
    ran: list[int] = []

    @registry.tool()
    def t(key: str, value: Any) -> None:
        ran.append(1)

    @registry.workflow("w", version=1)
    def wf(ctx: RunContext) -> Any:
        return ctx.call_tool(t, object())

    engine = make_engine(registry)
    with pytest.raises(InvalidInputError, match="not JSON"):
        engine.run(wf, "r")
    assert (ran, engine.store.tool_calls("r")) == ([], [])


def test_a_holder_whose_lease_lapsed_leases_the_run_again_before_a_tool_call(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Heartbeats that fell behind (a stalled machine) let the lease lapse; starting a tool call
    leases the run again, in the transaction that records the call, so no other worker can claim
    the run (and call the tool a second time) while the call runs."""
    registry = Registry()
    claimed: list[Run] = []

    @registry.tool()
    def charge(key: str, n: int) -> int:
        claimed.extend(other.store.claim("other", 30, 10, [("w", 1)]))  # another worker looks, mid-call
        return n

    @registry.workflow("w", version=1)
    def wf(ctx: RunContext) -> Any:
        ctx.step("stall", time.sleep, 0.8)  # longer than the lease: it lapses here
        return ctx.call_tool(charge, 5)

    engine = make_engine(registry, lease=0.4)
    monkeypatch.setattr(engine.store, "heartbeat", lambda *args: True)  # beats that never land
    other = make_engine(registry)
    run = engine.run(wf, "r")
    assert claimed == []
    assert (run.status, run.output) == (RunStatus.COMPLETED, 5)
    assert [(c.status, c.result) for c in engine.store.tool_calls("r")] == [("completed", 5)]


def test_a_heartbeat_that_waited_for_a_lock_on_the_run_leases_from_when_it_got_the_row(
    make_engine: EngineFactory, database_url: str
) -> None:
    """Another transaction holds the run's row (an event being sent); the beat waits for it and
    then leases from that moment, so the run is not claimable the instant the beat returns."""
    registry = Registry()

    @registry.workflow("w", version=1)
    def wf(ctx: RunContext) -> None:
        return None

    engine = make_engine(registry)
    engine.start(wf, "r")
    held = engine.store.acquire("r", "worker-a", 1.0)
    assert held is not None
    url = make_url(database_url)
    blocker: Any
    if url.get_backend_name() == "sqlite":
        blocker = sqlite3.connect(str(url.database), isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")  # SQLite locks the database for writing
    else:
        blocker = psycopg.connect(url.set(drivername="postgresql").render_as_string(False))
        blocker.execute("SELECT 1 FROM statekeep_workflow.runs WHERE run_id = 'r' FOR UPDATE")
    beats: list[bool] = []
    beating = threading.Thread(target=lambda: beats.append(engine.store.heartbeat("r", held.epoch, 1.0)))
    beating.start()
    time.sleep(1.5)  # longer than the lease the beat asks for
    blocker.rollback()
    beating.join(30)
    blocker.close()
    assert beats == [True]
    assert engine.store.claim("worker-b", 30, 10, [("w", 1)]) == []
    assert engine.store.get("r").lease_owner == "worker-a"
