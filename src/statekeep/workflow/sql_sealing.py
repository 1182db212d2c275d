"""Whose data key seals what the SQL workflow store writes to a run from outside its worker.

A worker seals its run's payloads with the owner's key exactly when it has a key
ring; an event, a retry's note, a fork or a person's decision written from
elsewhere (a CLI, a console) must be sealed the same way, or the worker could
not read it. :class:`Sealer` reads that from the run's own payloads, and makes
sure the owner's key exists before a write transaction needs it.
"""

from __future__ import annotations

import sqlalchemy as sa

from statekeep.db import Database
from statekeep.keys import KeyRing, is_sealed
from statekeep.workflow.tables import approvals, runs


class Sealer:
    """The key ring of one SQL workflow store, and the owner whose key seals each write."""

    def __init__(self, db: Database, keys: KeyRing | None) -> None:
        self.db = db
        self.keys = keys

    def prepare(self, owner: str | None) -> None:
        """Make sure the owner's data key exists before a write transaction (creating it takes its own)."""
        if self.keys is not None and owner is not None and not self.keys.ready(owner):
            self.keys.prepare(owner)

    def of_run(self, run_id: str) -> str | None:
        """Whose data key seals what is written to a run from outside its worker (an event, a note, a fork).

        The run's owner when this store has a key ring and the run's input is sealed;
        otherwise None, and the payload is stored plain: see :func:`sealing_owner`.
        """
        if self.keys is None:
            return None
        with self.db.read() as conn:
            row = conn.execute(sa.select(runs.c.owner, runs.c.input).where(runs.c.run_id == run_id)).first()
        return None if row is None else sealing_owner(row.owner, row.input)

    def of_decision(self, approval_id: str) -> str | None:
        """Whose key seals a decision: the run owner's when its worker sealed the question it asked.

        Deciding never makes a run unreadable for its worker: a run worked
        without a key ring gets a plain decision, whoever decides.
        """
        if self.keys is None:
            return None
        q = sa.select(runs.c.owner, approvals.c.args).join(approvals, approvals.c.run_id == runs.c.run_id)
        with self.db.read() as conn:
            row = conn.execute(q.where(approvals.c.approval_id == approval_id)).first()
        return None if row is None else sealing_owner(row.owner, row.args)


def sealing_owner(owner: str | None, beside: str | None) -> str | None:
    """``owner`` if ``beside``, a payload of the same run that its worker wrote, is sealed; else None.

    Whoever writes to a run (its worker, or a person's decision from a CLI or a
    console opened with the home's key ring), the run's worker must be able to
    read it. A worker seals exactly when it has a key ring, so a payload is
    sealed when the run's own payloads are, and stored plain when they are not:
    a store without keys reads plain text, and one with keys reads both.
    """
    return owner if beside is not None and is_sealed(beside) else None
