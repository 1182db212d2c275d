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
from statekeep.keys import KeyRing, is_sealed
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

    def _sealer(self, run_id: str) -> str | None:
        """Whose data key seals what is written to a run from outside its worker (an event, a note, a fork).

        The run's owner when this store has a key ring and the run's input is sealed;
        otherwise None, and the payload is stored plain: see :func:`sealing_owner`.
        """
        if self.keys is None:
            return None
        with self.db.read() as conn:
            row = conn.execute(sa.select(runs.c.owner, runs.c.input).where(runs.c.run_id == run_id)).first()
        return None if row is None else sealing_owner(row.owner, row.input)

    def close(self) -> None:
        self.db.dispose()


def sealing_owner(owner: str | None, beside: str | None) -> str | None:
    """``owner`` if ``beside``, a payload of the same run that its worker wrote, is sealed; else None.

    Whoever writes to a run (its worker, or a person's decision from a CLI or a
    console opened with the home's key ring), the run's worker must be able to
    read it. A worker seals exactly when it has a key ring, so a payload is
    sealed when the run's own payloads are, and stored plain when they are not:
    a store without keys reads plain text, and one with keys reads both.
    """
    return owner if beside is not None and is_sealed(beside) else None


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
