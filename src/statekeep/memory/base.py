"""The long-term memory contract: owner-scoped, provenance-tracked, searchable, erasable.

A backend implements the primitives of :class:`~statekeep.memory._backend.MemoryBackend`
(``_insert``, ``_same``, ``_nearest``, ``_text``, ``_get``, ``_list``,
``_mark_superseded``, ``_erase``, ``_purge``, ``_stale``, ``_set_vectors``);
validation, embedding and deduplication (:mod:`._dedupe`), reading (search, export),
erasing and re-embedding live here, once, in one class; how hybrid search ranks is
:mod:`statekeep.memory.recall` (its stages: :data:`~statekeep.memory.recall._ranking.STAGES`),
and the optional primitives a backend implements are its declared
:class:`~statekeep.memory._backend.Capability` set.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import numpy as np

from statekeep import _check, tracing
from statekeep.errors import ConflictError, InvalidInputError, MemoryNotFoundError
from statekeep.memory import _dedupe, _types
from statekeep.memory._backend import Capability, MemoryBackend
from statekeep.memory._dedupe import UNSET, merged, policy
from statekeep.memory._types import (
    SEARCH_MODES,
    Dedupe,
    DedupeMode,
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
    check_query_vector,
    check_vectors,
    is_embedder,
)
from statekeep.memory.recall._ranking import Fusion, fuse_scores
from statekeep.memory.recall._sentences import (
    SENTENCE_CHARS,
    Parts,
    embed_with_sentences,
    sentence_vectors_of,
)
from statekeep.memory.recall._when import window

#: ``progress(done, total)``, called after each batch of a re-embedding.
Progress = Callable[[int, int], None]


def new_id() -> str:
    """A fresh memory id."""
    return uuid.uuid4().hex


class MemoryStore(MemoryBackend):
    """Long-term memories of owners, searchable by meaning, provably erasable.

    Every call names its owner, and no call reads, changes or deletes another
    owner's memories.

    ``dedupe`` says what :meth:`remember` does with a memory the owner already has:

    * ``"exact"`` (the default): a memory with the same ``key``, or without a key
      and with the same text after normalisation (Unicode NFKC, case-folded,
      whitespace collapsed), is the same fact; nothing is stored and the existing
      memory is returned, with ``dedupe`` saying so. Anything else is stored.
    * ``"similar"`` (opt-in; also chosen by giving ``duplicate_threshold``): as
      ``"exact"``, and a memory whose embedding is at least ``duplicate_threshold``
      (0.92 by default) from a current one is stored, merged into it
      (``duplicate_of``, ``duplicate_score``) and returned with ``dedupe`` saying
      so; search leaves it out unless ``include_merged=True``; export lists it.
    * ``"none"``: every memory is stored (``duplicate_threshold=None`` also means this).

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
    #: How hybrid search fuses its rankings (pool, weights, session context).
    fusion: Fusion = Fusion()
    _sentence_chars: int = SENTENCE_CHARS

    @property
    def sentence_chars(self) -> int:
        """Memories of at most this many characters keep a vector per sentence (:mod:`._sentences`);
        0 keeps none. It applies to what is written from then on (stored memories keep theirs;
        :meth:`reembed` embeds another model's memories with their sentences, and
        :meth:`embed_sentences` the sentences of memories that have none).

        Raises:
            InvalidInputError: set to anything but an int >= 0.
        """
        return self._sentence_chars

    @sentence_chars.setter
    def sentence_chars(self, value: int) -> None:
        self._sentence_chars = _check.check_int(value, "sentence_chars", minimum=0)

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        dedupe: DedupeMode | None = None,
        duplicate_threshold: float | None = UNSET,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.dedupe, self.duplicate_threshold = policy(dedupe, duplicate_threshold)
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
        self._clock = clock or (lambda: datetime.now(UTC))
        self._write_lock = threading.RLock()

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
        key: str | None = None,
    ) -> Memory:
        """Store one memory of ``owner`` and return it.

        If the owner already has this fact (the same ``key``, or the same text
        after normalisation; see the store's ``dedupe``), nothing is stored and
        the existing memory is returned, its ``dedupe`` saying why. Only with
        ``dedupe="similar"`` is a merely similar memory merged into another.

        Examples:
            >>> from statekeep.memory import FakeEmbedder, InMemoryMemoryStore
            >>> store = InMemoryMemoryStore(FakeEmbedder())
            >>> rex = store.remember("alice", "Alice's dog is called Rex", kind="episodic",
            ...                      provenance=Provenance("user_supplied", session_id="s1", run_id="r1"))
            >>> rex.owner, rex.kind, rex.trust, rex.provenance.run_id
            ('alice', 'episodic', 0.8, 'r1')
            >>> again = store.remember("alice", "alice's dog is  called Rex")
            >>> again.id == rex.id, again.dedupe.reason, again.dedupe.stored
            (True, 'same_text', False)

        Raises:
            InvalidInputError: an argument is invalid; nothing was written.
        """
        expiry = _types.expiry(expires_at, ttl, self.now())
        meta = {} if metadata is None else metadata
        tags_ = _types.check_tags(tags)
        item = MemoryInput(content, kind, tags_, meta, provenance or Provenance(), expiry, key)
        return self.remember_many(owner, [item])[0]

    def remember_many(self, owner: str, items: Sequence[MemoryInput | str]) -> list[Memory]:
        """Store many memories of ``owner``, embedded in one batch, in one write.

        Returns one memory per item, in order; an item that repeats a stored memory
        or an earlier item of the batch returns that memory (see :meth:`remember`).

        Raises:
            InvalidInputError: an item is invalid; nothing was written.
        """
        with tracing.span("memory.write", {"statekeep.memory.backend": self.backend}):
            return self._write(owner, items, dedupe=True)

    def insert(self, memories: Sequence[Memory], vectors: Vectors | None = None) -> list[Memory]:
        """Store memories of one owner exactly as given (ids, tags, times chosen by the caller), atomically.

        For adapters and imports that keep their own identities: no deduplication,
        no merging. ``vectors`` (one row per memory, of the embedder's dimension)
        default to the embeddings of the contents. An id the owner already has is
        refused by the backend: erase it first (:meth:`forget_many`).

        Raises:
            InvalidInputError: no memories, several owners, a repeated or invalid id,
                or vectors of the wrong shape; nothing was written.
        """
        if isinstance(memories, Memory) or not isinstance(memories, Sequence) or not memories:
            raise InvalidInputError("must be a non-empty list of Memory records", field="memories")
        if not all(isinstance(m, Memory) for m in memories):
            raise InvalidInputError("must hold only Memory records", field="memories")
        owners = {_check.check_id(m.owner, "owner") for m in memories}
        ids = [_check.check_id(m.id, "memory_id") for m in memories]
        if len(owners) != 1 or len(set(ids)) != len(ids):
            raise InvalidInputError("must be of one owner, each id once", field="memories")
        parts: Parts | None = None
        if vectors is None:
            vectors, parts = self._embed_parts([m.content for m in memories])
        shape = np.shape(vectors)
        if shape != (len(memories), self.embedder.dimension) or not np.isfinite(vectors).all():
            raise InvalidInputError(
                f"must be {len(memories)} finite vectors of {self.embedder.dimension} numbers",
                field="vectors",
            )
        with tracing.span("memory.write", {"statekeep.memory.backend": self.backend}), self._writing():
            return self._insert(list(memories), check_vectors(self.embedder, vectors, len(memories)), parts)

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
        appear side by side. Omitted fields (the key too) are taken from the old
        memory. The new memory is always stored: superseding never deduplicates.

        Raises:
            MemoryNotFoundError: the owner has no such memory.
            ConflictError: the memory was already superseded.
        """
        old = self.get(owner, memory_id)
        if old.superseded_by is not None:
            raise _superseded(memory_id, old.superseded_by)
        item = MemoryInput(
            content,
            old.kind if kind is None else kind,
            tuple(old.tags if tags is None else _types.check_tags(tags)),
            old.metadata if metadata is None else metadata,
            provenance or old.provenance,
            expires_at,
            old.key,
        )
        with tracing.span("memory.write", {"statekeep.memory.backend": self.backend}):
            # two threads superseding one memory: the second's _insert_superseding sees the first's mark
            return self._write(owner, [item], dedupe=False, supersedes=old.id)[0]

    def _write(
        self, owner: str, items: Sequence[MemoryInput | str], *, dedupe: bool, supersedes: str | None = None
    ) -> list[Memory]:
        owner = _check.check_id(owner, "owner")
        if isinstance(items, str | MemoryInput) or not isinstance(items, Sequence) or not items:
            raise InvalidInputError("must be a non-empty list of strings or MemoryInput", field="items")
        now = self.now()
        inputs = [_types.check_input(item, now) for item in items]
        idents = [_dedupe.identity(i.content, i.key) for i in inputs]
        policy: DedupeMode = self.dedupe if dedupe else "none"
        found = self._same(owner, sorted(set(idents)), now) if policy != "none" else {}
        first, fresh = _dedupe.plan(idents, found, policy)
        # outside the store's lock: other threads' searches and writes do not wait for the model
        vectors, parts = self._embed_parts([inputs[i].content for i in fresh]) if fresh else _dedupe.NOTHING
        with self._writing():
            if fresh and policy != "none":
                found |= self._stored_meanwhile(owner, sorted({idents[i] for i in fresh}), now)
                first, fresh, vectors, parts = _dedupe.replan(idents, found, policy, fresh, vectors, parts)
            embedded = (vectors, parts)
            stored = self._store_fresh(owner, inputs, idents, fresh, embedded, policy, now, supersedes)
        lost = sorted({idents[i] for i in fresh if i not in stored})
        if lost:  # another writer stored them since _same looked
            found |= self._same(owner, lost, now)
        out = []
        for i, ident in enumerate(idents):
            if i in stored:
                out.append(stored[i])
                continue
            existing = found.get(ident) or stored.get(first[ident])
            if existing is None:  # stored by another writer, then superseded or erased: try again
                out.append(self._write(owner, [inputs[i]], dedupe=True)[0])
                continue
            why = Dedupe("same_key" if inputs[i].key is not None else "same_text", existing.id, stored=False)
            out.append(dataclasses.replace(existing, dedupe=why))
        return out

    def _store_fresh(
        self,
        owner: str,
        inputs: list[MemoryInput],
        idents: list[str],
        fresh: list[int],
        embedded: tuple[Vectors, Parts],
        policy: DedupeMode,
        now: datetime,
        supersedes: str | None,
    ) -> dict[int, Memory]:
        """Store the ``fresh`` items with their vectors and sentence vectors (``embedded``), less those
        another writer stored meanwhile."""
        if not fresh:
            return {}
        vectors, parts = embedded
        ids = [new_id() for _ in fresh]
        links = self._similar(owner, vectors, ids) if policy == "similar" else [None] * len(fresh)
        memories = [
            self._memory(mid, owner, inputs[i], now, idents[i], link)
            for mid, i, link in zip(ids, fresh, links, strict=True)
        ]
        written: list[Memory | None]
        if supersedes is not None:
            stored = self._insert_superseding(memories[0], vectors, supersedes, parts)
            if stored is None:  # another writer superseded (or erased) it since supersede looked
                raise _superseded(supersedes, self.get(owner, supersedes).superseded_by)
            written = [stored]
        elif policy == "none":
            written = list(self._insert(memories, vectors, parts))
        else:  # another writer may have stored one of these identities since _same looked
            written = self._insert_unless_same(memories, vectors, now, parts)
        return {i: merged(m) for i, m in zip(fresh, written, strict=True) if m is not None}

    def _writing(self) -> AbstractContextManager[object]:
        """Held while a write looks again at what the owner has and stores what is still new.

        This default, one lock per store, makes the threads of one process take turns (the
        in-memory and LanceDB backends have one writing process); the model never runs under it.
        A backend that many processes write to settles concurrent writers of one fact in its
        database (:meth:`_insert_unless_same`): it holds nothing here, nor looks again.
        """
        return self._write_lock

    def _stored_meanwhile(self, owner: str, identities: list[str], now: datetime) -> dict[str, Memory]:
        """Which of ``identities`` another thread stored while the write embedded (under ``_writing``)."""
        return self._same(owner, identities, now)

    def _insert_superseding(
        self, new: Memory, vectors: Vectors, old_id: str, parts: Parts | None = None
    ) -> Memory | None:
        """Insert ``new`` and mark ``old_id`` superseded by it, under :meth:`_writing`; neither (None)
        when ``old_id`` was superseded or erased meanwhile. Transactional backends do both at once."""
        old = self._get(new.owner, old_id, new.created_at)
        if old is None or old.superseded_by is not None:
            return None
        stored = self._insert([new], vectors, parts)[0]
        self._mark_superseded(new.owner, old_id, new.id)
        return stored

    def _memory(
        self,
        memory_id: str,
        owner: str,
        item: MemoryInput,
        now: datetime,
        identity: str,
        link: tuple[str, float] | None,
    ) -> Memory:
        del identity  # backends store it from (content, key); kept in the signature for overrides
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
            duplicate_of=None if link is None else link[0],
            key=item.key,
            duplicate_score=None if link is None else link[1],
        )

    def _embed(self, texts: Sequence[str]) -> Vectors:
        return check_vectors(self.embedder, self.embedder.embed(texts), len(texts))

    def _embed_parts(self, texts: Sequence[str]) -> tuple[Vectors, Parts]:
        """The vectors of ``texts`` and of their sentences (:mod:`._sentences`), in one batch."""
        return embed_with_sentences(self._embed, texts, self.sentence_chars)

    def _similar(self, owner: str, vectors: Vectors, ids: list[str]) -> list[tuple[str, float] | None]:
        """For each new vector, what it merges into (a stored or an earlier new memory) and the cosine."""
        if self.duplicate_threshold is None:
            return [None] * len(vectors)
        stored = self._nearest_each(owner, vectors, self.now())
        return _dedupe.similar_links(vectors, ids, stored, self.duplicate_threshold)

    # --- reading -----------------------------------------------------------------------

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
                during = dataclasses.replace(filters, since=since, until=until)
                more, _ = self._hybrid(owner, vec, query, pool, during, now)
                seen = {h.memory.id for h in near}
                near = [*near, *(h for h in more if h.memory.id not in seen)]
        openers: set[str] = set()
        if "opener" in self.fusion.stages and self.fusion.opener_weight > 0:  # _openers asks the capability
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
        return self._receipt(_check.check_id(owner, "owner"), None)

    def forget_one(self, owner: str, memory_id: str) -> ForgetReceipt:
        """Erase one memory of ``owner`` (physically, like :meth:`forget`).

        Raises:
            MemoryNotFoundError: the owner has no such memory.
        """
        memory = self.get(owner, memory_id)
        return self._receipt(memory.owner, [memory.id])

    def forget_many(self, owner: str, memory_ids: Iterable[str]) -> ForgetReceipt:
        """Erase these memories of ``owner`` (physically, like :meth:`forget`); ids they lack are skipped.

        Raises:
            InvalidInputError: an invalid owner or id; nothing was erased.
        """
        if isinstance(memory_ids, str):
            raise InvalidInputError("must be a list of memory ids", field="memory_ids")
        ids = sorted({_check.check_id(i, "memory_ids") for i in memory_ids})
        return self._receipt(_check.check_id(owner, "owner"), ids)

    def _receipt(self, owner: str, ids: list[str] | None) -> ForgetReceipt:
        # an empty list names no memory (None names them all)
        removed, locations, not_reached = self._erase(owner, ids) if ids != [] else ([], [], [])
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

    def optimize(self, *, full: bool = False) -> None:
        """Bring the store's files and statistics up to date after bulk loads; search answers as before.

        LanceDB lays out what was written since the last run by owner and indexes it
        (call it after bulk loads and from time to time: each write adds a file);
        PostgreSQL vacuums and analyzes the memory table (``VACUUM (ANALYZE)``), as its
        documentation asks after a bulk load and autovacuum does some time later; the
        in-memory store has nothing to do. Results stay the same, except the
        approximate neighbours of a PostgreSQL owner big enough to be searched through
        the HNSW index, which may differ between any two plans of a search.

        Args:
            full: rewrite everything, not just what changed (LanceDB: the whole table,
                so that each owner's rows are together again; PostgreSQL: ``VACUUM FULL``,
                which locks each partition while it is rewritten).
        """
        if not isinstance(full, bool):
            raise InvalidInputError("must be True or False", field="full")
        self._optimize(full)

    def _optimize(self, full: bool) -> None:
        """The backend's own upkeep for :meth:`optimize` (nothing, unless overridden)."""

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
            vectors, parts = self._embed_parts([content for _, _, content in rows])
            self._set_vectors(model, rows, vectors, parts)
            done += len(rows)
            if progress is not None:
                progress(done, total)
        return done

    def embed_sentences(self, *, batch_size: int = 256, progress: Progress | None = None) -> int:
        """Embed the sentences of the memories that would keep sentence vectors now but have none.

        Memories written before sentence vectors (before LanceDB's ``sentences`` column,
        PostgreSQL's memory migration 6), or while :attr:`sentence_chars` was lower, are
        scored by their whole text only; this gives each one of this store's model, of at
        most :attr:`sentence_chars` characters and of two or more sentences, its sentence
        vectors (:mod:`._sentences`). Whole vectors stay as they are; a memory stored by
        :meth:`insert` with the caller's vectors gains sentence vectors of this store's
        embedder too. Each memory read is marked as split, so a second call finds only
        what was written since without sentences. ``progress(done, total)`` is called
        after each batch, over the memories read.

        Returns:
            How many memories gained sentence vectors.

        Raises:
            ConfigError: on pgvector, the role is one that row-level security confines
                to a single owner; run it as the tables' owner.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidInputError("must be an int >= 1", field="batch_size")
        model, most = self.embedder.name, self.sentence_chars
        if most == 0 or Capability.SENTENCE_VECTORS not in self.capabilities:
            return 0
        total = self._count_unsplit(model, most)
        read = gained = 0
        while read < total:
            rows = self._unsplit(model, most, batch_size)
            if not rows:
                break
            parts = sentence_vectors_of(self._embed, [c for _, _, c in rows], self.embedder.dimension)
            stored = self._set_sentences(model, rows, parts)  # marks the ones of no sentences split too
            gained += sum(
                1 for (owner, mid, _), p in zip(rows, parts, strict=True) if len(p) and (owner, mid) in stored
            )
            read += len(rows)
            if progress is not None:
                progress(min(read, total), total)
        return gained

    def close(self) -> None:
        """Release what the store holds (connections, locks)."""

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _superseded(memory_id: str, by: str | None) -> ConflictError:
    return ConflictError(f"memory {memory_id!r} was already superseded by {by!r}")
