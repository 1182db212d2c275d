"""The in-memory reference backend of the workflow store: for unit tests and notebooks, not for durability.

Everything lives in dicts in this process, behind one lock, and is lost when the
process ends. It keeps the contract the SQL backend keeps (the conformance suite
runs on both): a fenced transaction holds the lock from its first read to its
commit, stages its changes, and applies them only when its block ended without
an error and the run's epoch is still its own.

It holds every payload (inputs, outputs, tool arguments and results, approval
comments, event payloads) as plain JSON text in process memory: there is no key
ring (``keys=``) as in :class:`~statekeep.workflow.SQLWorkflowStore`, so nothing
is sealed, and erasing an owner drops the objects for Python's garbage collector.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from statekeep.errors import (
    ApprovalDecidedError,
    InvalidInputError,
    RunConflictError,
    RunFinishedError,
)
from statekeep.workflow import codec
from statekeep.workflow._types import LIVE, Approval, LedgerEntry, Run, RunStatus, StepRecord
from statekeep.workflow.base import Decision, Wanted, WorkflowStore
from statekeep.workflow.inmemory_tx import (
    MemoryRunWrite,
    RunRow,
    Stored,
    Tables,
    approval_record,
    finish,
    lapsed,
    ledger_entry,
    run_record,
    take_lease,
    wake,
    withdrawn,
)
from statekeep.workflow.rules import check_fork_point, forked_key, last_set
from statekeep.workflow.run_write import now

_WAITS_ON_PERSON = [RunStatus.WAITING_FOR_APPROVAL, RunStatus.NEEDS_DECISION]
_COUNTS = ("runs", "steps", "tool_calls", "approvals", "events")


class InMemoryWorkflowStore(WorkflowStore):
    """Runs, the journal, the ledger, approvals and events held in dicts; lost when the process ends.

    Thread-safe (one lock): workers in threads of one process may share it. Give
    every engine of a test the same instance, as processes would share a database.

    Examples:
        >>> from statekeep.workflow import Engine, Registry, RunContext
        >>> registry = Registry()
        >>> @registry.workflow("greet", version=1)
        ... def greet(ctx: RunContext, name: str) -> str:
        ...     return ctx.step("shout", str.upper, name)
        >>> store = InMemoryWorkflowStore()
        >>> Engine(store, registry).run(greet, "greet-ada", "ada").output
        'ADA'
        >>> [s.name for s in store.steps("greet-ada")]
        ['shout']
    """

    def __init__(self) -> None:
        self._tables = Tables()
        self._lock = threading.RLock()

    # --- runs -----------------------------------------------------------------------------

    def _open_run(self, run: dict[str, Any], parent: Run | None) -> Run:
        stamp = now()
        with self._lock:
            if parent is not None:
                self._tables.fence(parent.run_id, parent.epoch).row.updated_at = stamp
            stored = self._tables.runs.get(run["run_id"])
            if stored is None:
                fields = {**run, "status": RunStatus(run["status"]), "epoch": 0, "last_seq": 0}
                row = RunRow(**{**fields, "created_at": stamp, "updated_at": stamp})
                stored = self._tables.runs[row.run_id] = Stored(row)
            return run_record(stored.row)

    def _find(self, run_id: str) -> Run | None:
        with self._lock:
            stored = self._tables.runs.get(run_id)
            return None if stored is None else run_record(stored.row)

    def _list_runs(
        self, wanted: Wanted, workflow: str | None, parent_id: str | None, limit: int
    ) -> list[Run]:
        with self._lock:
            rows = [
                s.row
                for s in self._tables.runs.values()
                if (wanted is None or s.row.status in wanted)
                and (workflow is None or s.row.workflow == workflow)
                and (parent_id is None or s.row.parent_id == parent_id)
            ]
            rows.sort(key=lambda r: (r.created_at, r.run_id))
            return [run_record(r) for r in rows[:limit]]

    def _cancel(self, run_id: str) -> Run:
        with self._lock:
            stored = self._tables.get(run_id)
            if stored.row.status.finished:
                raise RunFinishedError(run_id, stored.row.status.value, "cancel it")
            finish(stored.row, RunStatus.CANCELLED, None, "cancelled")
            stored.row.epoch += 1
            for approval in withdrawn(stored.approvals.values()):
                self._tables.put_approval(approval)
            parent = self._tables.runs.get(stored.row.parent_id or "")
            if parent is not None:  # a parent waiting for it learns it ended, as it would of a failure
                wake(parent.row, [RunStatus.WAITING_FOR_CHILD])
            return run_record(stored.row)

    def _retry(self, run_id: str) -> Run:
        with self._lock:
            row = self._tables.get(run_id).row
            if row.status is not RunStatus.FAILED:
                raise InvalidInputError(
                    f"run {run_id!r} is {row.status.value}: only a failed run is retried", field="run_id"
                )
            error = row.error
            stamp = now()
            row.status, row.epoch, row.runnable_at, row.updated_at = (
                RunStatus.PENDING,
                row.epoch + 1,
                stamp,
                stamp,
            )
            row.output = row.error = row.finished_at = row.waiting = None
            row.lease_owner = row.lease_expires_at = None
            note = {"error": error, "after_seq": row.last_seq}
            self._tables.add_event(run_id, "statekeep.retried", codec.to_json(note), consumed_seq=0)
            return run_record(row)

    def _fork(self, run_id: str, at_seq: int, run: dict[str, Any]) -> Run:
        new_id = run["run_id"]
        with self._lock:
            source = self._tables.get(run_id)
            check_fork_point(run_id, source.row.last_seq, at_seq)
            taken = self._tables.runs.get(new_id)
            if taken is not None:
                existing = run_record(taken.row)  # forking again with the same input returns the fork
                if (
                    existing.workflow == source.row.workflow
                    and codec.digest(existing.input) == run["input_hash"]
                ):
                    return existing
                raise RunConflictError(new_id, "is taken by another run")
            forked = self._copy(source, new_id, at_seq, run)
            note = {"run_id": new_id, "at_seq": at_seq}
            self._tables.add_event(run_id, "statekeep.forked", codec.to_json(note), consumed_seq=0)
            return run_record(forked.row)

    def _copy(self, source: Stored, new_id: str, at_seq: int, run: dict[str, Any]) -> Stored:
        """A new pending run ``new_id`` holding ``source``'s journal and completed calls up to ``at_seq``."""
        journal = sorted((s for s in source.steps.values() if s.seq <= at_seq), key=lambda s: s.seq)
        stamp = now()
        row = replace(
            source.row,
            run_id=new_id,
            input=run["input"],
            input_hash=run["input_hash"],
            status=RunStatus.PENDING,
            runnable_at=stamp,
            created_at=stamp,
            updated_at=stamp,
            epoch=0,
            last_seq=at_seq,
            state_version=last_set(s.state_version for s in journal),
            cursor=last_set(s.cursor for s in journal),
            parent_id=None,
            output=None,
            error=None,
            finished_at=None,
            lease_owner=None,
            lease_expires_at=None,
            waiting=None,
            trace_context=None,
        )
        forked = self._tables.runs[new_id] = Stored(row, {s.seq: replace(s, run_id=new_id) for s in journal})
        for call in source.calls.values():
            if call.seq <= at_seq and call.status == "completed":
                key = forked_key(call.key, source.row.run_id, new_id)
                self._tables.put_call(forked, call.seq, replace(call, run_id=new_id, key=key))
        return forked

    # --- leases ---------------------------------------------------------------------------

    def _acquire(self, run_id: str, owner: str, lease: float, parent: Run | None) -> Run | None:
        with self._lock:
            fenced_by = None if parent is None else self._tables.fence(parent.run_id, parent.epoch)
            row = self._tables.get(run_id).row
            stamp = now()
            if fenced_by is not None:
                fenced_by.row.updated_at = stamp
            # with a parent: only a lapsed lease (a live holder may be inside a tool call)
            taken = row.status in LIVE and (parent is None or lapsed(row, stamp))
            if taken:
                take_lease(row, owner, lease)
            return run_record(row) if taken or row.status.finished else None

    def _claim(self, owner: str, lease: float, limit: int, workflows: list[tuple[str, int]]) -> list[Run]:
        pairs = set(workflows)  # a set for the membership test below (the base gave them distinct)
        with self._lock:
            stamp = now()
            due = [
                s.row
                for s in self._tables.runs.values()
                if s.row.runnable_at is not None
                and s.row.runnable_at <= stamp
                and lapsed(s.row, stamp)
                and s.row.status in LIVE
                and (s.row.workflow, s.row.version) in pairs
            ]
            due.sort(key=lambda r: r.runnable_at or stamp)
            for row in due[:limit]:
                take_lease(row, owner, lease)
            return [run_record(r) for r in due[:limit]]

    def _heartbeat(self, run_id: str, epoch: int, lease: float) -> bool:
        with self._lock:
            stored = self._tables.runs.get(run_id)
            if stored is None or stored.row.epoch != epoch:
                return False
            stored.row.lease_expires_at = now() + timedelta(seconds=lease)
            return True

    @contextmanager
    def _fenced(self, run: Run) -> Iterator[MemoryRunWrite]:
        with self._lock:
            tx = MemoryRunWrite(run, self._tables)
            yield tx
            tx.commit()

    # --- journal and ledger ---------------------------------------------------------------

    def _journal(self, run_id: str, start: int, last: int) -> list[StepRecord]:
        with self._lock:
            stored = self._tables.runs.get(run_id)
            found = [] if stored is None else [s for s in stored.steps.values() if start <= s.seq <= last]
        return sorted(found, key=lambda s: s.seq)

    def _tool_calls(self, run_id: str) -> list[LedgerEntry]:
        with self._lock:
            stored = self._tables.runs.get(run_id)
            return [] if stored is None else [ledger_entry(stored.calls[s]) for s in sorted(stored.calls)]

    def _tool_call(self, run_id: str, seq: int) -> LedgerEntry | None:
        with self._lock:
            stored = self._tables.runs.get(run_id)
            call = None if stored is None else stored.calls.get(seq)
            return None if call is None else ledger_entry(call)

    # --- approvals and events -------------------------------------------------------------

    def _approvals(self, wanted: dict[str, str], limit: int | None, after: str | None) -> list[Approval]:
        with self._lock:
            mark = None if after is None else self._tables.approval(after)
            found = [
                a
                for s in self._tables.runs.values()
                for a in s.approvals.values()
                if all(getattr(a, f) == v for f, v in wanted.items())
                and (mark is None or (a.created_at, a.approval_id) > (mark.created_at, mark.approval_id))
            ]
            found.sort(key=lambda a: (a.created_at, a.approval_id))
            return [approval_record(a) for a in found[:limit]]

    def _approval(self, approval_id: str) -> Approval:
        with self._lock:
            return approval_record(self._tables.approval(approval_id))

    def _approval_at(self, run_id: str, seq: int, kind: str) -> Approval | None:
        with self._lock:
            stored = self._tables.runs.get(run_id)
            found = [] if stored is None else list(stored.approvals.values())
            found = [a for a in found if a.seq == seq and a.kind == kind]
            latest = max(found, key=lambda a: a.created_at, default=None)
            return None if latest is None else approval_record(latest)

    def _decide(self, approval_id: str, decision: Decision) -> Approval:
        with self._lock:
            current = self._tables.approval(approval_id)
            if current.status == "expired":  # by an earlier attempt, or a worker's resume: the base raises
                return approval_record(current)
            if current.status != "pending":
                raise ApprovalDecidedError(approval_id, current.status)
            stamp = now()
            expired = current.expires_at is not None and current.expires_at <= stamp
            decided = replace(current, status="expired", decided_at=stamp)
            if not expired:
                decided = replace(
                    decided,
                    status="approved" if decision.approve else "rejected",
                    decided_by=decision.by,
                    comment=decision.comment,
                    result=decision.result,
                )
            self._tables.put_approval(decided)
            wake(self._tables.get(current.run_id).row, _WAITS_ON_PERSON)
        return approval_record(decided)

    def _send_event(self, run_id: str, name: str, text: str) -> None:
        with self._lock:
            row = self._tables.get(run_id).row
            if row.status.finished:
                raise RunFinishedError(run_id, row.status.value, f"receive event {name!r}")
            row.updated_at = now()
            self._tables.add_event(run_id, name, text)
            if (
                row.status is RunStatus.WAITING_FOR_EVENT
                and json.loads(row.waiting or "{}").get("event") == name
            ):
                wake(row, [RunStatus.WAITING_FOR_EVENT])

    # --- retention ------------------------------------------------------------------------

    def _finished_runs(self, workflow: str | None) -> list[tuple[str, str, datetime]]:
        with self._lock:
            return [
                (r.run_id, r.workflow, r.finished_at or r.updated_at)
                for r in (s.row for s in self._tables.runs.values())
                if r.status.finished and (workflow is None or r.workflow == workflow)
            ]

    def _delete_runs(self, run_ids: list[str]) -> int:
        with self._lock:
            return len(self._drop(run_ids))

    def _drop(self, run_ids: Iterable[str]) -> list[Stored]:
        """Delete the finished runs among ``run_ids`` with everything they hold; return what they held."""
        gone = []
        for run_id in dict.fromkeys(run_ids):
            stored = self._tables.runs.get(run_id)
            if stored is not None and stored.row.status.finished:
                gone.append(self._tables.remove(run_id))
        return gone

    # --- erasure --------------------------------------------------------------------------

    def _runs_of(self, owner: str) -> list[Run]:
        with self._lock:
            rows = [s.row for s in self._tables.runs.values() if s.row.owner == owner]
            rows.sort(key=lambda r: (r.created_at, r.run_id))
            return [run_record(r) for r in rows]

    def _delete_owner(self, owner: str) -> dict[str, int]:
        with self._lock:
            gone = self._drop([run_id for run_id, s in self._tables.runs.items() if s.row.owner == owner])
        counts = dict.fromkeys(_COUNTS, 0)
        for stored in gone:
            sizes = (1, len(stored.steps), len(stored.calls), len(stored.approvals), len(stored.events))
            for name, size in zip(_COUNTS, sizes, strict=True):
                counts[name] += size
        return counts
