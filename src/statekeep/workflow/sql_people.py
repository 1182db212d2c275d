"""Approvals and events of the SQL workflow store: the queue people decide from, and events sent to runs."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep._text import check_id, check_storable
from statekeep.errors import (
    ApprovalDecidedError,
    ApprovalExpiredError,
    ApprovalNotFoundError,
    InvalidInputError,
    RunFinishedError,
    RunNotFoundError,
)
from statekeep.keys import KeyRing
from statekeep.workflow import codec
from statekeep.workflow._types import FINISHED, Approval, RunStatus
from statekeep.workflow.base import APPROVAL_STATUSES, now
from statekeep.workflow.sql_base import SQLBase
from statekeep.workflow.sql_tx import approval_record, seal, wake
from statekeep.workflow.tables import approvals, events, runs
from statekeep.working.base import check_run_id

_WAITS_ON_PERSON = [RunStatus.WAITING_FOR_APPROVAL, RunStatus.NEEDS_DECISION]


class SQLPeople(SQLBase):
    """Approvals (listed, decided once) and events (delivered, or kept until the run waits)."""

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
            return [approval_record(r, self.keys) for r in conn.execute(q).mappings()]

    def approval(self, approval_id: str) -> Approval:
        """One approval by id.

        Raises:
            InvalidInputError: ``approval_id`` is not an id.
            ApprovalNotFoundError: no such approval.
        """
        check_id(approval_id, "approval_id")
        with self.db.read() as conn:
            return _approval(conn, approval_id, self.keys)

    def approval_at(self, run_id: str, seq: int, kind: str) -> Approval | None:
        q = sa.select(approvals).where(
            approvals.c.run_id == run_id, approvals.c.seq == seq, approvals.c.kind == kind
        )
        with self.db.read() as conn:
            row = conn.execute(q.order_by(approvals.c.created_at.desc())).mappings().first()
        return None if row is None else approval_record(row, self.keys)

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
        encoded = _check_decision(approval_id, approve, by, comment, result)
        owner = self._approval_owner(approval_id) if self.keys is not None else None
        self._prepare(owner)
        with self.db.begin() as conn:
            current = _approval(conn, approval_id, self.keys)
            expired = current.expires_at is not None and current.expires_at <= now()
            status = "expired" if expired else ("approved" if approve else "rejected")
            values: dict[str, Any] = {"status": status, "decided_at": now()}
            if not expired:
                sealed_comment = None if comment is None else seal(self.keys, owner, comment)
                values.update(decided_by=by, comment=sealed_comment, result=seal(self.keys, owner, encoded))
            q = approvals.update().where(
                approvals.c.approval_id == approval_id, approvals.c.status == "pending"
            )
            if conn.execute(q.values(values)).rowcount != 1:
                if current.status == "expired":  # by an earlier attempt, or a worker's resume
                    raise ApprovalExpiredError(approval_id, current.action, "expired before a decision")
                raise ApprovalDecidedError(approval_id, current.status)
            wake(conn, current.run_id, _WAITS_ON_PERSON)
            decided = _approval(conn, approval_id, self.keys)
        if expired:
            raise ApprovalExpiredError(approval_id, current.action, "expired before a decision")
        return decided

    def _approval_owner(self, approval_id: str) -> str | None:
        q = sa.select(runs.c.owner).join(approvals, approvals.c.run_id == runs.c.run_id)
        with self.db.read() as conn:
            return conn.execute(q.where(approvals.c.approval_id == approval_id)).scalar()

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
        owner = self._owner(run_id) if self.keys is not None else None
        self._prepare(owner)
        text = seal(self.keys, owner, text)
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


def _approval(conn: Connection, approval_id: str, keys: KeyRing | None) -> Approval:
    row = conn.execute(sa.select(approvals).where(approvals.c.approval_id == approval_id)).mappings().first()
    if row is None:
        raise ApprovalNotFoundError(approval_id)
    return approval_record(row, keys)


def _check_decision(approval_id: str, approve: bool, by: str, comment: str | None, result: Any) -> str:
    """Validate a decision before any query; return the encoded result."""
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
        return codec.to_json(result)
    except codec.NotJSONError as exc:
        raise InvalidInputError(str(exc), field="result") from exc


def _wake_waiter(conn: Connection, run_id: str, name: str) -> None:
    row = conn.execute(sa.select(runs.c.status, runs.c.waiting).where(runs.c.run_id == run_id)).first()
    if row is None or row.status != RunStatus.WAITING_FOR_EVENT.value:
        return
    waiting = codec.loads(row.waiting or "{}")
    if waiting.get("event") == name:
        wake(conn, run_id, [RunStatus.WAITING_FOR_EVENT])
