"""The memory-store conformance suite on every backend: in-memory, LanceDB and pgvector.

The suite embeds with the fast fake embedder; its test of search by meaning uses
the real model (all-MiniLM-L6-v2) on every backend.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statekeep.memory import Embedder, InMemoryMemoryStore, MemoryStore, SentenceTransformerEmbedder
from statekeep.testing import MemoryStoreFactory, MemoryStoreSuite


def _closing(open_store: Any) -> Iterator[MemoryStoreFactory]:
    """A factory that closes the stores it opened before (a LanceDB folder is locked by its writer)."""
    opened: list[MemoryStore] = []

    def make(embedder: Embedder, **options: Any) -> MemoryStore:
        for store in opened:
            store.close()
        opened.append(open_store(embedder, **options))
        return opened[-1]

    yield make
    for store in opened:
        store.close()


class _RealModel(MemoryStoreSuite):
    @pytest.fixture
    def semantic_embedder(self, real_embedder: SentenceTransformerEmbedder) -> Embedder:
        return real_embedder


class TestInMemoryMemory(_RealModel):
    @pytest.fixture
    def make_store(self) -> MemoryStoreFactory:
        first: list[InMemoryMemoryStore] = []

        def make(embedder: Embedder, **options: Any) -> MemoryStore:
            first.append(InMemoryMemoryStore(embedder, shared=first[0] if first else None, **options))
            return first[-1]

        return make


class TestLanceDBMemory(_RealModel):
    @pytest.fixture
    def make_store(self, tmp_path: Path) -> Iterator[MemoryStoreFactory]:
        from statekeep.memory.lancedb import LanceDBMemoryStore

        yield from _closing(lambda embedder, **kw: LanceDBMemoryStore(tmp_path / "memory", embedder, **kw))


class TestPgVectorMemory(_RealModel):
    @pytest.fixture
    def make_store(self, postgres_url: str) -> Iterator[MemoryStoreFactory]:
        from statekeep.memory.pgvector import PgVectorMemoryStore

        yield from _closing(lambda embedder, **kw: PgVectorMemoryStore(postgres_url, embedder, **kw))
