"""The SQL backend of the working-state store (SQLite and PostgreSQL).

The statement functions take a ``Connection`` so that another store (the
workflow store) can append a state version inside its own transaction.

With a key ring (``keys=``), the state JSON of a run that has an owner is
sealed with the owner's data key (:meth:`SQLWorkingStateStore.sealed`); reads
open it. The working store does not know runs: the owner comes from the caller
(the workflow engine passes the run's).
"""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.db import Database, Migration
from statekeep.db.catalog import Erased, Erasing, StoreSpec
from statekeep.db.dialects import no_statistics
from statekeep.db.migrations import create_tables
from statekeep.db.types import UTCDateTime
from statekeep.errors import VersionConflictError
from statekeep.keys import KeyRing, is_sealed, no_key_ring
from statekeep.working._types import StateVersion
from statekeep.working.base import WorkingStateStore
from statekeep.working.schema import StateMigrations

SCHEMA = "statekeep_working"
metadata = sa.MetaData(schema=SCHEMA)

versions = sa.Table(
    "working_versions",
    metadata,
    sa.Column("run_id", sa.String(255), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("schema_name", sa.String(255), nullable=False),
    sa.Column("schema_version", sa.Integer, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
)


#: The state JSON, sealed with the run owner's data key when the store has a key ring.
SEALED = {"working_versions": ("state",)}
#: ANALYZE would copy sampled states into pg_statistic, which erasure does not rewrite.
NO_STATISTICS = SEALED


def _no_statistics(conn: Connection) -> None:
    no_statistics(conn, SCHEMA, NO_STATISTICS)


MIGRATIONS = [
    Migration(1, "working_versions", create_tables(metadata, "working_versions")),
    Migration(2, "no statistics on states (PostgreSQL)", _no_statistics),
]


def _erase(store: WorkingStateStore | None, erasing: Erasing) -> Erased:
    """The versions of the owner's runs (the working store knows runs, not owners)."""
    return Erased({"versions": store.delete(*erasing.run_ids) if store is not None else 0})


STORE: StoreSpec[WorkingStateStore] = StoreSpec(
    "working", metadata, MIGRATIONS, sealed=SEALED, no_statistics=NO_STATISTICS, erase=_erase
)


def setup(db: Database) -> None:
    """Create or upgrade the working-state tables (idempotent)."""
    STORE.upgrade(db)


def latest_version(conn: Connection, run_id: str) -> int:
    """The latest version number of a run, 0 when it has none."""
    # ORDER BY ... LIMIT 1 walks the primary key backwards; max() may scan the run's versions
    q = (
        sa.select(versions.c.version)
        .where(versions.c.run_id == run_id)
        .order_by(versions.c.version.desc())
        .limit(1)
    )
    return int(conn.execute(q).scalar() or 0)


def append(conn: Connection, record: StateVersion, expected: int | None) -> StateVersion:
    """Insert ``record`` as the run's next version, inside the caller's transaction.

    Raises:
        VersionConflictError: ``expected`` is stale, or a concurrent writer won the race.
    """
    latest = latest_version(conn, record.run_id)
    if expected is not None and expected != latest:
        raise VersionConflictError(record.run_id, expected, latest)
    stored = dataclasses.replace(record, version=latest + 1)
    try:
        with conn.begin_nested():
            conn.execute(versions.insert().values(_row(stored)))
    except sa.exc.IntegrityError as exc:
        raise VersionConflictError(record.run_id, latest, latest + 1) from exc
    return stored


_INSERT = versions.insert()
_OF_RUN = sa.select(versions).where(versions.c.run_id == sa.bindparam("rid"))
_LATEST = _OF_RUN.order_by(versions.c.version.desc()).limit(1)
_VERSION = _OF_RUN.where(versions.c.version == sa.bindparam("v"))


def append_after(conn: Connection, record: StateVersion, latest: int) -> int:
    """Insert ``record`` as version ``latest + 1`` in one statement, when the caller knows ``latest``.

    The hot path of a fenced writer (a workflow step's completion): no read, no
    savepoint. A concurrent writer that took the version first makes it a conflict.

    Raises:
        VersionConflictError: version ``latest + 1`` of the run already exists.
    """
    try:
        conn.execute(_INSERT, {**_row(record), "version": latest + 1})
    except sa.exc.IntegrityError as exc:
        raise VersionConflictError(record.run_id, latest, latest + 1) from exc
    return latest + 1


def _row(record: StateVersion) -> dict[str, object]:
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


def _record(row: sa.Row[tuple[object, ...]], keys: KeyRing | None) -> StateVersion:
    values = dict(row._mapping)
    if keys is not None:
        values["state"] = keys.open(values["state"])
    elif is_sealed(values["state"]):
        raise no_key_ring(values["state"], "working-state", f"run {values['run_id']!r}")
    return StateVersion(**values)


class SQLWorkingStateStore(WorkingStateStore):
    """Working state in SQLite or PostgreSQL.

    Args:
        db: a :class:`~statekeep.db.Database` (shared with the workflow store) or a URL.
        migrations: how older state schemas load into the current models.
        keys: seal the states of owned runs with their owner's data key (see :mod:`statekeep.keys`).

    Examples:
        >>> store = SQLWorkingStateStore("sqlite:///:memory:")
    """

    def __init__(
        self, db: Database | str, migrations: StateMigrations | None = None, *, keys: KeyRing | None = None
    ) -> None:
        super().__init__(migrations)
        self.db = db if isinstance(db, Database) else Database(db, setting="STATEKEEP_WORKING_URL")
        self.keys = keys
        setup(self.db)

    def sealed(self, record: StateVersion, owner: str | None, *, create: bool = False) -> StateVersion:
        """``record`` with its state sealed under ``owner``'s data key (unchanged without keys or owner).

        ``create=False`` (inside another transaction of the same database) needs the
        owner's key to exist already: :meth:`KeyRing.prepare <statekeep.keys.KeyRing.prepare>` it first.
        """
        if self.keys is None or owner is None:
            return record
        return dataclasses.replace(record, state=self.keys.seal(owner, record.state, create=create))

    def _seal(self, record: StateVersion, owner: str | None) -> StateVersion:
        return self.sealed(record, owner, create=True)

    def close(self) -> None:
        self.db.dispose()

    def _append(self, record: StateVersion, expected: int | None) -> StateVersion:
        with self.db.begin(f"saving state of run {record.run_id!r}") as conn:
            stored = append(conn, record, expected)
        if self.keys is None:
            return stored
        return dataclasses.replace(stored, state=self.keys.open(stored.state))

    def _get(self, run_id: str, version: int | None) -> StateVersion | None:
        q, params = (
            (_LATEST, {"rid": run_id}) if version is None else (_VERSION, {"rid": run_id, "v": version})
        )
        with self.db.read() as conn:
            row = conn.execute(q, params).first()
        return None if row is None else _record(row, self.keys)

    def _list(self, run_id: str) -> list[StateVersion]:
        q = sa.select(versions).where(versions.c.run_id == run_id).order_by(versions.c.version)
        with self.db.read() as conn:
            return [_record(r, self.keys) for r in conn.execute(q)]

    def _prune(self, run_id: str, keep: int) -> int:
        with self.db.begin() as conn:
            cutoff = latest_version(conn, run_id) - keep
            q = versions.delete().where(versions.c.run_id == run_id, versions.c.version <= cutoff)
            return int(conn.execute(q).rowcount)

    def _delete(self, run_ids: list[str]) -> int:  # secure_delete is on for every SQLite connection
        deleted = 0
        with self.db.begin() as conn:
            for start in range(0, len(run_ids), 500):
                chunk = run_ids[start : start + 500]
                deleted += int(conn.execute(versions.delete().where(versions.c.run_id.in_(chunk))).rowcount)
        return deleted
