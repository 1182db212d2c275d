"""The long-term memory contract: owner-scoped, provenance-tracked, searchable, erasable.

A backend implements a few primitives (``_insert``, ``_nearest``, ``_text``,
``_get``, ``_list``, ``_mark_superseded``, ``_erase``, ``_purge``, ``_stale``,
``_set_vectors``); validation, embedding, near-duplicate linking, hybrid fusion,
export and re-embedding live here, once. Every primitive takes the owner and
must never touch another owner's rows.
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import numpy as np

from statekeep import tracing
from statekeep.errors import ConflictError, InvalidInputError, MemoryNotFoundError
from statekeep.memory import _check
from statekeep.memory._types import (
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
from statekeep.memory.embedders import (
    Embedder,
    SentenceTransformerEmbedder,
    Vectors,
    check_vectors,
    is_embedder,
)

#: Cosine similarity at or above which a new memory is linked to an existing one as a duplicate.
DEFAULT_DUPLICATE_THRESHOLD = 0.92
#: The constant of reciprocal-rank fusion: score = sum(1 / (RRF_K + rank)).
RRF_K = 60
Progress = Callable[[int, int], None]


def new_id() -> str:
    """A fresh memory id."""
    return uuid.uuid4().hex


def fuse(rankings: Sequence[Sequence[SearchResult]], k: int) -> list[SearchResult]:
    """Reciprocal-rank fusion of several rankings into the top ``k``."""
    scores: dict[str, float] = {}
    memories: dict[str, Memory] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, start=1):
            scores[hit.memory.id] = scores.get(hit.memory.id, 0.0) + 1.0 / (RRF_K + rank)
            memories[hit.memory.id] = hit.memory
    best = sorted(scores, key=lambda i: (-scores[i], i))[:k]
    return [SearchResult(memories[i], scores[i]) for i in best]


class MemoryStore(ABC):
    """Long-term memories of owners, searchable by meaning, provably erasable.

    Every call names its owner, and no call reads, changes or deletes another
    owner's memories.

    Examples:
        >>> from statekeep.memory import FakeEmbedder, InMemoryMemoryStore, Provenance
        >>> store = InMemoryMemoryStore(FakeEmbedder())
        >>> m = store.remember("alice", "Alice prefers tea", provenance=Provenance("user_supplied"))
        >>> [r.memory.content for r in store.search("alice", "tea")]
        ['Alice prefers tea']
        >>> store.forget("alice").removed
        1
    """

    #: The backend's name, reported in receipts.
    backend: ClassVar[str] = "base"

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        duplicate_threshold: float | None = DEFAULT_DUPLICATE_THRESHOLD,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        if duplicate_threshold is not None and (
            isinstance(duplicate_threshold, bool)
            or not isinstance(duplicate_threshold, int | float)
            or not 0 < duplicate_threshold <= 1
        ):
            raise InvalidInputError("must be in (0, 1], or None to turn it off", field="duplicate_threshold")
        if embedder is not None and not is_embedder(embedder):
            raise InvalidInputError(
                f"must be an Embedder (name, dimension, embed), not {type(embedder).__name__}",
                field="embedder",
            )
        if clock is not None:
            tick = clock() if callable(clock) else None
            if not isinstance(tick, datetime) or tick.tzinfo is None:
                raise InvalidInputError("must be a function returning aware datetimes", field="clock")
        self.embedder: Embedder = embedder or SentenceTransformerEmbedder()
        self.duplicate_threshold = duplicate_threshold
        self._clock = clock or (lambda: datetime.now(UTC))

    def now(self) -> datetime:
        """The store's clock (UTC)."""
        return self._clock()

    # --- writing -------------------------------------------------------------------------

    def remember(
        self,
        owner: str,
        content: str,
        *,
        kind: MemoryKind = "semantic",
        tags: Iterable[str] = (),
        metadata: dict[str, Any] | None = None,
        provenance: Provenance | None = None,
        expires_at: datetime | None = None,
        ttl: timedelta | None = None,
    ) -> Memory:
        """Store one memory of ``owner`` and return it.

        A near-duplicate of one of the owner's current memories (cosine
        similarity at least ``duplicate_threshold``, same model) is stored but
        linked to it with ``duplicate_of``, and search returns only the original.

        Examples:
            >>> from statekeep.memory import FakeEmbedder, InMemoryMemoryStore
            >>> store = InMemoryMemoryStore(FakeEmbedder())
            >>> rex = store.remember("alice", "Alice's dog is called Rex", kind="episodic",
            ...                      provenance=Provenance("user_supplied", session_id="s1", run_id="r1"))
            >>> rex.owner, rex.kind, rex.trust, rex.provenance.run_id
            ('alice', 'episodic', 0.8, 'r1')

        Raises:
            InvalidInputError: an argument is invalid; nothing was written.
        """
        expiry = _check.expiry(expires_at, ttl, self.now())
        meta = {} if metadata is None else metadata
        item = MemoryInput(content, kind, _check.check_tags(tags), meta, provenance or Provenance(), expiry)
        return self.remember_many(owner, [item])[0]

    def remember_many(self, owner: str, items: Sequence[MemoryInput | str]) -> list[Memory]:
        """Store many memories of ``owner``, embedded in one batch, in one write.

        Raises:
            InvalidInputError: an item is invalid; nothing was written.
        """
        with tracing.span("memory.write", {"statekeep.memory.backend": self.backend}):
            return self._write(owner, items, dedupe=True)

    def supersede(
        self,
        owner: str,
        memory_id: str,
        content: str,
        *,
        kind: MemoryKind | None = None,
        tags: Iterable[str] | None = None,
        metadata: dict[str, Any] | None = None,
        provenance: Provenance | None = None,
        expires_at: datetime | None = None,
    ) -> Memory:
        """Replace a memory with a new one; the old one is kept, marked, and points to it.

        Search never returns the old memory again, so contradicting facts do not
        appear side by side. Omitted fields are taken from the old memory.

        Raises:
            MemoryNotFoundError: the owner has no such memory.
            ConflictError: the memory was already superseded.
        """
        old = self.get(owner, memory_id)
        if old.superseded_by is not None:
            raise ConflictError(f"memory {memory_id!r} was already superseded by {old.superseded_by!r}")
        item = MemoryInput(
            content,
            old.kind if kind is None else kind,
            tuple(old.tags if tags is None else _check.check_tags(tags)),
            old.metadata if metadata is None else metadata,
            provenance or old.provenance,
            expires_at,
        )
        with tracing.span("memory.write", {"statekeep.memory.backend": self.backend}):
            return self._write(owner, [item], dedupe=False, supersedes=old.id)[0]

    def _write(
        self, owner: str, items: Sequence[MemoryInput | str], *, dedupe: bool, supersedes: str | None = None
    ) -> list[Memory]:
        owner = _check.check_owner(owner)
        if isinstance(items, str | MemoryInput) or not isinstance(items, Sequence) or not items:
            raise InvalidInputError("must be a non-empty list of strings or MemoryInput", field="items")
        now = self.now()
        inputs = [_check.check_input(item, now) for item in items]
        vectors = self._embed([i.content for i in inputs])
        ids = [new_id() for _ in inputs]
        links = self._duplicates(owner, vectors, ids) if dedupe else [None] * len(inputs)
        memories = [
            self._memory(mid, owner, item, now, link)
            for mid, item, link in zip(ids, inputs, links, strict=True)
        ]
        if supersedes is None:
            self._insert(memories, vectors)
        else:
            self._insert_superseding(memories[0], vectors, supersedes)
        return memories

    def _insert_superseding(self, new: Memory, vectors: Vectors, old_id: str) -> None:
        """Insert ``new`` and mark ``old_id`` superseded by it; transactional backends do both at once."""
        self._insert([new], vectors)
        self._mark_superseded(new.owner, old_id, new.id)

    def _memory(
        self, memory_id: str, owner: str, item: MemoryInput, now: datetime, duplicate_of: str | None
    ) -> Memory:
        return Memory(
            id=memory_id,
            owner=owner,
            content=item.content,
            kind=item.kind,
            tags=item.tags,
            metadata=dict(item.metadata),
            provenance=item.provenance,
            model=self.embedder.name,
            created_at=now,
            expires_at=item.expires_at,
            duplicate_of=duplicate_of,
        )

    def _embed(self, texts: Sequence[str]) -> Vectors:
        return check_vectors(self.embedder, self.embedder.embed(texts), len(texts))

    def _duplicates(self, owner: str, vectors: Vectors, ids: list[str]) -> list[str | None]:
        """For each new vector, the id it duplicates: a stored memory, or an earlier one of the batch."""
        if self.duplicate_threshold is None:
            return [None] * len(vectors)
        now = self.now()
        links: list[str | None] = []
        originals: list[int] = []  # batch items that are not duplicates themselves
        stored = self._nearest_each(owner, vectors, now)
        for i, vec in enumerate(vectors):
            hit = stored[i]
            score, link = (hit.score, hit.memory.id) if hit else (-1.0, None)
            if originals:
                sims = vectors[originals] @ vec
                j = int(np.argmax(sims))
                if sims[j] > score:
                    score, link = float(sims[j]), ids[originals[j]]
            links.append(link if score >= self.duplicate_threshold else None)
            if links[-1] is None:
                originals.append(i)
        return links

    # --- reading -------------------------------------------------------------------------

    def search(
        self,
        owner: str,
        query: str,
        *,
        k: int = 5,
        mode: SearchMode = "vector",
        kinds: Iterable[MemoryKind] | MemoryKind | None = None,
        tags: Iterable[str] | str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        sources: Iterable[SourceKind] | SourceKind | None = None,
        min_trust: float | None = None,
        vector: Sequence[float] | None = None,
    ) -> list[SearchResult]:
        """The owner's ``k`` current memories nearest in meaning to ``query``, best first.

        ``mode="hybrid"`` fuses the vector ranking with a full-text ranking
        (reciprocal-rank fusion). Superseded, duplicate and expired memories, and
        memories embedded by another model, are never returned. Pass ``vector``
        to reuse a query embedding already computed with this store's embedder.

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
        owner = _check.check_owner(owner)
        query = _check.check_text(query, "query", limit=_check.MAX_CONTENT)
        k = _check.check_k(k)
        if mode not in ("vector", "hybrid"):
            raise InvalidInputError("must be 'vector' or 'hybrid'", field="mode")
        filters = _check.check_filters(kinds, tags, since, until, sources, min_trust)
        attributes = {
            "statekeep.memory.backend": self.backend,
            "statekeep.memory.k": k,
            "statekeep.memory.mode": mode,
        }
        with tracing.span("memory.search", attributes) as span:
            vec = self._query_vector(query, vector)
            now = self.now()
            pool = k if mode == "vector" else max(k * 4, 20)
            hits = self._nearest(owner, vec, pool, filters, now)
            if mode != "vector":
                hits = fuse([hits, self._text(owner, query, pool, filters, now)], k)
            span.set_attribute("statekeep.memory.results", len(hits[:k]))
            return hits[:k]

    def _query_vector(self, query: str, vector: Sequence[float] | None) -> Vectors:
        if vector is None:
            vec: Vectors = self._embed([query])[0]
            return vec
        want = f"must be {self.embedder.dimension} finite numbers, not all zero"
        if isinstance(vector, str | bytes | Mapping):
            raise InvalidInputError(want, field="vector")
        try:
            with np.errstate(over="ignore"):
                flat = np.asarray(vector, dtype=np.float32)
        except (TypeError, ValueError):
            raise InvalidInputError(want, field="vector") from None
        if flat.ndim != 1:
            raise InvalidInputError(want + " (one vector, not a batch)", field="vector")
        arr = flat.reshape(1, -1)
        if arr.shape[1] != self.embedder.dimension or not np.isfinite(arr).all() or not arr.any():
            raise InvalidInputError(want, field="vector")
        checked: Vectors = check_vectors(self.embedder, arr, 1)[0]
        return checked

    def get(self, owner: str, memory_id: str) -> Memory:
        """One of the owner's memories, current or not (expired ones are gone).

        Raises:
            MemoryNotFoundError: the owner has no such memory (another owner's id is not found either).
        """
        owner, memory_id = _check.check_owner(owner), _check.check_id(memory_id)
        memory = self._get(owner, memory_id, self.now())
        if memory is None:
            raise MemoryNotFoundError(owner, memory_id)
        return memory

    def list_memories(self, owner: str) -> list[Memory]:
        """Every unexpired memory of the owner, oldest first, superseded and duplicates included."""
        return sorted(self._list(_check.check_owner(owner), self.now()), key=lambda m: (m.created_at, m.id))

    def export(self, owner: str) -> str:
        """All of the owner's memories as a JSON document (for a data-subject request or a backup)."""
        memories = self.list_memories(owner)
        doc = {
            "owner": owner,
            "exported_at": self.now().isoformat(),
            "count": len(memories),
            "memories": [m.as_dict() for m in memories],
        }
        return json.dumps(doc, ensure_ascii=False, indent=2)

    # --- erasing -------------------------------------------------------------------------

    def forget(self, owner: str) -> ForgetReceipt:
        """Erase every memory of ``owner`` from every file of the store and return a receipt.

        Examples:
            >>> from statekeep.memory import FakeEmbedder, InMemoryMemoryStore
            >>> store = InMemoryMemoryStore(FakeEmbedder())
            >>> _ = store.remember_many("alice", ["Alice drinks tea", "Alice has a dog"])
            >>> receipt = store.forget("alice")
            >>> receipt.removed, store.list_memories("alice")
            (2, [])

        Raises:
            ErasureError: rows were deleted but a file could not be rewritten; call again.
        """
        return self._receipt(_check.check_owner(owner), None)

    def forget_one(self, owner: str, memory_id: str) -> ForgetReceipt:
        """Erase one memory of ``owner`` (physically, like :meth:`forget`).

        Raises:
            MemoryNotFoundError: the owner has no such memory.
        """
        memory = self.get(owner, memory_id)
        return self._receipt(memory.owner, [memory.id])

    def _receipt(self, owner: str, ids: list[str] | None) -> ForgetReceipt:
        removed, locations, not_reached = self._erase(owner, ids)
        return ForgetReceipt(
            owner=owner,
            removed=len(removed),
            memory_ids=tuple(sorted(removed)),
            backend=self.backend,
            locations=tuple(locations),
            not_reached=tuple(not_reached),
            finished_at=self.now(),
        )

    def purge_expired(self) -> int:
        """Erase every expired memory of every owner; return how many were removed.

        Raises:
            ConfigError: on pgvector, the role is one that row-level security confines
                to a single owner; run it as the tables' owner.
        """
        return self._purge(self.now())

    # --- re-embedding --------------------------------------------------------------------

    def reembed(self, *, batch_size: int = 256, progress: Progress | None = None) -> int:
        """Re-embed, in batches, every memory stored by another model than this store's embedder.

        ``progress(done, total)`` is called after each batch. Until a memory is
        re-embedded, vector search does not see it (two models' vectors are
        never compared).

        Returns:
            How many memories were re-embedded.

        Raises:
            ConfigError: on pgvector, the role is one that row-level security confines
                to a single owner; run it as the tables' owner.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidInputError("must be an int >= 1", field="batch_size")
        model = self.embedder.name
        total = self._count_stale(model)
        done = 0
        while done < total:
            rows = self._stale(model, batch_size)
            if not rows:
                break
            vectors = self._embed([content for _, _, content in rows])
            self._set_vectors(model, [(owner, mid) for owner, mid, _ in rows], vectors)
            done += len(rows)
            if progress is not None:
                progress(done, total)
        return done

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Release what the store holds (connections, locks)."""

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- primitives ----------------------------------------------------------------------

    @abstractmethod
    def _insert(self, memories: list[Memory], vectors: Vectors) -> None:
        """Store memories (all of one owner) with their vectors, atomically."""

    @abstractmethod
    def _nearest(
        self, owner: str, vector: Vectors, k: int, filters: Filters, now: datetime
    ) -> list[SearchResult]:
        """Current, unexpired memories of ``owner`` by this model, nearest first; score = cosine."""

    def _nearest_each(self, owner: str, vectors: Vectors, now: datetime) -> list[SearchResult | None]:
        """The nearest current memory of ``owner`` to each vector (backends override to batch it)."""
        return [next(iter(self._nearest(owner, v, 1, Filters(), now)), None) for v in vectors]

    @abstractmethod
    def _text(self, owner: str, query: str, k: int, filters: Filters, now: datetime) -> list[SearchResult]:
        """Current, unexpired memories of ``owner`` ranked by full-text relevance to ``query``."""

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
    def _set_vectors(self, model: str, keys: list[tuple[str, str]], vectors: Vectors) -> None:
        """Store new vectors of ``model`` for the memories named by (owner, id)."""
