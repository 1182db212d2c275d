"""Runs, decisions and key rings: whoever decides an approval, the run's own worker can read it.

A store opened with a key ring (the CLI, the console, a Runtime) seals an owned
run's payloads; a hand-built engine without one stores them plain. A decision is
sealed exactly when the approval it answers was (its arguments, written by the
run's worker), and a worker that meets a sealed value it cannot open holds the
run back instead of failing it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from statekeep.errors import InvalidInputError, SealedDataError
from statekeep.keys import KeyRing, LocalKeyFile, is_sealed
from statekeep.workflow import Engine, Registry, RunContext, RunStatus, SQLWorkflowStore, Worker
from statekeep.workflow.tables import approvals, runs, steps

from .conftest import EngineFactory, append, lines


def ship_registry(effects: Path) -> Registry:
    """An owned workflow: a priced step, then a shipment a person must approve."""
    registry = Registry()

    @registry.tool("ship")
    def ship(key: str, customer: str, cents: int) -> dict[str, Any]:
        append(effects, f"{key} {customer} {cents}")
        return {"shipped": cents}

    @registry.workflow("order", version=1, owner="customer")
    def order(ctx: RunContext, customer: str) -> Any:
        cents = ctx.step("price", lambda: 1234)
        return ctx.call_tool(ship.requiring_approval("shipping needs a person"), customer, cents)

    return registry


@pytest.fixture
def ring(database_url: str, tmp_path: Path) -> KeyRing:
    """The key ring a CLI or a console would open: the home's key file, keys in the workflow database."""
    return KeyRing(database_url, LocalKeyFile(tmp_path / "keys.json"))


def _raw(store: object, column: sa.ColumnElement[Any]) -> list[Any]:
    """The stored values of ``column``, as they are on disk."""
    assert isinstance(store, SQLWorkflowStore)
    with store.db.read() as conn:
        return list(conn.execute(sa.select(column)).scalars())


def test_a_keyless_worker_reads_a_decision_made_with_keys(
    make_engine: EngineFactory, database_url: str, ring: KeyRing, tmp_path: Path
) -> None:
    """A run written plain, decided by a store with a key ring: the decision is plain, the run completes."""
    effects = tmp_path / "effects"
    engine = make_engine(ship_registry(effects))
    order = engine.registry.get("order", 1)
    assert engine.run(order, "o-1", "ada").status is RunStatus.WAITING_FOR_APPROVAL
    console = SQLWorkflowStore(database_url, keys=ring)
    (ask,) = console.approvals(run_id="o-1")
    decided = console.decide(ask.approval_id, approve=True, by="carol@example.com", comment="fine")
    assert (decided.status, decided.comment) == ("approved", "fine")
    assert not any(is_sealed(v) for v in _raw(console, approvals.c.comment))
    done = Worker(engine, poll=0.01, max_poll=0.05)
    assert done.run_once() == 1
    run = engine.store.get("o-1")
    assert (run.status, run.output, run.error) == (RunStatus.COMPLETED, {"shipped": 1234}, None)
    assert engine.store.approval(ask.approval_id).comment == "fine"
    assert lines(effects) == ["o-1/2/0 ada 1234"]
    console.close()


def test_a_decision_on_a_sealed_run_is_sealed(
    make_engine: EngineFactory, database_url: str, ring: KeyRing, tmp_path: Path
) -> None:
    """A run sealed by its worker: the decision is sealed too, and a store without keys cannot decide it."""
    effects = tmp_path / "effects"
    engine = make_engine(ship_registry(effects), keys=ring)
    assert engine.run(engine.registry.get("order", 1), "o-2", "bob").status is RunStatus.WAITING_FOR_APPROVAL
    assert all(is_sealed(v) for v in _raw(engine.store, runs.c.input))
    keyless = SQLWorkflowStore(database_url)
    with pytest.raises(SealedDataError):
        keyless.approvals()
    (ask,) = engine.store.approvals(run_id="o-2")
    with pytest.raises(SealedDataError):
        keyless.decide(ask.approval_id, approve=True, by="mallory@example.com", comment="sure")
    assert engine.store.approval(ask.approval_id).status == "pending"  # nothing written
    console = SQLWorkflowStore(database_url, keys=ring)
    console.decide(ask.approval_id, approve=True, by="carol@example.com", comment="sure")
    assert all(is_sealed(v) for v in _raw(console, approvals.c.comment))
    assert engine.resume("o-2").output == {"shipped": 1234}
    assert lines(effects) == ["o-2/2/0 bob 1234"]
    keyless.close()
    console.close()


def test_a_worker_without_keys_holds_a_sealed_run_back_and_a_worker_with_keys_finishes_it(
    make_engine: EngineFactory, database_url: str, ring: KeyRing, tmp_path: Path
) -> None:
    """Started plain, advanced sealed, claimed by a keyless worker: held back, not failed; nothing repeats."""
    effects = tmp_path / "effects"
    registry = ship_registry(effects)
    keyless = make_engine(registry)
    keyed = make_engine(registry, keys=ring)
    keyless.start(registry.get("order", 1), "o-3", "cy")  # input plain: any worker can claim it
    assert keyed.resume("o-3").status is RunStatus.WAITING_FOR_APPROVAL  # its journal is sealed
    assert all(is_sealed(v) for v in _raw(keyed.store, steps.c.output))
    (ask,) = keyed.store.approvals(run_id="o-3")
    keyed.store.decide(ask.approval_id, approve=True, by="carol@example.com")
    assert Worker(keyless, poll=0.01, max_poll=0.05).run_once() == 1
    run = keyless.store.get("o-3")
    assert run.status is RunStatus.PENDING, run.error
    held = (run.waiting or {}).get("held", "")
    assert held.startswith("SealedDataError")
    assert "'o-3'" in held
    assert "keys=" in held
    assert [r.run_id for r in keyless.held_back()] == ["o-3"]
    assert Worker(keyless, poll=0.01, max_poll=0.05).run_once() == 0  # held: not claimed again
    assert lines(effects) == []
    assert keyed.resume("o-3").output == {"shipped": 1234}
    assert lines(effects) == ["o-3/2/0 cy 1234"]
    assert keyed.held_back() == []


def test_a_worker_without_keys_stops_at_a_run_whose_input_is_sealed_and_leaves_it_claimable(
    make_engine: EngineFactory, ring: KeyRing, tmp_path: Path
) -> None:
    """A keyless worker cannot even read the run it would claim: it stops with the error, takes no lease."""
    registry = ship_registry(tmp_path / "effects")
    keyed = make_engine(registry, keys=ring)
    keyed.start(registry.get("order", 1), "o-5", "eve")
    with pytest.raises(SealedDataError, match="'o-5'"):
        Worker(make_engine(registry), poll=0.01, max_poll=0.05).run(idle_exit=0.2)
    run = keyed.store.get("o-5")
    assert (run.status, run.lease_owner) == (RunStatus.PENDING, None)
    assert Worker(keyed, poll=0.01, max_poll=0.05).run_once() == 1
    assert keyed.store.get("o-5").status is RunStatus.WAITING_FOR_APPROVAL


def test_a_sealed_value_read_without_keys_names_the_run_the_owner_and_the_fix(
    make_engine: EngineFactory, database_url: str, ring: KeyRing, tmp_path: Path
) -> None:
    """The error names the data key, the run and its owner, and says to open the store with keys=."""
    engine = make_engine(ship_registry(tmp_path / "effects"), keys=ring)
    engine.run(engine.registry.get("order", 1), "o-4", "dora")
    console = make_engine(Registry())
    with pytest.raises(SealedDataError) as raised:
        console.store.get("o-4")
    message = str(raised.value)
    assert raised.value.key_id != "-"
    assert raised.value.key_id in message
    assert "'o-4'" in message
    assert "'dora'" in message
    assert "keys=open_key_ring(" in message


def test_an_engine_takes_a_key_ring(make_engine: EngineFactory, database_url: str, ring: KeyRing) -> None:
    """Engine(url, registry, keys=ring) uses the ring; keys for a ready store or not a ring: refused."""
    engine = make_engine(ship_registry(Path("unused")), keys=ring)
    assert isinstance(engine.store, SQLWorkflowStore)
    assert engine.store.keys is ring
    with pytest.raises(InvalidInputError, match="keys"):
        Engine(engine.store, Registry(), keys=ring)
    with pytest.raises(InvalidInputError, match="keys"):
        Engine(database_url, Registry(), keys="local")  # type: ignore[arg-type]
