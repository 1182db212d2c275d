"""The context store's tables and their migrations (SQLite and PostgreSQL)."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.db import Database, Migration
from statekeep.db.catalog import StoreSpec, by_owner
from statekeep.db.dialects import no_statistics, schema_for
from statekeep.db.migrations import create_tables
from statekeep.db.types import UTCDateTime

if TYPE_CHECKING:
    from statekeep.context.base import ContextStore

SCHEMA = "statekeep_context"
metadata = sa.MetaData(schema=SCHEMA)

sessions = sa.Table(
    "context_sessions",
    metadata,
    sa.Column("session_id", sa.String(255), primary_key=True),
    sa.Column("last_seq", sa.BigInteger, nullable=False),
    sa.Column("summary_seq", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("pruned_to", sa.BigInteger, nullable=False, server_default="0"),
    # NULL: created without an owner (or before owners were recorded) and not claimed since
    sa.Column("owner", sa.String(255), nullable=True),
    # Random, set when the row is inserted: a session erased and started again under the same
    # id gets another, so entries decoded from the old one are never taken for the new one's.
    # NULL for sessions created before migration 4 (one incarnation each: a new row gets one).
    sa.Column("incarnation", sa.BigInteger, nullable=True, default=lambda: secrets.randbits(62)),
)
sa.Index("context_sessions_owner", sessions.c.owner)

events = sa.Table(
    "context_events",
    metadata,
    sa.Column("session_id", sa.String(255), primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("tokens", sa.Integer, nullable=False),
    sa.Column("counter", sa.String(64), nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("key", sa.String(255), nullable=True),
)

# Partial, so the tail query never mistakes it for a path to a session's events.
sa.Index(
    "context_events_key",
    events.c.session_id,
    events.c.key,
    unique=True,
    postgresql_where=events.c.key.isnot(None),
    sqlite_where=events.c.key.isnot(None),
)


def _add_session_column(conn: Connection, column: sa.Column[object]) -> None:
    """Add a nullable column of ``context_sessions`` unless the table has it.

    Tables created after the migration that adds it (by migration 1, from the
    current metadata) already have it, hence the check.
    """
    schema = schema_for(conn, SCHEMA)
    columns = {c["name"] for c in sa.inspect(conn).get_columns(sessions.name, schema=schema)}
    if column.name not in columns:
        quote = conn.dialect.identifier_preparer.quote
        table = f"{quote(schema)}.{quote(sessions.name)}" if schema else quote(sessions.name)
        kind = column.type.compile(dialect=conn.dialect)
        conn.execute(sa.text(f"ALTER TABLE {table} ADD COLUMN {quote(column.name)} {kind}"))


def _add_session_owner(conn: Connection) -> None:
    # Version 1 had no owner column. Existing sessions stay unowned (NULL): the
    # context store does not know runs, so the first write with an owner, or
    # claim(), records one (the runtime claims a session it finds unowned for the
    # owner of the session's first run, see Runtime.claim_session).
    _add_session_column(conn, sessions.c.owner)
    for index in sessions.indexes:
        index.create(conn, checkfirst=True)


def _add_session_incarnation(conn: Connection) -> None:
    # Existing sessions keep NULL: each of them is one incarnation until erased.
    _add_session_column(conn, sessions.c.incarnation)


#: Event payloads (messages and summaries), sealed with the session owner's data key.
SEALED = {"context_events": ("payload",)}
#: PostgreSQL's ANALYZE would copy sampled payloads (and owner ids) into pg_statistic,
#: which erasure does not rewrite; the planner needs neither.
NO_STATISTICS = {"context_events": ("payload",), "context_sessions": ("owner",)}


def _no_statistics(conn: Connection) -> None:
    no_statistics(conn, SCHEMA, NO_STATISTICS)


MIGRATIONS = [
    Migration(
        1, "context_sessions, context_events", create_tables(metadata, "context_sessions", "context_events")
    ),
    Migration(2, "context_sessions.owner: a session belongs to one owner", _add_session_owner),
    Migration(3, "no statistics on payloads and owners (PostgreSQL)", _no_statistics),
    Migration(
        4, "context_sessions.incarnation: a session started again is told apart", _add_session_incarnation
    ),
]


STORE: StoreSpec[ContextStore] = StoreSpec(
    "context", metadata, MIGRATIONS, sealed=SEALED, no_statistics=NO_STATISTICS, erase=by_owner
)


def setup(db: Database) -> None:
    """Create or upgrade the context tables (idempotent)."""
    STORE.upgrade(db)
