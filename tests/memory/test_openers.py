"""Hybrid search lifts the memory that opens its session: what a person comes to tell is mostly in
their first message. Which memory opens a session is the backend's to say (``_openers``), from every
memory of the owner stored in that session, whatever the candidates of one search."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from statekeep.errors import InvalidInputError
from statekeep.memory import Memory, MemoryInput, MemoryStore, Provenance, SearchResult
from statekeep.memory._ranking import OPENER_WEIGHT, Fusion, fuse_scores, openers_among

from .conftest import StoreFactory

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def memory(n: int, content: str, session: str | None) -> Memory:
    return Memory(
        id=f"m{n}", owner="o", content=content, kind="episodic", tags=(), metadata={},
        provenance=Provenance("imported", session_id=session), model="test", created_at=NOW, seq=n,
    )  # fmt: skip


def test_the_opener_of_a_session_is_lifted_before_it_lends_context() -> None:
    """Two memories as well matched, of two sessions: the one that opens its session is multiplied by
    ``1 + opener_weight`` and ranks first; its neighbour gets its share of the lifted score; a weight of
    0 leaves the tie to the content."""
    first, after = memory(1, "b: same words", "s"), memory(2, "c: unrelated", "s")
    second = memory(3, "a: same words", "t")
    vector = [SearchResult(first, 0.8), SearchResult(second, 0.8), SearchResult(after, 0.1)]
    text = [SearchResult(first, 4.0), SearchResult(second, 4.0), SearchResult(after, 1.0)]
    fusion = Fusion(length_weight=0)
    hits = fuse_scores(vector, text, 3, fusion, openers={"m1"})
    assert [h.memory.id for h in hits] == ["m1", "m3", "m2"]
    scores = {h.memory.id: h.score for h in hits}
    assert scores["m1"] == pytest.approx(1 + OPENER_WEIGHT)
    assert scores["m3"] == pytest.approx(1.0)
    assert scores["m2"] == pytest.approx(fusion.context_weight * (1 + OPENER_WEIGHT))
    off = fuse_scores(vector, text, 3, Fusion(length_weight=0, opener_weight=0), openers={"m1"})
    assert [h.memory.id for h in off] == ["m3", "m1", "m2"]  # tied: by content
    assert fuse_scores(vector, text, 3, fusion) == off  # no opener known: none lifted


def test_openers_are_the_first_written_of_each_session_in_any_order() -> None:
    stored = [memory(5, "e", "s"), memory(2, "b", "s"), memory(3, "c", "t"), memory(1, "a", None)]
    assert openers_among(stored, stored) == {"m2", "m3"}
    assert openers_among(stored, [stored[0], stored[3]]) == set()  # m5 follows m2; no session: none
    assert openers_among([], [memory(7, "x", "u"), memory(8, "y", "u")]) == {"m7"}  # among the asked too


@pytest.mark.parametrize("value", [-0.1, math.inf, math.nan, "0.3"])
def test_an_opener_weight_out_of_range_is_refused(value: object) -> None:
    with pytest.raises(InvalidInputError) as refused:
        Fusion(opener_weight=value)  # type: ignore[arg-type]
    assert refused.value.field == "opener_weight"


def sessions(store: MemoryStore, owner: str, *turns: tuple[str, str | None]) -> list[Memory]:
    items = [MemoryInput(text, provenance=Provenance("imported", session_id=s)) for text, s in turns]
    return store.remember_many(owner, items)


def test_each_backend_tells_the_first_memory_of_each_session_whatever_its_state(
    make_store: StoreFactory,
) -> None:
    """The first stored in a session opens it, superseded or not, after reopening too; another
    owner's memories of a session of the same name change nothing; when the first is erased, the
    next opens the session; a memory of no session opens none."""
    store = make_store()
    sessions(store, "bob", ("Bob's first words.", "s1"))  # another owner, earlier, the same session id
    a1, a2, b1, none = sessions(
        store, "alice",
        ("Alice opens the first session.", "s1"), ("Alice goes on.", "s1"),
        ("Alice opens the second.", "s2"), ("Alice in no session.", None),
    )  # fmt: skip
    a3 = sessions(store, "alice", ("Alice comes back to the first.", "s1"))[0]
    everything = [a1, a2, b1, none, a3]
    assert store._openers("alice", everything) == {a1.id, b1.id}
    store.supersede("alice", a1.id, "Alice opened the first session, said again.")
    store = make_store()  # reopened: read from storage
    assert store._openers("alice", everything) == {a1.id, b1.id}
    assert store._openers("alice", [a2, a3, none]) == set()
    store.forget_one("alice", a1.id)
    assert store._openers("alice", [a2, a3, b1]) == {a2.id, b1.id}
    assert store._openers("bob", store.list_memories("bob")) == {store.list_memories("bob")[0].id}


@pytest.mark.parametrize("make_store", ["lancedb"], indirect=True)
def test_lancedb_tells_openers_of_an_owner_too_big_to_hold(make_store: StoreFactory) -> None:
    from statekeep.memory.lancedb import LanceDBMemoryStore

    store = make_store(cache_bytes=0)  # no owner is held: the table is read
    a1, a2, b1 = sessions(store, "alice", ("First.", "s1"), ("Second.", "s1"), ("Other first.", "s2"))
    assert isinstance(store, LanceDBMemoryStore)
    assert store._held("alice") is None
    assert store._openers("alice", [a2, b1, a1]) == {a1.id, b1.id}


@pytest.mark.parametrize("make_store", ["lancedb", "pgvector"], indirect=True)
def test_search_lifts_the_memory_that_opens_its_session(make_store: StoreFactory) -> None:
    """With the real embedder and each backend's full text: a memory alone in its session opens it, and
    its hybrid score is its score without the lift multiplied by ``1 + opener_weight``; a statement
    written second in its session is found, not lifted."""
    store = make_store()
    told = "user: I adopted a rescue greyhound called Biscuit last spring."
    again = "user: Biscuit, my rescue greyhound, loves the beach."
    filler = [f"user: Day {n} of my pottery course: bowl number {n}." for n in range(20)]
    sessions(store, "u", *((t, f"f{n}") for n, t in enumerate(filler)))
    sessions(store, "u", (told, "a"), ("user: Hello again!", "b"), (again, "b"))
    query = "What is my rescue greyhound called?"
    store.fusion = Fusion(opener_weight=0)
    plain = {h.memory.content: h.score for h in store.search("u", query, k=5)}
    store.fusion = Fusion()
    lifted = {h.memory.content: h.score for h in store.search("u", query, k=5)}
    assert told in plain
    assert again in lifted
    assert lifted[told] == pytest.approx((1 + OPENER_WEIGHT) * plain[told])
    assert next(iter(lifted)) == told
