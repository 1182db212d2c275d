"""pgvector specifics: row-level security against a plain role, and erasure from every file."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from statekeep.db import Database
from statekeep.errors import ConfigError, MemoryNotFoundError
from statekeep.memory import FakeEmbedder, SentenceTransformerEmbedder
from statekeep.memory.pgvector import PgVectorMemoryStore
from tests.memory.test_conformance import Clock


def libpq(url: str) -> str:
    """A SQLAlchemy URL as a libpq URL (psycopg)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def database_files(url: str) -> list[Path]:
    """Every file of this database's directory (heap, TOAST, indexes, FSM/VM), after a checkpoint."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        data_dir = conn.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
        oid = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]  # type: ignore[index]
    folder = Path(data_dir) / "base" / str(oid)
    assert folder.is_dir(), f"cannot read the data directory {folder}: run the tests on the server's machine"
    return [p for p in folder.iterdir() if p.is_file()]


def files_with(url: str, marker: str) -> list[str]:
    needle = marker.encode()
    return [p.name for p in database_files(url) if needle in p.read_bytes()]


def test_invariant_8_forget_leaves_the_owner_in_no_table_toast_or_index_file(
    postgres_url: str, real_embedder: SentenceTransformerEmbedder
) -> None:
    """After forget and a checkpoint, no heap, TOAST or index file holds the marker; a plain DELETE would."""
    store = PgVectorMemoryStore(postgres_url, real_embedder)
    store.remember_many("bob", [f"Bob's note number {i} about gardening." for i in range(50)])
    marker = f"zq{uuid.uuid4().hex}"  # short: stored inline, uncompressed, so a byte search can see it
    store.remember("alice", f"Alice's locker code is {marker}.")
    store.remember("carol", f"Carol's locker code is {marker}x.")
    assert files_with(postgres_url, marker)
    with psycopg.connect(libpq(postgres_url), autocommit=True) as conn:  # what a naive erasure does
        conn.execute("DELETE FROM statekeep_memory.memories WHERE owner = 'carol'")
        conn.execute("VACUUM statekeep_memory.memories")
    assert files_with(postgres_url, f"{marker}x"), (
        "a plain DELETE + VACUUM leaves the bytes: the scan sees them"
    )
    store.forget("carol")
    receipt = store.forget("alice")
    assert receipt.removed == 1
    assert files_with(postgres_url, marker) == []
    assert any("write-ahead log" in line for line in receipt.not_reached)
    assert len(store.list_memories("bob")) == 50
    store.close()


def test_row_level_security_refuses_other_owners_rows_to_a_plain_role(postgres_url: str) -> None:
    """A role without superuser or BYPASSRLS, scoped to alice, cannot read, change or add bob's rows."""
    admin = PgVectorMemoryStore(postgres_url, FakeEmbedder())
    role = f"worker_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq(postgres_url), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw' NOSUPERUSER NOBYPASSRLS")
    admin.grant(role)
    worker_url = make_url(postgres_url).set(username=role, password="pw").render_as_string(False)
    worker = PgVectorMemoryStore(worker_url, FakeEmbedder())
    worker.remember("alice", "alice's note")
    bob = worker.remember("bob", "bob's secret")
    with psycopg.connect(libpq(worker_url), autocommit=True) as raw:
        assert raw.execute(
            "SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user"
        ).fetchone() == (False, False)
        assert raw.execute("SELECT count(*) FROM statekeep_memory.memories").fetchone() == (0,)
        raw.execute("SELECT set_config('statekeep.owner', 'alice', false)")
        assert raw.execute("SELECT owner FROM statekeep_memory.memories").fetchall() == [("alice",)]
        assert raw.execute("SELECT * FROM statekeep_memory.memories WHERE owner = 'bob'").fetchall() == []
        assert (
            raw.execute("UPDATE statekeep_memory.memories SET content = 'x' WHERE owner = 'bob'").rowcount
            == 0
        )
        assert raw.execute("DELETE FROM statekeep_memory.memories WHERE owner = 'bob'").rowcount == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            raw.execute(
                "INSERT INTO statekeep_memory.memories (owner, id, content, kind, source, trust, model, "
                "created_us, embedding) "
                "VALUES ('bob', 'x', 'forged', 'semantic', 'imported', 1, 'm', 0, '[1,0]')"
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            raw.execute("SELECT * FROM statekeep_memory.memories_p0")
    assert admin.get("bob", bob.id).content == "bob's secret"
    assert worker.forget("bob").removed == 1  # the worker role can still erase (VACUUM FULL via MAINTAIN)
    worker.close()
    admin.close()


def test_work_across_owners_refuses_a_role_that_row_level_security_confines(postgres_url: str) -> None:
    """purge_expired and reembed as a plain role would see no rows and report 0: a ConfigError instead."""
    clock = Clock()
    admin = PgVectorMemoryStore(postgres_url, FakeEmbedder(), clock=clock)
    role = f"worker_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq(postgres_url), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw' NOSUPERUSER NOBYPASSRLS")
    admin.grant(role)
    worker_url = make_url(postgres_url).set(username=role, password="pw").render_as_string(False)
    worker = PgVectorMemoryStore(worker_url, FakeEmbedder(), clock=clock)
    gone = worker.remember("alice", "in a meeting until noon", ttl=timedelta(hours=1))
    clock.now += timedelta(hours=2)
    with pytest.raises(ConfigError, match=rf"purge_expired .* confines role '{role}'"):
        worker.purge_expired()
    with pytest.raises(ConfigError, match="reembed"):
        worker.reembed()
    assert admin.purge_expired() == 1  # the tables' owner sees every owner's rows
    with pytest.raises(MemoryNotFoundError):
        admin.get("alice", gone.id)
    worker.close()
    admin.close()


def test_filtered_search_uses_iterative_hnsw_scans(postgres_url: str) -> None:
    """The search turns on hnsw.iterative_scan, so filtering cannot silently shrink the result."""
    store = PgVectorMemoryStore(postgres_url, FakeEmbedder())
    store.remember_many("alice", [f"alice fact {i} tea" for i in range(5)])
    seen: list[str] = []
    from sqlalchemy import event

    event.listen(store.db.engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    assert len(store.search("alice", "tea", k=5)) == 5
    assert any("hnsw.iterative_scan = relaxed_order" in s for s in seen)
    assert any("force_custom_plan" in s for s in seen)
    store.close()


def test_pgvector_store_accepts_a_shared_database_and_refuses_sqlite(
    postgres_url: str, sqlite_url: str
) -> None:
    """A Database shared with other stores works; a SQLite URL is a ConfigError."""
    db = Database(postgres_url)
    store = PgVectorMemoryStore(db, FakeEmbedder())
    assert store.remember("o", "x").owner == "o"
    with pytest.raises(ConfigError):
        PgVectorMemoryStore(sqlite_url, FakeEmbedder())
    db.dispose()
