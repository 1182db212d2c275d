"""Reading memories: search (vector, full text, or both fused), one by id, all of an owner, export."""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import ClassVar

from statekeep import _check, tracing
from statekeep.errors import InvalidInputError, MemoryNotFoundError
from statekeep.memory import _types
from statekeep.memory._backend import Capability, MemoryBackend
from statekeep.memory._types import (
    SEARCH_MODES,
    Memory,
    MemoryKind,
    Provenance,  # noqa: F401 - the search docstring's example uses it
    SearchMode,
    SearchResult,
    SourceKind,
)
from statekeep.memory.embedders import Embedder, Vectors, check_query_vector
from statekeep.memory.recall._ranking import Fusion, fuse_scores
from statekeep.memory.recall._when import window


class Reading(MemoryBackend):
    """Search, get, list and export, on top of the backend's primitives.

    Part of :class:`~statekeep.memory.MemoryStore`, which supplies the clock, the
    embedder and the knobs of hybrid search (``fusion``).
    """

    backend: ClassVar[str] = "base"
    embedder: Embedder
    fusion: Fusion

    @abstractmethod
    def now(self) -> datetime:
        """The store's clock."""

    @abstractmethod
    def _embed(self, texts: Sequence[str]) -> Vectors:
        """Vectors of these texts, by this store's embedder."""

    def search(
        self,
        owner: str,
        query: str,
        *,
        k: int = 5,
        mode: SearchMode = "hybrid",
        kinds: Iterable[MemoryKind] | MemoryKind | None = None,
        tags: Iterable[str] | str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        sources: Iterable[SourceKind] | SourceKind | None = None,
        min_trust: float | None = None,
        vector: Sequence[float] | None = None,
        include_merged: bool = False,
        sessions: Iterable[str] | str | None = None,
    ) -> list[SearchResult]:
        """The owner's ``k`` current memories most relevant to ``query``, best first.

        ``mode="hybrid"`` (the default; ``bench/retrieval.py`` compares the modes)
        fuses the vector ranking with the full-text ranking by their normalised
        scores, lifts the memory that opens its session, lets neighbouring memories
        of a session lend each other context and scores long memories down by their length (see
        :mod:`statekeep.memory.recall._ranking`); ``"vector"`` ranks by meaning alone
        (score = cosine), ``"text"`` by full-text relevance alone. Superseded
        and expired memories are never returned; memories merged into another
        (``dedupe="similar"``) only with ``include_merged=True``. A memory
        embedded by another model than this store's is ranked by full text only,
        until :meth:`reembed` embeds it again. ``sessions`` keeps the memories of those sessions
        (``provenance.session_id``); the other filters are on kind, tags, creation
        time, source and trust. Pass ``vector`` to reuse a query embedding already computed with this store's
        embedder. Ties in score are broken by content, then write order, so the
        same data and query give the same results on every run.

        Examples:
            >>> from statekeep.memory import FakeEmbedder, InMemoryMemoryStore
            >>> store = InMemoryMemoryStore(FakeEmbedder())
            >>> _ = store.remember("alice", "Alice drinks green tea", provenance=Provenance("user_supplied"))
            >>> _ = store.remember("alice", "Alice may like coffee")  # agent_inferred: trust 0.4
            >>> hits = store.search("alice", "what does Alice drink?", k=3, kinds="semantic", min_trust=0.5)
            >>> [h.memory.content for h in hits]
            ['Alice drinks green tea']

        Raises:
            InvalidInputError: an argument is invalid.
        """
        owner = _check.check_id(owner, "owner")
        query = _check.check_text(query, "query", limit=_types.MAX_CONTENT)
        k = _check.check_int(k, "k", minimum=1, maximum=_types.MAX_K)
        if mode not in SEARCH_MODES:
            raise InvalidInputError(f"must be one of {list(SEARCH_MODES)}", field="mode")
        filters = _types.check_filters(
            kinds, tags, since, until, sources, min_trust, include_merged, sessions
        )
        attributes = {
            "statekeep.memory.backend": self.backend,
            "statekeep.memory.k": k,
            "statekeep.memory.mode": mode,
        }
        with tracing.span("memory.search", attributes) as span:
            now = self.now()
            if mode == "text":
                hits = self._text(owner, query, k, filters, now)
            elif mode == "vector":
                hits = self._nearest(owner, self._query_vector(query, vector), k, filters, now)
            else:
                hits = self._hybrid_search(owner, query, self._query_vector(query, vector), k, filters, now)
            span.set_attribute("statekeep.memory.results", len(hits))
            return hits

    def _hybrid_search(
        self, owner: str, query: str, vec: Vectors, k: int, filters: _types.Filters, now: datetime
    ) -> list[SearchResult]:
        """Both rankings fused; when the query names a period (:mod:`._when`), the memories written
        in it are candidates too (a second pair of rankings, narrowed to it), and scored up; the
        candidates that open their session are lifted (:meth:`_openers`)."""
        pool = max(k, self.fusion.pool)
        near, text = self._hybrid(owner, vec, query, pool, filters, now)
        timed = "time" in self.fusion.stages and self.fusion.time_weight > 0
        period = window(query, now) if timed else None
        if period is not None:
            since = max(period[0], filters.since or period[0])
            until = min(period[1], filters.until or period[1])
            if since < until:
                during = replace(filters, since=since, until=until)
                more, _ = self._hybrid(owner, vec, query, pool, during, now)
                seen = {h.memory.id for h in near}
                near = [*near, *(h for h in more if h.memory.id not in seen)]
        openers: set[str] = set()
        if (
            "opener" in self.fusion.stages
            and self.fusion.opener_weight > 0
            and Capability.OPENERS in self.capabilities
        ):
            openers = self._openers(owner, list({h.memory.id: h.memory for h in (*near, *text)}.values()))
        return fuse_scores(near, text, k, self.fusion, period, query, openers)

    def _query_vector(self, query: str, vector: Sequence[float] | None) -> Vectors:
        if vector is None:
            vec: Vectors = self._embed([query])[0]
            return vec
        return check_query_vector(self.embedder, vector)

    def get(self, owner: str, memory_id: str) -> Memory:
        """One of the owner's memories, current or not (expired ones are gone).

        Raises:
            MemoryNotFoundError: the owner has no such memory (another owner's id is not found either).
        """
        owner, memory_id = _check.check_id(owner, "owner"), _check.check_id(memory_id, "memory_id")
        memory = self._get(owner, memory_id, self.now())
        if memory is None:
            raise MemoryNotFoundError(owner, memory_id)
        return memory

    def list_memories(self, owner: str) -> list[Memory]:
        """Every unexpired memory of the owner, oldest first, superseded and merged ones included."""
        return sorted(
            self._list(_check.check_id(owner, "owner"), self.now()), key=lambda m: (m.created_at, m.seq)
        )

    def export(self, owner: str) -> str:
        """All of the owner's memories as a JSON document (for a data-subject request or a backup).

        Superseded and merged memories are included (``superseded_by``, ``duplicate_of``);
        ``merged`` counts the memories merged into another.
        """
        memories = self.list_memories(owner)
        doc = {
            "owner": owner,
            "exported_at": self.now().isoformat(),
            "count": len(memories),
            "merged": sum(m.duplicate_of is not None for m in memories),
            "memories": [m.as_dict() for m in memories],
        }
        return json.dumps(doc, ensure_ascii=False, indent=2)
