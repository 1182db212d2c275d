"""Deterministic ranking (issue 19, part 3): the same data and query give the same results, every time.

Ties in score are broken by content (by code point), then by write order, on
every backend, so two separate ingests of the same data rank alike, and backends
whose scores agree (vector search) rank alike too.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
import pytest

from statekeep.memory import (
    Embedder,
    Filters,
    InMemoryMemoryStore,
    MemoryInput,
    MemoryStore,
    SearchResult,
    SentenceTransformerEmbedder,
)
from tests.conftest import sqlalchemy_url

from .conftest import BACKENDS, CachedEmbedder, LookupEmbedder
from .test_dedupe import statements

K = 20
QUERIES = [
    "good luck",
    "bye",
    "Bye Joanna! Good luck!",
    "It takes courage",
    "your words mean a lot",
    "see you soon",
    "June 2023",
    "Caroline",
    "Thanks! I will.",
    "Who said goodbye on 9 June?",
]
Opener = Callable[..., MemoryStore]


def corpus() -> list[MemoryInput]:
    """Tie-heavy memories: 400 short statements sharing most words, and the same text said 3 times."""
    texts = statements()[::2][:400]
    items = [MemoryInput(t, metadata={"n": i}) for i, t in enumerate(texts)]
    for turn in range(3):  # the same words in three turns: kept apart by dedupe="none", tied in every score
        items += [
            MemoryInput(t, metadata={"n": 1000 + 10 * turn + j}) for j, t in enumerate(["Bye!", "Good luck!"])
        ]
    return items


@pytest.fixture(scope="module")
def embedded(real_embedder: SentenceTransformerEmbedder) -> CachedEmbedder:
    """all-MiniLM-L6-v2 with the corpus and the queries embedded once."""
    return CachedEmbedder(real_embedder, sorted({i.content for i in corpus()} | set(QUERIES)))


def new_database(admin_url: str) -> Iterator[str]:
    """A fresh database with pgvector, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(sqlalchemy_url(admin_url, name).replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    yield sqlalchemy_url(admin_url, name)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens a store of a backend in a location of its own, each call a new one."""
    opened: list[MemoryStore] = []
    databases: list[Iterator[str]] = []

    def _open(backend: str, embedder: Embedder, **kw: Any) -> MemoryStore:
        store: MemoryStore
        if backend == "memory":
            store = InMemoryMemoryStore(embedder, **kw)
        elif backend == "lancedb":
            from statekeep.memory.lancedb import LanceDBMemoryStore

            store = LanceDBMemoryStore(tmp_path / f"lance-{len(opened)}", embedder, **kw)
        else:
            from statekeep.memory.pgvector import PgVectorMemoryStore

            databases.append(new_database(request.getfixturevalue("postgres_admin_url")))
            store = PgVectorMemoryStore(next(databases[-1]), embedder, **kw)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()
    for database in databases:
        next(database, None)


def full_text(store: MemoryStore, query: str) -> list[SearchResult]:
    """The backend's full-text ranking alone (what hybrid search fuses with the vector ranking)."""
    return store._text("locomo", query, 4 * K, Filters(), store.now())


def ranked(store: MemoryStore, owner: str, **kw: Any) -> list[tuple[str, int, float]]:
    """One search's results as (content, which ingested item, score)."""
    return [(r.memory.content, r.memory.metadata["n"], r.score) for r in store.search(owner, **kw)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_ingests_of_the_same_data_rank_alike(
    backend: str, fresh: Opener, embedded: CachedEmbedder
) -> None:
    """Two fresh stores given the same memories return the same ordered results for every query and mode.

    Many results tie: full-text ranks of statements sharing their words, and the same
    text said three times (tied in every score, kept in write order).
    """
    items = corpus()
    stores = [fresh(backend, embedded, dedupe="none") for _ in range(2)]
    for store in stores:
        for start in range(0, len(items), 100):
            store.remember_many("locomo", items[start : start + 100])
    ties = 0
    for query in QUERIES + [i.content for i in items[::40]]:
        for mode in ("vector", "hybrid"):
            first, second = (ranked(s, "locomo", query=query, k=K, mode=mode) for s in stores)
            assert [r[:2] for r in first] == [r[:2] for r in second], (query, mode)
            scores = [r[2] for r in first]
            assert scores == sorted(scores, reverse=True)
            keys = [(-score, content, n) for content, n, score in first]
            assert [k[:2] for k in keys] == sorted(k[:2] for k in keys), "ties broken by content"
        # the full-text ranking that hybrid search fuses, on its own: mostly ties
        texts: list[list[tuple[str, Any]]] = [
            [(h.memory.content, h.memory.metadata["n"]) for h in full_text(s, query)] for s in stores
        ]
        first_text, second_text = texts
        assert first_text == second_text, query
        scores = [h.score for h in full_text(stores[0], query)]
        ties += len(scores) - len(set(scores))
    assert ties > 200, "the corpus must be tie-heavy, or this test proves little"
    said = [r for r in ranked(stores[0], "locomo", query="Bye!", k=K) if r[0] == "Bye!"]
    assert [n for _, n, _ in said] == [1000, 1010, 1020]  # identical memories: in the order written


def grouped_vectors(groups: int, size: int, dim: int = 64, seed: int = 7) -> npt.NDArray[np.float32]:
    """``groups`` random unit vectors, each repeated ``size`` times: every search is full of exact ties."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((groups, dim)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    return np.repeat(base, size, axis=0)


def test_every_backend_ranks_a_vector_search_alike(fresh: Opener) -> None:
    """In-memory, LanceDB and pgvector return the same ordered results, ties and cuts inside ties included.

    Groups of five memories share one vector, so each search ties in groups, and
    k=7 cuts through a group: which of its members are returned is decided by
    content, then write order, not by each engine. (Full-text scores differ by
    backend, so hybrid search is compared per backend, above.)
    """
    vectors = grouped_vectors(60, 5)
    rng = np.random.default_rng(1)
    queries = vectors[::5][:30] + 0.3 * rng.standard_normal((30, vectors.shape[1])).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    for q in queries:  # the groups that reach the top 20 score apart, so float rounding cannot reorder them
        top = np.sort(vectors[::5] @ q)[::-1][: K // 5 + 2]
        assert -np.diff(top).min() > 1e-5
    order = [int(i) for i in np.random.default_rng(2).permutation(len(vectors))]
    items = [MemoryInput(f"doc-{i}", metadata={"n": i}) for i in order]
    items += [MemoryInput(f"doc-{i}", metadata={"n": 1000 + i}) for i in order[:40]]  # the same text twice
    results: dict[str, list[list[tuple[str, int]]]] = {}
    for backend in BACKENDS:
        store = fresh(backend, LookupEmbedder(vectors), dedupe="none")
        for start in range(0, len(items), 64):
            store.remember_many("o", items[start : start + 64])
        results[backend] = [
            [r[:2] for r in ranked(store, "o", query="q", k=k, vector=q)] for q in queries for k in (7, K)
        ]
    assert results["lancedb"] == results["memory"]
    assert results["pgvector"] == results["memory"]
    assert all(len(r) == 7 for r in results["memory"][::2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_owners_results_and_scores_owe_nothing_to_other_owners_or_to_optimize(
    backend: str, fresh: Opener, embedded: CachedEmbedder
) -> None:
    """The same memories of one owner give the same results, scores included, whatever the others hold.

    A full-text score weighted by the whole table's word counts (LanceDB's own index)
    moved one owner's scores with what other owners wrote, once ``optimize`` had
    indexed it: an owner could learn how often a word occurs in other owners'
    memories from their own scores. Here another owner writes the query's words many
    times over, and the table is optimized.
    """
    items = corpus()[:200]
    alone, crowded = fresh(backend, embedded, dedupe="none"), fresh(backend, embedded, dedupe="none")
    others = [MemoryInput(f"Bye Joanna, good luck with the courage speech {i}!") for i in range(300)]
    for store in (alone, crowded):
        store.remember_many("locomo", items)
    crowded.remember_many("other", others)
    queries = QUERIES + [i.content for i in items[::25]]

    def answers(store: MemoryStore) -> list[list[tuple[str, int, float]]]:
        return [ranked(store, "locomo", query=q, k=K, mode=m) for q in queries for m in ("text", "hybrid")]

    expected = answers(alone)
    assert sum(len(a) for a in expected) > 10 * len(queries)
    assert answers(crowded) == expected
    crowded.optimize()
    alone.optimize()
    assert answers(crowded) == expected
    assert answers(alone) == expected
