"""Hybrid search lifts the memory that opens its session: what a person comes to tell is mostly in
their first message. Which memory opens a session is the backend's to say (``_openers``), from every
memory of the owner stored in that session, whatever the candidates of one search."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from statekeep.errors import InvalidInputError
from statekeep.memory import (
    FakeEmbedder,
    InMemoryMemoryStore,
    Memory,
    MemoryInput,
    MemoryStore,
    Provenance,
    SearchResult,
)
from statekeep.memory.recall._ranking import OPENER_WEIGHT, Fusion, fuse_scores, openers_among

from .conftest import Clock, StoreFactory
from .test_pgvector import libpq

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


def check_openers(write: MemoryStore, read: Callable[[], MemoryStore]) -> None:
    """Writes with ``write``, asks ``read()`` after each step: the first stored in a session opens it,
    superseded or not; memories written after the owner was read are seen; another owner's memories of
    a session of the same name change nothing; when the first is erased, the next opens the session;
    a memory of no session opens none; the candidates asked about need not include the first."""
    sessions(write, "bob", ("Bob's first words.", "s1"))  # another owner, earlier, the same session id
    a1, a2, b1, none = sessions(
        write, "alice",
        ("Alice opens the first session.", "s1"), ("Alice goes on.", "s1"),
        ("Alice opens the second.", "s2"), ("Alice in no session.", None),
    )  # fmt: skip
    assert read()._openers("alice", [a1, a2, b1, none]) == {a1.id, b1.id}
    assert read()._openers("alice", [a2, b1, none]) == {b1.id}  # a1 is no candidate, and still first
    a3, c1 = sessions(
        write, "alice", ("Alice comes back to the first.", "s1"), ("Alice opens a third.", "s3")
    )
    assert read()._openers("alice", [a2, a3, c1]) == {c1.id}
    write.supersede("alice", a1.id, "Alice opened the first session, said again.")
    assert read()._openers("alice", [a1, a2, a3]) == {a1.id}
    assert read()._openers("alice", [a2, a3]) == set()
    write.forget_one("alice", a1.id)
    assert read()._openers("alice", [a2, a3, b1]) == {a2.id, b1.id}
    bob = write.list_memories("bob")
    assert read()._openers("bob", bob) == {bob[0].id}
    assert read()._openers("alice", []) == set()


def test_each_backend_tells_the_first_memory_of_each_session_whatever_its_state(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    check_openers(store, lambda: store)
    assert make_store()._openers("alice", make_store().list_memories("alice"))  # reopened: from storage


@pytest.mark.parametrize("make_store", ["lancedb"], indirect=True)
def test_lancedb_tells_openers_of_owners_it_does_not_hold(make_store: StoreFactory, tmp_path: Path) -> None:
    """An owner too big to hold (the table is read), and a read-only store beside the writer."""
    from statekeep.memory.lancedb import LanceDBMemoryStore

    unheld = make_store(cache_bytes=0)
    assert isinstance(unheld, LanceDBMemoryStore)
    check_openers(unheld, lambda: unheld)
    assert unheld._held("alice") is None
    writer = LanceDBMemoryStore(tmp_path / "other", unheld.embedder)
    readers: list[LanceDBMemoryStore] = []

    def reader() -> LanceDBMemoryStore:
        readers.append(LanceDBMemoryStore(tmp_path / "other", unheld.embedder, read_only=True))
        return readers[-1]

    try:
        check_openers(writer, reader)
    finally:
        for r in (writer, *readers):
            r.close()


def test_hybrid_search_asks_about_every_candidate_of_every_ranking() -> None:
    """The vector ranking's, the full text's and the named period's candidates are all asked about."""
    clock = Clock()
    store = InMemoryMemoryStore(FakeEmbedder(), clock=clock)
    for day in range(1, 20):
        clock.now = datetime(2026, 3, day, tzinfo=UTC)
        sessions(
            store, "u", (f"Day {day}: I planted tulips.", f"d{day}"), (f"Then a walk, day {day}.", f"d{day}")
        )
    clock.now = datetime(2026, 3, 20, tzinfo=UTC)
    found: list[set[str]] = []
    asked: list[set[str]] = []
    hybrid, openers = store._hybrid, store._openers

    def spy_hybrid(*args: Any) -> Any:
        near, text = hybrid(*args)
        found.append({h.memory.id for h in (*near, *text)})
        return near, text

    def spy_openers(owner: str, memories: list[Memory]) -> set[str]:
        asked.append({m.id for m in memories})
        return openers(owner, memories)

    store._hybrid, store._openers = spy_hybrid, spy_openers  # type: ignore[method-assign,assignment]
    store.fusion = Fusion(pool=3)
    store.search("u", "What did I plant three days ago?", k=2)
    assert len(found) == 2  # the period named: a second pair of rankings
    assert asked == [found[0] | found[1]]
    assert found[1] - found[0]  # the period's search found candidates the first did not


@pytest.mark.parametrize("make_store", ["pgvector"], indirect=True)
def test_a_postgres_store_of_schema_7_tells_openers_after_the_upgrade(
    make_store: StoreFactory, postgres_url: str
) -> None:
    """Migration 8 indexes the memories written before it by session; they open their sessions."""
    import psycopg

    from statekeep.db import Database, upgrade
    from statekeep.memory.pgvector import _sql as q

    db = Database(postgres_url)
    upgrade(db, "memory", q.SCHEMA, q.MIGRATIONS[:7])
    db.dispose()
    vector = "[" + ",".join(["0.125"] * 64) + "]"
    with psycopg.connect(libpq(postgres_url)) as conn:
        for i, session in enumerate(["s1", "s1", "s2", None]):
            conn.execute(
                f"INSERT INTO {q.TABLE} (owner, id, content, kind, source, trust, model, created_us, "
                "embedding, dedupe_key, session_id) VALUES ('alice', %s, %s, 'semantic', 'imported', 0.5, "
                "'fake-hash-64', %s, CAST(%s AS vector), %s, %s)",
                (f"m{i}", f"memory {i}", i, vector, f"m{i}", session),
            )
    store = make_store(FakeEmbedder())
    with psycopg.connect(libpq(postgres_url)) as conn:
        indexes = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND indexname = 'memories_session'",
            (q.SCHEMA,),
        ).fetchall()
    assert indexes
    assert "(owner, session_id, seq)" in indexes[0][0]
    assert store._openers("alice", store.list_memories("alice")) == {"m0", "m2"}


@pytest.mark.parametrize("make_store", ["lancedb", "pgvector"], indirect=True)
def test_search_lifts_the_memory_that_opens_its_session(make_store: StoreFactory) -> None:
    """With the real embedder and each backend's full text: a memory alone in its session opens it, and
    its hybrid score is its score without the lift multiplied by ``1 + opener_weight``, and it ranks
    first; a statement written second in its session is found too."""
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
