"""The rows of the in-memory workflow store, and its fenced write.

The rows mirror the SQL backend's five tables (runs, steps, tool_calls,
approvals, events), one :class:`Stored` per run holding that run's rows.
Payloads stay the JSON text the engine passed and are decoded on every read, so
no caller ever holds a reference into the store.

:class:`MemoryRunWrite` stages every change of a fenced transaction and applies
them in :meth:`~MemoryRunWrite.commit`, which the store calls only when the
``with`` block ended without an error and the run's epoch is still the one the
transaction was opened with.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

from statekeep.errors import (
    ApprovalNotFoundError,
    InvalidInputError,
    LeaseLostError,
    RunNotFoundError,
    StorageError,
)
from statekeep.workflow._types import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    CallStatus,
    LedgerEntry,
    Run,
    RunStatus,
    StepRecord,
)
from statekeep.workflow.run_write import RunWrite, now


@dataclass(slots=True)
class RunRow:
    """A run as stored; the payloads (``input``, ``output``, ``waiting``) are JSON text."""

    run_id: str
    workflow: str
    version: int
    input: str
    input_hash: str
    status: RunStatus
    created_at: datetime
    updated_at: datetime
    runnable_at: datetime | None = None
    parent_id: str | None = None
    output: str | None = None
    error: str | None = None
    finished_at: datetime | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    epoch: int = 0
    state_schema: str | None = None
    state_schema_version: int | None = None
    state_version: int | None = None
    cursor: int | None = None
    last_seq: int = 0
    waiting: str | None = None
    trace_context: str | None = None
    owner: str | None = None


@dataclass(slots=True)
class CallRow:
    """A tool call in the ledger; ``args`` and ``result`` are JSON text."""

    run_id: str
    seq: int
    tool: str
    key: str
    args: str
    status: CallStatus
    started_at: datetime
    result: str | None = None
    completed_at: datetime | None = None


@dataclass(slots=True)
class ApprovalRow:
    """An approval; ``args`` and ``result`` are JSON text."""

    approval_id: str
    run_id: str
    seq: int
    kind: ApprovalKind
    action: str
    args: str
    args_hash: str
    reason: str
    status: ApprovalStatus
    created_at: datetime
    expires_at: datetime | None
    decided_by: str | None = None
    decided_at: datetime | None = None
    comment: str | None = None
    result: str | None = None


@dataclass(slots=True)
class EventRow:
    """An event sent to a run (or a note of what happened to it: ``consumed_seq`` 0, never taken)."""

    id: int
    name: str
    payload: str
    created_at: datetime
    consumed_seq: int | None = None


@dataclass(slots=True)
class Stored:
    """One run with everything that belongs to it."""

    row: RunRow
    steps: dict[int, StepRecord] = field(default_factory=dict)
    calls: dict[int, CallRow] = field(default_factory=dict)
    approvals: dict[str, ApprovalRow] = field(default_factory=dict)
    events: list[EventRow] = field(default_factory=list)


class Tables:
    """Every run with its rows, and the indexes that span runs (approval ids, idempotency keys).

    Not locked itself: the store holds its lock around every use.
    """

    def __init__(self) -> None:
        self.runs: dict[str, Stored] = {}
        self.approval_runs: dict[str, str] = {}
        self.keys: set[str] = set()
        self._event_ids = itertools.count(1)

    def get(self, run_id: str) -> Stored:
        """The run ``run_id``.

        Raises:
            RunNotFoundError: no such run.
        """
        stored = self.runs.get(run_id)
        if stored is None:
            raise RunNotFoundError(run_id)
        return stored

    def fence(self, run_id: str, epoch: int) -> Stored:
        """The run ``run_id`` while ``epoch`` is its current one.

        Raises:
            LeaseLostError: it is not (or there is no such run).
        """
        stored = self.runs.get(run_id)
        if stored is None or stored.row.epoch != epoch:
            raise LeaseLostError(run_id, epoch)
        return stored

    def approval(self, approval_id: str) -> ApprovalRow:
        """The approval ``approval_id``.

        Raises:
            ApprovalNotFoundError: no such approval.
        """
        run_id = self.approval_runs.get(approval_id)
        if run_id is None:
            raise ApprovalNotFoundError(approval_id)
        return self.runs[run_id].approvals[approval_id]

    def put_approval(self, approval: ApprovalRow) -> None:
        stored = self.runs.get(approval.run_id)
        if stored is not None:
            stored.approvals[approval.approval_id] = approval
            self.approval_runs[approval.approval_id] = approval.run_id

    def put_call(self, stored: Stored, seq: int, call: CallRow | None) -> None:
        """Store, replace or (with None) drop the call at ``seq``, keeping the key index."""
        old = stored.calls.pop(seq, None)
        if old is not None:
            self.keys.discard(old.key)
        if call is not None:
            stored.calls[seq] = call
            self.keys.add(call.key)

    def add_event(self, run_id: str, name: str, payload: str, consumed_seq: int | None = None) -> None:
        """Append an event to a run's mailbox (``consumed_seq`` 0: a note no wait takes)."""
        event = EventRow(next(self._event_ids), name, payload, now(), consumed_seq)
        self.runs[run_id].events.append(event)

    def remove(self, run_id: str) -> Stored:
        """Delete a run with its rows and its entries in the indexes; return what it held."""
        stored = self.runs.pop(run_id)
        self.keys.difference_update(c.key for c in stored.calls.values())
        for approval_id in stored.approvals:
            del self.approval_runs[approval_id]
        return stored


# --- changes of a run row, shared by the store's own writes and the fenced ones ----------------


def wake(row: RunRow, waiting: Iterable[RunStatus]) -> bool:
    """Make a run runnable now if it is in one of the ``waiting`` states."""
    if row.status not in set(waiting):
        return False
    row.status, row.runnable_at = RunStatus.PENDING, now()
    row.updated_at = row.runnable_at
    return True


def finish(row: RunRow, status: RunStatus, output: str | None, error: str | None) -> None:
    """End a run with ``status``: it is unleased and runnable no more."""
    stamp = now()
    row.status, row.output, row.error = status, output, error
    row.finished_at = row.updated_at = stamp
    row.runnable_at = row.lease_owner = row.lease_expires_at = None
    row.waiting = None


def lapsed(row: RunRow, at: datetime) -> bool:
    """No worker holds the run at ``at``: it has no lease, or its lease has lapsed."""
    return row.lease_expires_at is None or row.lease_expires_at < at


def take_lease(row: RunRow, owner: str, lease: float) -> None:
    """Lease a run to ``owner``, bumping its epoch."""
    stamp = now()
    row.status, row.epoch, row.lease_owner = RunStatus.RUNNING, row.epoch + 1, owner
    row.lease_expires_at = stamp + timedelta(seconds=lease)
    # runnable_at stays set while running, so that the run is claimable once the lease lapses
    row.runnable_at = row.updated_at = stamp


def withdrawn(approvals: Iterable[ApprovalRow]) -> list[ApprovalRow]:
    """The pending ones of ``approvals``, withdrawn: a run that ended asks nobody anything."""
    return [replace(a, status="withdrawn", decided_at=now()) for a in approvals if a.status == "pending"]


# --- rows onto records -------------------------------------------------------------------------

_RUN_FIELDS = [f.name for f in fields(Run)]


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def run_record(row: RunRow) -> Run:
    """The :class:`Run` a row stores, its payloads decoded."""
    values = {name: getattr(row, name) for name in _RUN_FIELDS}
    values.update(input=json.loads(row.input), output=_loads(row.output), waiting=_loads(row.waiting))
    return Run(**values)


def ledger_entry(row: CallRow) -> LedgerEntry:
    """The :class:`LedgerEntry` a call row stores."""
    args = json.loads(row.args)
    return LedgerEntry(
        row.run_id,
        row.seq,
        row.tool,
        row.key,
        args["args"],
        args["kwargs"],
        row.status,
        _loads(row.result),
        row.started_at,
        row.completed_at,
    )


def approval_record(row: ApprovalRow) -> Approval:
    """The :class:`Approval` a row stores, its arguments and result decoded."""
    values = {name: getattr(row, name) for name in Approval.__slots__}
    values.update(args=json.loads(row.args), result=_loads(row.result))
    return Approval(**values)


# --- the fenced write --------------------------------------------------------------------------


class MemoryRunWrite(RunWrite):
    """A fenced transaction of one run: changes are staged here and applied by :meth:`commit`.

    The store holds its lock from the moment it opens the transaction until it
    commits or drops it, so reads inside the transaction see the stored rows plus
    what it staged, and nothing else changes under it.
    """

    def __init__(self, run: Run, tables: Tables) -> None:
        super().__init__(run)
        self.tables = tables
        self.stored = tables.fence(run.run_id, run.epoch)
        self.row = replace(self.stored.row, updated_at=now())
        self.steps: dict[int, StepRecord] = {}
        self.reset = False  # True: ``steps`` replaces the whole journal
        self.calls: dict[int, CallRow | None] = {}
        self.approvals: dict[str, ApprovalRow] = {}
        self.consumed: dict[int, int] = {}
        self.wake_parent = False

    def record_step(self, step: StepRecord) -> None:
        if step.run_id != self.run.run_id:
            raise InvalidInputError(f"belongs to run {step.run_id!r}, not {self.run.run_id!r}", field="step")
        if step.seq in self.steps or (not self.reset and step.seq in self.stored.steps):
            raise StorageError(f"run {step.run_id!r}: journal entry {step.seq} is already recorded")
        self.steps[step.seq] = step
        row = self.row
        row.last_seq, row.updated_at = step.seq, step.finished_at
        row.state_version = row.state_version if step.state_version is None else step.state_version
        row.cursor = row.cursor if step.cursor is None else step.cursor

    def replace_journal(self, journal: list[StepRecord], version: int) -> None:
        self.reset, self.steps = True, {s.seq: s for s in sorted(journal, key=lambda s: s.seq)}
        self.row.version, self.row.last_seq = version, max(self.steps, default=0)

    def _call(self, seq: int) -> CallRow | None:
        return self.calls[seq] if seq in self.calls else self.stored.calls.get(seq)

    def start_call(self, seq: int, tool: str, key: str, args: str) -> None:
        staged = {c.key for c in self.calls.values() if c is not None}
        if self._call(seq) is not None or key in self.tables.keys or key in staged:
            raise StorageError(f"run {self.run.run_id!r}: tool call {seq} ({key!r}) is already recorded")
        self.calls[seq] = CallRow(self.run.run_id, seq, tool, key, args, "started", now())

    def extend_lease(self, seconds: float) -> None:
        self.row.lease_expires_at = now() + timedelta(seconds=seconds)  # fenced by the epoch at commit

    def restart_call(self, seq: int) -> None:
        call = self._call(seq)
        if call is not None:
            self.calls[seq] = replace(call, status="started", started_at=now())

    def drop_call(self, seq: int) -> None:
        self.calls[seq] = None

    def complete_call(self, seq: int, result: str) -> None:
        call = self._call(seq)
        if call is not None:
            self.calls[seq] = replace(call, status="completed", result=result, completed_at=now())

    def _approval(self, approval_id: str) -> ApprovalRow:
        return self.approvals.get(approval_id) or self.tables.approval(approval_id)

    def open_approval(self, fields: dict[str, Any], expires_at: datetime | None) -> str:
        approval_id = uuid4().hex
        self.approvals[approval_id] = ApprovalRow(
            approval_id=approval_id,
            run_id=self.run.run_id,
            status="pending",
            created_at=now(),
            expires_at=expires_at,
            **fields,
        )
        return approval_id

    def approval_pending(self, approval_id: str) -> bool:
        return self._approval(approval_id).status == "pending"

    def expire_approval(self, approval_id: str) -> None:
        approval = self._approval(approval_id)
        if approval.status == "pending":
            self.approvals[approval_id] = replace(approval, status="expired", decided_at=now())

    def take_event(self, name: str, seq: int) -> tuple[bool, Any]:
        for event in self.stored.events:
            if event.name == name and event.consumed_seq is None and event.id not in self.consumed:
                self.consumed[event.id] = seq
                return True, json.loads(event.payload)
        return False, None

    def suspend(self, status: RunStatus, wake_at: datetime | None, waiting: dict[str, Any]) -> None:
        row = self.row
        row.status, row.runnable_at, row.waiting = status, wake_at, json.dumps(waiting)
        row.lease_owner = row.lease_expires_at = None

    def wake(self, waiting: Iterable[RunStatus]) -> bool:
        return wake(self.row, waiting)

    def finish(self, status: RunStatus, output: str | None, error: str | None) -> None:
        finish(self.row, status, output, error)
        mine = {**self.stored.approvals, **{a.approval_id: a for a in self.approvals.values()}}
        self.approvals.update((a.approval_id, a) for a in withdrawn(mine.values()))
        self.wake_parent = self.run.parent_id is not None

    def child_finished(self, child_id: str) -> bool:
        return self.tables.get(child_id).row.status.finished

    def commit(self) -> None:
        """Apply what was staged, if the run's epoch is still the transaction's.

        Raises:
            LeaseLostError: the run was taken over (or deleted) meanwhile; nothing was applied.
        """
        if self.tables.runs.get(self.run.run_id) is not self.stored:
            raise LeaseLostError(self.run.run_id, self.run.epoch)
        self.tables.fence(self.run.run_id, self.run.epoch)
        self.stored.row = self.row
        if self.reset:
            self.stored.steps = self.steps
        else:
            self.stored.steps.update(self.steps)
        for seq, call in self.calls.items():
            self.tables.put_call(self.stored, seq, call)
        for approval in self.approvals.values():
            self.tables.put_approval(approval)
        for event in self.stored.events:
            event.consumed_seq = self.consumed.get(event.id, event.consumed_seq)
        parent = self.tables.runs.get(self.run.parent_id or "") if self.wake_parent else None
        if parent is not None:
            wake(parent.row, [RunStatus.WAITING_FOR_CHILD])
