"""Rewriting PostgreSQL tables after an erasure, so that no dead row keeps what was deleted.

``DELETE`` leaves the deleted row versions in the table's files; ``VACUUM FULL``
writes the live rows to new files and drops the old ones. But PostgreSQL copies a
deleted row into the new files too while any transaction that began before the
delete may still see it: a report running for minutes, a session left idle in a
transaction, a prepared transaction, a replication slot's ``xmin``. Such a row,
a wrapped data key or a memory's text, would outlive the erasure on disk.

So an erasure marks its deleting transaction (:data:`MARK`), and :func:`rewrite`
waits until nothing older than the mark can see the database's rows any more,
then runs ``VACUUM FULL``. When something older is still there after the wait,
the rewrite runs all the same (it drops every row it may) and the erasure fails
with an :class:`~statekeep.errors.ErasureError` that names what held the rows:
end it, and erase again (erasing again is harmless, and rewrites again).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import sqlalchemy as sa

from statekeep.errors import ErasureError

if TYPE_CHECKING:
    from statekeep.db.engine import Database

#: The transaction id of the deleting transaction, read inside it (assigning one if it deleted nothing).
MARK = "SELECT CAST(xid(pg_current_xact_id()) AS text)"

#: How long an erasure waits, in seconds, for transactions older than its delete to end (and, on
#: SQLite, for the readers of the write-ahead log).
WAIT = 30.0

#: What may still see rows deleted by the transaction ``:mark``: backends of this database (or of
#: none) whose snapshot or own transaction is not newer, except lazy vacuums (PostgreSQL ignores
#: theirs), replication slots and prepared transactions. ``age`` orders transaction ids across
#: their wraparound: an older id has the greater age.
_HOLDERS = """
SELECT 'backend ' || a.pid || coalesce(' (' || a.state || ')', '') AS what
FROM pg_stat_activity AS a
WHERE a.pid <> pg_backend_pid()
  AND (a.datid IS NULL OR a.datname = current_database())
  AND NOT EXISTS (SELECT FROM pg_stat_progress_vacuum AS v WHERE v.pid = a.pid)
  AND (age(a.backend_xmin) >= age(CAST(:mark AS xid)) OR age(a.backend_xid) >= age(CAST(:mark AS xid)))
UNION ALL
SELECT 'replication slot ' || quote_ident(s.slot_name)
FROM pg_replication_slots AS s
WHERE (s.database IS NULL OR s.database = current_database())
  AND age(s.xmin) >= age(CAST(:mark AS xid))
UNION ALL
SELECT 'prepared transaction ' || quote_literal(p.gid)
FROM pg_prepared_xacts AS p
WHERE p.database = current_database() AND age(p.transaction) >= age(CAST(:mark AS xid))
ORDER BY 1
"""


def rewrite(db: Database, tables: Sequence[str], *, mark: str, owner: str) -> None:
    """``VACUUM FULL`` each of ``tables`` once nothing older than the transaction ``mark`` remains
    (waiting :data:`WAIT` seconds at most).

    Args:
        db: the PostgreSQL database of the tables.
        tables: qualified table (or partition) names.
        mark: what :data:`MARK` returned inside the transaction that deleted the rows.
        owner: whose rows they were, for the error.

    Raises:
        ErasureError: a table could not be rewritten, or something older than the delete
            still held its rows after the wait (the tables were rewritten all the same).
    """
    deadline = time.monotonic() + WAIT
    pause = 0.01
    try:
        with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            while holders := list(conn.execute(sa.text(_HOLDERS), {"mark": mark}).scalars()):
                if time.monotonic() >= deadline:
                    break
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
            for table in tables:
                conn.exec_driver_sql(f"VACUUM (FULL) {table}")
    except sa.exc.SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
        raise ErasureError(owner, f"VACUUM FULL {', '.join(tables)}", reason) from exc
    if holders:
        raise ErasureError(
            owner,
            f"VACUUM FULL {', '.join(tables)}",
            f"{', '.join(holders)} began before the delete and may still see the deleted rows, so "
            "PostgreSQL keeps them in the files: end it (commit, roll back or drop it)",
        )
