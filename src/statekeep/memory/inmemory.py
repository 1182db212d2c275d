"""The in-memory reference backend: exact search over a dict; for tests and notebooks, not durability."""

from __future__ import annotations

import dataclasses
import itertools
import re
import threading
from datetime import datetime
from typing import Any

import numpy as np

from statekeep.memory._backend import Capability
from statekeep.memory._dedupe import identity
from statekeep.memory._types import Filters, Memory, SearchResult
from statekeep.memory.base import MemoryStore
from statekeep.memory.embedders import Embedder, Vectors
from statekeep.memory.recall._exact import nearest
from statekeep.memory.recall._ranking import first_writes, rank_key
from statekeep.memory.recall._sentences import Parts

_WORD = re.compile(r"\w+", re.UNICODE)


def _alive(memory: Memory, now: datetime) -> bool:
    return memory.expires_at is None or memory.expires_at > now


def words(text: str) -> set[str]:
    """The lower-cased words of a text (the reference tokenizer of full-text search)."""
    return set(_WORD.findall(text.lower()))


class InMemoryMemoryStore(MemoryStore):
    """Memories held in a dict, searched exactly; lost when the process ends.

    Pass ``shared=`` another in-memory store to open the same memories with a
    different embedder (as reopening a database would).

    Examples:
        >>> from statekeep.memory import FakeEmbedder
        >>> store = InMemoryMemoryStore(FakeEmbedder())
    """

    backend = "memory"
    capabilities = frozenset({Capability.CANDIDATE_COSINES, Capability.SENTENCE_VECTORS, Capability.OPENERS})

    def __init__(
        self, embedder: Embedder | None = None, *, shared: InMemoryMemoryStore | None = None, **kw: Any
    ) -> None:
        super().__init__(embedder, **kw)
        self._rows: dict[str, dict[str, tuple[Memory, Vectors]]] = shared._rows if shared else {}
        #: The sentence vectors of the memories that have them, by (owner, id).
        self._parts: dict[tuple[str, str], Vectors] = shared._parts if shared else {}
        self._lock: threading.RLock = shared._lock if shared else threading.RLock()
        self._seq: itertools.count[int] = shared._seq if shared else itertools.count(1)

    def _writing(self) -> threading.RLock:
        return self._lock  # shared with the stores opened on the same memories (``shared=``)

    def _owned(self, owner: str) -> list[tuple[Memory, Vectors]]:
        with self._lock:  # a snapshot: writers in other threads change the dict
            return list(self._rows.get(owner, {}).values())

    def _insert(self, memories: list[Memory], vectors: Vectors, parts: Parts | None = None) -> list[Memory]:
        stored = []
        with self._lock:
            for i, (memory, vector) in enumerate(zip(memories, vectors, strict=True)):
                memory = dataclasses.replace(memory, seq=next(self._seq))
                self._rows.setdefault(memory.owner, {})[memory.id] = (memory, vector.copy())
                self._set_parts(memory.owner, memory.id, None if parts is None else parts[i])
                stored.append(memory)
        return stored

    def _set_parts(self, owner: str, memory_id: str, parts: Vectors | None) -> None:
        if parts is None:
            self._parts.pop((owner, memory_id), None)
        else:
            self._parts[(owner, memory_id)] = parts.copy()

    def _vectors_of(self, owner: str, ids: list[str]) -> dict[str, tuple[Vectors, Vectors | None]]:
        with self._lock:
            rows = self._rows.get(owner, {})
            return {
                i: (rows[i][1], self._parts.get((owner, i)))
                for i in ids
                if i in rows and rows[i][0].model == self.embedder.name
            }

    def _same(self, owner: str, identities: list[str], now: datetime) -> dict[str, Memory]:
        wanted = set(identities)
        found: dict[str, Memory] = {}
        for m, _ in sorted(self._owned(owner), key=lambda row: row[0].seq):
            ident = identity(m.content, m.key)
            if ident in wanted and ident not in found and m.superseded_by is None and _alive(m, now):
                found[ident] = m
        return found

    def _candidates(self, owner: str, filters: Filters, now: datetime) -> list[tuple[Memory, Vectors]]:
        return [
            (m, v)
            for m, v in self._owned(owner)
            if m.superseded_by is None
            and (m.duplicate_of is None or filters.include_merged)
            and _alive(m, now)
            and filters.matches(m)
        ]

    def _nearest(
        self, owner: str, vector: Vectors, k: int, filters: Filters, now: datetime
    ) -> list[SearchResult]:
        model = self.embedder.name
        rows = [(m, v) for m, v in self._candidates(owner, filters, now) if m.model == model]
        if not rows:
            return []
        return nearest([m for m, _ in rows], np.stack([v for _, v in rows]), vector, k)

    def _text(self, owner: str, query: str, k: int, filters: Filters, now: datetime) -> list[SearchResult]:
        terms = words(query)
        scored = [
            SearchResult(m, float(len(terms & words(m.content))))
            for m, _ in self._candidates(owner, filters, now)
        ]
        hits = [r for r in scored if r.score > 0]
        return sorted(hits, key=rank_key)[:k]

    def _first_writes(self, owner: str, sessions: list[str]) -> dict[str, int]:
        wanted = set(sessions)
        return first_writes(
            (m.provenance.session_id, m.seq)
            for m, _ in self._owned(owner)
            if m.provenance.session_id in wanted
        )

    def _get(self, owner: str, memory_id: str, now: datetime) -> Memory | None:
        row = self._rows.get(owner, {}).get(memory_id)
        return row[0] if row and _alive(row[0], now) else None

    def _list(self, owner: str, now: datetime) -> list[Memory]:
        return [m for m, _ in self._owned(owner) if _alive(m, now)]

    def _mark_superseded(self, owner: str, memory_id: str, successor: str) -> None:
        with self._lock:
            memory, vector = self._rows[owner][memory_id]
            self._rows[owner][memory_id] = (dataclasses.replace(memory, superseded_by=successor), vector)

    def _erase(self, owner: str, ids: list[str] | None) -> tuple[list[str], list[str], list[str]]:
        with self._lock:
            owned = self._rows.get(owner, {})
            removed = list(owned) if ids is None else [i for i in ids if i in owned]
            for memory_id in removed:
                del owned[memory_id]
                self._parts.pop((owner, memory_id), None)
            if not owned:
                self._rows.pop(owner, None)
        return removed, ["process memory"], []

    def _purge(self, now: datetime) -> int:
        with self._lock:
            expired = [
                (o, i) for o, rows in self._rows.items() for i, (m, _) in rows.items() if not _alive(m, now)
            ]
            for owner, memory_id in expired:
                del self._rows[owner][memory_id]
                self._parts.pop((owner, memory_id), None)
        return len(expired)

    def _all_stale(self, model: str) -> list[tuple[str, str, str]]:
        return [
            (o, i, m.content)
            for o, rows in self._rows.items()
            for i, (m, _) in rows.items()
            if m.model != model
        ]

    def _count_stale(self, model: str) -> int:
        return len(self._all_stale(model))

    def _stale(self, model: str, limit: int) -> list[tuple[str, str, str]]:
        return self._all_stale(model)[:limit]

    def _set_vectors(
        self, model: str, rows: list[tuple[str, str, str]], vectors: Vectors, parts: Parts | None = None
    ) -> None:
        with self._lock:
            for i, ((owner, memory_id, content), vector) in enumerate(zip(rows, vectors, strict=True)):
                row = self._rows.get(owner, {}).get(memory_id)
                if row is None or row[0].content != content:
                    continue  # forgotten since (and its id perhaps reused)
                memory = row[0]
                self._rows[owner][memory_id] = (dataclasses.replace(memory, model=model), vector.copy())
                self._set_parts(owner, memory_id, None if parts is None else parts[i])

    def _all_unsplit(self, model: str, most_chars: int) -> list[tuple[str, str, str]]:
        with self._lock:
            return [
                (o, i, m.content)
                for o, rows in self._rows.items()
                for i, (m, _) in rows.items()
                if m.model == model and (o, i) not in self._parts and len(m.content) <= most_chars
            ]

    def _count_unsplit(self, model: str, most_chars: int) -> int:
        return len(self._all_unsplit(model, most_chars))

    def _unsplit(self, model: str, most_chars: int, limit: int) -> list[tuple[str, str, str]]:
        return self._all_unsplit(model, most_chars)[:limit]

    def _set_sentences(
        self, model: str, rows: list[tuple[str, str, str]], parts: list[Vectors]
    ) -> set[tuple[str, str]]:
        stored = set()
        with self._lock:
            for (owner, memory_id, content), p in zip(rows, parts, strict=True):
                row = self._rows.get(owner, {}).get(memory_id)
                same = row is not None and row[0].model == model and row[0].content == content
                if same and (owner, memory_id) not in self._parts:
                    self._set_parts(owner, memory_id, p)
                    stored.add((owner, memory_id))
        return stored
