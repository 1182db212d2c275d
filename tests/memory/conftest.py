"""Memory stores on every backend: in-memory (reference), LanceDB and pgvector.

The real embedder (all-MiniLM-L6-v2) is loaded once per session; ``make_store``
opens LanceDB and pgvector stores with it, the in-memory reference with the
deterministic fake, unless a test passes another. The contract itself is tested by
the conformance suite (``statekeep.testing.MemoryStoreSuite``, run in test_suite.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from statekeep.memory import (
    Embedder,
    FakeEmbedder,
    InMemoryMemoryStore,
    MemoryStore,
    SentenceTransformerEmbedder,
)

BACKENDS = ["memory", "lancedb", "pgvector"]
StoreFactory = Callable[..., MemoryStore]


@pytest.fixture(scope="session")
def real_embedder() -> SentenceTransformerEmbedder:
    """all-MiniLM-L6-v2, loaded once for the whole session."""
    embedder = SentenceTransformerEmbedder()
    embedder.embed(["warm up"])
    return embedder


class LookupEmbedder:
    """Maps ``"doc-<i>"`` to row ``i`` of a given matrix: synthetic vectors through the public write path."""

    def __init__(self, vectors: npt.NDArray[np.float32], name: str = "synthetic") -> None:
        self.vectors = vectors
        self.name = name
        self.dimension = int(vectors.shape[1])

    def embed(self, texts: Any) -> npt.NDArray[np.float32]:
        return self.vectors[[int(t.split("-")[1]) for t in texts]]


class CachedEmbedder:
    """The real embedder, with the vectors of texts embedded once before (each backend reuses them)."""

    def __init__(self, real: SentenceTransformerEmbedder, texts: list[str]) -> None:
        self.real = real
        self.name = real.name
        self.dimension = real.dimension
        self.cache = dict(zip(texts, real.embed(texts), strict=True))

    def embed(self, texts: Any) -> npt.NDArray[np.float32]:
        missing = [t for t in texts if t not in self.cache]
        if missing:
            self.cache.update(zip(missing, self.real.embed(missing), strict=True))
        return np.stack([self.cache[t] for t in texts]) if texts else self.real.embed([])


class Clock:
    """A clock a test can move forward."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def open_backend(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., MemoryStore]:
    """A function that opens (or reopens) one fresh store location of ``backend``."""
    if backend == "memory":
        first: list[InMemoryMemoryStore] = []

        def _memory(embedder: Embedder, **kw: Any) -> MemoryStore:
            store = InMemoryMemoryStore(embedder, shared=first[0] if first else None, **kw)
            first.append(store)
            return store

        return _memory
    if backend == "lancedb":
        from statekeep.memory.lancedb import LanceDBMemoryStore

        return lambda embedder, **kw: LanceDBMemoryStore(tmp_path / "memory", embedder, **kw)
    from statekeep.memory.pgvector import PgVectorMemoryStore

    url = request.getfixturevalue("postgres_url")
    return lambda embedder, **kw: PgVectorMemoryStore(url, embedder, **kw)


@pytest.fixture(params=BACKENDS)
def make_store(
    request: pytest.FixtureRequest, tmp_path: Path, real_embedder: SentenceTransformerEmbedder
) -> Iterator[StoreFactory]:
    """A factory of stores over one fresh location; opening again closes the previous store."""
    opener = open_backend(request.param, request, tmp_path)
    default: Embedder = FakeEmbedder() if request.param == "memory" else real_embedder
    opened: list[MemoryStore] = []

    def _open(embedder: Embedder | None = None, **kw: Any) -> MemoryStore:
        for store in opened:
            store.close()
        store = opener(embedder or default, **kw)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


@pytest.fixture
def store(make_store: StoreFactory) -> MemoryStore:
    """A fresh store of each backend."""
    return make_store()


def synthetic_vectors(n: int, dim: int, seed: int = 0) -> npt.NDArray[np.float32]:
    """Clustered unit vectors, like sentence embeddings of many topics (neighbours near 0.7 cosine)."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((max(8, n // 200), dim)).astype(np.float32)
    points = centers[rng.integers(0, len(centers), n)] + 0.6 * rng.standard_normal((n, dim)).astype(
        np.float32
    )
    unit: npt.NDArray[np.float32] = points / np.linalg.norm(points, axis=1, keepdims=True)
    return unit
