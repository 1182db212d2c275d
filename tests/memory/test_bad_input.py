"""Bad input to the memory stores: InvalidInputError naming the field, and nothing written.

Each case escaped as IndexError, TypeError, OverflowError or a pyarrow error
before, was stored (a provenance source of None), or blamed the embedder for the
caller's vector. Every backend is checked: validation runs before any of them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from statekeep.errors import ConfigError, InvalidInputError
from statekeep.memory import FakeEmbedder, MemoryStore, Provenance, open_memory_store

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
        (lambda s: s.remember("alice", "x", provenance=Provenance(("user_supplied",), trust=0.5)), "source"),
        (lambda s: s.remember("alice", "x", provenance=Provenance(None, trust=0.5)), "source"),
        (lambda s: s.remember("alice", "x", provenance=Provenance(["user_supplied"])), "source"),
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
    ],
)
def test_bad_arguments_are_refused_and_nothing_is_written(
    make_store: StoreFactory, call: Callable[[MemoryStore], Any], field: str
) -> None:
    store = make_store(FakeEmbedder())
    with pytest.raises(InvalidInputError, match=field):
        call(store)
    assert store.list_memories("alice") == []


@pytest.mark.parametrize(
    ("target", "error"),
    [
        (None, InvalidInputError),
        (5, InvalidInputError),
        (["a"], InvalidInputError),
        ("a\x00b", InvalidInputError),
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
