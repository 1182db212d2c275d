"""What every part of the SQL workflow store shares: the database, the key ring, a run by id.

:class:`~statekeep.workflow.sql.SQLWorkflowStore` is assembled from this base and
the modules beside it, one per concern: runs, leases and the journal
(:mod:`.sql`), approvals and events (:mod:`.sql_people`), retention and erasure
(:mod:`.sql_retention`).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.db import Database
from statekeep.errors import (
    RunNotFoundError,
)
from statekeep.keys import KeyRing
from statekeep.workflow import codec
from statekeep.workflow._types import (
    Run,
)
from statekeep.workflow.base import (
    WorkflowStore,
    now,
)
from statekeep.workflow.sql_tx import (
    run_record,
    seal,
)
from statekeep.workflow.tables import events, runs, setup


class SQLBase(WorkflowStore):
    """The database, the key ring and the owner's data key, for each part of the SQL store."""

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


def get_run(conn: Connection, run_id: str, keys: KeyRing | None) -> Run:
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
