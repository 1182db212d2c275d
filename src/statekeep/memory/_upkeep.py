"""Erasing and re-embedding: the upkeep every memory store shares, on top of its backend's primitives."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import ClassVar

from statekeep import _check
from statekeep.errors import InvalidInputError
from statekeep.memory._backend import Capability, MemoryBackend
from statekeep.memory._types import ForgetReceipt, Memory
from statekeep.memory.embedders import Embedder, Vectors
from statekeep.memory.recall._sentences import Parts, sentence_vectors_of

#: ``progress(done, total)``, called after each batch of a re-embedding.
Progress = Callable[[int, int], None]


class Upkeep(MemoryBackend):
    """Forgetting (an owner, one memory, some memories, the expired) and re-embedding.

    Part of :class:`~statekeep.memory.MemoryStore`, which supplies the clock, the
    embedder and :meth:`get`.
    """

    backend: ClassVar[str] = "base"
    embedder: Embedder
    sentence_chars: int

    @abstractmethod
    def now(self) -> datetime:
        """The store's clock."""

    @abstractmethod
    def get(self, owner: str, memory_id: str) -> Memory:
        """One memory of the owner."""

    @abstractmethod
    def _embed(self, texts: Sequence[str]) -> Vectors:
        """Vectors of these texts by this store's embedder, checked."""

    @abstractmethod
    def _embed_parts(self, texts: Sequence[str]) -> tuple[Vectors, Parts]:
        """Vectors of these texts and of their sentences, by this store's embedder."""

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
