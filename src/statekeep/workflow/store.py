"""The SQL backend of the workflow store: runs, leases, the step journal and the ledger.

Every write a worker makes goes through :meth:`WorkflowStore.fenced`, which bumps
the run row only if the worker's lease epoch is still current: a worker whose
lease was taken over can read, but never advance the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep._numbers import check_int
from statekeep._text import check_id
from statekeep.db import Database
from statekeep.db.types import UTCDateTime
from statekeep.errors import (
    InvalidInputError,
    LeaseLostError,
    RunConflictError,
    RunFinishedError,
    RunNotFoundError,
)
from statekeep.workflow import codec
from statekeep.workflow._types import FINISHED, Checkpoint, Run, RunStatus, StepRecord, ToolCall
from statekeep.workflow.tables import approvals, runs, setup, steps, tool_calls
from statekeep.working.base import check_run_id

#: The largest journal position: seq columns are 32-bit integers.
MAX_SEQ = 2**31 - 1


def _statuses(status: RunStatus | str | Iterable[RunStatus | str]) -> list[RunStatus]:
    """One status, its name, or several, as statuses.

    Raises:
        InvalidInputError: a value that names no status.
    """
    given = [status] if isinstance(status, str) else status
    try:
        return [RunStatus(s) for s in given]
    except (TypeError, ValueError):
        names = ", ".join(s.value for s in RunStatus)
        raise InvalidInputError(f"must be one or more of {names}", field="status") from None


LIVE = [s.value for s in RunStatus if s not in FINISHED]


def now() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


class RunStore:
    """Runs, leases, journal and ledger in SQLite or PostgreSQL (see ``WorkflowStore``)."""

    def __init__(self, db: Database | str) -> None:
        self.db = db if isinstance(db, Database) else Database(db, setting="STATEKEEP_WORKFLOW_URL")
        setup(self.db)

    # --- runs -----------------------------------------------------------------------------

    def open_run(self, run: dict[str, Any]) -> Run:
        """Insert a new run (``run`` holds its columns) or return the existing one with that id.

        Raises:
            RunConflictError: the id is taken by another workflow or another input.
        """
        stamp = now()
        row = {**run, "created_at": stamp, "updated_at": stamp, "epoch": 0, "last_seq": 0}
        with self.db.begin() as conn:
            conn.execute(self.db.dialect.insert(runs).values(row).on_conflict_do_nothing())
            stored = self._get(conn, run["run_id"])
        if stored.workflow != run["workflow"]:
            raise RunConflictError(
                stored.run_id, f"belongs to workflow {stored.workflow!r}, not {run['workflow']!r}"
            )
        if codec.digest(stored.input) != run["input_hash"]:
            raise RunConflictError(stored.run_id, "was started with another input")
        return stored

    def get(self, run_id: str) -> Run:
        """The run with this id.

        Raises:
            RunNotFoundError: no such run.
        """
        check_run_id(run_id)
        with self.db.read() as conn:
            return self._get(conn, run_id)

    def find(self, run_id: str) -> Run | None:
        """The run with this id, or None."""
        check_run_id(run_id)
        with self.db.read() as conn:
            row = conn.execute(sa.select(runs).where(runs.c.run_id == run_id)).mappings().first()
        return None if row is None else codec.run_record(row)

    def _get(self, conn: Connection, run_id: str) -> Run:
        row = conn.execute(sa.select(runs).where(runs.c.run_id == run_id)).mappings().first()
        if row is None:
            raise RunNotFoundError(run_id)
        return codec.run_record(row)

    def list_runs(
        self,
        *,
        status: RunStatus | str | Iterable[RunStatus | str] | None = None,
        workflow: str | None = None,
        parent_id: str | None = None,
        limit: int = 1000,
    ) -> list[Run]:
        """Runs filtered by status (a status, its name, or several), workflow name or parent, oldest first."""
        q = (
            sa.select(runs)
            .order_by(runs.c.created_at, runs.c.run_id)
            .limit(check_int(limit, "limit", minimum=1))
        )
        if status is not None:
            q = q.where(runs.c.status.in_([s.value for s in _statuses(status)]))
        if workflow is not None:
            q = q.where(runs.c.workflow == check_id(workflow, "workflow"))
        if parent_id is not None:
            q = q.where(runs.c.parent_id == check_id(parent_id, "parent_id"))
        with self.db.read() as conn:
            return [codec.run_record(r) for r in conn.execute(q).mappings()]

    def checkpoint(self, run_id: str) -> Checkpoint:
        """The run's last completed step, latest working-state version and context cursor."""
        run = self.get(run_id)
        return Checkpoint(run.run_id, run.last_seq, run.state_version, run.cursor)

    def cancel(self, run_id: str) -> Run:
        """Cancel a live run; its lease is revoked (epoch bumped) so no worker advances it.

        Raises:
            RunNotFoundError: no such run.
            RunFinishedError: the run has already finished.
        """
        check_run_id(run_id)
        with self.db.begin() as conn:
            run = self._get(conn, run_id)
            if run.status.finished:
                raise RunFinishedError(run_id, run.status, "cancel it")
            conn.execute(
                runs.update()
                .where(runs.c.run_id == run_id)
                .values({**_finish_values(RunStatus.CANCELLED, None, "cancelled"), "epoch": runs.c.epoch + 1})
            )
            withdraw_approvals(conn, run_id)
            return self._get(conn, run_id)

    # --- leases ---------------------------------------------------------------------------

    def acquire(self, run_id: str, owner: str, lease: float) -> Run:
        """Take a run over for this process (explicit resume): bump its epoch, fencing others.

        Raises:
            RunNotFoundError: no such run.
        """
        with self.db.begin() as conn:
            run = self._get(conn, run_id)
            if run.status.finished:
                return run
            conn.execute(
                runs.update().where(runs.c.run_id == run_id).values(_lease_values(owner, lease, now()))
            )
            return self._get(conn, run_id)

    def claim(self, owner: str, lease: float, limit: int, workflows: Iterable[tuple[str, int]]) -> list[Run]:
        """Claim up to ``limit`` runnable runs of the given (workflow, version) pairs."""
        pairs = [sa.and_(runs.c.workflow == n, runs.c.version == v) for n, v in workflows]
        if not pairs:
            return []
        stamp = now()
        q = (
            sa.select(runs.c.run_id)
            .where(
                runs.c.runnable_at <= stamp,
                sa.or_(runs.c.lease_expires_at.is_(None), runs.c.lease_expires_at < stamp),
                runs.c.status.in_(LIVE),
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
                runs.update().where(runs.c.run_id.in_(ids)).values(_lease_values(owner, lease, stamp))
            )
            rows = conn.execute(sa.select(runs).where(runs.c.run_id.in_(ids))).mappings()
            return [codec.run_record(r) for r in rows]

    def heartbeat(self, run_id: str, epoch: int, lease: float) -> bool:
        """Extend a lease; False when the epoch is stale (the run was taken over)."""
        with self.db.begin() as conn:
            q = (
                runs.update()
                .where(runs.c.run_id == run_id, runs.c.epoch == epoch)
                .values(lease_expires_at=now() + timedelta(seconds=lease))
            )
            return bool(conn.execute(q).rowcount == 1)

    @contextmanager
    def fenced(self, run_id: str, epoch: int) -> Iterator[Connection]:
        """A write transaction that goes through only while ``epoch`` is the run's current one.

        Raises:
            LeaseLostError: another worker took the run over; nothing was written.
        """
        with self.db.begin() as conn:
            if conn.execute(_FENCE, {"rid": run_id, "ep": epoch, "now": now()}).rowcount != 1:
                raise LeaseLostError(run_id, epoch)
            yield conn

    # --- journal --------------------------------------------------------------------------

    def journal(self, run_id: str, start: int, size: int) -> list[StepRecord]:
        """Journal entries ``start <= seq < start + size`` of a run, in order."""
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
            return [codec.step_record(r) for r in conn.execute(q).mappings()]

    def steps(self, run_id: str) -> list[StepRecord]:
        """Every journal entry of a run, in order."""
        return self.journal(run_id, 1, MAX_SEQ)

    def tool_calls(self, run_id: str) -> list[ToolCall]:
        """Every ledger entry of a run, in order."""
        check_run_id(run_id)
        q = sa.select(tool_calls).where(tool_calls.c.run_id == run_id).order_by(tool_calls.c.seq)
        with self.db.read() as conn:
            return [codec.tool_call_record(r) for r in conn.execute(q).mappings()]

    def tool_call(self, run_id: str, seq: int) -> ToolCall | None:
        """The ledger entry at a journal position, or None."""
        check_run_id(run_id)
        check_int(seq, "seq", maximum=MAX_SEQ)
        q = sa.select(tool_calls).where(tool_calls.c.run_id == run_id, tool_calls.c.seq == seq)
        with self.db.read() as conn:
            row = conn.execute(q).mappings().first()
        return None if row is None else codec.tool_call_record(row)


# --- statement functions, run inside a fenced transaction ---------------------------------------


# hot statements are built once; values travel as bind parameters (no per-call compilation)
_FENCE = (
    runs.update()
    .where(runs.c.run_id == sa.bindparam("rid"), runs.c.epoch == sa.bindparam("ep"))
    .values(updated_at=sa.bindparam("now", type_=UTCDateTime))
)
_INSERT_STEP = steps.insert()
_CHECKPOINT = (
    runs.update()
    .where(runs.c.run_id == sa.bindparam("rid"), runs.c.epoch == sa.bindparam("ep"))
    .values(
        last_seq=sa.bindparam("seq", type_=sa.Integer),
        state_version=sa.func.coalesce(sa.bindparam("sv", type_=sa.Integer), runs.c.state_version),
        cursor=sa.func.coalesce(sa.bindparam("cur", type_=sa.BigInteger), runs.c.cursor),
        updated_at=sa.bindparam("now", type_=UTCDateTime),
    )
)


def record_step(conn: Connection, step: StepRecord, epoch: int) -> None:
    """Insert a journal entry and move the run's checkpoint forward, fenced by ``epoch``.

    Raises:
        LeaseLostError: another worker took the run over; the transaction must roll back.
    """
    params = {"rid": step.run_id, "ep": epoch, "seq": step.seq, "sv": step.state_version}
    # the fence first: a stale worker must hear "lease lost", not trip over the new owner's journal
    if conn.execute(_CHECKPOINT, {**params, "cur": step.cursor, "now": step.finished_at}).rowcount != 1:
        raise LeaseLostError(step.run_id, epoch)
    conn.execute(_INSERT_STEP, {k: getattr(step, k) for k in StepRecord.__slots__})


def start_call(conn: Connection, run_id: str, seq: int, tool: str, key: str, args: str) -> None:
    """Record a tool call as started, before it runs."""
    conn.execute(
        tool_calls.insert().values(
            run_id=run_id, seq=seq, tool=tool, key=key, args=args, status="started", started_at=now()
        )
    )


def restart_call(conn: Connection, run_id: str, seq: int) -> None:
    """Mark a settled ambiguous call as started again, just before it is re-run."""
    q = tool_calls.update().where(tool_calls.c.run_id == run_id, tool_calls.c.seq == seq)
    conn.execute(q.values(status="started", started_at=now()))


def drop_call(conn: Connection, run_id: str, seq: int) -> None:
    """Forget a started call whose tool raised: it reported that it did not complete."""
    conn.execute(tool_calls.delete().where(tool_calls.c.run_id == run_id, tool_calls.c.seq == seq))


def complete_call(conn: Connection, run_id: str, seq: int, result: str) -> None:
    """Store a tool call's result and mark it completed."""
    q = tool_calls.update().where(tool_calls.c.run_id == run_id, tool_calls.c.seq == seq)
    conn.execute(q.values(status="completed", result=result, completed_at=now()))


def suspend(conn: Connection, run_id: str, status: RunStatus, wake_at: datetime | None, waiting: str) -> None:
    """Park a run in a waiting state and release its lease."""
    conn.execute(
        runs.update()
        .where(runs.c.run_id == run_id)
        .values(
            status=status.value, runnable_at=wake_at, waiting=waiting, lease_owner=None, lease_expires_at=None
        )
    )


def finish(conn: Connection, run: Run, status: RunStatus, output: str | None, error: str | None) -> None:
    """End a run, and wake its parent if the parent waits for it."""
    conn.execute(
        runs.update().where(runs.c.run_id == run.run_id).values(_finish_values(status, output, error))
    )
    withdraw_approvals(conn, run.run_id)
    if run.parent_id is not None:
        wake(conn, run.parent_id, [RunStatus.WAITING_FOR_CHILD])


def withdraw_approvals(conn: Connection, run_id: str) -> None:
    """A run that ended asks nobody anything: its pending approvals become ``withdrawn``.

    They leave the queue people work from, and a late decision is refused.
    """
    q = approvals.update().where(approvals.c.run_id == run_id, approvals.c.status == "pending")
    conn.execute(q.values(status="withdrawn", decided_at=now()))


def wake(conn: Connection, run_id: str, waiting: Iterable[RunStatus]) -> bool:
    """Make a run runnable now if it is in one of the ``waiting`` states."""
    q = (
        runs.update()
        .where(runs.c.run_id == run_id, runs.c.status.in_([s.value for s in waiting]))
        .values(status=RunStatus.PENDING.value, runnable_at=now(), updated_at=now())
    )
    return bool(conn.execute(q).rowcount == 1)


def _finish_values(status: RunStatus, output: str | None, error: str | None) -> dict[str, Any]:
    stamp = now()
    return {
        "status": status.value,
        "output": output,
        "error": error,
        "finished_at": stamp,
        "updated_at": stamp,
        "runnable_at": None,
        "lease_owner": None,
        "lease_expires_at": None,
        "waiting": None,
    }


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
