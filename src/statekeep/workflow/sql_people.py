"""Approvals and events of the SQL workflow store: the queue people decide from, and events sent to runs."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep._check import check_id
from statekeep.errors import (
    ApprovalDecidedError,
    ApprovalExpiredError,
    ApprovalNotFoundError,
    RunFinishedError,
    RunNotFoundError,
)
from statekeep.keys import KeyRing
from statekeep.workflow import codec
from statekeep.workflow._types import (
    FINISHED,
    Approval,
    RunStatus,
)
from statekeep.workflow.base import (
    now,
)
from statekeep.workflow.rules import (
    check_approval_filters,
    check_approvals_page,
    check_decision,
    check_event,
)
from statekeep.workflow.sql_base import SQLBase, sealing_owner
from statekeep.workflow.sql_tx import (
    approval_record,
    seal,
    wake,
)
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
        limit: int | None = None,
        after: str | None = None,
    ) -> list[Approval]:
        q = sa.select(approvals).order_by(approvals.c.created_at, approvals.c.approval_id)
        for column, value in check_approval_filters(status, run_id, kind, action).items():
            q = q.where(approvals.c[column] == value)
        limit, after = check_approvals_page(limit, after)
        q = q.limit(limit)
        with self.db.read() as conn:
            if after is not None:
                mark = conn.execute(
                    sa.select(approvals.c.created_at).where(approvals.c.approval_id == after)
                ).scalar_one_or_none()
                if mark is None:
                    raise ApprovalNotFoundError(after)
                q = q.where(
                    sa.or_(
                        approvals.c.created_at > mark,
                        sa.and_(approvals.c.created_at == mark, approvals.c.approval_id > after),
                    )
                )
            return [approval_record(r, self.keys) for r in conn.execute(q).mappings()]

    def approval(self, approval_id: str) -> Approval:
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
        encoded = check_decision(approval_id, approve, by, comment, result)
        owner = self._decision_sealer(approval_id)
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

    def _decision_sealer(self, approval_id: str) -> str | None:
        """Whose key seals a decision: the run owner's when its worker sealed the question it asked.

        Deciding never makes a run unreadable for its worker: a run worked
        without a key ring gets a plain decision, whoever decides.
        """
        if self.keys is None:
            return None
        q = sa.select(runs.c.owner, approvals.c.args).join(approvals, approvals.c.run_id == runs.c.run_id)
        with self.db.read() as conn:
            row = conn.execute(q.where(approvals.c.approval_id == approval_id)).first()
        return None if row is None else sealing_owner(row.owner, row.args)

    def send_event(self, run_id: str, name: str, payload: Any = None) -> None:
        check_run_id(run_id)
        text = check_event(name, payload)
        owner = self._sealer(run_id)
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


def _wake_waiter(conn: Connection, run_id: str, name: str) -> None:
    row = conn.execute(sa.select(runs.c.status, runs.c.waiting).where(runs.c.run_id == run_id)).first()
    if row is None or row.status != RunStatus.WAITING_FOR_EVENT.value:
        return
    waiting = codec.loads(row.waiting or "{}")
    if waiting.get("event") == name:
        wake(conn, run_id, [RunStatus.WAITING_FOR_EVENT])
