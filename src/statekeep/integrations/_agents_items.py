"""The table of the Agents SDK session's exact items, importable without the SDK: erasure reaches it.

:class:`~statekeep.integrations.agents.StatekeepSession` keeps each item the SDK
adds (its JSON, sealed with the session owner's data key when the session has a
key ring) in ``statekeep_agents.items``, beside the context event that names it
by key. :data:`STORE` declares the table, and :func:`delete_items` is how
:func:`statekeep.erasure.erase_owner` removes an erased owner's items; it needs
neither the SDK nor the table (a database where the adapter never ran has none).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.db import Database, Migration
from statekeep.db.catalog import Erased, Erasing, StoreSpec
from statekeep.db.dialects import no_statistics
from statekeep.db.migrations import create_tables

SCHEMA = "statekeep_agents"
metadata = sa.MetaData(schema=SCHEMA)
items_table = sa.Table(
    "items",
    metadata,
    sa.Column("session_id", sa.String(255), primary_key=True),
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("item", sa.Text, nullable=False),
)


#: Each item's JSON, sealed with the session owner's data key when the session has a key ring.
SEALED = {"items": ("item",)}
#: ANALYZE would copy sampled items into pg_statistic, which erasure does not rewrite.
NO_STATISTICS = SEALED


def _no_statistics(conn: Connection) -> None:
    no_statistics(conn, SCHEMA, NO_STATISTICS)


MIGRATIONS = [
    Migration(1, "items: the exact SDK item of each logged event", create_tables(metadata, "items")),
    Migration(2, "no statistics on items (PostgreSQL)", _no_statistics),
]


def _erase(db: Database | None, erasing: Erasing) -> Erased:
    """The items of the owner's sessions, in the context store's database (none without SQL)."""
    return Erased({"items": delete_items(db, erasing.session_ids) if db is not None else 0})


STORE: StoreSpec[Database] = StoreSpec(
    "agents",
    metadata,
    MIGRATIONS,
    lives_in="context",
    part_of="context",
    sealed=SEALED,
    erase=_erase,
    no_statistics=NO_STATISTICS,
)


def setup(db: Database) -> None:
    """Create or upgrade the items table (idempotent)."""
    STORE.upgrade(db)


def delete_items(db: Database, session_ids: Sequence[str]) -> int:
    """Erasure: delete every stored item of these sessions; how many went (0 without the table).

    On SQLite the rows are deleted with ``secure_delete`` (every statekeep connection
    has it on); the caller truncates the WAL (:meth:`Database.scrub
    <statekeep.db.Database.scrub>`). Creates nothing.
    """
    if not session_ids or STORE.version(db) == 0:
        return 0
    removed = 0
    with db.begin("erasing agent session items") as conn:
        for start in range(0, len(session_ids), 500):
            chunk = list(session_ids[start : start + 500])
            removed += int(
                conn.execute(items_table.delete().where(items_table.c.session_id.in_(chunk))).rowcount
            )
    return removed
