"""The long-term memory contract: owner-scoped, provenance-tracked, searchable, erasable.

A backend implements the primitives of :class:`~statekeep.memory._backend.MemoryBackend`
(``_insert``, ``_same``, ``_nearest``, ``_text``, ``_get``, ``_list``,
``_mark_superseded``, ``_erase``, ``_purge``, ``_stale``, ``_set_vectors``);
validation, embedding and deduplication (:mod:`._dedupe`) live here, once; reading
(search, fusion and ranking, export) in :mod:`._reading` and :mod:`._ranking`, erasing and
re-embedding in :mod:`._upkeep`.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import numpy as np

from statekeep import _check, tracing
from statekeep.errors import ConflictError, InvalidInputError
from statekeep.memory import _dedupe, _types
from statekeep.memory._dedupe import UNSET, merged, policy
from statekeep.memory._reading import Reading
from statekeep.memory._types import (
    Dedupe,
    DedupeMode,
    Memory,
    MemoryInput,
    MemoryKind,
    Provenance,
)
from statekeep.memory._upkeep import Upkeep
from statekeep.memory.embedders import (
    Embedder,
    SentenceTransformerEmbedder,
    Vectors,
    check_vectors,
    is_embedder,
)
from statekeep.memory.recall._ranking import Fusion
from statekeep.memory.recall._sentences import SENTENCE_CHARS, Parts, embed_with_sentences


def new_id() -> str:
    """A fresh memory id."""
    return uuid.uuid4().hex


class MemoryStore(Reading, Upkeep):
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

    def close(self) -> None:
        """Release what the store holds (connections, locks)."""

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _superseded(memory_id: str, by: str | None) -> ConflictError:
    return ConflictError(f"memory {memory_id!r} was already superseded by {by!r}")
