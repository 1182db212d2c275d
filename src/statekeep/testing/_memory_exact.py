"""Conformance tests of exact inserts and erasure by ids (part of ``MemoryStoreSuite``)."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from statekeep.errors import InvalidInputError, MemoryNotFoundError
from statekeep.memory import Memory, MemoryStore, Provenance


def _memory(store: MemoryStore, owner: str, mid: str, content: str) -> Memory:
    return Memory(
        id=mid,
        owner=owner,
        content=content,
        kind="semantic",
        tags=("imported",),
        metadata={"source": "test"},
        provenance=Provenance("imported"),
        model=store.embedder.name,
        created_at=datetime(2026, 1, 2, tzinfo=UTC),
    )


class ExactSuite:
    """``insert`` stores records as given; ``forget_many`` erases exactly the ids named."""

    def test_insert_keeps_the_callers_ids_and_vectors(self, store: MemoryStore) -> None:
        """Inserted memories read back under their own ids, and search finds them by the vectors given."""
        rows = [_memory(store, "alice", f"ext-{i}", f"imported fact number {i}") for i in range(3)]
        vectors = np.zeros((3, store.embedder.dimension), dtype=np.float32)
        vectors[:, 0] = 1.0
        vectors[2, 0], vectors[2, 1] = 0.0, 1.0
        stored = store.insert(rows, vectors)
        assert [m.id for m in stored] == ["ext-0", "ext-1", "ext-2"]
        got = store.get("alice", "ext-1")
        assert (got.content, got.tags, dict(got.metadata)) == (
            "imported fact number 1",
            ("imported",),
            {"source": "test"},
        )
        query = np.zeros(store.embedder.dimension, dtype=np.float32)
        query[1] = 1.0
        hits = store.search("alice", "anything", k=1, vector=query.tolist())
        assert [h.memory.id for h in hits] == ["ext-2"]
        assert store.list_memories("bob") == []

    def test_insert_refuses_bad_batches_and_writes_nothing(self, store: MemoryStore) -> None:
        """Two owners, a repeated id or vectors of the wrong shape are refused before anything is stored."""
        a, b = _memory(store, "alice", "x1", "one"), _memory(store, "bob", "x2", "two")
        with pytest.raises(InvalidInputError):
            store.insert([a, b])
        with pytest.raises(InvalidInputError):
            store.insert([a, a])
        with pytest.raises(InvalidInputError):
            store.insert([a], np.zeros((1, store.embedder.dimension + 1), dtype=np.float32))
        with pytest.raises(InvalidInputError):
            store.insert([])
        assert store.list_memories("alice") == []

    def test_forget_many_erases_only_the_named_ids(self, store: MemoryStore) -> None:
        """forget_many removes the ids named (unknown ones skipped); the rest stay; [] removes nothing."""
        store.insert([_memory(store, "alice", f"m{i}", f"fact {i}") for i in range(3)])
        receipt = store.forget_many("alice", ["m0", "m2", "nope"])
        assert (receipt.removed, receipt.memory_ids) == (2, ("m0", "m2"))
        assert [m.id for m in store.list_memories("alice")] == ["m1"]
        with pytest.raises(MemoryNotFoundError):
            store.get("alice", "m0")
        assert store.forget_many("alice", []).removed == 0
        assert [m.id for m in store.list_memories("alice")] == ["m1"]
        with pytest.raises(InvalidInputError):
            store.forget_many("alice", "m1")
