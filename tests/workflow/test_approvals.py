"""Approvals: bad decisions, and an approval across three processes.

The gate's invariants (the call waits as a row, one decision, the exact call runs
once, expiry, withdrawal) are in the conformance suite (test_suite.py).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from statekeep.db import Database
from statekeep.errors import (
    ApprovalNotFoundError,
    InvalidInputError,
)
from statekeep.workflow import Engine, Registry, RunContext, RunStatus, Worker

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
