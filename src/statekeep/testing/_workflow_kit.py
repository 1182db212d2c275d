"""Shared pieces of the workflow conformance suite: workloads and helpers its tests use."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

from statekeep.workflow import (
    LedgerEntry,
    Reconciliation,
    Registry,
    Run,
    RunContext,
    RunStatus,
    StepRecord,
    WorkflowStore,
    codec,
)
from statekeep.workflow.run_write import now
from statekeep.working import WorkingState

#: Opens a store over the test's data; each call sees what stores from earlier calls wrote.
WorkflowStoreFactory = Callable[[], WorkflowStore]


class Crash(BaseException):
    """Stands in for a process dying mid-step (not an Exception, so nothing records it)."""


class Boom(Exception):
    """An error raised inside a fenced transaction."""


class Notes(WorkingState):
    state_schema: ClassVar[str] = "suite.notes"
    lines: list[str] = []


def three_steps(calls: list[str], crash_at: str | None = None) -> Registry:
    """``three``: three steps that record their calls, one of which may crash."""
    registry = Registry()

    def work(name: str) -> str:
        calls.append(name)
        if name == crash_at:
            raise Crash
        return name.upper()

    @registry.workflow("three", version=1)
    def three(ctx: RunContext, prefix: str) -> list[str]:
        return [ctx.step(f"s{i}", work, f"{prefix}{i}") for i in range(3)]

    @registry.workflow("waiter", version=1)
    def waiter(ctx: RunContext) -> Any:
        return ctx.wait_for_event("go")

    return registry


def mail_registry(
    effects: list[str],
    *,
    crash: bool = False,
    reconcile: bool = False,
    spy: Callable[[], None] | None = None,
    registry: Registry | None = None,
) -> Registry:
    """``mail``: one step, then one email sent through the ledger (crashing once after it, if asked)."""
    registry = registry or Registry()
    crashes = [True] if crash else []

    def reconciler(call: LedgerEntry) -> Reconciliation:
        done = [e for e in effects if e.startswith(call.key + " ")]
        return Reconciliation(True, {"sent": call.kwargs["to"]}) if done else Reconciliation(False)

    @registry.tool("send_email", reconciler=reconciler if reconcile else None)
    def send_email(key: str, *, to: str) -> dict[str, str]:
        if spy is not None:
            spy()
        effects.append(f"{key} {to}")
        if crashes:
            crashes.pop()
            raise Crash
        return {"sent": to}

    @registry.workflow("mail", version=1)
    def mail(ctx: RunContext, to: str) -> dict[str, str]:
        ctx.step("prepare", str, to)
        return ctx.call_tool(send_email, to=to)

    return registry


def refund_registry(
    effects: list[str],
    amount: dict[str, int],
    expires: float | None = None,
    *,
    registry: Registry | None = None,
) -> Registry:
    """``refund``: quote an amount, then refund it through a tool gated by a person's approval."""
    registry = registry or Registry()

    @registry.tool("refund")
    def refund(key: str, order: str, value: int) -> dict[str, Any]:
        effects.append(f"{key} {order} {value}")
        return {"refunded": value}

    @registry.workflow("refund", version=1)
    def flow(ctx: RunContext, order: str) -> Any:
        ctx.step("quote", lambda: amount["value"])
        gated = refund.requiring_approval(
            "refunds need a person", expires_in=None if expires is None else timedelta(seconds=expires)
        )
        return ctx.call_tool(gated, order, amount["value"])  # the amount as it is now: maybe tampered

    return registry


def child_fields(parent_id: str) -> dict[str, Any]:
    """The fields of a child run ``kid-1`` of workflow ``kid``, as the engine opens it."""
    payload: dict[str, Any] = {"args": [], "kwargs": {}}
    return {
        "run_id": "kid-1",
        "workflow": "kid",
        "version": 1,
        "input": codec.to_json(payload),
        "input_hash": codec.digest(payload),
        "status": RunStatus.PENDING.value,
        "runnable_at": now(),
        "parent_id": parent_id,
        "state_schema": None,
        "state_schema_version": None,
    }


def step_record(run_id: str, seq: int, name: str, output: Any) -> StepRecord:
    stamp = now()
    return StepRecord(run_id, seq, name, "step", "h", codec.to_json(output), 1, stamp, stamp, None, None)


def write_a_step_a_call_and_the_end(store: WorkflowStore, run: Run, *, then_fail: bool = False) -> None:
    """Journal a step, start a call and finish the run in one fenced transaction (then raise, if asked)."""
    with store.fenced(run) as tx:
        tx.record_step(step_record(run.run_id, 1, "s0", "A0"))
        tx.start_call(2, "t", f"{run.run_id}/2/0", '{"args":[],"kwargs":{}}')
        tx.finish(RunStatus.COMPLETED, '"done"', None)
        if then_fail:
            raise Boom
