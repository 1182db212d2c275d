"""Dialect hooks: the few places where SQLite and PostgreSQL differ.

Shared code never checks ``dialect.name``; it calls a named hook on the
:class:`Dialect` that :class:`~statekeep.db.Database` picked for its URL.
"""

from __future__ import annotations

import zlib
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine


class Dialect:
    """Base hooks; each backend overrides what it must."""

    name = "base"
    #: True where a store's schema name maps onto a real SQL schema.
    has_schemas = False

    def configure(self, engine: Engine) -> None:
        """Install connection-level settings (pragmas, event hooks)."""

    def create_schema(self, conn: Connection, schema: str) -> None:
        """Create the SQL schema a store lives in, if the backend has schemas."""

    def lock(self, conn: Connection, key: str) -> None:
        """Serialize a critical section across processes until the transaction ends."""

    def insert(self, table: sa.Table) -> Any:
        """An INSERT that supports ``on_conflict_do_update``/``on_conflict_do_nothing``."""
        raise NotImplementedError

    def write_options(self) -> dict[str, Any]:
        """Execution options for a connection that will write."""
        return {}

    def read_options(self) -> dict[str, Any]:
        """Execution options that make a read transaction one consistent snapshot.

        The base (SQLite, WAL) needs nothing: a read transaction keeps the
        snapshot of its first read until it ends.
        """
        return {}

    def claim(self, query: sa.Select[Any]) -> sa.Select[Any]:
        """Make a SELECT of rows a worker is about to claim safe against other workers.

        The base (SQLite) needs nothing: write transactions begin IMMEDIATE, so a
        claim already holds the database's only write lock.
        """
        return query


class SQLiteDialect(Dialect):
    """SQLite: WAL, full fsync, and ``BEGIN IMMEDIATE`` for write transactions.

    Taking the write lock at BEGIN (not at the first write) means two writers
    queue on ``busy_timeout`` instead of deadlocking on a lock upgrade.
    """

    name = "sqlite"

    def configure(self, engine: Engine) -> None:
        @sa.event.listens_for(engine, "connect")
        def _connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @sa.event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
            conn.exec_driver_sql(f"BEGIN {mode}")

    def insert(self, table: sa.Table) -> Any:
        return sqlite.insert(table)

    def write_options(self) -> dict[str, Any]:
        return {"sqlite_begin": "IMMEDIATE"}


class PostgresDialect(Dialect):
    """PostgreSQL: one SQL schema per store, advisory locks for migrations."""

    name = "postgresql"
    has_schemas = True

    def create_schema(self, conn: Connection, schema: str) -> None:
        conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))

    def lock(self, conn: Connection, key: str) -> None:
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _lock_id(key)})

    def insert(self, table: sa.Table) -> Any:
        return postgresql.insert(table)

    def read_options(self) -> dict[str, Any]:
        """``REPEATABLE READ READ ONLY``: every statement sees the snapshot of the first.

        Under the default READ COMMITTED each statement takes a new snapshot, so
        a reader could see a session head from before a commit and a tail from
        after it. A read-only transaction never fails to serialize.
        """
        return {"isolation_level": "REPEATABLE READ", "postgresql_readonly": True}

    def claim(self, query: sa.Select[Any]) -> sa.Select[Any]:
        """``FOR UPDATE SKIP LOCKED``: concurrent workers claim disjoint rows without waiting."""
        return query.with_for_update(skip_locked=True)


def _lock_id(key: str) -> int:
    """A stable signed 64-bit advisory-lock id for a name."""
    return zlib.crc32(key.encode()) - 2**31


DIALECTS: dict[str, type[Dialect]] = {"sqlite": SQLiteDialect, "postgresql": PostgresDialect}
