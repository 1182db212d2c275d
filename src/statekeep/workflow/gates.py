"""Approvals, events and retention: the parts of the workflow store a person or a sender touches.

Events sent to a live run that is not (yet) waiting for them are kept in its
mailbox until it waits; events to a finished or unknown run are refused.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep._numbers import check_duration, check_int
from statekeep._text import check_id, check_storable
from statekeep.db import Database
from statekeep.errors import (
    ApprovalDecidedError,
    ApprovalExpiredError,
    ApprovalNotFoundError,
    InvalidInputError,
    RunFinishedError,
    RunNotFoundError,
)
from statekeep.workflow import codec
from statekeep.workflow._types import FINISHED, Approval, RunStatus
from statekeep.workflow.store import RunStore, now, wake
from statekeep.workflow.tables import approvals, events, runs, steps, tool_calls
from statekeep.working.base import check_run_id

APPROVAL_STATUSES = ("pending", "approved", "rejected", "expired", "withdrawn")
_WAITS_ON_PERSON = [RunStatus.WAITING_FOR_APPROVAL, RunStatus.NEEDS_DECISION]


class GateStore:
    """Approvals, events and retention over one :class:`~statekeep.db.Database`."""

    db: Database

    def approvals(
        self,
        *,
        status: str | None = "pending",
        run_id: str | None = None,
        kind: str | None = None,
        action: str | None = None,
    ) -> list[Approval]:
        """Approvals filtered by status (``pending`` by default; None for all), run, kind or action.

        Raises:
            InvalidInputError: a filter that is not a storable, non-empty string.
        """
        if status is not None and status not in APPROVAL_STATUSES:
            raise InvalidInputError(f"must be one of {APPROVAL_STATUSES} or None", field="status")
        if kind is not None and kind not in ("gate", "ambiguous"):
            raise InvalidInputError("must be 'gate', 'ambiguous' or None", field="kind")
        q = sa.select(approvals).order_by(approvals.c.created_at)
        filters = {"status": status, "run_id": run_id, "kind": kind, "action": action}
        for column, value in filters.items():
            if value is not None:
                q = q.where(approvals.c[column] == check_id(value, column))
        with self.db.read() as conn:
            return [codec.approval_record(r) for r in conn.execute(q).mappings()]

    def approval(self, approval_id: str) -> Approval:
        """One approval by id.

        Raises:
            InvalidInputError: ``approval_id`` is not an id.
            ApprovalNotFoundError: no such approval.
        """
        check_id(approval_id, "approval_id")
        with self.db.read() as conn:
            return _get(conn, approval_id)

    def decide(
        self, approval_id: str, *, approve: bool, by: str, comment: str | None = None, result: Any = None
    ) -> Approval:
        """Record a person's decision, once, and make the run runnable again.

        For an ``ambiguous`` tool call, approve means "it did not happen: run it";
        reject means "it happened", and ``result`` becomes the call's output.

        Raises:
            InvalidInputError: a bad id, ``by`` empty, ``approve`` not a bool, ``comment``
                not storable text, or ``result`` not JSON; nothing was written.
            ApprovalNotFoundError: no such approval.
            ApprovalDecidedError: the approval was already decided or withdrawn.
            ApprovalExpiredError: the approval expired (now or before); it is recorded as
                expired and fails closed.
        """
        check_id(approval_id, "approval_id")
        if not isinstance(by, str) or not by.strip():
            raise InvalidInputError("must name who decides", field="by")
        check_id(by, "by")
        if not isinstance(approve, bool):
            raise InvalidInputError("must be True or False", field="approve")
        if comment is not None:
            if not isinstance(comment, str):
                raise InvalidInputError("must be a string or None", field="comment")
            check_storable(comment, "comment")
        try:
            encoded = codec.to_json(result)
        except codec.NotJSONError as exc:
            raise InvalidInputError(str(exc), field="result") from exc
        with self.db.begin() as conn:
            current = _get(conn, approval_id)
            expired = current.expires_at is not None and current.expires_at <= now()
            status = "expired" if expired else ("approved" if approve else "rejected")
            values = {"status": status, "decided_at": now()}
            if not expired:
                values.update(decided_by=by, comment=comment, result=encoded)
            q = approvals.update().where(
                approvals.c.approval_id == approval_id, approvals.c.status == "pending"
            )
            if conn.execute(q.values(values)).rowcount != 1:
                if current.status == "expired":  # by an earlier attempt, or a worker's resume
                    raise ApprovalExpiredError(approval_id, current.action, "expired before a decision")
                raise ApprovalDecidedError(approval_id, current.status)
            wake(conn, current.run_id, _WAITS_ON_PERSON)
            decided = _get(conn, approval_id)
        if expired:
            raise ApprovalExpiredError(approval_id, current.action, "expired before a decision")
        return decided

    def send_event(self, run_id: str, name: str, payload: Any = None) -> None:
        """Deliver a named event to a run: woken if it waits for it, kept until it does otherwise.

        Raises:
            InvalidInputError: empty name or non-JSON payload; nothing was written.
            RunNotFoundError: no such run.
            RunFinishedError: the run has finished; the event is refused.
        """
        check_run_id(run_id)
        check_id(name, "name")
        try:
            text = codec.to_json(payload)
        except codec.NotJSONError as exc:
            raise InvalidInputError(str(exc), field="payload") from exc
        with self.db.begin() as conn:
            # lock the run row first, so a run suspending right now sees the event or is woken
            row = conn.execute(
                runs.update().where(runs.c.run_id == run_id).values(updated_at=now()).returning(runs.c.status)
            ).first()
            if row is None:
                raise RunNotFoundError(run_id)
            if RunStatus(row[0]) in FINISHED:
                raise RunFinishedError(run_id, row[0], f"receive event {name!r}")
            conn.execute(events.insert().values(run_id=run_id, name=name, payload=text, created_at=now()))
            _wake_waiter(conn, run_id, name)

    def purge(
        self,
        *,
        older_than: timedelta | None = None,
        keep_last: int | None = None,
        workflow: str | None = None,
    ) -> int:
        """Retention: delete finished runs older than an age, or beyond the last N per workflow.

        Live runs (anything not completed, failed or cancelled) are never touched.
        Returns the number of runs deleted. This deletes the workflow store's rows
        only; :meth:`Engine.purge <statekeep.workflow.Engine.purge>` also deletes
        the runs' working state.
        """
        return self.delete_runs(self.purgeable(older_than=older_than, keep_last=keep_last, workflow=workflow))

    def purgeable(
        self,
        *,
        older_than: timedelta | None = None,
        keep_last: int | None = None,
        workflow: str | None = None,
    ) -> list[str]:
        """The ids :meth:`purge` would delete, without deleting anything."""
        if older_than is None and keep_last is None:
            raise InvalidInputError("give older_than, keep_last, or both", field="older_than")
        if older_than is not None:
            check_duration(older_than, "older_than", positive=False)
        if keep_last is not None:
            check_int(keep_last, "keep_last")
        if workflow is not None:
            check_id(workflow, "workflow")
        with self.db.read() as conn:
            return _purgeable(conn, older_than, keep_last, workflow)

    def delete_runs(self, run_ids: list[str]) -> int:
        """Delete these finished runs with their journal, ledger, approvals and events; live ones are kept.

        Returns the number of runs deleted.
        """
        if not isinstance(run_ids, list | tuple):
            raise InvalidInputError("must be a list of run ids", field="run_ids")
        for run_id in run_ids:
            check_run_id(run_id)
        finished = [s.value for s in FINISHED]
        deleted = 0
        with self.db.begin() as conn:
            for start in range(0, len(run_ids), 500):
                q = sa.select(runs.c.run_id).where(
                    runs.c.run_id.in_(run_ids[start : start + 500]), runs.c.status.in_(finished)
                )
                chunk = list(conn.execute(q).scalars())
                for table in (steps, tool_calls, approvals, events, runs):
                    conn.execute(table.delete().where(table.c.run_id.in_(chunk)))
                deleted += len(chunk)
        return deleted


def _purgeable(
    conn: Connection, older_than: timedelta | None, keep_last: int | None, workflow: str | None
) -> list[str]:
    finished = [s.value for s in FINISHED]
    q = sa.select(runs.c.run_id, runs.c.workflow, runs.c.finished_at).where(runs.c.status.in_(finished))
    if workflow is not None:
        q = q.where(runs.c.workflow == workflow)
    rows = list(conn.execute(q.order_by(runs.c.finished_at.desc(), runs.c.run_id)))
    doomed: set[str] = set()
    if older_than is not None:
        cutoff = now() - older_than
        doomed |= {r.run_id for r in rows if r.finished_at < cutoff}
    if keep_last is not None:
        seen: dict[str, int] = {}
        for r in rows:
            seen[r.workflow] = seen.get(r.workflow, 0) + 1
            if seen[r.workflow] > keep_last:
                doomed.add(r.run_id)
    return sorted(doomed)


def _wake_waiter(conn: Connection, run_id: str, name: str) -> None:
    row = conn.execute(sa.select(runs.c.status, runs.c.waiting).where(runs.c.run_id == run_id)).first()
    if row is None or row.status != RunStatus.WAITING_FOR_EVENT.value:
        return
    waiting = codec.loads(row.waiting or "{}")
    if waiting.get("event") == name:
        wake(conn, run_id, [RunStatus.WAITING_FOR_EVENT])


def _get(conn: Connection, approval_id: str) -> Approval:
    row = conn.execute(sa.select(approvals).where(approvals.c.approval_id == approval_id)).mappings().first()
    if row is None:
        raise ApprovalNotFoundError(approval_id)
    return codec.approval_record(row)


def approval_at(conn: Connection, run_id: str, seq: int, kind: str) -> Approval | None:
    """The latest approval of ``kind`` a run opened at a journal position, if any."""
    q = sa.select(approvals).where(
        approvals.c.run_id == run_id, approvals.c.seq == seq, approvals.c.kind == kind
    )
    row = conn.execute(q.order_by(approvals.c.created_at.desc())).mappings().first()
    return None if row is None else codec.approval_record(row)


def decided(conn: Connection, approval_id: str) -> bool:
    """True once an approval is no longer pending (decided or expired)."""
    q = sa.select(approvals.c.status).where(approvals.c.approval_id == approval_id)
    return bool(conn.execute(q).scalar_one() != "pending")


def open_approval(conn: Connection, fields: dict[str, Any], expires_at: datetime | None) -> str:
    """Insert a pending approval; return its id."""
    approval_id = uuid.uuid4().hex
    conn.execute(
        approvals.insert().values(
            approval_id=approval_id, status="pending", created_at=now(), expires_at=expires_at, **fields
        )
    )
    return approval_id


def expire(conn: Connection, approval_id: str) -> None:
    """Mark a pending approval expired (fail closed)."""
    q = approvals.update().where(approvals.c.approval_id == approval_id, approvals.c.status == "pending")
    conn.execute(q.values(status="expired", decided_at=now()))


def take_event(conn: Connection, run_id: str, name: str, seq: int) -> tuple[bool, Any]:
    """Consume the oldest unconsumed event ``name`` of a run for the wait at ``seq``."""
    q = (
        sa.select(events.c.id, events.c.payload)
        .where(events.c.run_id == run_id, events.c.name == name, events.c.consumed_seq.is_(None))
        .order_by(events.c.id)
        .limit(1)
    )
    row = conn.execute(q).first()
    if row is None:
        return False, None
    conn.execute(events.update().where(events.c.id == row.id).values(consumed_seq=seq))
    return True, codec.loads(row.payload)


class WorkflowStore(RunStore, GateStore):
    """The workflow store: runs, journal, ledger, approvals, events and retention.

    Construct it from a :class:`~statekeep.db.Database` (to share transactions with
    the working-state store) or a URL.

    Examples:
        >>> store = WorkflowStore("sqlite:///:memory:")
        >>> store.find("nope") is None
        True
    """
