"""Tool calls through the ledger, and the approval gate in front of them.

A call is recorded ``started`` (with its idempotency key ``<run>/<seq>/<index>``)
before the tool runs, and ``completed`` together with the step's completion
after. A ``started`` call found on resume is ambiguous: it is never re-run
blindly. The tool's reconciler decides; without one (or when it cannot tell) the
run waits as ``needs_decision`` for a person, through an ``ambiguous`` approval.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

from statekeep.errors import (
    ApprovalExpiredError,
    ApprovalMismatchError,
    ApprovalRejectedError,
    InvalidInputError,
    StepFailedError,
    Suspended,
)
from statekeep.workflow import codec, gates, store
from statekeep.workflow._types import Approval, Reconciliation, RunStatus, ToolCall
from statekeep.workflow.registry import Tool

if TYPE_CHECKING:
    from statekeep.workflow.context import RunContext


def call(ctx: RunContext, tool: Tool[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call ``tool`` at the run's next journal position; see the module docstring."""
    seq, recorded = ctx._position(tool.name, "tool")
    index = ctx._calls
    ctx._calls += 1
    if recorded is not None:
        return recorded.value
    try:
        payload = {"args": list(args), "kwargs": kwargs}
        encoded = codec.to_json(payload)
    except codec.NotJSONError as exc:
        raise InvalidInputError(f"arguments of tool {tool.name!r} are not JSON: {exc}", field="args") from exc
    if tool.gate is not None:
        _check_gate(ctx, seq, tool, payload)
    key = f"{ctx.run_id}/{seq}/{index}"
    entry = ctx.engine.store.tool_call(ctx.run_id, seq)
    if entry is None:
        with ctx.engine.store.fenced(ctx.run_id, ctx.run.epoch) as conn:
            store.start_call(conn, ctx.run_id, seq, tool.name, key, encoded)
        return _invoke(ctx, seq, tool, key, args, kwargs)
    if entry.status == "completed":
        return _complete(ctx, seq, tool, codec.to_json(entry.result))
    return _settle(ctx, seq, tool, entry)


def _invoke(
    ctx: RunContext, seq: int, tool: Tool[Any, Any], key: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    try:
        value = ctx._call(tool.fn, (key, *args), kwargs)
    except Exception as exc:
        # the tool returned control with an error: it did not complete, so the call may be made again
        with ctx.engine.store.fenced(ctx.run_id, ctx.run.epoch) as conn:
            store.drop_call(conn, ctx.run_id, seq)
        raise StepFailedError(ctx.run_id, tool.name, seq, 1, repr(exc)) from exc
    return _complete(ctx, seq, tool, ctx._encode(tool.name, value))


def _complete(ctx: RunContext, seq: int, tool: Tool[Any, Any], output: str) -> Any:
    entry_hash = codec.digest(output)
    with ctx.engine.store.fenced(ctx.run_id, ctx.run.epoch) as conn:
        store.complete_call(conn, ctx.run_id, seq, output)
        ctx._write(conn, seq, tool.name, "tool", entry_hash, output, 1, store.now())
    return json.loads(output)


def _settle(ctx: RunContext, seq: int, tool: Tool[Any, Any], entry: ToolCall) -> Any:
    """An ambiguous call: a person's decision, then the reconciler, then ask a person."""
    with ctx.engine.store.db.read() as conn:
        decision = gates.approval_at(conn, ctx.run_id, seq, "ambiguous")
    if decision is not None and decision.status == "pending":
        _park(ctx, RunStatus.NEEDS_DECISION, None, {"approval_id": decision.approval_id})
    if decision is not None and decision.decided_at is not None and decision.decided_at > entry.started_at:
        if decision.status == "rejected":  # it happened; the person supplied its result
            return _complete(ctx, seq, tool, codec.to_json(decision.result))
        if decision.status == "approved":
            return _rerun(ctx, seq, tool, entry)
    verdict = tool.reconciler(entry) if tool.reconciler is not None else Reconciliation(None)
    if verdict.happened is True:
        return _complete(ctx, seq, tool, ctx._encode(tool.name, verdict.result))
    if verdict.happened is False:
        return _rerun(ctx, seq, tool, entry)
    fields = _fields(ctx, seq, "ambiguous", tool.name, {"args": entry.args, "kwargs": entry.kwargs})
    fields["reason"] = f"tool call {entry.key} started but never completed; did it happen?"
    return _park(ctx, RunStatus.NEEDS_DECISION, None, {}, ask=(fields, None))


def _rerun(ctx: RunContext, seq: int, tool: Tool[Any, Any], entry: ToolCall) -> Any:
    with ctx.engine.store.fenced(ctx.run_id, ctx.run.epoch) as conn:
        store.restart_call(conn, ctx.run_id, seq)
    return _invoke(ctx, seq, tool, entry.key, tuple(entry.args), entry.kwargs)


def _check_gate(ctx: RunContext, seq: int, tool: Tool[Any, Any], payload: dict[str, Any]) -> None:
    """Return only when an unexpired approval of exactly these arguments is recorded."""
    assert tool.gate is not None
    with ctx.engine.store.db.read() as conn:
        approval = gates.approval_at(conn, ctx.run_id, seq, "gate")
    if approval is None:
        fields = _fields(ctx, seq, "gate", tool.name, payload)
        fields["reason"] = tool.gate.reason
        expires = None if tool.gate.expires_in is None else store.now() + tool.gate.expires_in
        _park(ctx, RunStatus.WAITING_FOR_APPROVAL, expires, {}, ask=(fields, expires))
    if approval.status == "pending" and not _expired(approval):
        _park(ctx, RunStatus.WAITING_FOR_APPROVAL, approval.expires_at, {"approval_id": approval.approval_id})
    _refuse_unless_approved(ctx, approval, codec.digest(payload))


def _refuse_unless_approved(ctx: RunContext, approval: Approval, args_hash: str) -> None:
    if approval.status == "pending":  # expired while pending: fail closed, and record it
        with ctx.engine.store.fenced(ctx.run_id, ctx.run.epoch) as conn:
            gates.expire(conn, approval.approval_id)
        raise ApprovalExpiredError(approval.approval_id, approval.action, "expired before a decision")
    if approval.status == "expired":
        raise ApprovalExpiredError(approval.approval_id, approval.action, "expired before a decision")
    if approval.status == "rejected":
        note = f": {approval.comment}" if approval.comment else ""
        raise ApprovalRejectedError(
            approval.approval_id, approval.action, f"rejected by {approval.decided_by}{note}"
        )
    if approval.args_hash != args_hash:
        raise ApprovalMismatchError(
            approval.approval_id, approval.action, "the call about to be made differs from the approved one"
        )


def _expired(approval: Approval) -> bool:
    return approval.expires_at is not None and approval.expires_at <= store.now()


def _fields(ctx: RunContext, seq: int, kind: str, action: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "run_id": ctx.run_id,
        "seq": seq,
        "kind": kind,
        "action": action,
        "args": codec.to_json(payload),
        "args_hash": codec.digest(payload),
    }


def _park(
    ctx: RunContext,
    status: RunStatus,
    wake_at: datetime | None,
    detail: dict[str, Any],
    *,
    ask: tuple[dict[str, Any], datetime | None] | None = None,
) -> NoReturn:
    """Suspend the run, first opening an approval when ``ask`` (fields, expiry) is given."""
    with ctx.engine.store.fenced(ctx.run_id, ctx.run.epoch) as conn:
        if ask is not None:
            detail = {"approval_id": gates.open_approval(conn, *ask)}
        waiting = {**detail, "seq": ctx._seq}
        store.suspend(conn, ctx.run_id, status, wake_at, json.dumps(waiting))
        # a decision may have landed since we looked: then it found the run running, so wake it here
        if gates.decided(conn, waiting["approval_id"]):
            store.wake(conn, ctx.run_id, [status])
    raise Suspended(ctx.run_id, status.value, waiting)
