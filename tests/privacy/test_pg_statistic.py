"""No memory content survives in PostgreSQL's statistics (pg_statistic), read back through SQL.

ANALYZE samples values of table columns and of index expressions into
pg_statistic. Statistics are off on the memory table's columns; the HNSW
index's expression (the embedding cast to its dimension) is a column of its own,
sampled for vectors of up to ~250 dimensions. A 64-dimension embedder shows it.
"""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy.engine import make_url

from statekeep.memory import FakeEmbedder
from statekeep.memory.pgvector import PgVectorMemoryStore
from statekeep.memory.pgvector import _sql as q


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def sampled_vectors(url: str) -> list[list[float]]:
    """Every vector pg_statistic holds for a relation of the memory schema, decoded through SQL."""
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        rows = conn.execute(
            """SELECT s.stavalues1::text, s.stavalues2::text, s.stavalues3::text,
                      s.stavalues4::text, s.stavalues5::text
               FROM pg_statistic s JOIN pg_class c ON c.oid = s.starelid
               WHERE c.relnamespace = 'statekeep_memory'::regnamespace"""
        ).fetchall()
    found = []
    for row in rows:
        for text in row:
            for part in (text or "").strip("{}").split('","'):
                part = part.strip('"')
                if part.startswith("["):
                    found.append([float(x) for x in part.strip("[]").split(",")])
    return found


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 1e-4 for x, y in zip(a, b, strict=True))


def _analyze(url: str) -> None:
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        conn.execute("ANALYZE")


def test_statistics_are_off_on_the_memory_index_expressions(postgres_url: str) -> None:
    """After ANALYZE, pg_statistic holds no sample of any memory index expression (nor table column)."""
    embedder = FakeEmbedder(dimension=64)
    store = PgVectorMemoryStore(postgres_url, embedder)
    store.remember_many("alice", [f"alice fact number {i} about tea" for i in range(200)])
    _analyze(postgres_url)
    assert sampled_vectors(postgres_url) == []
    with psycopg.connect(_libpq(postgres_url), autocommit=True) as conn:
        expressions = conn.execute(
            """SELECT a.attrelid::regclass::text, a.attstattarget FROM pg_index i
               JOIN pg_attribute a ON a.attrelid = i.indexrelid AND a.attnum > 0
               JOIN pg_class c ON c.oid = i.indexrelid
               WHERE c.relnamespace = 'statekeep_memory'::regnamespace AND i.indexprs IS NOT NULL"""
        ).fetchall()
    assert len(expressions) == 1 + q.PARTITIONS, "the HNSW index and each partition's have an expression"
    assert {target for _, target in expressions} == {0}
    store.close()


def test_forget_leaves_no_statistics_row_that_decodes_to_the_owners_embeddings(postgres_url: str) -> None:
    """Even where a database sampled the expression (before this fix), forget leaves no such row."""
    embedder = FakeEmbedder(dimension=64)
    store = PgVectorMemoryStore(postgres_url, embedder)
    texts = [f"alice secret number {i}" for i in range(50)]
    store.remember_many("alice", texts)
    store.remember_many("bob", [f"bob note {i}" for i in range(50)])
    with psycopg.connect(_libpq(postgres_url), autocommit=True) as conn:  # as an older database would be
        names = conn.execute(
            """SELECT i.indexrelid::regclass::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE c.relnamespace = 'statekeep_memory'::regnamespace AND i.indexprs IS NOT NULL"""
        ).fetchall()
        for (name,) in names:
            conn.execute(f"ALTER INDEX {name} ALTER COLUMN 1 SET STATISTICS 100")
    _analyze(postgres_url)
    vectors = [v.tolist() for v in embedder.embed(texts)]
    sampled = sampled_vectors(postgres_url)
    assert any(_close(s, v) for s in sampled for v in vectors), "the decoding must see sampled vectors"

    store.forget("alice")

    sampled = sampled_vectors(postgres_url)
    assert not any(_close(s, v) for s in sampled for v in vectors)
    store.close()


@pytest.mark.parametrize("dimension", [64])
def test_a_new_index_has_statistics_off_from_the_start(postgres_url: str, dimension: int) -> None:
    """An index made for another model later (a re-embedding) gets statistics off on creation too."""
    PgVectorMemoryStore(postgres_url, FakeEmbedder(dimension=8)).close()
    store = PgVectorMemoryStore(postgres_url, FakeEmbedder(dimension=dimension, name="other"))
    store.remember("carol", "carol's fact")
    _analyze(postgres_url)
    assert sampled_vectors(postgres_url) == []
    name, _ = q.index_ddl("other", dimension)
    with psycopg.connect(_libpq(postgres_url), autocommit=True) as conn:
        targets = conn.execute(
            "SELECT attstattarget FROM pg_attribute WHERE attrelid = %s::regclass AND attnum = 1",
            (f"{q.SCHEMA}.{name}",),
        ).fetchall()
    assert targets == [(0,)]
    store.close()
