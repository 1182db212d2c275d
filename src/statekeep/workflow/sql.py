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

:class:`SQLWorkflowStore` implements the primitives of
:class:`~statekeep.workflow.base.WorkflowStore` (which checks every argument
first): runs, leases and the journal here; approvals and events in
:mod:`.sql_people`, retention and erasure in :mod:`.sql_retention` (functions
over the database); whose key seals a write in :mod:`.sql_sealing`; the fenced
transaction and the mapping of rows in :mod:`.sql_tx`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import sqlalchemy as sa

from statekeep.db import Database
from statekeep.db.types import UTCDateTime
from statekeep.errors import (
    InvalidInputError,
    RunConflictError,
    RunFinishedError,
)
from statekeep.keys import KeyRing
from statekeep.workflow import codec, sql_people, sql_retention
from statekeep.workflow._types import (
    LIVE,
    Approval,
    LedgerEntry,
    ReplayEntry,
    Run,
    RunPage,
    RunStatus,
    StepRecord,
)
from statekeep.workflow.base import Decision, RunFilter, Wanted, WorkflowStore
from statekeep.workflow.rules import check_fork_point, forked_key, last_set
from statekeep.workflow.run_write import now
from statekeep.workflow.search import page_of, run_matches
from statekeep.workflow.sql_sealing import Sealer
from statekeep.workflow.sql_tx import (
    SQLRunWrite,
    fence,
    finish_values,
    get_run,
    ledger_entry,
    note_event,
    run_record,
    seal,
    step_record,
    unseal,
    wake,
    withdraw_approvals,
)
from statekeep.workflow.tables import runs, setup, steps, tool_calls

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
        self.sealer = Sealer(self.db, keys)
        setup(self.db)

    def close(self) -> None:
        self.db.dispose()

    # --- runs -----------------------------------------------------------------------------

    def _open_run(self, run: dict[str, Any], parent: Run | None) -> Run:
        stamp = now()
        owner = run.get("owner")
        self.sealer.prepare(owner)
        row = {**run, "created_at": stamp, "updated_at": stamp, "epoch": 0, "last_seq": 0}
        row["input"] = seal(self.keys, owner, run["input"])
        with self.db.begin() as conn:
            if parent is not None:
                fence(conn, parent.run_id, parent.epoch)
            conn.execute(self.db.dialect.insert(runs).values(row).on_conflict_do_nothing())
            return get_run(conn, run["run_id"], self.keys)

    def _find(self, run_id: str) -> Run | None:
        with self.db.read() as conn:
            row = conn.execute(_FIND, {"rid": run_id}).mappings().first()
        return None if row is None else run_record(row, self.keys)

    def _list_runs(
        self, wanted: Wanted, workflow: str | None, parent_id: str | None, limit: int
    ) -> list[Run]:
        q = sa.select(runs).order_by(runs.c.created_at, runs.c.run_id).limit(limit)
        if wanted is not None:
            q = q.where(runs.c.status.in_([s.value for s in wanted]))
        if workflow is not None:
            q = q.where(runs.c.workflow == workflow)
        if parent_id is not None:
            q = q.where(runs.c.parent_id == parent_id)
        with self.db.read() as conn:
            return [run_record(r, self.keys) for r in conn.execute(q).mappings()]

    def _search_runs(self, filters: RunFilter, limit: int, offset: int) -> RunPage:
        needle = filters.needle
        where: list[sa.ColumnElement[bool]] = []
        if filters.workflow is not None:
            where.append(runs.c.workflow == filters.workflow)
        if filters.owners is not None:
            where.append(sa.or_(*(_owned_by(o) for o in filters.owners)))
        if filters.run_ids is not None:
            where.append(runs.c.run_id.in_(filters.run_ids))
        if needle is not None and self.keys is not None:  # sealed input: match what a person reads
            with self.db.read() as conn:
                rows = conn.execute(sa.select(runs).where(*where)).mappings().all()
            decoded = (run_record(r, self.keys) for r in rows)
            return page_of([r for r in decoded if run_matches(r, needle)], filters.wanted, limit, offset)
        if needle is not None:
            where.append(_contains(needle))
        wanted = None if filters.wanted is None else [s.value for s in filters.wanted]
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

    def _workflow_names(self) -> list[str]:
        with self.db.read() as conn:
            q = sa.select(runs.c.workflow).distinct().order_by(runs.c.workflow)
            return [str(name) for name in conn.execute(q).scalars()]

    def _cancel(self, run_id: str) -> Run:
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

    def _retry(self, run_id: str) -> Run:
        stamp = now()
        owner = self.sealer.of_run(run_id)
        self.sealer.prepare(owner)
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

    def _fork(self, run_id: str, at_seq: int, run: dict[str, Any]) -> Run:
        new_id = run["run_id"]
        stamp = now()
        owner = self.sealer.of_run(run_id)  # the fork's payloads are sealed as its source's are
        self.sealer.prepare(owner)
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

    def _acquire(self, run_id: str, owner: str, lease: float, parent: Run | None) -> Run | None:
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

    def _claim(self, owner: str, lease: float, limit: int, workflows: list[tuple[str, int]]) -> list[Run]:
        pairs = [sa.and_(runs.c.workflow == n, runs.c.version == v) for n, v in workflows]
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

    def _heartbeat(self, run_id: str, epoch: int, lease: float) -> bool:
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
    def _fenced(self, run: Run) -> Iterator[SQLRunWrite]:
        self.sealer.prepare(run.owner)
        with self.db.begin() as conn:
            tx = SQLRunWrite(run, conn, self.db, self.keys)
            yield tx
            tx.close()

    # --- journal and ledger ---------------------------------------------------------------

    def _journal(self, run_id: str, start: int, last: int) -> list[StepRecord]:
        q = (
            sa.select(steps)
            .where(steps.c.run_id == run_id, steps.c.seq >= start, steps.c.seq <= last)
            .order_by(steps.c.seq)
        )
        with self.db.read() as conn:
            return [step_record(r, self.keys) for r in conn.execute(q).mappings()]

    def _replay(self, run_id: str, start: int, last: int) -> list[ReplayEntry]:
        # five columns as plain tuples: no timestamps converted, no output opened until replay needs it
        params = {"rid": run_id, "lo": start, "hi": last}
        opener = partial(unseal, self.keys, whose=f"run {run_id!r}")
        with self.db.read() as conn:
            return [ReplayEntry(*row, opener) for row in conn.execute(_REPLAY, params).all()]

    def _tool_calls(self, run_id: str) -> list[LedgerEntry]:
        q = sa.select(tool_calls).where(tool_calls.c.run_id == run_id).order_by(tool_calls.c.seq)
        with self.db.read() as conn:
            return [ledger_entry(r, self.keys) for r in conn.execute(q).mappings()]

    def _tool_call(self, run_id: str, seq: int) -> LedgerEntry | None:
        q = sa.select(tool_calls).where(tool_calls.c.run_id == run_id, tool_calls.c.seq == seq)
        with self.db.read() as conn:
            row = conn.execute(q).mappings().first()
        return None if row is None else ledger_entry(row, self.keys)

    # --- approvals and events: :mod:`.sql_people` -------------------------------------------

    def _approvals(self, wanted: dict[str, str], limit: int | None, after: str | None) -> list[Approval]:
        return sql_people.list_approvals(self.db, self.keys, wanted, limit, after)

    def _approval(self, approval_id: str) -> Approval:
        with self.db.read() as conn:
            return sql_people.approval(conn, approval_id, self.keys)

    def _approval_at(self, run_id: str, seq: int, kind: str) -> Approval | None:
        return sql_people.approval_at(self.db, self.keys, run_id, seq, kind)

    def _decide(self, approval_id: str, decision: Decision) -> Approval:
        return sql_people.decide(self.db, self.sealer, approval_id, decision)

    def _send_event(self, run_id: str, name: str, payload: str) -> None:
        sql_people.send_event(self.db, self.sealer, run_id, name, payload)

    # --- retention and erasure: :mod:`.sql_retention` ---------------------------------------

    def _finished_runs(self, workflow: str | None) -> list[tuple[str, str, datetime]]:
        return sql_retention.finished_runs(self.db, workflow)

    def _delete_runs(self, run_ids: list[str]) -> int:
        return sql_retention.delete_runs(self.db, run_ids)

    def _runs_of(self, owner: str) -> list[Run]:
        return sql_retention.runs_of(self.db, self.keys, owner)

    def _delete_owner(self, owner: str) -> dict[str, int]:
        return sql_retention.delete_owner(self.db, owner)


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
