"""The primitives a memory backend implements (the contract under :class:`MemoryStore`).

Every primitive takes the owner and must never touch another owner's rows.
Validation, embedding, deduplication, fusion, export and re-embedding are
written once, in :mod:`statekeep.memory.base`, over these.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import datetime
from enum import StrEnum
from typing import ClassVar

import numpy as np

from statekeep.memory._types import Filters, Memory, SearchResult
from statekeep.memory.embedders import Vectors
from statekeep.memory.recall._ranking import openers_of
from statekeep.memory.recall._sentences import Parts, best_cosines


class Capability(StrEnum):
    """An optional part of the memory contract: a backend that implements it declares it in
    ``capabilities``; one that does not, says so by leaving it out, and gets the base's fallback.

    The conformance suite (:class:`~statekeep.testing.MemoryStoreSuite`) checks that a backend
    declares exactly the capabilities whose primitives (:data:`PRIMITIVES`) it implements.
    """

    #: ``_cosines`` or ``_vectors_of``: hybrid search scores every candidate of either ranking by its
    #: best cosine (without: the nearest by their whole vector only; full-text finds score 0 there).
    CANDIDATE_COSINES = "candidate_cosines"
    #: ``_count_unsplit``, ``_unsplit``, ``_set_sentences``: ``embed_sentences`` gives stored memories
    #: their sentence vectors (without: it embeds none and returns 0).
    SENTENCE_VECTORS = "sentence_vectors"
    #: ``_first_writes``: hybrid search tells the memories that open their session and lifts them
    #: (without: none is lifted).
    OPENERS = "openers"
    #: ``_hybrid``: both rankings of a hybrid search at once (without: one call for each).
    ONE_PASS_HYBRID = "one_pass_hybrid"
    #: ``_nearest_each``: the nearest memory of many vectors in one call (without: one search each).
    BATCHED_NEAREST = "batched_nearest"
    #: ``_insert_unless_same``: writers of one fact in many processes are settled by the database
    #: (without: one writing process; its threads take turns under ``_writing``).
    ATOMIC_DEDUPE = "atomic_dedupe"
    #: ``_insert_superseding``: the new memory and the old one's mark in one transaction (without:
    #: checked, inserted and marked under ``_writing``).
    ATOMIC_SUPERSEDE = "atomic_supersede"
    #: ``_optimize``: ``optimize()`` has upkeep to do (without: nothing).
    OPTIMIZE = "optimize"


#: The primitives that implement each capability: a backend declaring one overrides at least one of them.
PRIMITIVES: dict[Capability, tuple[str, ...]] = {
    Capability.CANDIDATE_COSINES: ("_cosines", "_vectors_of"),
    Capability.SENTENCE_VECTORS: ("_count_unsplit", "_unsplit", "_set_sentences"),
    Capability.OPENERS: ("_first_writes",),
    Capability.ONE_PASS_HYBRID: ("_hybrid",),
    Capability.BATCHED_NEAREST: ("_nearest_each",),
    Capability.ATOMIC_DEDUPE: ("_insert_unless_same",),
    Capability.ATOMIC_SUPERSEDE: ("_insert_superseding",),
    Capability.OPTIMIZE: ("_optimize",),
}


class MemoryBackend(ABC):
    """What a backend provides: storage and the two rankings (vector, full text) of one owner.

    Its optional primitives are grouped in :class:`Capability`; ``capabilities`` declares the ones
    the backend implements.
    """

    #: The optional capabilities this backend implements (:class:`Capability`).
    capabilities: ClassVar[frozenset[Capability]] = frozenset()

    @abstractmethod
    def _insert(self, memories: list[Memory], vectors: Vectors, parts: Parts | None = None) -> list[Memory]:
        """Store memories (all of one owner) with their vectors, atomically; return them as stored.

        ``parts``: each memory's sentence vectors, or None (:mod:`._sentences`). The
        store gives each its ``seq``, increasing in the order of ``memories``.
        """

    def _insert_unless_same(
        self, memories: list[Memory], vectors: Vectors, now: datetime, parts: Parts | None = None
    ) -> list[Memory | None]:
        """As :meth:`_insert`, but None in place of a memory whose identity the owner has by ``now``.

        What :meth:`_same` would find, written by another writer since the caller
        looked. A backend that other processes write to concurrently makes the
        check and the insert one step (pgvector); this default inserts them all.
        """
        stored: list[Memory | None] = list(self._insert(memories, vectors, parts))
        return stored

    @abstractmethod
    def _same(self, owner: str, identities: list[str], now: datetime) -> dict[str, Memory]:
        """For each identity (:func:`_dedupe.identity`) the owner's oldest unexpired,
        not superseded memory that has it (merged ones included), if any."""

    @abstractmethod
    def _nearest(
        self, owner: str, vector: Vectors, k: int, filters: Filters, now: datetime
    ) -> list[SearchResult]:
        """Current, unexpired memories of ``owner`` by this model, nearest first; score = cosine.

        The ``k`` best by :func:`rank_key`: ties at the cut are decided by it, not by the engine.
        """

    def _hybrid(
        self, owner: str, vector: Vectors, query: str, k: int, filters: Filters, now: datetime
    ) -> tuple[list[SearchResult], list[SearchResult]]:
        """The two rankings of a hybrid search: the ``k`` nearest and the ``k`` best by full text,
        then every one of either (of this model) scored by its best cosine (:meth:`_cosines`; a
        backend without it: the nearest by their whole vector only).

        Backends override it to do it all at once.
        """
        near, text = self._nearest(owner, vector, k, filters, now), self._text(owner, query, k, filters, now)
        candidates = {h.memory.id: h.memory for h in (*near, *text)}
        cosines = {h.memory.id: h.score for h in near} | self._cosines(owner, vector, sorted(candidates))
        return [SearchResult(candidates[i], score) for i, score in cosines.items()], text

    def _cosines(self, owner: str, vector: Vectors, ids: list[str]) -> dict[str, float]:
        """For each of the owner's memories ``ids`` embedded by this store's model: its best cosine
        with ``vector``, of its whole vector's and its sentences' (:func:`._sentences.best_cosines`)."""
        found = self._vectors_of(owner, ids)
        if not found:
            return {}
        wholes = np.stack([whole for whole, _ in found.values()])
        return dict(zip(found, best_cosines(wholes, [p for _, p in found.values()], vector), strict=True))

    def _vectors_of(self, owner: str, ids: list[str]) -> dict[str, tuple[Vectors, Vectors | None]]:
        """The whole vector and the sentence vectors (or None) of each of ``ids`` embedded by this
        store's model. Optional (this default knows none): backends that keep vectors override it,
        or :meth:`_cosines`."""
        return {}

    def _openers(self, owner: str, memories: list[Memory]) -> set[str]:
        """The ids of those of ``memories`` that open their session: no memory of ``owner`` stored with
        the same ``provenance.session_id`` (current or not) was written before it (a lower ``seq``).
        A memory of no session opens none."""
        if Capability.OPENERS not in self.capabilities:
            return set()
        sessions = sorted({m.provenance.session_id for m in memories if m.provenance.session_id is not None})
        return openers_of(memories, self._first_writes(owner, sessions)) if sessions else set()

    def _first_writes(self, owner: str, sessions: list[str]) -> dict[str, int]:
        """The lowest ``seq`` of the memories of ``owner`` stored in each of ``sessions`` (current or
        not; a session of none is left out). Optional: this default knows none, so hybrid search lifts
        no memory as its session's first (:data:`._ranking.OPENER_WEIGHT`)."""
        return {}

    def _nearest_each(self, owner: str, vectors: Vectors, now: datetime) -> list[SearchResult | None]:
        """The nearest current memory of ``owner`` to each vector (backends override to batch it)."""
        return [next(iter(self._nearest(owner, v, 1, Filters(), now)), None) for v in vectors]

    @abstractmethod
    def _text(self, owner: str, query: str, k: int, filters: Filters, now: datetime) -> list[SearchResult]:
        """Current, unexpired memories of ``owner`` ranked by full-text relevance to ``query``.

        The ``k`` best by :func:`rank_key`, as for :meth:`_nearest`.
        """

    @abstractmethod
    def _get(self, owner: str, memory_id: str, now: datetime) -> Memory | None:
        """One unexpired memory of ``owner``."""

    @abstractmethod
    def _list(self, owner: str, now: datetime) -> list[Memory]:
        """Every unexpired memory of ``owner``."""

    @abstractmethod
    def _mark_superseded(self, owner: str, memory_id: str, successor: str) -> None:
        """Point ``memory_id`` at the memory that replaces it."""

    @abstractmethod
    def _erase(self, owner: str, ids: list[str] | None) -> tuple[list[str], list[str], list[str]]:
        """Delete, then physically erase, all of the owner's memories (or ``ids``).

        Returns (removed ids, locations rewritten, what erasure cannot reach).
        """

    @abstractmethod
    def _purge(self, now: datetime) -> int:
        """Erase every memory that expired at or before ``now``."""

    @abstractmethod
    def _count_stale(self, model: str) -> int:
        """How many memories were embedded by another model than ``model``."""

    @abstractmethod
    def _stale(self, model: str, limit: int) -> list[tuple[str, str, str]]:
        """Up to ``limit`` memories embedded by another model: (owner, id, content)."""

    @abstractmethod
    def _set_vectors(
        self, model: str, rows: list[tuple[str, str, str]], vectors: Vectors, parts: Parts | None = None
    ) -> None:
        """Store new vectors of ``model`` (and sentence vectors) for the memories named by (owner, id,
        content), as :meth:`_stale` returned them, that still hold that content: one forgotten since,
        its id reused by another memory, must not get vectors of the erased text."""

    def _count_unsplit(self, model: str, most_chars: int) -> int:
        """How many memories of ``model`` of at most ``most_chars`` characters were never split into
        sentences (``sentences`` null). Optional: a backend that keeps no sentence vectors has none."""
        return 0

    def _unsplit(self, model: str, most_chars: int, limit: int) -> list[tuple[str, str, str]]:
        """Up to ``limit`` of those memories, in any order: (owner, id, content)."""
        return []

    def _set_sentences(
        self, model: str, rows: list[tuple[str, str, str]], parts: list[Vectors]
    ) -> set[tuple[str, str]]:
        """Store sentence vectors (an empty array: split, and none) for the memories named by
        (owner, id, content) that still hold that content, are of ``model`` and are unsplit; their
        whole vectors stay as they are. Returns the (owner, id) of those it stored (a memory
        forgotten meanwhile, or another under its id, is left alone)."""
        raise NotImplementedError
