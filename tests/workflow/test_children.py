"""A stale worker is fenced everywhere, taking a child run included.

Creating and taking a child are conditional on holding the parent's current
epoch, in the same transaction; a parent's holder takes a child only when the
child's lease lapsed (whoever held it: a live holder may be inside a tool call). The tests with
real, stopped processes are in ``test_child_fencing.py``; these drive the store
and the engine in one process.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from statekeep.errors import LeaseLostError
from statekeep.workflow import (
    LedgerEntry,
    Reconciler,
    Reconciliation,
    Registry,
    Run,
    RunContext,
    RunStatus,
    SQLWorkflowStore,
    Worker,
)
from statekeep.workflow.tables import runs

from .conftest import EngineFactory


def family(
    effects: list[str],
    reconciler: Reconciler | None = None,
    mid_call: Callable[[], None] | None = None,
) -> Registry:
    """A parent whose child makes one call of ``charge`` (``mid_call`` runs inside it, first)."""
    registry = Registry()

    @registry.tool("charge", reconciler=reconciler)
    def charge(key: str) -> str:
        if mid_call is not None:
            mid_call()
        effects.append(key)
        return key

    @registry.workflow("kid", version=1)
    def kid(ctx: RunContext) -> str:
        return str(ctx.call_tool(charge))

    @registry.workflow("parent", version=1)
    def parent(ctx: RunContext) -> str:
        ctx.step("before", lambda: None)
        return "got " + str(ctx.child(kid, "kid-1"))

    return registry


def _child_fields() -> dict[str, Any]:
    return {
        "run_id": "kid-1",
        "workflow": "kid",
        "version": 1,
        "input": '{"args":[],"kwargs":{}}',
        "input_hash": _hash({"args": [], "kwargs": {}}),
        "status": RunStatus.PENDING.value,
        "runnable_at": None,
        "parent_id": "p",
        "state_schema": None,
        "state_schema_version": None,
    }


def _hash(value: Any) -> str:
    from statekeep.workflow import codec

    return codec.digest(value)


def test_a_child_held_through_an_older_parent_epoch_is_taken_only_once_its_lease_lapsed(
    make_engine: EngineFactory,
) -> None:
    """A child taken inline by a holder that has since lost the parent stays with that (live)
    holder while its lease runs; once the lease lapses, the parent's new holder takes it."""
    engine = make_engine(family([]))
    engine.start(engine.registry.get("parent", 1), "p")
    old = engine.store.acquire("p", "worker-a", 30)
    assert old is not None
    engine.store.open_run(_child_fields(), parent=old)
    held = engine.store.acquire("kid-1", "worker-a", 30, parent=old)
    assert held is not None
    new = engine.store.acquire("p", "worker-b", 30)
    assert new is not None
    assert engine.store.acquire("kid-1", "worker-b", 30, parent=new) is None  # its holder may be mid-call
    assert engine.store.get("kid-1").epoch == held.epoch
    assert engine.store.heartbeat("kid-1", held.epoch, 0.01)  # the holder stops beating: it lapses
    time.sleep(0.05)
    taken = engine.store.acquire("kid-1", "worker-b", 30, parent=new)
    assert taken is not None
    assert taken.epoch == held.epoch + 1
    # the old holder's next write to the child is refused
    with pytest.raises(LeaseLostError), engine.store.fenced(held) as tx:
        tx.finish(RunStatus.COMPLETED, '"stale"', None)
    assert engine.store.get("kid-1").status is RunStatus.RUNNING


def test_a_lease_leaves_no_parent_epoch_for_an_older_worker_to_read(make_engine: EngineFactory) -> None:
    """Workers of an older version took a child whose lease was live when ``lease_parent_epoch`` was
    set; every lease now writes it empty, whatever an older worker left there."""
    engine = make_engine(family([]))
    engine.start(engine.registry.get("parent", 1), "p")
    parent = engine.store.acquire("p", "worker-a", 30)
    assert parent is not None
    engine.store.open_run(_child_fields(), parent=parent)
    kid, store = runs.c.run_id == "kid-1", engine.store
    assert isinstance(store, SQLWorkflowStore)
    with store.db.begin() as conn:  # as an older worker left it
        conn.execute(runs.update().where(kid).values(lease_parent_epoch=parent.epoch))
    assert engine.store.acquire("kid-1", "worker-a", 30, parent=parent) is not None
    with store.db.read() as conn:
        assert conn.execute(sa.select(runs.c.lease_parent_epoch).where(kid)).scalar() is None


def test_a_parent_taken_over_during_its_childs_tool_call_does_not_call_the_tool_again(
    make_engine: EngineFactory,
) -> None:
    """The parent's lease lapses while its holder is inside the child's tool call, and another
    worker resumes the parent: it leaves the live child to its holder and waits, instead of
    taking the child and calling the tool a second time (the reconciler, asked mid-call, would
    say it did not happen). CI's crash test saw such a double twice."""
    effects: list[str] = []
    resumed: list[Run] = []

    def happened(call: LedgerEntry) -> Reconciliation:
        return Reconciliation(call.key in effects, call.key if call.key in effects else None)

    def take_over() -> None:
        if not resumed:  # mid-call: the parent is taken over and resumed by another worker
            taken = other.store.acquire("p", "worker-b", 30)
            assert taken is not None
            resumed.append(other.execute(taken))

    registry = family(effects, happened, take_over)
    engine = make_engine(registry)
    other = make_engine(registry, owner="worker-b")
    with contextlib.suppress(LeaseLostError):
        engine.run(registry.get("parent", 1), "p")
    [waiting] = resumed
    assert waiting.status is RunStatus.WAITING_FOR_CHILD
    assert engine.store.get("kid-1").status is RunStatus.COMPLETED  # its holder finished it
    assert Worker(other).run_once() == 1  # the child woke the parent
    assert engine.store.get("p").output == "got kid-1/1/0"
    assert effects == ["kid-1/1/0"]


def test_a_child_a_worker_claimed_is_left_to_it_and_the_parent_waits(make_engine: EngineFactory) -> None:
    """A parent resumed inline does not override a worker's live claim on its child; it waits, then ends."""
    effects: list[str] = []
    engine = make_engine(family(effects))
    engine.start(engine.registry.get("parent", 1), "p")
    parent = engine.store.acquire("p", "worker-a", 30)
    assert parent is not None
    engine.store.open_run({**_child_fields(), "runnable_at": parent.updated_at}, parent=parent)
    [claimed] = engine.store.claim("worker-w", 30, 1, [("kid", 1)])
    assert claimed.run_id == "kid-1"
    assert engine.store.acquire("kid-1", "worker-a", 30, parent=parent) is None
    assert engine.store.get("kid-1").epoch == claimed.epoch  # not bumped
    resumed = engine.resume("p")  # the parent replays up to ctx.child, then waits
    assert resumed.status is RunStatus.WAITING_FOR_CHILD
    assert engine.execute(claimed).status is RunStatus.COMPLETED  # the worker finishes the child
    assert engine.store.get("p").status is RunStatus.PENDING  # woken
    assert Worker(engine).run_once() == 1
    assert engine.store.get("p").output == "got kid-1/1/0"
    assert effects == ["kid-1/1/0"]
