"""The SQL side of a fenced write, and the mapping of rows onto records.

:class:`SQLRunWrite` is the :class:`~statekeep.workflow.run_write.RunWrite` of SQLite
and PostgreSQL: one connection inside one transaction that
:meth:`SQLWorkflowStore.fenced <statekeep.workflow.SQLWorkflowStore.fenced>`
opened after bumping the run row under the worker's epoch.

With a key ring, payloads are sealed here under the run owner's data key (which
``fenced`` made sure exists before the transaction began) and opened by the
row mappers.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from statekeep.db import Database
from statekeep.db.types import UTCDateTime
from statekeep.errors import LeaseLostError, RunNotFoundError
from statekeep.keys import KeyRing, is_sealed, no_key_ring
from statekeep.workflow import codec
from statekeep.workflow._types import Approval, LedgerEntry, Run, RunStatus, StepRecord
from statekeep.workflow.run_write import RunWrite, StagedState, now
from statekeep.workflow.tables import approvals, events, runs, steps, tool_calls
from statekeep.working import StateVersion, WorkingStateStore
from statekeep.working import sql as working_sql

# hot statements are built once; values travel as bind parameters (no per-call compilation)
FENCE = (
    runs.update()
    .where(runs.c.run_id == sa.bindparam("rid"), runs.c.epoch == sa.bindparam("ep"))
    .values(updated_at=sa.bindparam("now", type_=UTCDateTime))
)
#: the fence that also leases the run again (a tool call's start)
_HOLD = FENCE.values(lease_expires_at=sa.bindparam("expires", type_=UTCDateTime))
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

_PARK = (
    runs.update()
    .where(runs.c.run_id == sa.bindparam("rid"), runs.c.epoch == sa.bindparam("ep"))
    .values(
        status=sa.bindparam("st"),
        runnable_at=sa.bindparam("at", type_=UTCDateTime),
        waiting=sa.bindparam("w"),
        lease_owner=None,
        lease_expires_at=None,
        updated_at=sa.bindparam("now", type_=UTCDateTime),
    )
    .returning(*runs.c)
)


def fence(conn: Connection, run_id: str, epoch: int) -> None:
    """Bump the run row under ``epoch`` (locking it), or raise: the holder was taken over.

    Raises:
        LeaseLostError: ``epoch`` is not the run's current one.
    """
    if conn.execute(FENCE, {"rid": run_id, "ep": epoch, "now": now()}).rowcount != 1:
        raise LeaseLostError(run_id, epoch)


class SQLRunWrite(RunWrite):
    """A fenced transaction of one run over a SQLAlchemy connection.

    The fence is taken by the transaction's first write: a step's checkpoint is
    itself fenced by the epoch, so a step's completion (its state version, journal
    entry and checkpoint) writes the run row once, not twice; any other first write
    (through :attr:`conn`) bumps the run row under the epoch before it. A stale
    worker therefore hears "lease lost" before anything of its own is written.
    """

    def __init__(self, run: Run, conn: Connection, db: Database, keys: KeyRing | None = None) -> None:
        super().__init__(run)
        self._conn, self.db, self.keys = conn, db, keys
        self._fenced = False
        # a state version staged for the step's completion: inserted right after its checkpoint
        self._version: tuple[StateVersion, int] | None = None

    @property
    def conn(self) -> Connection:
        """The transaction's connection, fenced: the run row was bumped under the epoch first."""
        if not self._fenced:
            fence(self._conn, self._rid, self.run.epoch)
            self._fenced = True
        return self._conn

    def close(self) -> None:
        """Before the commit: write a version no checkpoint took; fence a transaction that wrote nothing."""
        self._write_version(self.conn)

    def _write_version(self, conn: Connection) -> None:
        """Insert the state version :meth:`save_state` staged, if any (the transaction is fenced)."""
        if self._version is not None:
            working_sql.append_after(conn, *self._version)
            self._version = None

    @property
    def _rid(self) -> str:
        return self.run.run_id

    def _seal(self, text: str) -> str:
        return seal(self.keys, self.run.owner, text)

    def connection(self, db: object) -> Connection | None:
        return self.conn if db is self.db else None

    def record_step(self, step: StepRecord) -> None:
        params = {"rid": step.run_id, "ep": self.run.epoch, "seq": step.seq, "sv": step.state_version}
        # the checkpoint is fenced by the epoch: a stale worker hears "lease lost", never a key clash
        if (
            self._conn.execute(_CHECKPOINT, {**params, "cur": step.cursor, "now": step.finished_at}).rowcount
            != 1
        ):
            raise LeaseLostError(step.run_id, self.run.epoch)
        self._fenced = True
        self._write_version(self._conn)
        row = {k: getattr(step, k) for k in StepRecord.__slots__}
        row["output"] = self._seal(step.output)
        self._conn.execute(_INSERT_STEP, row)

    def save_state(self, states: WorkingStateStore, staged: StagedState, latest: int | None) -> int:
        if not (isinstance(states, working_sql.SQLWorkingStateStore) and states.db is self.db):
            return super().save_state(states, staged, latest)
        _, record = staged  # same database: the version commits in this transaction
        record = states.sealed(record, self.run.owner)
        if latest is None:
            return working_sql.append(self.conn, record, None).version
        # written after the step's checkpoint (record_step), which fences the transaction
        self._version = (record, latest)
        return latest + 1

    def replace_journal(self, journal: list[StepRecord], version: int) -> None:
        self.conn.execute(steps.delete().where(steps.c.run_id == self._rid))
        for step in journal:
            row = {k: getattr(step, k) for k in step.__slots__}
            self.conn.execute(steps.insert().values({**row, "output": self._seal(step.output)}))
        last = max((s.seq for s in journal), default=0)
        self.conn.execute(
            runs.update().where(runs.c.run_id == self._rid).values(version=version, last_seq=last)
        )

    def start_call(self, seq: int, tool: str, key: str, args: str) -> None:
        self.conn.execute(
            tool_calls.insert().values(
                run_id=self._rid,
                seq=seq,
                tool=tool,
                key=key,
                args=self._seal(args),
                status="started",
                started_at=now(),
            )
        )

    def _call(self, seq: int) -> sa.Update:
        return tool_calls.update().where(tool_calls.c.run_id == self._rid, tool_calls.c.seq == seq)

    def extend_lease(self, seconds: float) -> None:
        stamp = now()
        params = {"rid": self._rid, "ep": self.run.epoch, "expires": stamp + timedelta(seconds=seconds)}
        if self._conn.execute(_HOLD, {**params, "now": stamp}).rowcount != 1:  # the fence itself
            raise LeaseLostError(self._rid, self.run.epoch)
        self._fenced = True

    def restart_call(self, seq: int) -> None:
        self.conn.execute(self._call(seq).values(status="started", started_at=now()))

    def drop_call(self, seq: int) -> None:
        self.conn.execute(
            tool_calls.delete().where(tool_calls.c.run_id == self._rid, tool_calls.c.seq == seq)
        )

    def complete_call(self, seq: int, result: str) -> None:
        self.conn.execute(
            self._call(seq).values(status="completed", result=self._seal(result), completed_at=now())
        )

    def open_approval(self, fields: dict[str, Any], expires_at: datetime | None) -> str:
        approval_id = uuid.uuid4().hex
        fields = {**fields, "args": self._seal(fields["args"])}
        self.conn.execute(
            approvals.insert().values(
                approval_id=approval_id,
                run_id=self._rid,
                status="pending",
                created_at=now(),
                expires_at=expires_at,
                **fields,
            )
        )
        return approval_id

    def approval_pending(self, approval_id: str) -> bool:
        # FOR SHARE: a decision being written right now is waited for and then seen (READ
        # COMMITTED would read the old row, and the decider's wake finds the run still running)
        q = sa.select(approvals.c.status).where(approvals.c.approval_id == approval_id)
        return bool(self.conn.execute(q.with_for_update(read=True)).scalar_one() == "pending")

    def expire_approval(self, approval_id: str) -> None:
        q = approvals.update().where(approvals.c.approval_id == approval_id, approvals.c.status == "pending")
        self.conn.execute(q.values(status="expired", decided_at=now()))

    def take_event(self, name: str, seq: int) -> tuple[bool, Any]:
        q = (
            sa.select(events.c.id, events.c.payload)
            .where(events.c.run_id == self._rid, events.c.name == name, events.c.consumed_seq.is_(None))
            .order_by(events.c.id)
            .limit(1)
        )
        row = self.conn.execute(q).first()
        if row is None:
            return False, None
        self.conn.execute(events.update().where(events.c.id == row.id).values(consumed_seq=seq))
        return True, codec.loads(unseal(self.keys, row.payload, f"run {self._rid!r}"))

    def suspend(self, status: RunStatus, wake_at: datetime | None, waiting: dict[str, Any]) -> None:
        # fenced by the epoch itself, and read back in the same statement: the engine returns it
        values = {"st": status.value, "at": wake_at, "w": json.dumps(waiting), "now": now()}
        row = self._conn.execute(_PARK, {"rid": self._rid, "ep": self.run.epoch, **values}).mappings().first()
        if row is None:
            raise LeaseLostError(self._rid, self.run.epoch)
        self._fenced = True
        self.parked = run_record(row, self.keys)

    def wake(self, waiting: Iterable[RunStatus]) -> bool:
        self.parked = None  # no longer as parked
        return wake(self.conn, self._rid, waiting)

    def finish(self, status: RunStatus, output: str | None, error: str | None) -> None:
        output = None if output is None else self._seal(output)
        error = None if error is None else self._seal(error)
        self.conn.execute(
            runs.update().where(runs.c.run_id == self._rid).values(finish_values(status, output, error))
        )
        withdraw_approvals(self.conn, self._rid)
        if self.run.parent_id is not None:
            wake(self.conn, self.run.parent_id, [RunStatus.WAITING_FOR_CHILD])

    def child_finished(self, child_id: str) -> bool:
        # FOR SHARE, for the same reason: a child finishing right now is waited for, then seen
        q = sa.select(runs.c.status).where(runs.c.run_id == child_id).with_for_update(read=True)
        return RunStatus(self.conn.execute(q).scalar_one()).finished


# --- statements shared with the store's own transactions ------------------------------------


def wake(conn: Connection, run_id: str, waiting: Iterable[RunStatus]) -> bool:
    """Make a run runnable now if it is in one of the ``waiting`` states."""
    q = (
        runs.update()
        .where(runs.c.run_id == run_id, runs.c.status.in_([s.value for s in waiting]))
        .values(status=RunStatus.PENDING.value, runnable_at=now(), updated_at=now())
    )
    return bool(conn.execute(q).rowcount == 1)


def get_run(conn: Connection, run_id: str, keys: KeyRing | None) -> Run:
    """The run with this id, read in ``conn``'s transaction.

    Raises:
        RunNotFoundError: no such run.
    """
    row = conn.execute(sa.select(runs).where(runs.c.run_id == run_id)).mappings().first()
    if row is None:
        raise RunNotFoundError(run_id)
    return run_record(row, keys)


def note_event(
    conn: Connection, run_id: str, name: str, payload: dict[str, Any], keys: KeyRing | None, owner: str | None
) -> None:
    """Record something that happened to a run as an event no wait consumes (``consumed_seq`` 0)."""
    text = seal(keys, owner, codec.to_json(payload))  # a retry's note holds the error: sealed like it
    conn.execute(
        events.insert().values(run_id=run_id, name=name, payload=text, created_at=now(), consumed_seq=0)
    )


def withdraw_approvals(conn: Connection, run_id: str) -> None:
    """A run that ended asks nobody anything: its pending approvals become ``withdrawn``.

    They leave the queue people work from, and a late decision is refused.
    """
    q = approvals.update().where(approvals.c.run_id == run_id, approvals.c.status == "pending")
    conn.execute(q.values(status="withdrawn", decided_at=now()))


def finish_values(status: RunStatus, output: str | None, error: str | None) -> dict[str, Any]:
    """The columns of a run that ends with ``status``."""
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


# --- sealing -----------------------------------------------------------------------------------


def seal(keys: KeyRing | None, owner: str | None, text: str) -> str:
    """``text`` sealed under ``owner``'s data key; plain without a key ring or an owner.

    Inside a write transaction: the key must exist already (``fenced`` prepared it).
    """
    if keys is None or owner is None:
        return text
    return keys.seal(owner, text, create=False)


def unseal(keys: KeyRing | None, text: str, whose: str = "a run") -> str:
    """The plain text of a stored payload (``whose``: the run it belongs to, for the error).

    Raises:
        SealedDataError: the payload is sealed and this store has no key ring, or its key was shredded.
    """
    if keys is not None:
        return keys.open(text)
    if text.startswith("sk1:") and is_sealed(text):
        raise no_key_ring(text, "workflow", whose)
    return text


def _whose(row: RowMapping) -> str:
    owner = row.get("owner")
    return f"run {row['run_id']!r}" + ("" if owner is None else f" (owner {owner!r})")


# --- rows onto records -----------------------------------------------------------------------


def _loads(text: str | None, keys: KeyRing | None = None, whose: str = "a run") -> Any:
    return None if text is None else json.loads(unseal(keys, text, whose))


def run_record(row: RowMapping, keys: KeyRing | None = None) -> Run:
    """Map a ``runs`` row onto a :class:`Run` (opening its sealed payloads with ``keys``)."""
    whose = _whose(row)
    return Run(
        run_id=row["run_id"],
        workflow=row["workflow"],
        version=row["version"],
        status=RunStatus(row["status"]),
        input=_loads(row["input"], keys, whose),
        output=_loads(row["output"], keys, whose),
        error=None if row["error"] is None else unseal(keys, row["error"], whose),
        parent_id=row["parent_id"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        finished_at=row["finished_at"],
        epoch=row["epoch"],
        lease_owner=row["lease_owner"],
        state_version=row["state_version"],
        cursor=row["cursor"],
        last_seq=row["last_seq"],
        waiting=_loads(row["waiting"]),
        trace_context=row.get("trace_context"),
        owner=row["owner"],
    )


def step_record(row: RowMapping, keys: KeyRing | None = None) -> StepRecord:
    """Map a ``steps`` row onto a :class:`StepRecord`."""
    values = {k: row[k] for k in StepRecord.__slots__}
    values["output"] = unseal(keys, values["output"], _whose(row))
    return StepRecord(**values)


def ledger_entry(row: RowMapping, keys: KeyRing | None = None) -> LedgerEntry:
    """Map a ``tool_calls`` row onto a :class:`LedgerEntry`."""
    whose = _whose(row)
    args = json.loads(unseal(keys, row["args"], whose))
    return LedgerEntry(
        run_id=row["run_id"],
        seq=row["seq"],
        tool=row["tool"],
        key=row["key"],
        args=args["args"],
        kwargs=args["kwargs"],
        status=row["status"],
        result=_loads(row["result"], keys, whose),
        started_at=row["started_at"],
        completed_at=row["completed_at"],
    )


def approval_record(row: RowMapping, keys: KeyRing | None = None) -> Approval:
    """Map an ``approvals`` row onto an :class:`Approval` (its arguments opened, for the person deciding)."""
    values = {k: row[k] for k in Approval.__slots__}
    whose = _whose(row)
    values["args"] = json.loads(unseal(keys, row["args"], whose))
    values["result"] = _loads(row["result"], keys, whose)
    values["comment"] = None if row["comment"] is None else unseal(keys, row["comment"], whose)
    return Approval(**values)
