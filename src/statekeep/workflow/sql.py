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
from datetime import timedelta
from functools import partial
from typing import Any

import sqlalchemy as sa

from statekeep._check import check_id, check_int
from statekeep.db.types import UTCDateTime
from statekeep.errors import (
    InvalidInputError,
    RunConflictError,
    RunFinishedError,
)
from statekeep.workflow import codec
from statekeep.workflow._types import (
    LedgerEntry,
    ReplayEntry,
    Run,
    RunPage,
    RunStatus,
    StepRecord,
)
from statekeep.workflow.base import (
    LIVE,
    MAX_SEQ,
    check_run_filters,
    now,
    page_of,
    run_matches,
    statuses,
)
from statekeep.workflow.rules import (
    check_fork_point,
    forked_key,
    last_set,
    same_run,
)
from statekeep.workflow.sql_base import get_run, note_event
from statekeep.workflow.sql_people import SQLPeople
from statekeep.workflow.sql_retention import SQLRetention
from statekeep.workflow.sql_tx import (
    SQLRunWrite,
    fence,
    finish_values,
    ledger_entry,
    run_record,
    seal,
    step_record,
    unseal,
    wake,
    withdraw_approvals,
)
from statekeep.workflow.tables import runs, steps, tool_calls
from statekeep.working.base import check_run_id

_LIVE = [s.value for s in LIVE]
# hot statements of a resume, built once; a plain bound comparison per live status, not an
# expanding IN list (whose parameters are rendered on every call)
_IS_LIVE = sa.or_(*(runs.c.status == s for s in _LIVE))


def _lapsed(at: Any) -> sa.ColumnElement[bool]:
    """No worker holds the run at ``at`` (a time or a bound parameter): no lease, or a lapsed one."""
    return sa.or_(runs.c.lease_expires_at.is_(None), runs.c.lease_expires_at < at)


_FIND = sa.select(runs).where(runs.c.run_id == sa.bindparam("rid"))
#: What taking a lease writes (values bound by :func:`_lease_params`). runnable_at stays set while
#: running, so that the run is claimable once the lease lapses.
_LEASE = {
    "status": RunStatus.RUNNING.value,
    "epoch": runs.c.epoch + 1,
    "lease_owner": sa.bindparam("holder"),
    "lease_expires_at": sa.bindparam("expires", type_=UTCDateTime),
    "runnable_at": sa.bindparam("now", type_=UTCDateTime),
    "updated_at": sa.bindparam("now", type_=UTCDateTime),
    # no longer read; cleared so that a worker of an older version, which took a child with a
    # live lease when this was set, never does so behind a worker of this one
    "lease_parent_epoch": None,
}
_TAKE = runs.update().where(runs.c.run_id == sa.bindparam("rid"), _IS_LIVE).values(_LEASE).returning(*runs.c)
# a child taken through its parent: only a lapsed lease, whoever held it (a live holder, even one
# fenced out of the parent, may be inside a tool call of the child: taking it would call it again)
_TAKE_CHILD = _TAKE.where(_lapsed(sa.bindparam("now", type_=UTCDateTime)))
_REPLAY = (
    sa.select(steps.c.seq, steps.c.name, steps.c.kind, steps.c.state_version, steps.c.output)
    .where(
        steps.c.run_id == sa.bindparam("rid"),
        steps.c.seq >= sa.bindparam("lo"),
        steps.c.seq <= sa.bindparam("hi"),
    )
    .order_by(steps.c.seq)
)


class SQLWorkflowStore(SQLPeople, SQLRetention):
    """The workflow store in SQLite or PostgreSQL.

    Construct it from a :class:`~statekeep.db.Database` (to share transactions with
    the working-state store) or a URL. ``keys`` (a :class:`~statekeep.keys.KeyRing`)
    seals the payloads of owned runs.

    Examples:
        >>> store = SQLWorkflowStore("sqlite:///:memory:")
        >>> store.find("nope") is None
        True
    """

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
            stored = get_run(conn, run["run_id"], self.keys)
        return same_run(stored, run)

    def find(self, run_id: str) -> Run | None:
        check_run_id(run_id)
        with self.db.read() as conn:
            row = conn.execute(_FIND, {"rid": run_id}).mappings().first()
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
            run = get_run(conn, run_id, self.keys)
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
            return get_run(conn, run_id, self.keys)

    def retry(self, run_id: str) -> Run:
        check_run_id(run_id)
        stamp = now()
        owner = self._sealer(run_id)
        self._prepare(owner)
        with self.db.begin() as conn:
            error = get_run(conn, run_id, self.keys).error
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
                    epoch=runs.c.epoch + 1,
                )
            )
            if conn.execute(reopen).rowcount != 1:
                status = get_run(conn, run_id, self.keys).status.value
                raise InvalidInputError(
                    f"run {run_id!r} is {status}: only a failed run is retried", field="run_id"
                )
            run = get_run(conn, run_id, self.keys)
            note = {"error": error, "after_seq": run.last_seq}
            note_event(conn, run_id, "statekeep.retried", note, self.keys, owner)
        return run

    def fork(self, run_id: str, at_seq: int, run: dict[str, Any]) -> Run:
        check_run_id(run_id)
        new_id = check_run_id(run["run_id"])
        check_int(at_seq, "at_seq", maximum=MAX_SEQ)
        stamp = now()
        owner = self._sealer(run_id)  # the fork's payloads are sealed as its source's are
        self._prepare(owner)
        with self.db.begin() as conn:
            source = get_run(conn, run_id, self.keys)
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
                "input": seal(self.keys, owner, run["input"]),
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
                existing = get_run(conn, new_id, self.keys)
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
            note_event(
                conn, run_id, "statekeep.forked", {"run_id": new_id, "at_seq": at_seq}, self.keys, owner
            )
            return get_run(conn, new_id, self.keys)

    # --- leases ---------------------------------------------------------------------------

    def acquire(self, run_id: str, owner: str, lease: float, *, parent: Run | None = None) -> Run | None:
        take = _TAKE if parent is None else _TAKE_CHILD
        params = {"rid": run_id, **_lease_params(owner, lease)}
        with self.db.begin() as conn:
            if parent is not None:
                fence(conn, parent.run_id, parent.epoch)  # first: it locks the parent row
            row = conn.execute(take, params).mappings().first()
            if row is not None:  # taken: the run as the take left it
                return run_record(row, self.keys)
            run = get_run(conn, run_id, self.keys)
        return run if run.status.finished else None

    def claim(self, owner: str, lease: float, limit: int, workflows: Iterable[tuple[str, int]]) -> list[Run]:
        pairs = [sa.and_(runs.c.workflow == n, runs.c.version == v) for n, v in workflows]
        if not pairs:
            return []
        stamp = now()
        q = (
            sa.select(runs.c.run_id)
            .where(
                runs.c.runnable_at <= stamp,
                _lapsed(stamp),
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
                runs.update().where(runs.c.run_id.in_(ids)).values(_LEASE), _lease_params(owner, lease)
            )
            rows = conn.execute(sa.select(runs).where(runs.c.run_id.in_(ids))).mappings()
            return [run_record(r, self.keys) for r in rows]

    def heartbeat(self, run_id: str, epoch: int, lease: float) -> bool:
        with self.db.begin() as conn:
            # the row first, then the time: a beat that waited for another transaction's lock on
            # the run (an event being sent, a child waking it) leases from when it got the row,
            # not from before the wait, which could leave a lease that lapsed as it was written
            lock = sa.select(runs.c.epoch).where(runs.c.run_id == run_id).with_for_update()
            if conn.execute(lock).scalar() != epoch:
                return False
            expires = now() + timedelta(seconds=lease)  # the row is ours: its epoch stays until commit
            conn.execute(runs.update().where(runs.c.run_id == run_id).values(lease_expires_at=expires))
            return True

    def shares(self, db: object) -> bool:
        return db is self.db

    @contextmanager
    def fenced(self, run: Run) -> Iterator[SQLRunWrite]:
        self._prepare(run.owner)
        with self.db.begin() as conn:
            tx = SQLRunWrite(run, conn, self.db, self.keys)
            yield tx
            tx.close()

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

    def replay(self, run_id: str, start: int, size: int) -> list[ReplayEntry]:
        # five columns as plain tuples: no timestamps converted, no output opened until replay needs it
        params = {"rid": run_id, "lo": start, "hi": min(start + size - 1, MAX_SEQ)}
        opener = partial(unseal, self.keys, whose=f"run {run_id!r}")
        with self.db.read() as conn:
            return [ReplayEntry(*row, opener) for row in conn.execute(_REPLAY, params).all()]

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


def _lease_params(owner: str, lease: float) -> dict[str, Any]:
    """The values :data:`_LEASE` binds: a lease of ``lease`` seconds for ``owner`` from now."""
    stamp = now()
    return {"holder": owner, "expires": stamp + timedelta(seconds=lease), "now": stamp}
