"""Schema migrations: applied once, in order, atomically, under a lock; never onto a newer database."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.db import Database, Migration, upgrade
from statekeep.db.migrations import current_version
from statekeep.errors import SchemaVersionError
from statekeep.workflow import tables as workflow_tables
from tests.conftest import BACKENDS
from tests.workflow.conftest import append, fork, lines, wait

SCHEMA = "statekeep_toy"


def toy_migrations(log: Path, *, fail_second: bool = False) -> list[Migration]:
    """Two migrations that create a table each and log every time they are applied."""

    def create(name: str, fail: bool = False) -> Migration:
        def _apply(conn: Connection) -> None:
            append(log, f"{name} {os.getpid()}")
            table = sa.Table(name, sa.MetaData(schema=SCHEMA), sa.Column("id", sa.Integer, primary_key=True))
            table.create(conn)  # fails if applied twice
            if fail:
                raise RuntimeError(f"{name} is broken")

        return Migration(int(name[-1]), f"create {name}", _apply)

    return [create("toy1"), create("toy2", fail_second)]


def toy_tables(db: Database) -> set[str]:
    with db.read() as conn:
        return set(sa.inspect(conn).get_table_names(schema=SCHEMA if db.dialect.has_schemas else None))


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest) -> Iterator[Database]:
    database = Database(request.getfixturevalue(f"{request.param}_url"))
    yield database
    database.dispose()


def test_upgrade_applies_each_migration_once_and_records_it(db: Database, tmp_path: Path) -> None:
    """The first upgrade applies both in order; a second is a no-op."""
    log = tmp_path / "log"
    assert current_version(db, "toy", SCHEMA) == 0
    assert upgrade(db, "toy", SCHEMA, toy_migrations(log)) == 2
    assert upgrade(db, "toy", SCHEMA, toy_migrations(log)) == 2
    assert [line.split()[0] for line in lines(log)] == ["toy1", "toy2"]
    assert current_version(db, "toy", SCHEMA) == 2
    assert {"toy1", "toy2"} <= toy_tables(db)


def test_a_failing_migration_leaves_no_trace_and_is_applied_once_fixed(db: Database, tmp_path: Path) -> None:
    """Each migration is its own transaction: a failure rolls back its DDL and records no version."""
    log = tmp_path / "log"
    with pytest.raises(RuntimeError, match="toy2 is broken"):
        upgrade(db, "toy", SCHEMA, toy_migrations(log, fail_second=True))
    assert current_version(db, "toy", SCHEMA) == 1
    assert "toy2" not in toy_tables(db)
    assert upgrade(db, "toy", SCHEMA, toy_migrations(log)) == 2
    assert "toy2" in toy_tables(db)


def test_a_database_newer_than_the_code_is_refused(db: Database, tmp_path: Path) -> None:
    """Old code meeting a newer schema stops with SchemaVersionError instead of using it."""
    upgrade(db, "toy", SCHEMA, toy_migrations(tmp_path / "log"))
    with pytest.raises(SchemaVersionError, match="newer than this code"):
        upgrade(db, "toy", SCHEMA, toy_migrations(tmp_path / "log")[:1])
    assert current_version(db, "toy", SCHEMA) == 2


def test_misnumbered_migrations_are_refused_before_touching_the_database(sqlite_url: str) -> None:
    """Numbers must run 1..n: a gap or a repeat is a bug in the code, reported as such."""
    db = Database(sqlite_url)
    noop = Migration(1, "noop", lambda conn: None)
    try:
        for numbers in ([1, 3], [1, 1], [2]):
            migrations = [Migration(n, noop.description, noop.apply) for n in numbers]
            with pytest.raises(SchemaVersionError, match=r"numbered 1\.\.n"):
                upgrade(db, "toy", SCHEMA, migrations)
        assert current_version(db, "toy", SCHEMA) == 0
    finally:
        db.dispose()


def test_workers_upgrading_at_once_apply_each_migration_once(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Four processes start against a new database together: the lock lets one apply each step."""
    for backend in BACKENDS:
        url = request.getfixturevalue(f"{backend}_url")
        log, go = tmp_path / f"{backend}.log", tmp_path / f"{backend}.go"

        def child(url: str = url, log: Path = log, go: Path = go) -> None:
            while not go.exists():
                pass
            db = Database(url)
            upgrade(db, "toy", SCHEMA, toy_migrations(log))
            db.dispose()

        pids = [fork(child) for _ in range(4)]
        go.touch()
        assert [wait(pid) for pid in pids] == [0, 0, 0, 0], backend
        assert sorted(line.split()[0] for line in lines(log)) == ["toy1", "toy2"], backend
        db = Database(url)
        assert current_version(db, "toy", SCHEMA) == 2
        db.dispose()


def _approval_indexes(db: Database) -> set[str]:
    schema = workflow_tables.SCHEMA if db.dialect.has_schemas else None
    with db.read() as conn:
        return {str(ix["name"]) for ix in sa.inspect(conn).get_indexes("approvals", schema=schema)}


def test_workflow_2_drops_the_redundant_approvals_index_of_a_version_1_database(db: Database) -> None:
    """A database made by version 1 (with its index on run_id alone) upgrades; a new one never had it."""
    upgrade(db, "workflow", workflow_tables.SCHEMA, workflow_tables.MIGRATIONS[:1])
    version_1 = sa.Table(  # the column as version 1 declared it: SQLAlchemy names its index
        "approvals",
        sa.MetaData(schema=workflow_tables.SCHEMA),
        sa.Column("run_id", sa.String(255), nullable=False, index=True),
    )
    (index,) = version_1.indexes
    with db.begin() as conn:
        index.create(conn)
    old_index = str(index.name)
    assert old_index in _approval_indexes(db)

    workflow_tables.setup(db)
    assert current_version(db, "workflow", workflow_tables.SCHEMA) == len(workflow_tables.MIGRATIONS)
    indexes = _approval_indexes(db)
    assert old_index not in indexes
    assert "ix_approvals_run_seq" in indexes  # still serves lookups by run
    assert old_index not in {ix.name for ix in workflow_tables.approvals.indexes}


def test_workflow_3_adds_the_lease_parent_epoch_to_a_version_2_database(db: Database) -> None:
    """A version-2 database (runs without lease_parent_epoch) upgrades, and children fence again."""
    upgrade(db, "workflow", workflow_tables.SCHEMA, workflow_tables.MIGRATIONS[:2])
    table = "runs" if db.name == "sqlite" else f"{workflow_tables.SCHEMA}.runs"
    with db.begin() as conn:  # version 1 built runs from today's metadata: take the column away
        conn.execute(sa.text(f"ALTER TABLE {table} DROP COLUMN lease_parent_epoch"))
    assert "lease_parent_epoch" not in _run_columns(db)

    workflow_tables.setup(db)
    assert current_version(db, "workflow", workflow_tables.SCHEMA) == len(workflow_tables.MIGRATIONS)
    assert "lease_parent_epoch" in _run_columns(db)
    workflow_tables.setup(db)  # idempotent
    assert current_version(db, "workflow", workflow_tables.SCHEMA) == len(workflow_tables.MIGRATIONS)


def _run_columns(db: Database) -> set[str]:
    schema = workflow_tables.SCHEMA if db.name == "postgresql" else None
    with db.read() as conn:
        return {c["name"] for c in sa.inspect(conn).get_columns("runs", schema=schema)}
