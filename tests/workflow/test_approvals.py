"""Approvals: a gate persists the proposed call, a person decides once, the exact call runs once."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from statekeep.db import Database
from statekeep.errors import (
    ApprovalDecidedError,
    ApprovalExpiredError,
    ApprovalNotFoundError,
    InvalidInputError,
)
from statekeep.workflow import Engine, Registry, RunContext, RunStatus, Worker, codec

from .conftest import EngineFactory, append, fork, lines, wait


def refund_registry(effects: Path, amount_file: Path, expires: float | None = None) -> Registry:
    """A workflow that refunds the amount read from a file, gated by a person's approval."""
    registry = Registry()

    @registry.tool("refund")
    def refund(key: str, order: str, amount: int) -> dict[str, Any]:
        append(effects, f"{key} {order} {amount}")
        return {"refunded": amount}

    @registry.workflow("refund", version=1)
    def flow(ctx: RunContext, order: str) -> Any:
        amount = ctx.step("quote", lambda: int(amount_file.read_text()))
        if amount_file.read_text().strip() != str(amount):  # tampering: the call differs from the quote
            amount = int(amount_file.read_text())
        gated = refund.requiring_approval(
            "refunds need a person", expires_in=None if expires is None else timedelta(seconds=expires)
        )
        return ctx.call_tool(gated, order, amount)

    return registry


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    amount = tmp_path / "amount"
    amount.write_text("120")
    return tmp_path / "effects", amount


def test_invariant_4_a_gate_persists_the_call_and_the_run_waits(
    make_engine: EngineFactory, files: tuple[Path, Path]
) -> None:
    """The run parks as waiting_for_approval with action, arguments, hash, reason and id; nothing ran."""
    effects, amount = files
    engine = make_engine(refund_registry(effects, amount, expires=3600))
    run = engine.run(engine.registry.get("refund", 1), "r", "o-1")
    assert run.status is RunStatus.WAITING_FOR_APPROVAL
    assert run.lease_owner is None
    (ask,) = engine.store.approvals()
    args = {"args": ["o-1", 120], "kwargs": {}}
    assert (ask.run_id, ask.kind, ask.action, ask.args, ask.status) == (
        "r",
        "gate",
        "refund",
        args,
        "pending",
    )
    assert ask.args_hash == codec.digest(args)
    assert ask.reason == "refunds need a person"
    assert ask.expires_at is not None
    assert engine.store.approvals(run_id="other") == []
    assert engine.store.approvals(action="refund", kind="gate") == [ask]
    assert lines(effects) == []


def test_approved_action_runs_once_and_a_second_decision_is_refused(
    make_engine: EngineFactory, files: tuple[Path, Path]
) -> None:
    """After approval the call runs once with the approved arguments; deciding again raises."""
    effects, amount = files
    engine = make_engine(refund_registry(effects, amount))
    engine.run(engine.registry.get("refund", 1), "r", "o-1")
    (ask,) = engine.store.approvals()
    decided = engine.store.decide(ask.approval_id, approve=True, by="alice@example.com", comment="ok")
    assert (decided.status, decided.decided_by, decided.comment) == ("approved", "alice@example.com", "ok")
    with pytest.raises(ApprovalDecidedError):
        engine.store.decide(ask.approval_id, approve=False, by="mallory@example.com")
    assert engine.store.get("r").status is RunStatus.PENDING
    run = engine.resume("r")
    assert (run.status, run.output) == (RunStatus.COMPLETED, {"refunded": 120})
    engine.resume("r")
    assert lines(effects) == ["r/2/0 o-1 120"]


def test_a_rejected_action_never_runs(make_engine: EngineFactory, files: tuple[Path, Path]) -> None:
    """A rejection fails the run with who rejected it and why; the tool never ran."""
    effects, amount = files
    engine = make_engine(refund_registry(effects, amount))
    engine.run(engine.registry.get("refund", 1), "r", "o-1")
    (ask,) = engine.store.approvals()
    engine.store.decide(ask.approval_id, approve=False, by="bob@example.com", comment="fraud")
    run = engine.resume("r")
    assert run.status is RunStatus.FAILED
    assert run.error is not None
    assert "rejected by bob@example.com: fraud" in run.error
    assert lines(effects) == []


def test_a_tampered_argument_after_approval_is_refused(
    make_engine: EngineFactory, files: tuple[Path, Path]
) -> None:
    """If the call about to be made differs from the approved one, it is refused and never runs."""
    effects, amount = files
    engine = make_engine(refund_registry(effects, amount))
    engine.run(engine.registry.get("refund", 1), "r", "o-1")
    (ask,) = engine.store.approvals()
    engine.store.decide(ask.approval_id, approve=True, by="alice@example.com")
    amount.write_text("9999")
    run = engine.resume("r")
    assert run.status is RunStatus.FAILED
    assert run.error is not None
    assert "ApprovalMismatchError" in run.error
    assert lines(effects) == []


def test_an_expired_approval_fails_closed(make_engine: EngineFactory, files: tuple[Path, Path]) -> None:
    """A decision after expiry is refused, and the run resuming past expiry fails without acting."""
    effects, amount = files
    engine = make_engine(refund_registry(effects, amount, expires=0.3))
    engine.run(engine.registry.get("refund", 1), "r", "o-1")
    engine.run(engine.registry.get("refund", 1), "r2", "o-2")
    time.sleep(0.4)
    late = engine.store.approvals(run_id="r")[0]
    with pytest.raises(ApprovalExpiredError):
        engine.store.decide(late.approval_id, approve=True, by="alice@example.com")
    assert engine.store.approval(late.approval_id).status == "expired"
    assert engine.resume("r").status is RunStatus.FAILED
    run2 = engine.resume("r2")  # never decided: the worker-side check fails it closed as well
    assert run2.status is RunStatus.FAILED
    assert run2.error is not None
    assert "expired" in run2.error
    assert engine.store.approvals(run_id="r2", status="expired") != []
    assert lines(effects) == []


def test_bad_decisions_are_refused_and_write_nothing(
    make_engine: EngineFactory, files: tuple[Path, Path]
) -> None:
    """Unknown or unstorable ids, a bad decider, approve or comment, non-JSON results: refused, pending."""
    effects, amount = files
    engine = make_engine(refund_registry(effects, amount))
    engine.run(engine.registry.get("refund", 1), "r", "o-1")
    (ask,) = engine.store.approvals()
    with pytest.raises(ApprovalNotFoundError):
        engine.store.decide("nope", approve=True, by="alice")
    with pytest.raises(InvalidInputError, match="by"):
        engine.store.decide(ask.approval_id, approve=True, by="")
    with pytest.raises(InvalidInputError, match="result"):
        engine.store.decide(ask.approval_id, approve=True, by="alice", result={1, 2})
    with pytest.raises(InvalidInputError, match="approval_id"):
        engine.store.decide("a\x00b", approve=True, by="alice")
    with pytest.raises(InvalidInputError, match="approve"):
        engine.store.decide(ask.approval_id, approve="yes", by="alice")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="comment"):
        engine.store.decide(ask.approval_id, approve=True, by="alice", comment="ok\x00")
    with pytest.raises(InvalidInputError, match="by"):
        engine.store.decide(ask.approval_id, approve=True, by="x" * 256)
    with pytest.raises(InvalidInputError, match="by"):
        engine.store.decide(ask.approval_id, approve=True, by="   ")
    with pytest.raises(InvalidInputError, match="approval_id"):
        engine.store.approval("\ud800")
    with pytest.raises(InvalidInputError, match="run_id"):
        engine.store.approvals(run_id="r\x00")
    assert engine.store.approval(ask.approval_id).status == "pending"


def test_an_approval_across_three_processes(database_url: str, files: tuple[Path, Path]) -> None:
    """One process starts and exits while waiting, a second approves, a third (a worker) finishes once."""
    effects, amount = files

    def start() -> None:
        engine = Engine(Database(database_url), refund_registry(effects, amount))
        assert (
            engine.run(engine.registry.get("refund", 1), "r", "o-7").status is RunStatus.WAITING_FOR_APPROVAL
        )

    def approve() -> None:
        engine = Engine(Database(database_url), Registry())  # a person's console knows no workflow code
        (ask,) = engine.store.approvals(status="pending")
        engine.store.decide(ask.approval_id, approve=True, by="carol@example.com")

    def finish() -> None:
        engine = Engine(Database(database_url), refund_registry(effects, amount), lease=2)
        Worker(engine, poll=0.02, max_poll=0.1).run(idle_exit=0.5)

    for step in (start, approve, finish):
        assert wait(fork(step)) == 0
    check = Engine(Database(database_url), Registry())
    run = check.store.get("r")
    assert (run.status, run.output) == (RunStatus.COMPLETED, {"refunded": 120})
    assert check.store.approvals(status=None)[0].decided_by == "carol@example.com"
    assert lines(effects) == ["r/2/0 o-7 120"]
    check.store.close()


def test_a_cancelled_run_withdraws_its_pending_approval(
    make_engine: EngineFactory, files: tuple[Path, Path]
) -> None:
    """Nobody is asked about a run that ended: the approval leaves the queue; a late decision is refused."""
    effects, amount = files
    engine = make_engine(refund_registry(effects, amount))
    engine.run(engine.registry.get("refund", 1), "r", "o-1")
    engine.run(engine.registry.get("refund", 1), "other", "o-2")
    (ask, keep) = engine.store.approvals()
    engine.store.cancel("r")
    assert [a.run_id for a in engine.store.approvals()] == ["other"]
    assert engine.store.approval(ask.approval_id).status == "withdrawn"
    with pytest.raises(ApprovalDecidedError):
        engine.store.decide(ask.approval_id, approve=True, by="alice")
    assert engine.store.get("r").status is RunStatus.CANCELLED
    assert engine.store.approval(keep.approval_id).status == "pending"
    assert lines(effects) == []
