"""Dialect hooks: the few places where SQLite and PostgreSQL differ.

Shared code never checks ``dialect.name``; it calls a named hook on the
:class:`Dialect` that :class:`~statekeep.db.Database` picked for its URL.
"""

from __future__ import annotations

import sqlite3
import time
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine


class Dialect:
    """Base hooks; each backend overrides what it must."""

    name = "base"
    #: True where a store's schema name maps onto a real SQL schema.
    has_schemas = False
    #: True where the database takes one write transaction at a time (SQLite): writers of
    #: one process may queue on a lock instead of sleeping in the database's busy handler.
    single_writer = False
    #: True where a timestamp column keeps its time zone (SQLite stores naive UTC).
    keeps_time_zones = True
    #: The SQLAlchemy driver of code driven on an event loop, and the module it needs.
    async_driver = ""
    async_module = ""
    #: True where a deleted row stays on disk as a dead tuple until its table is rewritten
    #: (PostgreSQL); SQLite overwrites deleted rows (``secure_delete``).
    keeps_dead_rows = False
    #: What an erasure cannot reach on this backend, said plainly (an erasure receipt's lines).
    not_reached: tuple[str, ...] = ()
    #: True where the pgvector extension can hold memories' vectors (PostgreSQL).
    holds_pgvector = False

    def engine_options(self) -> dict[str, Any]:
        """Keyword arguments for ``create_engine`` (the connection pool's size)."""
        return {}

    def in_memory(self, url: URL) -> bool:
        """True for a database that lives in one connection (in-memory SQLite): no other engine sees it."""
        return False

    def file_of(self, url: URL) -> Path | None:
        """The database file a URL names; None for a server or an in-memory database."""
        return None

    def configure(self, engine: Engine) -> None:
        """Install connection-level settings (pragmas, event hooks)."""

    def create_schema(self, conn: Connection, schema: str) -> None:
        """Create the SQL schema a store lives in, if the backend has schemas."""

    def lock(self, conn: Connection, key: str) -> None:
        """Serialize a critical section across processes until the transaction ends."""

    def lock_tables(self, conn: Connection, tables: Sequence[sa.Table]) -> None:
        """Hold off every other writer of these tables until the transaction ends; readers go on.

        The base (SQLite) needs nothing: a write transaction begins IMMEDIATE and so
        already excludes every other writer.
        """

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

    def scrub(self, engine: Engine, wait: float) -> str | None:
        """After an erasure: make the deleted bytes unrecoverable from the database's files; say how.

        None when something kept the bytes for ``wait`` seconds. The base (PostgreSQL)
        does nothing here: sealed payloads are crypto-shredded, and what must really
        go is rewritten by the store that holds it.
        """
        return "nothing to rewrite"

    def claim(self, query: sa.Select[Any]) -> sa.Select[Any]:
        """Make a SELECT of rows a worker is about to claim safe against other workers.

        The base (SQLite) needs nothing: write transactions begin IMMEDIATE, so a
        claim already holds the database's only write lock.
        """
        return query

    def no_statistics(self, conn: Connection, schema: str, columns: Mapping[str, Sequence[str]]) -> None:
        """Keep the values of these ``{table: columns}`` out of the planner's statistics.

        The base (SQLite) has no per-column statistics target to turn off.
        """

    def hash_partitions(self, conn: Connection, schema: str, table: str, count: int) -> list[str]:
        """Create ``count`` hash partitions ``<table>_p<i>`` of a table declared partitioned; their names.

        The base (SQLite) has no partitions: the table holds every row itself.
        """
        return []

    def partition_holding(
        self, conn: Connection, schema: str, table: str, count: int, key: str
    ) -> str | None:
        """The qualified name of the hash partition of ``table`` holding ``key``; None without partitions."""
        return None

    def append_only(self, conn: Connection, schema: str, table: str, message: str) -> None:
        """Make ``table`` refuse every UPDATE and DELETE (a trigger raising ``message``)."""
        raise NotImplementedError


#: How long a SQLite connection waits for a lock held by another, in milliseconds.
BUSY_TIMEOUT_MS = 60_000


def _enter_wal(cur: Any) -> None:
    """Put the database in WAL mode, waiting out other connections doing the same.

    The switch needs the file to itself, and SQLite reports ``database is locked``
    at once (without its busy handler) when another process holds it, as when
    several workers open a new database together; the mode is persistent, so a
    connection to a database already in WAL only reads it.
    """
    deadline = time.monotonic() + 60
    delay = 0.005
    while True:
        try:
            cur.execute("PRAGMA journal_mode")  # the cursor of sqlite3 or of SQLAlchemy's aiosqlite adapter
            row = cur.fetchone()
            if row is not None and str(row[0]).lower() == "wal":
                return
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:  # the aiosqlite adapter raises sqlite3's errors too
            if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


class SQLiteDialect(Dialect):
    """SQLite: WAL, full fsync, ``secure_delete``, and ``BEGIN IMMEDIATE`` for write transactions.

    Taking the write lock at BEGIN (not at the first write) means two writers
    queue on ``busy_timeout`` instead of deadlocking on a lock upgrade.
    ``secure_delete`` zeroes deleted rows and freed pages, so that no free space
    of the file keeps a deleted value (retention and erasure rely on it; the
    WAL's old frames go at :meth:`scrub`).
    """

    name = "sqlite"
    single_writer = True
    keeps_time_zones = False
    async_driver = "sqlite+aiosqlite"
    async_module = "aiosqlite"
    not_reached = (
        "the file system below SQLite: freed disk blocks and SSD cells the WAL or the database once used",
    )

    def in_memory(self, url: URL) -> bool:
        return url.database in (None, "", ":memory:")

    def file_of(self, url: URL) -> Path | None:
        return None if self.in_memory(url) else Path(str(url.database))

    def configure(self, engine: Engine) -> None:
        @sa.event.listens_for(engine, "connect")
        def _connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            _enter_wal(cur)
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA secure_delete=ON")
            cur.close()

        @sa.event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
            conn.exec_driver_sql(f"BEGIN {mode}")

    def insert(self, table: sa.Table) -> Any:
        return sqlite.insert(table)

    def scrub(self, engine: Engine, wait: float) -> str | None:
        """Checkpoint the WAL into the database and truncate it to zero bytes.

        Old WAL frames still hold page images from before a delete. Truncating waits
        for every reader of the WAL to finish; the checkpoint is tried again, a second
        of ``busy_timeout`` at a time, for ``wait`` seconds at most (not the minute a
        write waits, again and again): None when a reader outlasts it.
        """
        deadline = time.monotonic() + wait
        raw = engine.raw_connection()  # autocommit: a checkpoint cannot run inside a transaction
        try:
            cur = raw.cursor()
            cur.execute("PRAGMA busy_timeout=1000")
            try:
                while True:
                    row = cur.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                    if not row or int(row[0]) == 0:
                        return "WAL checkpointed and truncated to 0 bytes (secure_delete zeroed freed pages)"
                    if time.monotonic() >= deadline:
                        return None
                    time.sleep(0.05)
            finally:
                cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
                cur.close()
        finally:
            raw.close()

    def write_options(self) -> dict[str, Any]:
        return {"sqlite_begin": "IMMEDIATE"}

    def append_only(self, conn: Connection, schema: str, table: str, message: str) -> None:
        for event in ("UPDATE", "DELETE"):
            conn.exec_driver_sql(
                f"CREATE TRIGGER {table}_no_{event.lower()} BEFORE {event} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, '{message}'); END"
            )


class PostgresDialect(Dialect):
    """PostgreSQL: one SQL schema per store, advisory locks for migrations."""

    name = "postgresql"
    has_schemas = True
    async_driver = "postgresql+psycopg"
    async_module = "psycopg"
    keeps_dead_rows = True
    holds_pgvector = True
    not_reached = (
        "PostgreSQL's write-ahead log (pg_wal) until its segments are recycled, WAL archives, and "
        "replicas: they hold the deleted rows (payloads sealed) and the owner's wrapped data key",
        "dead tuples of the deleted rows until autovacuum reuses their pages: sealed payloads "
        "(undecryptable once the key is shredded) and plain identifiers (owner, session and run ids, "
        "tool and step names)",
    )

    def engine_options(self) -> dict[str, Any]:
        return {"pool_size": 5, "max_overflow": 10}

    def create_schema(self, conn: Connection, schema: str) -> None:
        conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))

    def lock(self, conn: Connection, key: str) -> None:
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _lock_id(key)})

    def lock_tables(self, conn: Connection, tables: Sequence[sa.Table]) -> None:
        """``LOCK TABLE ... IN SHARE ROW EXCLUSIVE MODE``, in the order given.

        It waits for the transactions that are writing these tables to end, and a writer
        that comes later waits for this one: its statement takes its table lock before its
        snapshot, so it then sees what this transaction committed.
        """
        names = ", ".join(_qualified(conn, t) for t in tables)
        conn.execute(sa.text(f"LOCK TABLE {names} IN SHARE ROW EXCLUSIVE MODE"))

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

    def no_statistics(self, conn: Connection, schema: str, columns: Mapping[str, Sequence[str]]) -> None:
        """``SET STATISTICS 0``: ANALYZE would copy sampled values into pg_statistic, which erasure
        does not rewrite; the planner needs none of these columns' histograms."""
        for table, names in columns.items():
            for column in names:
                conn.exec_driver_sql(f"ALTER TABLE {schema}.{table} ALTER COLUMN {column} SET STATISTICS 0")

    def hash_partitions(self, conn: Connection, schema: str, table: str, count: int) -> list[str]:
        names = [f"{table}_p{i}" for i in range(count)]
        for i, name in enumerate(names):
            conn.exec_driver_sql(
                f"CREATE TABLE {schema}.{name} PARTITION OF {schema}.{table} "
                f"FOR VALUES WITH (MODULUS {count}, REMAINDER {i})"
            )
        return names

    def partition_holding(
        self, conn: Connection, schema: str, table: str, count: int, key: str
    ) -> str | None:
        for i in range(count):
            hit = conn.execute(
                sa.text("SELECT satisfies_hash_partition(CAST(:p AS regclass), :m, :r, CAST(:o AS text))"),
                {"p": f"{schema}.{table}", "m": count, "r": i, "o": key},
            ).scalar_one()
            if hit:
                return f"{schema}.{table}_p{i}"
        raise AssertionError("hash partitions cover every key")  # pragma: no cover

    def append_only(self, conn: Connection, schema: str, table: str, message: str) -> None:
        conn.exec_driver_sql(
            f"""CREATE FUNCTION {schema}.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION '{message}'; END $$"""
        )
        conn.exec_driver_sql(
            f"CREATE TRIGGER append_only BEFORE UPDATE OR DELETE ON {schema}.{table} "
            f"FOR EACH ROW EXECUTE FUNCTION {schema}.refuse_change()"
        )


def _qualified(conn: Connection, table: sa.Table) -> str:
    """The quoted name of a table, in the schema the connection's translate map gives it."""
    schemas = conn.get_execution_options().get("schema_translate_map") or {}
    schema = schemas.get(table.schema, table.schema)
    prepare = conn.dialect.identifier_preparer
    name = prepare.quote(table.name)
    return f"{prepare.quote_schema(schema)}.{name}" if schema else name


def _lock_id(key: str) -> int:
    """A stable signed 64-bit advisory-lock id for a name."""
    return zlib.crc32(key.encode()) - 2**31


DIALECTS: dict[str, type[Dialect]] = {"sqlite": SQLiteDialect, "postgresql": PostgresDialect}
_HOOKS: dict[str, Dialect] = {name: cls() for name, cls in DIALECTS.items()}
_BASE = Dialect()


def dialect_of(url: URL) -> Dialect:
    """The hooks of a (normalized) database URL's backend."""
    return _HOOKS[url.get_backend_name()]


def named(name: str) -> Dialect:
    """The hooks of a backend by its name (``sqlite`` or ``postgresql``).

    Raises:
        KeyError: no such backend.
    """
    return _HOOKS[name]


def hooks(dialect: sa.engine.Dialect) -> Dialect:
    """The hooks of a SQLAlchemy dialect: a migration's ``conn.dialect``, a column type's ``dialect``.

    Another dialect (SQLAlchemy's default one, compiling a statement to show it) gets the base hooks.
    """
    return _HOOKS.get(dialect.name) or _BASE


def schema_for(conn: Connection, schema: str) -> str | None:
    """The schema name a store's tables have on this connection's backend (None on SQLite)."""
    return schema if hooks(conn.dialect).has_schemas else None


def no_statistics(conn: Connection, schema: str, columns: Mapping[str, Sequence[str]]) -> None:
    """A migration's step: keep a store's declared ``{table: columns}`` out of PostgreSQL's statistics."""
    hooks(conn.dialect).no_statistics(conn, schema, columns)
