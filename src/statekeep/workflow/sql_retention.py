"""Retention and erasure in SQL: which runs have finished, deleting them, and the runs of an owner.

Functions over a :class:`~statekeep.db.Database` that
:class:`~statekeep.workflow.SQLWorkflowStore`'s primitives call with checked
arguments.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa

from statekeep.db import Database
from statekeep.keys import KeyRing
from statekeep.workflow._types import FINISHED, Run
from statekeep.workflow.sql_tx import run_record
from statekeep.workflow.tables import approvals, events, runs, steps, tool_calls

#: The tables that hold a run, each row counted under this name; the run row goes last.
_HOLDING = (
    ("steps", steps),
    ("tool_calls", tool_calls),
    ("approvals", approvals),
    ("events", events),
    ("runs", runs),
)
#: Runs deleted per statement (a bound IN list stays well under every database's parameter limit).
_CHUNK = 500


def finished_runs(db: Database, workflow: str | None) -> list[tuple[str, str, datetime]]:
    """(run id, workflow, finished at) of every finished run, of ``workflow`` if given."""
    finished = [s.value for s in FINISHED]
    q = sa.select(runs.c.run_id, runs.c.workflow, runs.c.finished_at).where(runs.c.status.in_(finished))
    if workflow is not None:
        q = q.where(runs.c.workflow == workflow)
    with db.read() as conn:
        return [(r.run_id, r.workflow, r.finished_at) for r in conn.execute(q)]


def delete_runs(db: Database, run_ids: list[str]) -> int:
    """Delete the finished runs among ``run_ids`` with everything they hold; return how many."""
    finished = [s.value for s in FINISHED]
    deleted = 0
    with db.begin() as conn:
        for start in range(0, len(run_ids), _CHUNK):
            q = sa.select(runs.c.run_id).where(
                runs.c.run_id.in_(run_ids[start : start + _CHUNK]), runs.c.status.in_(finished)
            )
            chunk = list(conn.execute(q).scalars())
            for _, table in _HOLDING:
                conn.execute(table.delete().where(table.c.run_id.in_(chunk)))
            deleted += len(chunk)
    return deleted


def runs_of(db: Database, keys: KeyRing | None, owner: str) -> list[Run]:
    """Every run of ``owner``, oldest first."""
    q = sa.select(runs).where(runs.c.owner == owner).order_by(runs.c.created_at, runs.c.run_id)
    with db.read() as conn:
        return [run_record(r, keys) for r in conn.execute(q).mappings()]


def delete_owner(db: Database, owner: str) -> dict[str, int]:
    """Delete the finished runs of ``owner`` with everything they hold; the rows removed per table."""
    finished = [s.value for s in FINISHED]
    counts = dict.fromkeys(("runs", "steps", "tool_calls", "approvals", "events"), 0)
    q = sa.select(runs.c.run_id).where(runs.c.owner == owner, runs.c.status.in_(finished))
    with db.begin(f"erasing the runs of {owner!r}") as conn:
        ids = list(conn.execute(q).scalars())
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            for name, table in _HOLDING:
                gone = conn.execute(table.delete().where(table.c.run_id.in_(chunk)))
                counts[name] += int(gone.rowcount)
    return counts
