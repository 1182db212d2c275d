"""Conformance tests of deduplication and superseding (part of ``MemoryStoreSuite``)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from datetime import timedelta

import pytest

from statekeep.errors import ConflictError
from statekeep.memory import Embedder, Memory, MemoryStore, Provenance
from statekeep.memory.embedders import Vectors
from statekeep.testing._memory_kit import FACTS, Clock, MemoryStoreFactory


class _Slow:
    """The suite's embedder, taking a few milliseconds per call as a real model does (a wider race)."""

    def __init__(self, embedder: Embedder) -> None:
        self.inner, self.name, self.dimension = embedder, embedder.name, embedder.dimension

    def embed(self, texts: Sequence[str]) -> Vectors:
        time.sleep(0.005)
        return self.inner.embed(texts)


def _at_once(store: MemoryStore, texts: list[str], key: str | None) -> list[Memory]:
    """Each text remembered for alice on its own thread, all released by one barrier."""
    barrier = threading.Barrier(len(texts))
    results: list[Memory | None] = [None] * len(texts)

    def remember(i: int) -> None:
        barrier.wait()
        results[i] = store.remember("alice", texts[i], key=key)

    threads = [threading.Thread(target=remember, args=(i,)) for i in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [m for m in results if m is not None]


def _superseded_at_once(store: MemoryStore, old_id: str, texts: list[str]) -> list[Memory | BaseException]:
    """Each text supersedes alice's ``old_id`` on its own thread, all released by one barrier."""
    barrier = threading.Barrier(len(texts))
    outcomes: list[Memory | BaseException] = [ConflictError("not run")] * len(texts)

    def supersede(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = store.supersede("alice", old_id, texts[i])
        except BaseException as exc:  # what each thread heard is the caller's to check
            outcomes[i] = exc

    threads = [threading.Thread(target=supersede, args=(i,)) for i in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


class DedupeSuite:
    """Only the same fact is deduplicated (by default); merging by similarity is opt-in and visible."""

    # --- deduplication -------------------------------------------------------------------

    def test_the_same_text_is_the_same_fact_and_remember_says_so(self, store: MemoryStore) -> None:
        """By default, a memory whose text is the same after normalisation returns the stored one, and why."""
        first = store.remember("alice", "Alice's favourite drink is green tea.")
        again = store.remember(
            "alice", "  alice's FAVOURITE drink\u00a0is green tea. ", provenance=Provenance("imported")
        )
        assert again.id == first.id
        assert again == store.get("alice", first.id)
        assert again.dedupe is not None
        assert (again.dedupe.reason, again.dedupe.existing_id, again.dedupe.stored) == (
            "same_text",
            first.id,
            False,
        )
        assert first.dedupe is None
        similar = store.remember("alice", "Alice's favorite drink is green tea")  # not the same text: kept
        assert similar.dedupe is None
        assert similar.is_current
        # owners never mix
        assert store.remember("bob", "Alice's favourite drink is green tea.").id != first.id
        assert [m.content for m in store.list_memories("alice")] == [first.content, similar.content]

    def test_threads_remembering_one_fact_at_once_store_it_once(
        self, make_store: MemoryStoreFactory, embedder: Embedder
    ) -> None:
        """Threads sharing a store remember the same fact at once: one memory, the others get it back."""
        store = make_store(_Slow(embedder))
        for r in range(8):
            keyed = r % 2 == 1
            texts = [
                f"Alice's locker code is {r}",
                f"alice's LOCKER  code is {r}",
                f"Alice's locker code is {r} ",
            ]
            if keyed:
                texts = [f"Alice's locker code is now {r}{'!' * i}" for i in range(3)]
            got = _at_once(store, texts, f"locker-{r}" if keyed else None)
            assert len({m.id for m in got}) == 1, (
                f"round {r}: {len({m.id for m in got})} memories of one fact"
            )
            reasons = sorted(m.dedupe.reason if m.dedupe else "stored" for m in got)
            assert reasons == ["same_key" if keyed else "same_text"] * 2 + ["stored"]
        assert len(store.list_memories("alice")) == 8

    def test_duplicates_within_one_batch_return_the_first(self, store: MemoryStore) -> None:
        """remember_many stores a repeat inside the same batch once, and returns it for both items."""
        a, b, c = store.remember_many("alice", [FACTS[0], FACTS[0].upper(), FACTS[3]])
        assert (b.id, a.dedupe, c.dedupe) == (a.id, None, None)
        assert b.dedupe is not None
        assert b.dedupe.reason == "same_text"
        assert len(store.list_memories("alice")) == 2

    def test_an_explicit_key_is_the_identity_of_a_fact(self, store: MemoryStore) -> None:
        """With key=, the same key is the same fact whatever the text, and the same text under two keys is two."""  # noqa: E501
        bye1 = store.remember("locomo", "Bye!", key="session-1/turn-7")
        bye2 = store.remember("locomo", "Bye!", key="session-2/turn-3")
        again = store.remember("locomo", "Bye, bye!", key="session-1/turn-7")
        assert bye1.id != bye2.id
        assert again.id == bye1.id
        assert again.dedupe is not None
        assert again.dedupe.reason == "same_key"
        assert [m.key for m in store.list_memories("locomo")] == ["session-1/turn-7", "session-2/turn-3"]
        newer = store.supersede("locomo", bye1.id, "Bye Joanna!")
        assert newer.key == "session-1/turn-7"  # a new version of the same fact keeps its key
        assert store.remember("locomo", "Bye!", key="session-1/turn-7").id == newer.id

    def test_superseding_and_expiry_end_deduplication(
        self, make_store: MemoryStoreFactory, embedder: Embedder
    ) -> None:
        """A superseded or expired memory is no longer the fact: the same text is stored again."""
        clock = Clock()
        store = make_store(embedder, clock=clock)
        old = store.remember("alice", "Alice lives in Lisbon.")
        store.supersede("alice", old.id, "Alice moved to Porto.")
        back = store.remember("alice", "Alice lives in Lisbon.")
        assert back.id != old.id
        assert back.dedupe is None
        brief = store.remember("alice", "Alice is in a meeting.", ttl=timedelta(hours=1))
        clock.now += timedelta(hours=2)
        assert store.remember("alice", "Alice is in a meeting.").id != brief.id

    def test_similarity_merging_is_opt_in_visible_and_loses_nothing(
        self, make_store: MemoryStoreFactory, semantic_embedder: Embedder | None
    ) -> None:
        """dedupe='similar' merges a near-duplicate into the original, says so, and keeps it reachable."""
        if semantic_embedder is None:
            pytest.skip("needs an embedding model: override the semantic_embedder fixture")
        store = make_store(semantic_embedder, dedupe="similar")
        assert (store.dedupe, store.duplicate_threshold) == ("similar", 0.92)
        first = store.remember("alice", "Alice's favourite drink is green tea.")
        again = store.remember(
            "alice", "Alice's favorite drink is green tea", provenance=Provenance("user_supplied")
        )
        other = store.remember("alice", "Alice's favourite sport is tennis.")
        bob = store.remember("bob", "Alice's favourite drink is green tea.")
        assert again.duplicate_of == first.id
        assert again.dedupe is not None
        assert (again.dedupe.reason, again.dedupe.existing_id, again.dedupe.stored) == (
            "similar",
            first.id,
            True,
        )
        assert again.dedupe.similarity == again.duplicate_score
        assert again.duplicate_score is not None
        assert 0.92 <= again.duplicate_score <= 1.0
        assert other.duplicate_of is None
        assert bob.duplicate_of is None
        hits = [r.memory.id for r in store.search("alice", "What does Alice like to drink?", k=5)]
        assert first.id in hits
        assert again.id not in hits
        merged = store.search("alice", "What does Alice like to drink?", k=5, include_merged=True)
        assert again.id in [r.memory.id for r in merged]
        stored = store.get("alice", again.id)
        assert stored.provenance.source == "user_supplied"  # kept, with its provenance and score
        assert stored.duplicate_score == again.duplicate_score
        doc = json.loads(store.export("alice"))
        assert doc["merged"] == 1
        assert [(m["id"], m["duplicate_of"]) for m in doc["memories"] if m["duplicate_of"]] == [
            (again.id, first.id)
        ]

    def test_a_given_threshold_still_opts_in_and_none_still_turns_deduplication_off(
        self, make_store: MemoryStoreFactory, embedder: Embedder
    ) -> None:
        """The arguments of earlier versions keep their meaning."""
        assert make_store(embedder, duplicate_threshold=0.8).dedupe == "similar"
        assert make_store(embedder).dedupe == "exact"
        store = make_store(embedder, duplicate_threshold=None)
        assert store.dedupe == "none"
        a, b = store.remember_many("alice", [FACTS[0], FACTS[0]])
        assert a.id != b.id
        assert b.dedupe is None

    # --- superseding ---------------------------------------------------------------------

    def test_supersede_hides_the_old_fact_and_points_to_its_successor(self, store: MemoryStore) -> None:
        """A superseded memory is kept and marked, but never returned beside the fact that replaced it."""
        old = store.remember("alice", "Alice lives in Lisbon.", tags=["home"])
        new = store.supersede("alice", old.id, "Alice moved to Porto in 2026.")
        assert store.get("alice", old.id).superseded_by == new.id
        assert (new.tags, new.superseded_by) == (("home",), None)
        for mode in ("vector", "hybrid"):
            contents = [r.memory.content for r in store.search("alice", "Alice lives Lisbon", k=5, mode=mode)]
            assert contents == ["Alice moved to Porto in 2026."]
        with pytest.raises(ConflictError):
            store.supersede("alice", old.id, "Alice lives in Faro.")
        assert len(store.list_memories("alice")) == 2

    def test_threads_superseding_one_memory_at_once_leave_one_successor(
        self, make_store: MemoryStoreFactory, embedder: Embedder
    ) -> None:
        """Threads supersede the same memory at once: one succeeds, the others hear ConflictError."""
        store = make_store(_Slow(embedder))
        for r in range(6):
            old = store.remember("alice", f"Alice's desk is in room {r}.")
            texts = [f"Alice's desk moved to room {r}{'0' * i}." for i in range(1, 4)]
            outcomes = _superseded_at_once(store, old.id, texts)
            won = [o for o in outcomes if isinstance(o, Memory)]
            lost = [o for o in outcomes if not isinstance(o, Memory)]
            assert len(won) == 1, f"round {r}: {len(won)} successors of one memory"
            assert all(isinstance(o, ConflictError) for o in lost), lost
            assert store.get("alice", old.id).superseded_by == won[0].id
        current = [m for m in store.list_memories("alice") if m.superseded_by is None]
        assert len(current) == 6
