"""Bad input to the memory stores: InvalidInputError naming the field, and nothing written.

Each case escaped as IndexError, TypeError, OverflowError or a pyarrow error
before, was stored (a provenance source of None), or blamed the embedder for the
caller's vector. Every backend is checked: validation runs before any of them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from statekeep.errors import ConfigError, InvalidInputError
from statekeep.memory import FakeEmbedder, InMemoryMemoryStore, MemoryStore, Provenance, open_memory_store
from statekeep.memory.lancedb import LanceDBMemoryStore

from .conftest import StoreFactory

NAN = float("nan")
DIM = FakeEmbedder().dimension


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.remember("alice", "x", kind=None), "kind"),
        (lambda s: s.remember("alice", "x", kind=[]), "kind"),
        (lambda s: s.remember("alice", "x", kind=5), "kind"),
        (lambda s: s.remember("alice", "x", kind=["semantic"]), "kind"),
        (
            lambda s: s.remember("alice", "x", provenance=Provenance(("user_supplied",), trust=0.5)),  # type: ignore[arg-type]
            "provenance.source",
        ),
        (lambda s: s.remember("alice", "x", provenance=Provenance(None, trust=0.5)), "provenance.source"),  # type: ignore[arg-type]
        (lambda s: s.remember("alice", "x", provenance=Provenance(["user_supplied"])), "provenance.source"),  # type: ignore[arg-type]
        (lambda s: s.remember("alice", "x", ttl=timedelta.max), "ttl"),
        (lambda s: s.remember("alice", "x", ttl=3600), "ttl"),
        (lambda s: s.search("alice", "tea", kinds=5), "kinds"),
        (lambda s: s.search("alice", "tea", sources=5), "sources"),
        (lambda s: s.search("alice", "tea", sources=[None]), "sources"),
        (lambda s: s.search("alice", "tea", vector=[NAN] * DIM), "vector"),
        (lambda s: s.search("alice", "tea", vector=[1e39] * DIM), "vector"),
        (lambda s: s.search("alice", "tea", vector=[0.0] * DIM), "vector"),
        (lambda s: s.search("alice", "tea", vector="abc"), "vector"),
        (lambda s: s.search("alice", "tea", vector={"a": 1}), "vector"),
        (lambda s: s.search("alice", "tea", vector=[1.0] * (DIM - 1)), "vector"),
        (lambda s: s.remember("alice", "x", tags={"a": 1}), "tags"),
        (lambda s: s.search("alice", "tea", vector=[[1.0] * (DIM // 2)] * 2), "vector"),
    ],
)
def test_bad_arguments_are_refused_and_nothing_is_written(
    make_store: StoreFactory, call: Callable[[MemoryStore], Any], field: str
) -> None:
    store = make_store(FakeEmbedder())
    with pytest.raises(InvalidInputError) as err:
        call(store)
    assert err.value.field == field
    assert store.list_memories("alice") == []


@pytest.mark.parametrize(
    ("target", "error"),
    [
        (None, InvalidInputError),
        (5, InvalidInputError),
        (["a"], InvalidInputError),
        ("a\x00b", ConfigError),
        ("", ConfigError),
        ("  ", ConfigError),
    ],
)
def test_a_memory_store_needs_a_real_location(
    target: Any, error: type[Exception], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """None or a number used to become a folder named 'None' or '5' in the working directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error):
        open_memory_store(target, FakeEmbedder())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda tmp: InMemoryMemoryStore(FakeEmbedder(), duplicate_threshold="3"), "duplicate_threshold"),
        (lambda tmp: InMemoryMemoryStore(FakeEmbedder(), duplicate_threshold=True), "duplicate_threshold"),
        (lambda tmp: InMemoryMemoryStore(5), "embedder"),  # type: ignore[arg-type]
        (lambda tmp: InMemoryMemoryStore(FakeEmbedder(), clock=5), "clock"),
        (lambda tmp: InMemoryMemoryStore(FakeEmbedder(), clock=lambda: datetime(2030, 1, 1)), "clock"),
        (lambda tmp: FakeEmbedder("x"), "dimension"),  # type: ignore[arg-type]
        (lambda tmp: FakeEmbedder(2.5), "dimension"),  # type: ignore[arg-type]
        (lambda tmp: LanceDBMemoryStore(tmp / "m", FakeEmbedder(), exact_below=-1), "exact_below"),
        (lambda tmp: LanceDBMemoryStore(tmp / "m", FakeEmbedder(), nprobes=None), "nprobes"),  # type: ignore[arg-type]
    ],
)
def test_store_options_are_checked_when_it_is_built(
    make: Callable[[Path], Any], field: str, tmp_path: Path
) -> None:
    with pytest.raises(InvalidInputError) as err:
        make(tmp_path)
    assert err.value.field == field
    assert list(tmp_path.iterdir()) == []


def test_supersede_checks_the_new_kind(make_store: StoreFactory) -> None:
    store = make_store(FakeEmbedder())
    old = store.remember("alice", "Alice drinks tea.")
    with pytest.raises(InvalidInputError) as err:
        store.supersede("alice", old.id, "Alice drinks coffee.", kind=[])  # type: ignore[arg-type]
    assert err.value.field == "kind"
    assert [m.content for m in store.list_memories("alice")] == ["Alice drinks tea."]


def test_checking_an_embedder_does_not_load_its_model(tmp_path: Path) -> None:
    """A sentence-transformers embedder loads on first use; building a store must not load it."""
    from statekeep.memory import SentenceTransformerEmbedder

    lazy = SentenceTransformerEmbedder(str(tmp_path / "no-model-here"))
    store = InMemoryMemoryStore(lazy)  # would raise EmbedderError if the check read .dimension
    assert store.embedder is lazy
