"""Retention and erasure in the SQL workflow store: finished runs purged, an owner's runs deleted."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

from statekeep._check import check_id
from statekeep.workflow._types import (
    FINISHED,
    Run,
)
from statekeep.workflow.rules import (
    check_retention,
    check_run_ids,
    purge_selection,
)
from statekeep.workflow.sql_base import SQLBase
from statekeep.workflow.sql_tx import (
    run_record,
)
from statekeep.workflow.tables import approvals, events, runs, steps, tool_calls


class SQLRetention(SQLBase):
    """Purging finished runs, and erasing the runs of an owner."""

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
