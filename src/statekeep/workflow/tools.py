"""Tool calls through the ledger, and the approval gate in front of them.

A call is recorded ``started`` (with its idempotency key ``<run>/<seq>/<index>``)
before the tool runs, and ``completed`` together with the step's completion
after. A ``started`` call found on resume is ambiguous: it is never re-run
blindly. The tool's reconciler decides; without one (or when it cannot tell) the
run waits as ``needs_decision`` for a person, through an ``ambiguous`` approval.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NoReturn

from statekeep import tracing
from statekeep.errors import (
    ApprovalExpiredError,
    ApprovalMismatchError,
    ApprovalRejectedError,
    InvalidInputError,
    StepFailedError,
    Suspended,
)
from statekeep.workflow import codec, spans
from statekeep.workflow._types import Approval, LedgerEntry, Reconciliation, RunStatus
from statekeep.workflow.execution import Execution
from statekeep.workflow.registry import Tool
from statekeep.workflow.run_write import now


def call(exe: Execution, tool: Tool[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call ``tool`` at the run's next journal position; see the module docstring."""
    seq, recorded = exe.position(tool.name, "tool")
    index = exe.next_call_index()
    if recorded is not None:
        return recorded.value
    try:
        payload = {"args": list(args), "kwargs": kwargs}
        encoded = codec.to_json(payload)
    except codec.NotJSONError as exc:
        raise InvalidInputError(f"arguments of tool {tool.name!r} are not JSON: {exc}", field="args") from exc
    key = f"{exe.run_id}/{seq}/{index}"
    with spans.tool_call(exe.run, tool.name, seq, key):
        if tool.gate is not None:
            _check_gate(exe, seq, tool, payload)
        entry = exe.store.tool_call(exe.run_id, seq)
        if entry is None:
            with exe.write() as tx:
                tx.extend_lease(exe.lease)  # the whole lease for the call, or no call
                tx.start_call(seq, tool.name, key, encoded)
            return _invoke(exe, seq, tool, key, args, kwargs)
        if entry.status == "completed":
            tracing.note(spans.LEDGER_OUTCOME, "completed earlier; recorded now")
            return _complete(exe, seq, tool, codec.to_json(entry.result))
        return _settle(exe, seq, tool, entry)


def _invoke(
    exe: Execution, seq: int, tool: Tool[Any, Any], key: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    try:
        value = exe.invoke(tool.fn, (key, *args), kwargs)
    except Exception as exc:
        # the tool returned control with an error: it did not complete, so the call may be made again
        with exe.write() as tx:
            tx.drop_call(seq)
        tracing.note(spans.LEDGER_OUTCOME, "failed; dropped from the ledger")
        raise StepFailedError(exe.run_id, tool.name, seq, 1, repr(exc)) from exc
    tracing.note(spans.LEDGER_OUTCOME, "executed")
    return _complete(exe, seq, tool, exe.encode(tool.name, value))


def _complete(exe: Execution, seq: int, tool: Tool[Any, Any], output: str) -> Any:
    with exe.write() as tx:
        tx.complete_call(seq, output)
        return exe.record(tx, seq, tool.name, "tool", codec.digest(output), output)


def _settle(exe: Execution, seq: int, tool: Tool[Any, Any], entry: LedgerEntry) -> Any:
    """An ambiguous call: a person's decision, then the reconciler, then ask a person."""
    decision = exe.store.approval_at(exe.run_id, seq, "ambiguous")
    if decision is not None and decision.status == "pending":
        _park(exe, RunStatus.NEEDS_DECISION, None, {"approval_id": decision.approval_id})
    if decision is not None and decision.decided_at is not None and decision.decided_at > entry.started_at:
        spans.approval_waited(decision)
        if decision.status == "rejected":  # it happened; the person supplied its result
            return _complete(exe, seq, tool, codec.to_json(decision.result))
        if decision.status == "approved":
            return _rerun(exe, seq, tool, entry)
    verdict = tool.reconciler(entry) if tool.reconciler is not None else Reconciliation(None)
    tracing.note(spans.LEDGER_OUTCOME, f"ambiguous; reconciler: {verdict.happened}")
    if verdict.happened is True:
        return _complete(exe, seq, tool, exe.encode(tool.name, verdict.result))
    if verdict.happened is False:
        return _rerun(exe, seq, tool, entry)
    fields = _fields(seq, "ambiguous", tool.name, {"args": entry.args, "kwargs": entry.kwargs})
    fields["reason"] = f"tool call {entry.key} started but never completed; did it happen?"
    return _park(exe, RunStatus.NEEDS_DECISION, None, {}, ask=(fields, None))


def _rerun(exe: Execution, seq: int, tool: Tool[Any, Any], entry: LedgerEntry) -> Any:
    with exe.write() as tx:
        tx.extend_lease(exe.lease)
        tx.restart_call(seq)
    return _invoke(exe, seq, tool, entry.key, tuple(entry.args), entry.kwargs)


def _check_gate(exe: Execution, seq: int, tool: Tool[Any, Any], payload: dict[str, Any]) -> None:
    """Return only when an unexpired approval of exactly these arguments is recorded."""
    assert tool.gate is not None
    approval = exe.store.approval_at(exe.run_id, seq, "gate")
    if approval is None or approval.status == "withdrawn":  # nobody decided it: ask (again)
        fields = _fields(seq, "gate", tool.name, payload)
        fields["reason"] = tool.gate.reason
        expires = None if tool.gate.expires_in is None else now() + tool.gate.expires_in
        _park(exe, RunStatus.WAITING_FOR_APPROVAL, expires, {}, ask=(fields, expires))
    if approval.status == "pending" and not _expired(approval):
        _park(exe, RunStatus.WAITING_FOR_APPROVAL, approval.expires_at, {"approval_id": approval.approval_id})
    spans.approval_waited(approval)
    _refuse_unless_approved(exe, approval, codec.digest(payload))


def _refuse_unless_approved(exe: Execution, approval: Approval, args_hash: str) -> None:
    if approval.status == "pending":  # expired while pending: fail closed, and record it
        with exe.write() as tx:
            tx.expire_approval(approval.approval_id)
        raise ApprovalExpiredError(approval.approval_id, approval.action, "expired before a decision")
    if approval.status == "expired":
        raise ApprovalExpiredError(approval.approval_id, approval.action, "expired before a decision")
    if approval.status == "rejected":
        note = f": {approval.comment}" if approval.comment else ""
        raise ApprovalRejectedError(
            approval.approval_id, approval.action, f"rejected by {approval.decided_by}{note}"
        )
    if approval.status != "approved":  # fail closed on any status but a recorded approval
        reason = f"is {approval.status}, not approved"
        raise ApprovalExpiredError(approval.approval_id, approval.action, reason)
    if approval.args_hash != args_hash:
        raise ApprovalMismatchError(
            approval.approval_id, approval.action, "the call about to be made differs from the approved one"
        )


def _expired(approval: Approval) -> bool:
    return approval.expires_at is not None and approval.expires_at <= now()


def _fields(seq: int, kind: str, action: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "seq": seq,
        "kind": kind,
        "action": action,
        "args": codec.to_json(payload),
        "args_hash": codec.digest(payload),
    }


def _park(
    exe: Execution,
    status: RunStatus,
    wake_at: datetime | None,
    detail: dict[str, Any],
    *,
    ask: tuple[dict[str, Any], datetime | None] | None = None,
) -> NoReturn:
    """Suspend the run, first opening an approval when ``ask`` (fields, expiry) is given."""
    tracing.note(spans.LEDGER_OUTCOME, f"not run: {status.value}")
    with exe.write() as tx:
        if ask is not None:
            detail = {"approval_id": tx.open_approval(*ask)}
        waiting = {**detail, "seq": exe.seq}
        tx.suspend(status, wake_at, waiting)
        # a decision may have landed since we looked: then it found the run running, so wake it here
        if not tx.approval_pending(waiting["approval_id"]):
            tx.wake([status])
    raise Suspended(exe.run_id, status.value, waiting)
