"""Numbered, append-only migrations, recorded per store.

Each store owns a list of :class:`Migration` objects and a version table named
``<store>_migrations`` in its own schema. :func:`upgrade` applies what is
missing, in order, each in its own transaction, under a cross-process lock, so
calling it from many workers at once is safe and calling it twice is a no-op.
Never edit a migration once released: append a new one.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.db.engine import Database, storage_error
from statekeep.db.types import UTCDateTime
from statekeep.errors import SchemaVersionError, StorageError


@dataclass(frozen=True)
class Migration:
    """One numbered step of a store's schema."""

    version: int
    description: str
    apply: Callable[[Connection], None]


def create_tables(metadata: sa.MetaData, *tables: str) -> Callable[[Connection], None]:
    """A migration body that creates the named tables of a store's metadata."""

    def _apply(conn: Connection) -> None:
        metadata.create_all(conn, tables=[metadata.tables[_key(metadata, t)] for t in tables])

    return _apply


def _key(metadata: sa.MetaData, table: str) -> str:
    return f"{metadata.schema}.{table}" if metadata.schema else table


#: Stores each Database was found current for in this process, as (store, schema, version): a
#: store object opened again on the same Database (a worker opens them per run) checks nothing.
_CURRENT: weakref.WeakKeyDictionary[Database, set[tuple[str, str, int]]] = weakref.WeakKeyDictionary()


@functools.lru_cache(maxsize=64)
def _version_table(store: str, schema: str) -> sa.Table:
    return sa.Table(
        f"{store}_migrations",
        sa.MetaData(schema=schema),
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("applied_at", UTCDateTime, nullable=False),
    )


def current_version(db: Database, store: str, schema: str) -> int:
    """The highest migration applied to a store, 0 when none."""
    db.register_schema(schema)
    table = _version_table(store, schema)
    with db.read() as conn:
        if not sa.inspect(conn).has_table(table.name, schema=schema if db.dialect.has_schemas else None):
            return 0
        return int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(table.c.version), 0))).scalar_one())


def upgrade(db: Database, store: str, schema: str, migrations: Sequence[Migration]) -> int:
    """Apply a store's pending migrations; return the version it is at.

    Raises:
        SchemaVersionError: the database is at a version newer than this code.
    """
    _check_numbering(store, migrations)
    db.register_schema(schema)
    seen = (store, schema, len(migrations))
    if seen in _CURRENT.get(db, ()):
        return len(migrations)
    try:
        # a read first: opening a store whose schema is current takes no write lock
        applied = current_version(db, store, schema)
        if applied > len(migrations):
            raise SchemaVersionError(store, applied, len(migrations), "database is newer than this code")
        if applied < len(migrations):
            _apply_pending(db, store, _version_table(store, schema), schema, migrations)
    except (sa.exc.OperationalError, StorageError) as exc:
        raise storage_error(exc, f"upgrading the {store} store in {db!r}") from exc
    _CURRENT.setdefault(db, set()).add(seen)
    return len(migrations)


def _apply_pending(
    db: Database, store: str, table: sa.Table, schema: str, migrations: Sequence[Migration]
) -> None:
    with db.begin() as conn:
        db.dialect.lock(conn, f"statekeep-migrate-{store}")
        db.dialect.create_schema(conn, schema)
        table.create(conn, checkfirst=True)
    for migration in migrations:
        with db.begin() as conn:
            db.dialect.lock(conn, f"statekeep-migrate-{store}")
            applied = conn.execute(sa.select(sa.func.coalesce(sa.func.max(table.c.version), 0))).scalar_one()
            if applied > len(migrations):
                raise SchemaVersionError(store, applied, len(migrations), "database is newer than this code")
            if migration.version <= applied:
                continue
            migration.apply(conn)
            conn.execute(
                table.insert().values(
                    version=migration.version,
                    description=migration.description,
                    applied_at=datetime.now(UTC),
                )
            )


def _check_numbering(store: str, migrations: Sequence[Migration]) -> None:
    numbers = [m.version for m in migrations]
    if numbers != list(range(1, len(migrations) + 1)):
        raise SchemaVersionError(
            store, 0, len(migrations), f"migrations must be numbered 1..n, got {numbers}"
        )
