"""A write embeds outside the store's lock, and still stores each fact once.

The model runs for tens of milliseconds to seconds; while one thread's write
embeds, other threads' searches and writes go on. The embedder is the real model,
wrapped so that embedding a text marked ``GATED`` waits, inside ``embed``, until
the test lets it go: what happens meanwhile is decided by events, not by timing.
Each wait is bounded (``WAIT``) only so that a store that makes the others wait
fails the test instead of hanging it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from statekeep.errors import ConflictError
from statekeep.memory import Memory, SentenceTransformerEmbedder

from .conftest import StoreFactory

#: Seconds a step may take before the test calls it stuck (never reached by a store that does not block).
WAIT = 30


class GatedEmbedder:
    """The real embedder; the first embedding of a text holding ``marker`` waits for :attr:`release`."""

    def __init__(self, real: SentenceTransformerEmbedder, marker: str = "GATED") -> None:
        self.real = real
        self.marker = marker
        self.name = real.name
        self.dimension = real.dimension
        self.entered = threading.Event()
        self.release = threading.Event()
        self.on_gate: Callable[[], None] | None = None  # run in place of waiting, if given

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if not self.entered.is_set() and any(self.marker in t for t in texts):
            self.entered.set()
            if self.on_gate is not None:
                self.on_gate()
            else:
                assert self.release.wait(WAIT), "the test never let the gated embedding go"
        return self.real.embed(list(texts))


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, threading.Event, list[Any]]:
    """Run ``call`` in a thread; the event is set when it returns, the list holds its result or error."""
    done, out = threading.Event(), []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:  # the caller checks what the thread heard
            out.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done, out


def while_gated(
    gate: GatedEmbedder, first: Callable[[], Any], second: Callable[[], Any]
) -> tuple[Any, Any, bool]:
    """Start ``first`` (which embeds a GATED text), run ``second`` while it embeds, then let it go.

    Returns both results and whether ``second`` finished while ``first`` was still embedding.
    """
    slow, _, slow_out = in_thread(first)
    assert gate.entered.wait(WAIT), "the gated write never embedded"
    other, other_done, other_out = in_thread(second)
    meanwhile = other_done.wait(WAIT)
    gate.release.set()
    slow.join(WAIT)
    other.join(WAIT)
    assert slow_out, "the gated thread is stuck"
    assert other_out, "the other thread is stuck"
    return slow_out[0], other_out[0], meanwhile


def test_searches_and_writes_run_while_another_write_embeds(
    make_store: StoreFactory, real_embedder: SentenceTransformerEmbedder
) -> None:
    gate = GatedEmbedder(real_embedder)
    store = make_store(gate)
    store.remember("alice", "Alice plays the cello in an orchestra")

    def search_and_write() -> list[str]:
        hits = [h.memory.content for h in store.search("alice", "which instrument does Alice play?", k=1)]
        store.remember("alice", "Alice keeps bees on her roof")
        store.remember("bob", "Bob collects stamps")
        return hits

    slow, hits, meanwhile = while_gated(
        gate, lambda: store.remember("alice", "GATED Alice drinks green tea"), search_and_write
    )
    assert meanwhile, "a search or a write waited for another write's embedding"
    assert hits == ["Alice plays the cello in an orchestra"]
    assert isinstance(slow, Memory)
    assert slow.dedupe is None
    assert sorted(m.content for m in store.list_memories("alice")) == [
        "Alice keeps bees on her roof",
        "Alice plays the cello in an orchestra",
        "GATED Alice drinks green tea",
    ]
    assert [m.content for m in store.list_memories("bob")] == ["Bob collects stamps"]


def test_a_fact_stored_while_its_twin_embeds_is_stored_once(
    make_store: StoreFactory, real_embedder: SentenceTransformerEmbedder
) -> None:
    """The write that embedded first but stores second finds the other's memory and returns it."""
    gate = GatedEmbedder(real_embedder)
    store = make_store(gate)
    slow, quick, meanwhile = while_gated(
        gate,
        lambda: store.remember("alice", "GATED Alice's locker code is 7"),
        lambda: store.remember("alice", "gated  alice's LOCKER code is 7"),  # the same text, normalised
    )
    assert meanwhile, "a write waited for another write's embedding"
    assert isinstance(quick, Memory)
    assert isinstance(slow, Memory)
    assert quick.dedupe is None
    assert slow.id == quick.id
    assert slow.dedupe is not None
    assert (slow.dedupe.reason, slow.dedupe.existing_id, slow.dedupe.stored) == ("same_text", quick.id, False)
    assert [m.id for m in store.list_memories("alice")] == [quick.id]


def test_supersedes_racing_while_one_embeds_leave_one_successor(
    make_store: StoreFactory, real_embedder: SentenceTransformerEmbedder
) -> None:
    gate = GatedEmbedder(real_embedder)
    store = make_store(gate)
    old = store.remember("alice", "Alice lives in Lyon")
    slow, quick, meanwhile = while_gated(
        gate,
        lambda: store.supersede("alice", old.id, "GATED Alice lives in Oslo"),
        lambda: store.supersede("alice", old.id, "Alice lives in Porto"),
    )
    assert meanwhile, "a supersede waited for another one's embedding"
    assert isinstance(quick, Memory)
    assert isinstance(slow, ConflictError)
    assert repr(quick.id) in str(slow)
    assert store.get("alice", old.id).superseded_by == quick.id
    current = [m.content for m in store.list_memories("alice") if m.is_current]
    assert current == ["Alice lives in Porto"]


@pytest.mark.parametrize("then", ["superseded", "erased"])
def test_a_fact_another_writer_stored_then_superseded_or_erased_is_stored_again(
    postgres_url: str, real_embedder: SentenceTransformerEmbedder, then: str
) -> None:
    """The write loses the insert to another writer's memory of the fact, which is gone when it looks again.

    Only pgvector, which holds no lock in process, lets another writer in between
    its look and its insert: while the write embeds, another worker stores the
    fact; the insert finds it current and stores nothing; before the write looks
    again, the other worker supersedes or erases it. The write then tries again,
    and stores the fact.
    """
    from statekeep.memory.pgvector import PgVectorMemoryStore

    gate = GatedEmbedder(real_embedder, marker="code is 7")
    store, other = PgVectorMemoryStore(postgres_url, gate), PgVectorMemoryStore(postgres_url, real_embedder)
    theirs: list[Memory] = []
    gate.on_gate = lambda: theirs.append(other.remember("alice", "Alice's locker code is 7"))
    insert = store._insert_unless_same
    lost: list[list[Memory | None]] = []

    def insert_then_other_moves(
        memories: list[Memory], vectors: Any, now: Any, parts: Any = None
    ) -> list[Memory | None]:
        stored = insert(memories, vectors, now, parts)
        if not lost:
            lost.append(stored)
            if then == "superseded":
                other.supersede("alice", theirs[0].id, "Alice's locker code is 8")
            else:
                other.forget_one("alice", theirs[0].id)
        return stored

    store._insert_unless_same = insert_then_other_moves  # type: ignore[method-assign]
    mine = store.remember("alice", "alice's  LOCKER code is 7")  # the same fact, normalised
    assert lost == [[None]], "the other writer's memory did not take the insert: the test proves nothing"
    assert mine.content == "alice's  LOCKER code is 7"
    assert mine.dedupe is None
    assert mine.id != theirs[0].id
    assert store.get("alice", mine.id) == mine
    current = sorted(m.content for m in store.list_memories("alice") if m.is_current)
    expected = ["Alice's locker code is 8"] if then == "superseded" else []
    assert current == sorted([*expected, "alice's  LOCKER code is 7"])
    store.close()
    other.close()
