"""The SQL backend of the workflow store (SQLite and PostgreSQL).

Every write a worker makes goes through :meth:`SQLWorkflowStore.fenced`, which
bumps the run row only if the worker's lease epoch is still current: a worker
whose lease was taken over can read, but never advance the run. Events sent to
a live run that is not (yet) waiting for them are kept in its mailbox until it
waits; events to a finished or unknown run are refused.

With a key ring (``keys=``), the payloads of a run that has an owner (its input,
output and error, step outputs, tool arguments and results, approval arguments,
comments and results, event payloads) are sealed with the owner's data key;
every read opens them, so callers see plain values.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep._check import check_id, check_int
from statekeep.db import Database
from statekeep.errors import (
    ApprovalDecidedError,
    ApprovalExpiredError,
    ApprovalNotFoundError,
    InvalidInputError,
    RunConflictError,
    RunFinishedError,
    RunNotFoundError,
)
from statekeep.keys import KeyRing
from statekeep.workflow import codec
from statekeep.workflow._types import FINISHED, Approval, LedgerEntry, Run, RunPage, RunStatus, StepRecord
from statekeep.workflow.base import (
    LIVE,
    MAX_SEQ,
    WorkflowStore,
    check_run_filters,
    now,
    page_of,
    run_matches,
    statuses,
)
from statekeep.workflow.rules import (
    check_approval_filters,
    check_decision,
    check_event,
    check_fork_point,
    check_retention,
    check_run_ids,
    forked_key,
    last_set,
    purge_selection,
    same_run,
)
from statekeep.workflow.sql_tx import (
    SQLRunWrite,
    approval_record,
    fence,
    finish_values,
    ledger_entry,
    run_record,
    seal,
    step_record,
    wake,
    withdraw_approvals,
)
from statekeep.workflow.tables import approvals, events, runs, setup, steps, tool_calls
from statekeep.working.base import check_run_id

_LIVE = [s.value for s in LIVE]
_WAITS_ON_PERSON = [RunStatus.WAITING_FOR_APPROVAL, RunStatus.NEEDS_DECISION]


class SQLWorkflowStore(WorkflowStore):
    """The workflow store in SQLite or PostgreSQL.

    Construct it from a :class:`~statekeep.db.Database` (to share transactions with
    the working-state store) or a URL. ``keys`` (a :class:`~statekeep.keys.KeyRing`)
    seals the payloads of owned runs.

    Examples:
        >>> store = SQLWorkflowStore("sqlite:///:memory:")
        >>> store.find("nope") is None
        True
    """

    def __init__(self, db: Database | str, *, keys: KeyRing | None = None) -> None:
        self.db = db if isinstance(db, Database) else Database(db, setting="STATEKEEP_WORKFLOW_URL")
        self.keys = keys
        setup(self.db)

    def _prepare(self, owner: str | None) -> None:
        """Make sure the owner's data key exists before a write transaction (creating it takes its own)."""
        if self.keys is not None and owner is not None and not self.keys.ready(owner):
            self.keys.prepare(owner)

    def _owner(self, run_id: str) -> str | None:
        with self.db.read() as conn:
            return conn.execute(sa.select(runs.c.owner).where(runs.c.run_id == run_id)).scalar()

    def close(self) -> None:
        self.db.dispose()

    # --- runs -----------------------------------------------------------------------------

    def open_run(self, run: dict[str, Any], *, parent: Run | None = None) -> Run:
        stamp = now()
        owner = run.get("owner")
        self._prepare(owner)
        row = {**run, "created_at": stamp, "updated_at": stamp, "epoch": 0, "last_seq": 0}
        row["input"] = seal(self.keys, owner, run["input"])
        with self.db.begin() as conn:
            if parent is not None:
                fence(conn, parent.run_id, parent.epoch)
            conn.execute(self.db.dialect.insert(runs).values(row).on_conflict_do_nothing())
            stored = _get(conn, run["run_id"], self.keys)
        return same_run(stored, run)

    def find(self, run_id: str) -> Run | None:
        check_run_id(run_id)
        with self.db.read() as conn:
            row = conn.execute(sa.select(runs).where(runs.c.run_id == run_id)).mappings().first()
        return None if row is None else run_record(row, self.keys)

    def list_runs(
        self,
        *,
        status: RunStatus | str | Iterable[RunStatus | str] | None = None,
        workflow: str | None = None,
        parent_id: str | None = None,
        limit: int = 1000,
    ) -> list[Run]:
        q = (
            sa.select(runs)
            .order_by(runs.c.created_at, runs.c.run_id)
            .limit(check_int(limit, "limit", minimum=1))
        )
        if status is not None:
            q = q.where(runs.c.status.in_([s.value for s in statuses(status)]))
        if workflow is not None:
            q = q.where(runs.c.workflow == check_id(workflow, "workflow"))
        if parent_id is not None:
            q = q.where(runs.c.parent_id == check_id(parent_id, "parent_id"))
        with self.db.read() as conn:
            return [run_record(r, self.keys) for r in conn.execute(q).mappings()]

    def search_runs(
        self,
        *,
        status: RunStatus | str | Iterable[RunStatus | str] | None = None,
        workflow: str | None = None,
        owner: str | Iterable[str] | None = None,
        text: str | None = None,
        run_ids: Iterable[str] | None = None,
        limit: int = 20,
        offset: int = 0,
    ) -> RunPage:
        owners, needle, ids = check_run_filters(owner, text, run_ids, limit, offset)
        where: list[sa.ColumnElement[bool]] = []
        if workflow is not None:
            where.append(runs.c.workflow == check_id(workflow, "workflow"))
        if owners is not None:
            where.append(sa.or_(*(_owned_by(o) for o in owners)))
        if ids is not None:
            where.append(runs.c.run_id.in_(ids))
        if needle is not None and self.keys is not None:  # sealed input: match what a person reads
            with self.db.read() as conn:
                rows = conn.execute(sa.select(runs).where(*where)).mappings().all()
            decoded = (run_record(r, self.keys) for r in rows)
            return page_of([r for r in decoded if run_matches(r, needle)], status, limit, offset)
        if needle is not None:
            where.append(_contains(needle))
        wanted = None if status is None else [s.value for s in statuses(status)]
        counted = sa.select(runs.c.status, sa.func.count()).where(*where).group_by(runs.c.status)
        page = sa.select(runs).where(*where)
        if wanted is not None:
            page = page.where(runs.c.status.in_(wanted))
        page = page.order_by(runs.c.created_at.desc(), runs.c.run_id.desc()).limit(limit).offset(offset)
        with self.db.read() as conn:
            counts = {str(s): int(n) for s, n in conn.execute(counted)}
            found = [run_record(r, self.keys) for r in conn.execute(page).mappings()]
        total = sum(n for s, n in counts.items() if wanted is None or s in wanted)
        return RunPage(found, total, offset, limit, counts)

    def workflow_names(self) -> list[str]:
        with self.db.read() as conn:
            q = sa.select(runs.c.workflow).distinct().order_by(runs.c.workflow)
            return [str(name) for name in conn.execute(q).scalars()]

    def cancel(self, run_id: str) -> Run:
        check_run_id(run_id)
        with self.db.begin() as conn:
            run = _get(conn, run_id, self.keys)
            if run.status.finished:
                raise RunFinishedError(run_id, run.status, "cancel it")
            conn.execute(
                runs.update()
                .where(runs.c.run_id == run_id)
                .values({**finish_values(RunStatus.CANCELLED, None, "cancelled"), "epoch": runs.c.epoch + 1})
            )
            withdraw_approvals(conn, run_id)
            if run.parent_id is not None:  # a parent waiting for it learns it ended, as it would of a failure
                wake(conn, run.parent_id, [RunStatus.WAITING_FOR_CHILD])
            return _get(conn, run_id, self.keys)

    def retry(self, run_id: str) -> Run:
        check_run_id(run_id)
        stamp = now()
        owner = self._owner(run_id) if self.keys is not None else None
        self._prepare(owner)
        with self.db.begin() as conn:
            error = _get(conn, run_id, self.keys).error
            reopen = (
                runs.update()
                .where(runs.c.run_id == run_id, runs.c.status == RunStatus.FAILED.value)
                .values(
                    status=RunStatus.PENDING.value,
                    output=None,
                    error=None,
                    finished_at=None,
                    runnable_at=stamp,
                    updated_at=stamp,
                    waiting=None,
                    lease_owner=None,
                    lease_expires_at=None,
                    lease_parent_epoch=None,
                    epoch=runs.c.epoch + 1,
                )
            )
            if conn.execute(reopen).rowcount != 1:
                status = _get(conn, run_id, self.keys).status.value
                raise InvalidInputError(
                    f"run {run_id!r} is {status}: only a failed run is retried", field="run_id"
                )
            run = _get(conn, run_id, self.keys)
            note = {"error": error, "after_seq": run.last_seq}
            _note(conn, run_id, "statekeep.retried", note, self.keys, owner)
        return run

    def fork(self, run_id: str, at_seq: int, run: dict[str, Any]) -> Run:
        check_run_id(run_id)
        new_id = check_run_id(run["run_id"])
        check_int(at_seq, "at_seq", maximum=MAX_SEQ)
        stamp = now()
        owner = self._owner(run_id)
        self._prepare(owner)
        with self.db.begin() as conn:
            source = _get(conn, run_id, self.keys)
            check_fork_point(run_id, source.last_seq, at_seq)
            schema = conn.execute(
                sa.select(runs.c.state_schema, runs.c.state_schema_version).where(runs.c.run_id == run_id)
            ).one()
            q = sa.select(steps).where(steps.c.run_id == run_id, steps.c.seq <= at_seq).order_by(steps.c.seq)
            raw = conn.execute(q).mappings().all()  # copied as stored: the fork has the same owner
            journal = [step_record(r, self.keys) for r in raw]
            row = {
                "run_id": new_id,
                "workflow": source.workflow,
                "version": source.version,
                "input": seal(self.keys, source.owner, run["input"]),
                "input_hash": run["input_hash"],
                "status": RunStatus.PENDING.value,
                "owner": source.owner,
                "runnable_at": stamp,
                "created_at": stamp,
                "updated_at": stamp,
                "epoch": 0,
                "last_seq": at_seq,
                "state_schema": schema.state_schema,
                "state_schema_version": schema.state_schema_version,
                "state_version": last_set(s.state_version for s in journal),
                "cursor": last_set(s.cursor for s in journal),
            }
            insert = self.db.dialect.insert(runs).values(row).on_conflict_do_nothing()
            if conn.execute(insert.returning(runs.c.run_id)).first() is None:  # the id is taken
                existing = _get(conn, new_id, self.keys)
                if existing.workflow == source.workflow and codec.digest(existing.input) == run["input_hash"]:
                    return existing
                raise RunConflictError(new_id, "is taken by another run")
            for stored in raw:
                conn.execute(steps.insert().values({**stored, "run_id": new_id}))
            calls = sa.select(tool_calls).where(
                tool_calls.c.run_id == run_id, tool_calls.c.seq <= at_seq, tool_calls.c.status == "completed"
            )
            for call in conn.execute(calls).mappings().all():
                renamed = forked_key(str(call["key"]), run_id, new_id)
                conn.execute(tool_calls.insert().values({**call, "run_id": new_id, "key": renamed}))
            _note(conn, run_id, "statekeep.forked", {"run_id": new_id, "at_seq": at_seq}, self.keys, owner)
            return _get(conn, new_id, self.keys)

    # --- leases ---------------------------------------------------------------------------

    def acquire(self, run_id: str, owner: str, lease: float, *, parent: Run | None = None) -> Run | None:
        stamp = now()
        take = runs.update().where(runs.c.run_id == run_id, runs.c.status.in_(_LIVE))
        if parent is not None:  # only a lapsed lease, or one held through the parent
            take = take.where(
                sa.or_(
                    runs.c.lease_expires_at.is_(None),
                    runs.c.lease_expires_at < stamp,
                    runs.c.lease_parent_epoch.is_not(None),
                )
            )
        via = None if parent is None else parent.epoch
        values = {**_lease_values(owner, lease, stamp), "lease_parent_epoch": via}
        with self.db.begin() as conn:
            if parent is not None:
                fence(conn, parent.run_id, parent.epoch)  # first: it locks the parent row
            taken = conn.execute(take.values(values)).rowcount == 1
            run = _get(conn, run_id, self.keys)
        return run if taken or run.status.finished else None

    def claim(self, owner: str, lease: float, limit: int, workflows: Iterable[tuple[str, int]]) -> list[Run]:
        pairs = [sa.and_(runs.c.workflow == n, runs.c.version == v) for n, v in workflows]
        if not pairs:
            return []
        stamp = now()
        q = (
            sa.select(runs.c.run_id)
            .where(
                runs.c.runnable_at <= stamp,
                sa.or_(runs.c.lease_expires_at.is_(None), runs.c.lease_expires_at < stamp),
                runs.c.status.in_(_LIVE),
                sa.or_(*pairs),
            )
            .order_by(runs.c.runnable_at)
            .limit(limit)
        )
        with self.db.begin() as conn:
            ids = list(conn.execute(self.db.dialect.claim(q)).scalars())
            if not ids:
                return []
            conn.execute(
                runs.update()
                .where(runs.c.run_id.in_(ids))
                .values({**_lease_values(owner, lease, stamp), "lease_parent_epoch": None})
            )
            rows = conn.execute(sa.select(runs).where(runs.c.run_id.in_(ids))).mappings()
            return [run_record(r, self.keys) for r in rows]

    def heartbeat(self, run_id: str, epoch: int, lease: float) -> bool:
        with self.db.begin() as conn:
            q = (
                runs.update()
                .where(runs.c.run_id == run_id, runs.c.epoch == epoch)
                .values(lease_expires_at=now() + timedelta(seconds=lease))
            )
            return bool(conn.execute(q).rowcount == 1)

    @contextmanager
    def fenced(self, run: Run) -> Iterator[SQLRunWrite]:
        self._prepare(run.owner)
        with self.db.begin() as conn:
            fence(conn, run.run_id, run.epoch)
            yield SQLRunWrite(run, conn, self.db, self.keys)

    # --- journal and ledger ---------------------------------------------------------------

    def journal(self, run_id: str, start: int, size: int) -> list[StepRecord]:
        check_run_id(run_id)
        check_int(start, "start", maximum=MAX_SEQ)
        check_int(size, "size", maximum=MAX_SEQ)
        last = min(start + size - 1, MAX_SEQ)  # bound inside the 32-bit column's range
        q = (
            sa.select(steps)
            .where(steps.c.run_id == run_id, steps.c.seq >= start, steps.c.seq <= last)
            .order_by(steps.c.seq)
        )
        with self.db.read() as conn:
            return [step_record(r, self.keys) for r in conn.execute(q).mappings()]

    def tool_calls(self, run_id: str) -> list[LedgerEntry]:
        check_run_id(run_id)
        q = sa.select(tool_calls).where(tool_calls.c.run_id == run_id).order_by(tool_calls.c.seq)
        with self.db.read() as conn:
            return [ledger_entry(r, self.keys) for r in conn.execute(q).mappings()]

    def tool_call(self, run_id: str, seq: int) -> LedgerEntry | None:
        check_run_id(run_id)
        check_int(seq, "seq", maximum=MAX_SEQ)
        q = sa.select(tool_calls).where(tool_calls.c.run_id == run_id, tool_calls.c.seq == seq)
        with self.db.read() as conn:
            row = conn.execute(q).mappings().first()
        return None if row is None else ledger_entry(row, self.keys)

    # --- approvals and events -------------------------------------------------------------

    def approvals(
        self,
        *,
        status: str | None = "pending",
        run_id: str | None = None,
        kind: str | None = None,
        action: str | None = None,
    ) -> list[Approval]:
        q = sa.select(approvals).order_by(approvals.c.created_at)
        for column, value in check_approval_filters(status, run_id, kind, action).items():
            q = q.where(approvals.c[column] == value)
        with self.db.read() as conn:
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
        check_run_id(run_id)
        text = check_event(name, payload)
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

    # --- retention ------------------------------------------------------------------------

    def purgeable(
        self,
        *,
        older_than: timedelta | None = None,
        keep_last: int | None = None,
        workflow: str | None = None,
    ) -> list[str]:
        check_retention(older_than, keep_last, workflow)
        finished = [s.value for s in FINISHED]
        q = sa.select(runs.c.run_id, runs.c.workflow, runs.c.finished_at).where(runs.c.status.in_(finished))
        if workflow is not None:
            q = q.where(runs.c.workflow == workflow)
        with self.db.read() as conn:
            rows = [(r.run_id, r.workflow, r.finished_at) for r in conn.execute(q)]
        return purge_selection(rows, older_than, keep_last)

    def delete_runs(self, run_ids: list[str]) -> int:
        run_ids = check_run_ids(run_ids)
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

    # --- erasure --------------------------------------------------------------------------

    def runs_of(self, owner: str) -> list[Run]:
        check_id(owner, "owner")
        q = sa.select(runs).where(runs.c.owner == owner).order_by(runs.c.created_at, runs.c.run_id)
        with self.db.read() as conn:
            return [run_record(r, self.keys) for r in conn.execute(q).mappings()]

    def delete_owner(self, owner: str) -> dict[str, int]:
        check_id(owner, "owner")
        finished = [s.value for s in FINISHED]
        counts = dict.fromkeys(("runs", "steps", "tool_calls", "approvals", "events"), 0)
        q = sa.select(runs.c.run_id).where(runs.c.owner == owner, runs.c.status.in_(finished))
        with self.db.begin(f"erasing the runs of {owner!r}") as conn:
            ids = list(conn.execute(q).scalars())
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                for name, table in (
                    ("steps", steps),
                    ("tool_calls", tool_calls),
                    ("approvals", approvals),
                    ("events", events),
                    ("runs", runs),
                ):
                    gone = conn.execute(table.delete().where(table.c.run_id.in_(chunk)))
                    counts[name] += int(gone.rowcount)
        return counts


def _get(conn: Connection, run_id: str, keys: KeyRing | None) -> Run:
    row = conn.execute(sa.select(runs).where(runs.c.run_id == run_id)).mappings().first()
    if row is None:
        raise RunNotFoundError(run_id)
    return run_record(row, keys)


def _owned_by(owner: str) -> sa.ColumnElement[bool]:
    """Runs of ``owner``, by the owner each run records (migration 5 filled it in for older runs)."""
    return runs.c.owner == owner


def _contains(text: str) -> sa.ColumnElement[bool]:
    """Runs whose id, workflow, error or input contains ``text``, in any case (inputs are ASCII JSON)."""
    escaped = json.dumps(text)[1:-1]  # how the text appears inside the stored input
    clauses = [
        column.icontains(text, autoescape=True) for column in (runs.c.run_id, runs.c.workflow, runs.c.error)
    ]
    clauses += [runs.c.input.icontains(needle, autoescape=True) for needle in {text, escaped}]
    return sa.or_(*clauses)


def _note(
    conn: Connection, run_id: str, name: str, payload: dict[str, Any], keys: KeyRing | None, owner: str | None
) -> None:
    """Record something that happened to a run as an event no wait consumes (``consumed_seq`` 0)."""
    text = seal(keys, owner, codec.to_json(payload))  # a retry's note holds the error: sealed like it
    conn.execute(
        events.insert().values(run_id=run_id, name=name, payload=text, created_at=now(), consumed_seq=0)
    )


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


def _lease_values(owner: str, lease: float, stamp: datetime) -> dict[str, Any]:
    # runnable_at stays set while running, so that the run is claimable once the lease lapses
    return {
        "status": RunStatus.RUNNING.value,
        "epoch": runs.c.epoch + 1,
        "lease_owner": owner,
        "lease_expires_at": stamp + timedelta(seconds=lease),
        "runnable_at": stamp,
        "updated_at": stamp,
    }
