"""Filtered search does not silently return too few: a 1% owner in a big, indexed table."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from statekeep.memory import MemoryInput, MemoryStore

from .conftest import LookupEmbedder, open_backend, synthetic_vectors

ROWS, DIM, QUERIES, K = 20_000, 64, 40, 10


def load(store: MemoryStore, owners: list[str]) -> None:
    """Bulk-load doc-<i> for owner[i], one remember_many per owner and chunk."""
    by_owner: dict[str, list[int]] = defaultdict(list)
    for i, owner in enumerate(owners):
        by_owner[owner].append(i)
    for owner, ids in by_owner.items():
        for start in range(0, len(ids), 5000):
            store.remember_many(owner, [MemoryInput(f"doc-{i}") for i in ids[start : start + 5000]])


def recall(store: MemoryStore, vectors: np.ndarray, owners: list[str], owner: str) -> float:
    """Mean recall@10 of ``owner``'s searches against exact search over that owner's vectors."""
    mine = np.array([i for i, o in enumerate(owners) if o == owner])
    total = 0.0
    for q in range(ROWS, ROWS + QUERIES):
        exact = set(mine[np.argsort(-(vectors[mine] @ vectors[q]))[:K]].tolist())
        got = {int(r.memory.content.split("-")[1]) for r in store.search(owner, "q", k=K, vector=vectors[q])}
        total += len(exact & got) / K
    return total / QUERIES


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lancedb", "pgvector"])
def test_filtered_recall_at_10_of_a_one_percent_owner_is_at_least_0_95(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """With one owner holding 1% of 20,000 indexed memories, recall@10 against exact search is >= 0.95."""
    vectors = synthetic_vectors(ROWS + QUERIES, DIM)
    owners = ["small" if i % 100 == 0 else f"big-{i % 7}" for i in range(ROWS)]
    store = open_backend(backend, request, tmp_path)(LookupEmbedder(vectors), duplicate_threshold=None)
    started = time.perf_counter()
    load(store, owners)
    if backend == "lancedb":
        store.optimize()  # files grouped by owner, text and owner indexes
    print(f"{backend}: loaded {ROWS} in {time.perf_counter() - started:.1f}s")
    assert recall(store, vectors, owners, "small") >= 0.95
    store.close()
