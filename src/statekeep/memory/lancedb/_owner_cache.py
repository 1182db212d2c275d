"""An owner's memories, vectors and indexed words held in process by a LanceDB store.

The folder lock makes a writing :class:`~statekeep.memory.LanceDBMemoryStore`
the only writer, so what it read stays true until it writes: its writes of one
owner's memories (new ones, superseded ones) are applied to that owner's held
rows; other writes (erasure, expiry, re-embedding) let the owners go. A read-only
store lets every owner go when another process has committed a new version. A
search with no narrowing filter then ranks the owner's rows with one matrix
product instead of a scan of the table, and a full-text search ranks words already
counted (:mod:`._bm25`). The cache holds at most ``budget`` bytes, least recently
searched owners leaving first; an owner bigger than that is never held.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from statekeep.memory._rows import from_row, to_us
from statekeep.memory._types import Filters, Memory
from statekeep.memory.embedders import Vectors
from statekeep.memory.lancedb._layout import SENTENCES, sentence_vectors
from statekeep.memory.recall._bm25 import TextIndex
from statekeep.memory.recall._ranking import first_writes
from statekeep.memory.recall._sentences import Parts

#: Microseconds stored for "never expires" in the cached expiry column.
NEVER = np.iinfo(np.int64).max
#: A rough size of one memory held as a Python object and its words indexed, besides its vector.
ROW_BYTES = 2048
#: A rough size of what holding an owner costs besides their rows (an owner of no memories too).
OWNER_BYTES = 512


@dataclass(frozen=True)
class OwnerRows:
    """Every stored memory of one owner (current or not), its vectors, and the columns that filter them."""

    memories: list[Memory]
    matrix: Vectors  # float32, one unit vector per memory
    superseded: npt.NDArray[np.bool_]
    merged: npt.NDArray[np.bool_]
    expires_us: npt.NDArray[np.int64]  # NEVER when it does not expire
    models: npt.NDArray[np.str_]
    sentences: dict[str, Vectors]  # memory id -> its sentence vectors (:mod:`._sentences`), if it has them

    @cached_property
    def by_id(self) -> dict[str, Memory]:
        """The memories by id."""
        return {m.id: m for m in self.memories}

    @cached_property
    def _row(self) -> dict[str, int]:
        return {m.id: n for n, m in enumerate(self.memories)}

    @cached_property
    def first_seq(self) -> dict[str, int]:
        """The write order (``seq``) of the first memory held of each session."""
        return first_writes((m.provenance.session_id, m.seq) for m in self.memories)

    def rows_of(self, ids: list[str]) -> dict[str, int]:
        """The row of each of ``ids`` held (in ``memories`` and ``matrix``)."""
        return {i: self._row[i] for i in ids if i in self._row}

    @cached_property
    def nbytes(self) -> int:
        """About how much memory this takes (counted once: the cache asks at every write of the owner)."""
        parts = sum(int(p.nbytes) for p in self.sentences.values())
        return OWNER_BYTES + int(self.matrix.nbytes) + parts + ROW_BYTES * len(self.memories)

    #: shared by the later snapshots of the owner; empty until the first full-text search
    words: TextIndex = field(default_factory=TextIndex, compare=False)

    def current(self, filters: Filters, now: datetime, model: str) -> npt.NDArray[np.bool_]:
        """The mask of rows a vector search may return: current, unexpired, by ``model`` (merged if asked)."""
        mask: npt.NDArray[np.bool_] = (
            ~self.superseded & (self.expires_us > (to_us(now) or 0)) & (self.models == model)
        )
        return mask if filters.include_merged else mask & ~self.merged

    def searchable(self, filters: Filters, now: datetime) -> npt.NDArray[np.bool_]:
        """The mask of rows a full-text search may return: current, unexpired, passing ``filters``."""
        mask: npt.NDArray[np.bool_] = ~self.superseded & (self.expires_us > (to_us(now) or 0))
        if not filters.include_merged:
            mask &= ~self.merged
        if narrows(filters):
            passing = (filters.matches(m) for m in self.memories)
            mask &= np.fromiter(passing, dtype=bool, count=len(self.memories))
        return mask

    def text_index(self) -> TextIndex:
        """The words of these rows, indexed at the first full-text search and brought up to date since.

        Later snapshots of the owner (:meth:`extended`, :meth:`superseding`) share the
        index: they hold the same memories in the same order, and new ones after them.
        """
        index = self.words
        if len(index.lengths) < len(self.memories):
            index.add(m.content for m in self.memories[len(index.lengths) :])
        return index

    def extended(self, memories: list[Memory], vectors: Vectors, parts: Parts | None = None) -> OwnerRows:
        """These rows and ``memories`` just written (their vectors in ``vectors``, sentences in ``parts``)."""
        sentences = dict(self.sentences)
        for m, p in zip(memories, parts or [None] * len(memories), strict=True):
            if p is not None and len(p):  # as read back (an empty cell: no sentences)
                sentences[m.id] = p
        matrix = np.concatenate([self.matrix, vectors])
        return replace(held_rows(self.memories + memories, matrix, sentences), words=self.words)

    def superseding(self, memory_id: str, successor: str) -> OwnerRows:
        """These rows with ``memory_id`` pointing at ``successor``."""
        memories = [replace(m, superseded_by=successor) if m.id == memory_id else m for m in self.memories]
        return replace(
            self, memories=memories, superseded=self.superseded | [m.id == memory_id for m in memories]
        )


def narrows(filters: Filters) -> bool:
    """True when ``filters`` asks for more than current memories (kinds, tags, times, sources, ...)."""
    return bool(
        filters.sessions
        or filters.kinds
        or filters.tags
        or filters.sources
        or filters.since is not None
        or filters.until is not None
        or filters.min_trust is not None
    )


class OwnerCache:
    """Owners' rows, least recently used first out, within ``budget`` bytes (0 holds nothing)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._held: OrderedDict[str, OwnerRows] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        #: Bumped by every drop: rows read before a drop are never put after it.
        self.generation = 0
        #: Owners read and found too big to hold (sentence vectors are not in :meth:`fits`'s
        #: estimate): how many memories they had, so that they are not read whole again.
        self._too_big: dict[str, int] = {}

    def get(self, owner: str) -> OwnerRows | None:
        """The owner's rows if held (and now the most recently used)."""
        with self._lock:
            rows = self._held.get(owner)
            if rows is not None:
                self._held.move_to_end(owner)
            return rows

    def fits(self, owner: str, rows: int, dimension: int) -> bool:
        """Whether ``owner``, of ``rows`` memories, could be held (not once found too big with as many)."""
        with self._lock:
            if rows >= self._too_big.get(owner, rows + 1):
                return False
        return OWNER_BYTES + rows * (4 * dimension + ROW_BYTES) <= self.budget

    def put(self, owner: str, rows: OwnerRows, generation: int) -> None:
        """Hold ``rows`` read at ``generation``, unless a write dropped owners since; within the budget."""
        with self._lock:
            self._forget(owner)
            if rows.nbytes > self.budget:
                self._too_big[owner] = len(rows.memories)
                return
            if generation != self.generation:
                return
            self._held[owner] = rows
            self._size += rows.nbytes
            while self._size > self.budget:
                self._forget(next(iter(self._held)))

    def update(self, owner: str, change: Callable[[OwnerRows], OwnerRows]) -> None:
        """Apply a write of the owner's to their held rows, if held (a read under way is not put)."""
        with self._lock:
            self.generation += 1
            rows = self._held.get(owner)
            if rows is not None:
                self._forget(owner)
                changed = change(rows)
                if changed.nbytes <= self.budget:
                    self._held[owner] = changed
                    self._size += changed.nbytes

    def drop(self, owner: str | None = None) -> None:
        """Let one owner go (after a write of theirs), or every owner (``None``: after a rewrite)."""
        with self._lock:
            self.generation += 1
            if owner is None:
                self._held.clear()
                self._size = 0
            else:
                self._forget(owner)

    def _forget(self, owner: str) -> None:
        gone = self._held.pop(owner, None)
        if gone is not None:
            self._size -= gone.nbytes


def owner_rows(table: Any, dimension: int) -> OwnerRows:
    """An owner's rows read from LanceDB (every column, the vector, the sentences if read) as the cache
    holds them."""
    sentences: dict[str, Vectors] = {}
    if SENTENCES in table.column_names:
        ids = table.column("id").to_pylist()
        for memory_id, cell in zip(ids, table.column(SENTENCES).to_pylist(), strict=True):
            parts = sentence_vectors(cell, dimension)
            if parts is not None:
                sentences[memory_id] = parts
        table = table.drop_columns([SENTENCES])
    memories = [from_row(r) for r in table.drop_columns(["vector"]).to_pylist()]
    flat = table.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return held_rows(memories, np.asarray(flat, dtype=np.float32).reshape(-1, dimension), sentences)


def held_rows(
    memories: list[Memory], matrix: Vectors, sentences: dict[str, Vectors] | None = None
) -> OwnerRows:
    """Memories and their vectors (and sentence vectors, by id), with the columns a search filters on."""
    return OwnerRows(
        memories=memories,
        matrix=np.ascontiguousarray(matrix, dtype=np.float32),
        superseded=np.array([m.superseded_by is not None for m in memories], dtype=bool),
        merged=np.array([m.duplicate_of is not None for m in memories], dtype=bool),
        expires_us=np.array(
            [NEVER if m.expires_at is None else to_us(m.expires_at) for m in memories], dtype=np.int64
        ),
        models=np.array([m.model for m in memories], dtype=str),
        sentences=sentences or {},
    )
