"""Deduplication never hides a memory that is not the same fact (issue 19, part 1)."""

from __future__ import annotations

import itertools

import pytest

from statekeep.memory import MemoryInput, SentenceTransformerEmbedder

from .conftest import CachedEmbedder, StoreFactory

SPEAKERS = ["Caroline", "Melanie", "Joanna", "Nate", "Evan", "Sam", "Gina", "Jon", "Maria", "John"]
DATES = [f"{h}:{m:02d} pm on {d} June, 2023" for h, m, d in [(7, 55, 9), (1, 14, 2), (8, 30, 21), (4, 2, 28)]]
LINES = [
    "Bye {to}! Good luck!",
    "Thanks {to}! I will. Bye!",
    "Your words mean a lot to me, {to}.",
    "Yeah, {to}! It takes courage.",
    "See you soon, {to}!",
]


def statements(n: int = 1000) -> list[str]:
    """``n`` short, similar, distinct statements: 'Speaker (date): Bye X! Good luck!' and the like."""
    every = [
        f"{who} ({when}): {line.format(to=to)}"
        for line, when, who, to in itertools.product(LINES, DATES, SPEAKERS, SPEAKERS)
        if who != to
    ]
    picked = every[:: len(every) // n][:n]
    assert len(set(picked)) == n
    return picked


@pytest.fixture(scope="module")
def embedded(real_embedder: SentenceTransformerEmbedder) -> CachedEmbedder:
    """all-MiniLM-L6-v2 with the 1,000 statements embedded once for every backend."""
    return CachedEmbedder(real_embedder, statements())


def test_a_thousand_similar_but_distinct_statements_are_all_findable(
    make_store: StoreFactory, embedded: CachedEmbedder
) -> None:
    """With the default settings, none of 1,000 near-identical statements by different speakers is hidden.

    Under the old default (similarity merging at 0.92 cosine) 908 of them were hidden.
    """
    store = make_store(embedded)
    texts = statements()
    for start in range(0, len(texts), 250):
        store.remember_many("locomo", [MemoryInput(t) for t in texts[start : start + 250]])
    listed = store.list_memories("locomo")
    assert sorted(m.content for m in listed) == sorted(texts)
    hidden = [m.content for m in listed if not m.is_current]
    assert hidden == [], f"{len(hidden)} of {len(texts)} distinct statements were hidden, e.g. {hidden[:3]}"
    missing = [t for t in texts if t not in {r.memory.content for r in store.search("locomo", t, k=3)}]
    assert missing == [], f"{len(missing)} statements are not found by their own text, e.g. {missing[:3]}"
