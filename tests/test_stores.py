"""The one list of stores: each store declares itself once, and what walks the list reaches every store."""

from __future__ import annotations

import dataclasses
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from statekeep.cli import main
from statekeep.db import Database
from statekeep.db.catalog import StoreSpec
from statekeep.erasure import ErasureReceipt
from statekeep.keys import KeyRing, LocalKeyFile, key_id_of, reencrypt
from statekeep.stores import DECLARATIONS, declaration, declared


def _cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run ``statekeep ARGS`` in this process; its output (the exit code must be 0)."""
    monkeypatch.setattr(sys, "argv", ["statekeep", *args])
    code: object = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    assert not code, out
    return out.out + out.err


def _sql_stores() -> list[StoreSpec[Any]]:
    return [spec for spec in declared() if spec.lives_in is not None]


def _filler(column: sa.Column[Any]) -> object:
    """A value of the column's type, for a row that only has to exist."""
    kind = getattr(column.type, "impl_instance", column.type).python_type  # a TypeDecorator's own
    if kind is datetime:
        return datetime.now(UTC)
    return {str: "x", int: 1, bytes: b"x", bool: False}[kind]


def test_the_list_declares_each_store_once_under_its_name_with_the_data_keys_last() -> None:
    """Every entry resolves (langgraph is installed here), names itself as listed; keys are erased last."""
    assert [spec.name for spec in declared()] == list(DECLARATIONS)
    assert list(DECLARATIONS)[-1] == "keys"
    for spec in _sql_stores():
        assert spec.lives_in in ("context", "working", "workflow"), spec.name
        assert spec.metadata is not None
        assert spec.metadata.schema == spec.schema, spec.name
        tables = {t.name: t for t in spec.metadata.tables.values()}
        for table, columns in {**spec.sealed, **spec.no_statistics}.items():
            if table in tables:  # else a partition of one (the key table's, on PostgreSQL)
                assert set(columns) <= set(tables[table].c.keys()), (spec.name, table)
    assert declaration("agents").part_of == "context"


def test_the_erasure_receipt_has_a_section_for_every_store_with_an_erase_hook() -> None:
    """A store declared with an erase hook gets its counts in the receipt, under its name."""
    sections = {f.name for f in dataclasses.fields(ErasureReceipt)}
    erased = {spec.name for spec in declared() if spec.erase is not None}
    assert erased == {
        "working",
        "workflow",
        "context",
        "agents",
        "langgraph",
        "memory",
        "langgraph_store",
        "keys",
    }
    assert erased <= sections


def test_db_upgrade_brings_every_declared_sql_store_to_its_latest_version(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`statekeep db upgrade` creates each declared store's tables at their last migration, and says so."""
    out = _cli(monkeypatch, capsys, "db", "upgrade", "--database-url", database_url, "--home", str(tmp_path))
    db = Database(database_url)
    for spec in _sql_stores():
        assert f"{spec.name}: up to date" in out
        assert spec.version(db) == len(spec.migrations) > 0, spec.name
    assert "memory" not in out  # its backends create their own tables
    db.dispose()


def test_every_table_the_sql_stores_create_is_declared(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """After `db upgrade`, no statekeep table of the database is missing from its store's declaration."""
    _cli(monkeypatch, capsys, "db", "upgrade", "--database-url", database_url, "--home", str(tmp_path))
    db = Database(database_url)
    declared_tables = set()
    for spec in _sql_stores():
        assert spec.metadata is not None
        schema = spec.schema if db.dialect.has_schemas else None
        names = [t.name for t in spec.metadata.tables.values()]
        names += [*spec.no_statistics, f"{spec.name}_migrations"]  # and the key table's partitions
        declared_tables |= {(schema, name) for name in names}
    with db.read() as conn:
        inspector = sa.inspect(conn)
        schemas: list[str | None] = [s for s in inspector.get_schema_names() if s.startswith("statekeep_")]
        schemas = schemas or [None]  # SQLite: one schema
        found = {(schema, name) for schema in schemas for name in inspector.get_table_names(schema=schema)}
    assert found
    assert found - declared_tables == set()
    db.dispose()


def test_reencrypt_reseals_every_declared_sealed_column(database_url: str, tmp_path: Path) -> None:
    """A value sealed under a retired key in any declared sealed column is sealed again under the new one."""
    db = Database(database_url)
    ring = KeyRing(db, LocalKeyFile(tmp_path / "keys.json"), current_ttl=0.0)
    stores = [spec for spec in declared() if spec.sealed]
    assert {spec.name for spec in stores} == {"context", "working", "workflow", "agents"}
    markers: dict[tuple[str, str, str], str] = {}
    for spec in stores:
        spec.upgrade(db)
        for name, columns in spec.sealed.items():
            table = spec.table(name)
            row = {c.name: _filler(c) for c in table.columns if c.identity is None}
            for column in columns:
                markers[(spec.name, name, column)] = f"secret of {spec.name}.{name}.{column}"
                row[column] = ring.seal("alice", markers[(spec.name, name, column)])
            with db.begin() as conn:
                conn.execute(table.insert().values(row))
    old = key_id_of(ring.seal("alice", "probe"))
    ring.rotate()

    report = reencrypt(ring, {spec.name: db for spec in stores})

    for spec in stores:
        assert report[f"{spec.name}.resealed"] == sum(len(c) for c in spec.sealed.values()), spec.name
        for name, columns in spec.sealed.items():
            table = spec.table(name)
            with db.read() as conn:
                [stored] = conn.execute(sa.select(*(table.c[c] for c in columns))).all()
            for column, value in zip(columns, stored, strict=True):
                assert key_id_of(value) not in (None, old), (spec.name, name, column)
                assert ring.open(value) == markers[(spec.name, name, column)]
    db.dispose()


def test_keys_reencrypt_walks_every_store_that_declares_sealed_columns(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`statekeep keys reencrypt` reports a count for each declared store with sealed columns."""
    where = ("--database-url", database_url, "--home", str(tmp_path))
    _cli(monkeypatch, capsys, "db", "upgrade", *where)
    report = json.loads(_cli(monkeypatch, capsys, "keys", "reencrypt", *where))
    assert {k for k in report if k.endswith(".resealed")} == {
        f"{spec.name}.resealed" for spec in declared() if spec.sealed
    }


def test_every_declared_statistics_column_is_off_on_postgres(postgres_url: str) -> None:
    """After each store's migrations, PostgreSQL samples none of the columns its declaration names."""
    db = Database(postgres_url)
    stores = [spec for spec in _sql_stores() if spec.no_statistics]
    assert {spec.name for spec in stores} == {"context", "working", "workflow", "agents", "langgraph", "keys"}
    for spec in stores:
        spec.upgrade(db)
        with db.read() as conn:
            for table, columns in spec.no_statistics.items():
                for column in columns:
                    target = conn.execute(
                        sa.text(
                            "SELECT attstattarget FROM pg_attribute "
                            "WHERE attrelid = CAST(:t AS regclass) AND attname = :c"
                        ),
                        {"t": f"{spec.schema}.{table}", "c": column},
                    ).scalar_one()
                    assert target == 0, (spec.name, table, column)
    db.dispose()


def test_db_upgrade_refuses_a_key_provider_that_cannot_be_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broken STATEKEEP_KEYS is found when the stores are upgraded, before any table is made."""
    monkeypatch.setenv("STATEKEEP_KEYS", "statekeep_no_such_module:factory")
    monkeypatch.setattr(sys, "argv", ["statekeep", "db", "upgrade", "--home", str(tmp_path)])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code not in (0, None)
    out = capsys.readouterr()
    assert "STATEKEEP_KEYS" in out.out + out.err
    assert "up to date" not in out.out + out.err


def test_an_optional_declaration_that_fails_for_another_reason_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only the extra's own missing packages leave a declaration out: another import error is raised."""
    monkeypatch.setitem(DECLARATIONS, "langgraph", "statekeep_no_such_module:STORE")
    declaration.cache_clear()
    try:
        with pytest.raises(ImportError, match="statekeep_no_such_module"):
            declared()
    finally:
        monkeypatch.undo()
        declaration.cache_clear()
    assert "langgraph" in {spec.name for spec in declared()}
