"""Each backend declares the optional capabilities it implements; one it lacks is left out, not faked."""

from __future__ import annotations

from statekeep.memory import Capability, FakeEmbedder, Fusion, InMemoryMemoryStore, MemoryInput, Provenance
from statekeep.memory.lancedb import LanceDBMemoryStore
from statekeep.memory.pgvector import PgVectorMemoryStore

C = Capability


def test_each_backend_declares_what_it_implements() -> None:
    """The reference keeps vectors, sentences and sessions; LanceDB batches and optimizes too; PostgreSQL
    does all, settling concurrent writers in one transaction and both rankings in one round trip."""
    assert InMemoryMemoryStore.capabilities == {C.CANDIDATE_COSINES, C.SENTENCE_VECTORS, C.OPENERS}
    assert LanceDBMemoryStore.capabilities == {
        C.CANDIDATE_COSINES,
        C.SENTENCE_VECTORS,
        C.OPENERS,
        C.BATCHED_NEAREST,
        C.OPTIMIZE,
    }
    assert PgVectorMemoryStore.capabilities == set(Capability)


class _NoOpeners(InMemoryMemoryStore):
    capabilities = InMemoryMemoryStore.capabilities - {C.OPENERS}


def test_a_backend_that_leaves_out_openers_lifts_none() -> None:
    """Without the capability, hybrid search ranks as with the opener lift turned off, and says so."""
    store = _NoOpeners(FakeEmbedder())
    session = Provenance("imported", session_id="s1")
    store.remember_many(
        "alice", [MemoryInput(t, provenance=session) for t in ("tulips in May", "tulips then")]
    )
    assert C.OPENERS not in store.capabilities
    lifted = store.search("alice", "tulips", k=2)
    store.fusion = Fusion(opener_weight=0)
    assert lifted == store.search("alice", "tulips", k=2)
    reference = InMemoryMemoryStore(FakeEmbedder())
    reference.remember_many(
        "alice", [MemoryInput(t, provenance=session) for t in ("tulips in May", "tulips then")]
    )
    assert [h.score for h in reference.search("alice", "tulips", k=2)] != [h.score for h in lifted]
