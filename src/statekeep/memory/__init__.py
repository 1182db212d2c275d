"""Store 4: owner-scoped, provenance-tracked long-term memory, searchable by meaning, erasable.

Backends: :class:`LanceDBMemoryStore` (an embedded folder; the default),
:class:`PgVectorMemoryStore` (PostgreSQL with pgvector; many workers) and
:class:`InMemoryMemoryStore` (the reference, for tests). Heavy packages
(lancedb, sentence-transformers, torch) load only when a store or the default
embedder is used. Memory needs numpy, which every extra that stores vectors
brings (``lancedb``, ``postgres``, ``embeddings``); without one, importing this
package raises :class:`~statekeep.errors.MissingExtraError`.
"""

from __future__ import annotations

import os
from os import PathLike
from typing import TYPE_CHECKING, Any

from statekeep._extras import requires
from statekeep.errors import InvalidInputError
from statekeep.memory._types import (
    DEFAULT_TRUST,
    Filters,
    ForgetReceipt,
    Memory,
    MemoryInput,
    MemoryKind,
    Provenance,
    SearchMode,
    SearchResult,
    SourceKind,
)
from statekeep.memory.prompt import render_memories
from statekeep.memory.recall._ranking import Fusion

# Every backend and embedder computes with numpy; LanceDB, the default backend, names the extra.
with requires("lancedb", "long-term memory"):
    from statekeep.memory._backend import Capability
    from statekeep.memory.base import MemoryStore
    from statekeep.memory.embedders import Embedder, FakeEmbedder, SentenceTransformerEmbedder
    from statekeep.memory.inmemory import InMemoryMemoryStore

if TYPE_CHECKING:
    from statekeep.memory.lancedb import LanceDBMemoryStore
    from statekeep.memory.pgvector import PgVectorMemoryStore

__all__ = [
    "DEFAULT_TRUST",
    "Capability",
    "Embedder",
    "FakeEmbedder",
    "Filters",
    "ForgetReceipt",
    "Fusion",
    "InMemoryMemoryStore",
    "LanceDBMemoryStore",
    "Memory",
    "MemoryInput",
    "MemoryKind",
    "MemoryStore",
    "PgVectorMemoryStore",
    "Provenance",
    "SearchMode",
    "SearchResult",
    "SentenceTransformerEmbedder",
    "SourceKind",
    "open_memory_store",
    "render_memories",
]

_LAZY = {
    "LanceDBMemoryStore": "statekeep.memory.lancedb",
    "PgVectorMemoryStore": "statekeep.memory.pgvector",
}


def __getattr__(name: str) -> Any:
    """Import the backends on first use, so that ``import statekeep`` stays light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_memory_store(target: Any, embedder: Embedder | None = None, **kw: Any) -> MemoryStore:
    """Open the memory store a URL, a folder or a :class:`~statekeep.db.Database` names.

    ``postgresql://...`` or a PostgreSQL ``Database`` opens pgvector; a folder or
    ``lancedb://folder`` opens LanceDB (``STATEKEEP_MEMORY_URL`` syntax).

    Examples:
        >>> store = open_memory_store("/tmp/agent/memory", FakeEmbedder())
        >>> store.close()

    Raises:
        ConfigError: the URL is malformed.
    """
    from statekeep.config import parse_memory_url
    from statekeep.db import Database

    if isinstance(target, Database):
        from statekeep.memory.pgvector import PgVectorMemoryStore

        return PgVectorMemoryStore(target, embedder, **kw)
    if not isinstance(target, str | PathLike):
        raise InvalidInputError(
            f"must be a URL, a folder path or a Database, not {type(target).__name__}", field="target"
        )
    parsed = parse_memory_url(os.fspath(target))
    if parsed.backend == "pgvector":
        from statekeep.memory.pgvector import PgVectorMemoryStore

        return PgVectorMemoryStore(parsed.location, embedder, **kw)
    from statekeep.memory.lancedb import LanceDBMemoryStore

    return LanceDBMemoryStore(parsed.location, embedder, **kw)
