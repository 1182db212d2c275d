"""Approvals and events in SQL: the queue people decide from, and events sent to runs.

Functions over a :class:`~statekeep.db.Database` that
:class:`~statekeep.workflow.SQLWorkflowStore`'s primitives call with checked
arguments; a :class:`~statekeep.workflow.sql_sealing.Sealer` says whose key
seals what a person writes.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.db import Database
from statekeep.errors import (
    ApprovalDecidedError,
    ApprovalNotFoundError,
    RunFinishedError,
    RunNotFoundError,
)
from statekeep.keys import KeyRing
from statekeep.workflow import codec
from statekeep.workflow._types import FINISHED, Approval, RunStatus
from statekeep.workflow.base import Decision
from statekeep.workflow.run_write import now
from statekeep.workflow.sql_sealing import Sealer
from statekeep.workflow.sql_tx import approval_record, seal, wake
from statekeep.workflow.tables import approvals, events, runs

_WAITS_ON_PERSON = [RunStatus.WAITING_FOR_APPROVAL, RunStatus.NEEDS_DECISION]


def list_approvals(
    db: Database, keys: KeyRing | None, wanted: dict[str, str], limit: int | None, after: str | None
) -> list[Approval]:
    """Approvals whose columns equal ``wanted``, after the approval ``after``, oldest first.

    Raises:
        ApprovalNotFoundError: no approval has the id ``after``.
    """
    q = sa.select(approvals).order_by(approvals.c.created_at, approvals.c.approval_id)
    for column, value in wanted.items():
        q = q.where(approvals.c[column] == value)
    q = q.limit(limit)
    with db.read() as conn:
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
        return [approval_record(r, keys) for r in conn.execute(q).mappings()]


def approval_at(db: Database, keys: KeyRing | None, run_id: str, seq: int, kind: str) -> Approval | None:
    """The latest approval of ``kind`` the run opened at ``seq``, if any."""
    q = sa.select(approvals).where(
        approvals.c.run_id == run_id, approvals.c.seq == seq, approvals.c.kind == kind
    )
    with db.read() as conn:
        row = conn.execute(q.order_by(approvals.c.created_at.desc())).mappings().first()
    return None if row is None else approval_record(row, keys)


def decide(db: Database, sealer: Sealer, approval_id: str, decision: Decision) -> Approval:
    """Write a decision on a pending approval, or record it expired; wake the run either way.

    Raises:
        ApprovalNotFoundError: no such approval.
        ApprovalDecidedError: it was already decided or withdrawn.
        ApprovalExpiredError: it had expired before; nothing was written.
    """
    keys = sealer.keys
    owner = sealer.of_decision(approval_id)
    sealer.prepare(owner)
    with db.begin() as conn:
        current = approval(conn, approval_id, keys)
        expired = current.expires_at is not None and current.expires_at <= now()
        status = "expired" if expired else ("approved" if decision.approve else "rejected")
        values: dict[str, Any] = {"status": status, "decided_at": now()}
        if not expired:
            comment = None if decision.comment is None else seal(keys, owner, decision.comment)
            values.update(decided_by=decision.by, comment=comment, result=seal(keys, owner, decision.result))
        q = approvals.update().where(approvals.c.approval_id == approval_id, approvals.c.status == "pending")
        if conn.execute(q.values(values)).rowcount != 1:
            if current.status == "expired":  # by an earlier attempt, or a worker's resume: the base raises
                return current
            raise ApprovalDecidedError(approval_id, current.status)
        wake(conn, current.run_id, _WAITS_ON_PERSON)
        return approval(conn, approval_id, keys)


def send_event(db: Database, sealer: Sealer, run_id: str, name: str, text: str) -> None:
    """Keep an event (``text``: its JSON payload) for a run, and wake the run if it waits for ``name``.

    Raises:
        RunNotFoundError: no such run.
        RunFinishedError: the run has finished.
    """
    owner = sealer.of_run(run_id)
    sealer.prepare(owner)
    text = seal(sealer.keys, owner, text)
    with db.begin() as conn:
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


def approval(conn: Connection, approval_id: str, keys: KeyRing | None) -> Approval:
    """One approval, read in ``conn``'s transaction.

    Raises:
        ApprovalNotFoundError: no such approval.
    """
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
