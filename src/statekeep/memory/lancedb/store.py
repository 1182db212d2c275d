"""The LanceDB backend: an embedded folder, for one machine and one writer.

Filters are LanceDB SQL strings (:mod:`statekeep.memory.lancedb._sql`); every value in
them goes through :func:`quote`, so an owner such as ``a' OR '1'='1`` is just a
string. Searches prefilter by owner (and the other filters) before ranking,
exactly: ``optimize`` builds no vector index (a table an older statekeep indexed
is searched through its index until ``optimize``, exactly when the filter leaves
at most ``exact_below`` rows).

``optimize`` writes the rows grouped by owner into small data files, the owner
index in segments of a few files (:mod:`statekeep.memory.lancedb._layout`); once
the table is laid out, it lays out only the rows written since. There is no
full-text index (full-text search is BM25 over the owner's memories, in process:
:mod:`statekeep.memory.recall._bm25`); a writer drops the one an older statekeep built
when it opens the table. Erasure
deletes the rows, then rewrites each data file that held one
(``compact_files`` with ``materialize_deletions_threshold=0``, every other file
excluded), so Lance remaps only the index segments of those files, and deletes
every old version (``cleanup_old_versions`` with ``delete_unverified=True``),
indexes included: its cost follows the owner's rows, not the table.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

from statekeep._check import check_int
from statekeep._extras import requires
from statekeep.errors import ConfigError, ErasureError, InvalidInputError
from statekeep.memory._backend import Capability
from statekeep.memory._rows import COLUMNS, from_row, to_us
from statekeep.memory._types import Filters, Memory, SearchResult
from statekeep.memory.base import MemoryStore
from statekeep.memory.embedders import Embedder, Vectors
from statekeep.memory.lancedb._layout import (
    SENTENCES,
    TABLE,
    add_sentences,
    arrow_rows,
    drop_old_text_index,
    erase,
    index_segments,
    lay_out,
    lay_out_new,
    schema,
    sentence_vectors,
    upgrade,
)
from statekeep.memory.lancedb._lock import FolderLock, lance_errors, one_at_a_time
from statekeep.memory.lancedb._owner_cache import OwnerCache, OwnerRows, narrows, owner_rows
from statekeep.memory.lancedb._sql import in_list, quote, where
from statekeep.memory.recall._bm25 import TextIndex, ranked
from statekeep.memory.recall._exact import nearest
from statekeep.memory.recall._ranking import first_writes, top_k
from statekeep.memory.recall._sentences import Parts, take

NOT_REACHED = ("copies of the folder made outside statekeep (backups, snapshots, synced or copied folders)",)


class LanceDBMemoryStore(MemoryStore):
    """Memories in a LanceDB folder: zero servers; one machine, one writer.

    The folder is locked while the store is open; a second writer (another
    process, or another store in this one) gets :class:`MemoryLockedError`.
    Threads may share the store: its operations run one at a time.
    Many workers on many machines must use :class:`PgVectorMemoryStore`.

    Examples:
        >>> from statekeep.memory import FakeEmbedder
        >>> with LanceDBMemoryStore("/tmp/agent/memory", FakeEmbedder()) as store:
        ...     _ = store.remember("alice", "Alice prefers tea")

    Args:
        path: the folder (created if missing).
        embedder: defaults to all-MiniLM-L6-v2.
        exact_below: on a table with a vector index (built by an older statekeep, dropped by
            ``optimize``), searches whose filter leaves at most this many rows are exact.
        nprobes: IVF partitions probed by a search through such an index.
        cache_bytes: a store keeps the memories, vectors and indexed words of the owners it
            searched in process, up to this many bytes (0: none), so a search is one matrix
            product and a full-text ranking of words already counted. A writer applies its
            writes to what it holds; a read-only store lets everything go whenever another
            process has committed a new version of the table.
        read_only: open for reading only, without the writer lock (LanceDB readers are
            safe beside one writer), so searches and exports work while a worker writes;
            every read sees the latest committed version. The folder must hold memories.
    """

    backend = "lancedb"
    capabilities = frozenset(
        {
            Capability.CANDIDATE_COSINES,
            Capability.SENTENCE_VECTORS,
            Capability.OPENERS,
            Capability.BATCHED_NEAREST,
            Capability.OPTIMIZE,
        }
    )

    def __init__(
        self,
        path: str | Path,
        embedder: Embedder | None = None,
        *,
        exact_below: int = 20_000,
        nprobes: int = 32,
        read_only: bool = False,
        cache_bytes: int = 256 * 2**20,
        **kw: Any,
    ) -> None:
        super().__init__(embedder, **kw)
        with requires("lancedb", "LanceDB memory"):
            import lancedb
            import Stemmer  # noqa: F401 - full-text ranking (memory/_bm25.py) needs it at the first search
        check_int(exact_below, "exact_below")
        check_int(nprobes, "nprobes", minimum=1, maximum=100_000)
        check_int(cache_bytes, "cache_bytes")
        if not isinstance(path, str | PathLike) or not str(path).strip() or "\x00" in str(path):
            raise InvalidInputError("must be a folder path (a non-empty string without NUL)", field="path")
        self.path = Path(path)
        self.read_only = read_only
        self.exact_below = exact_below
        self.nprobes = nprobes
        self._lock: FolderLock | None = None
        try:
            with lance_errors("opening the memories table", self.path):
                self._connect(lancedb, cache_bytes)
        except BaseException:  # a table that cannot be opened leaves the folder free for another try
            if self._lock is not None:
                self._lock.release()
            raise

    def _connect(self, lancedb: Any, cache_bytes: int) -> None:
        if self.read_only:  # nothing is created, no lock is taken, and every read sees the latest version
            missing = ConfigError(
                "STATEKEEP_MEMORY_URL", str(self.path), "no memories there (nothing was created)"
            )
            if not (self.path / f"{TABLE}.lance").is_dir():  # before connecting, which makes the folder
                raise missing
            self._db = lancedb.connect(str(self.path), read_consistency_interval=timedelta(0))
            if TABLE not in self._db.list_tables().tables:
                raise missing
            self._table: Any = self._db.open_table(TABLE)
            if "seq" not in self._table.schema.names:
                raise ConfigError(
                    "STATEKEEP_MEMORY_URL",
                    str(self.path),
                    "written by an older statekeep: open it for writing once",
                )
        else:
            try:
                self.path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(
                    "STATEKEEP_MEMORY_URL", str(self.path), f"cannot create folder: {exc.strerror}"
                ) from exc
            self._lock = FolderLock(self.path)
            self._db = lancedb.connect(str(self.path))
            self._table = self._open_table()
        # a writer is the only writer (the folder lock), so its in-process caches stay true
        self._owner_rows: dict[str, int] = {}
        self._cache = OwnerCache(cache_bytes)
        self._read_version: int | None = None
        self._dim: int | None = None
        self._indexed = self._has_vector_index()
        self._next_seq = 0 if self.read_only else self._max_seq() + 1

    def _open_table(self) -> Any:
        if TABLE not in self._db.list_tables().tables:
            return self._db.create_table(TABLE, schema=schema(self.embedder.dimension))
        table = self._db.open_table(TABLE)
        if "seq" not in table.schema.names:
            table = upgrade(self._db, TABLE, table)
        if SENTENCES not in table.schema.names:
            add_sentences(table)
            table = self._db.open_table(TABLE)
        # before any erasure can run: erasure rebuilds no segment of that index, a stale one keeps tokens
        if drop_old_text_index(table):
            table = self._db.open_table(TABLE)
        return table

    def _reopen(self) -> None:
        """Open the table again at its latest version."""
        self._table = self._db.open_table(TABLE)

    def _max_seq(self) -> int:
        import pyarrow.compute as pc

        if not self._table.count_rows():
            return 0
        return int(pc.max(self._table.to_lance().to_table(columns=["seq"]).column("seq")).as_py() or 0)

    @property
    def _dimension(self) -> int:
        if self._dim is None or self.read_only:  # a writer knows when it changes (_resize)
            self._dim = int(self._table.schema.field("vector").type.list_size)
        return self._dim

    @one_at_a_time("closing")
    def close(self) -> None:
        """Release the folder lock."""
        if self._lock is not None:
            self._lock.release()

    def _writable(self) -> None:
        if self.read_only:
            raise InvalidInputError("this memory store was opened read-only", field="read_only")

    # --- writes ---------------------------------------------------------------------------

    @one_at_a_time("storing memories")
    def _insert(self, memories: list[Memory], vectors: Vectors, parts: Parts | None = None) -> list[Memory]:
        self._writable()
        if self._dimension != vectors.shape[1]:
            self._resize(vectors.shape[1])
        # the folder lock makes this store the only writer: its counter is the table's order
        memories = [replace(m, seq=self._next_seq + i) for i, m in enumerate(memories)]
        owner = memories[0].owner
        self._table.add(arrow_rows(memories, vectors, vectors.shape[1], parts))
        self._cache.update(owner, lambda rows: rows.extended(memories, vectors, parts))
        self._next_seq += len(memories)
        if owner in self._owner_rows:
            self._owner_rows[owner] += len(memories)
        return memories

    @one_at_a_time("looking up memories")
    def _same(self, owner: str, identities: list[str], now: datetime) -> dict[str, Memory]:
        found: dict[str, Memory] = {}
        alive = f"superseded_by IS NULL AND (expires_us IS NULL OR expires_us > {to_us(now)})"
        for start in range(0, len(identities), 1000):
            chunk = in_list("dedupe_key", identities[start : start + 1000])
            clause = f"{where(owner)} AND {alive} AND {chunk}"
            for row in sorted(self._rows(clause, [*COLUMNS]), key=lambda r: int(r["seq"])):
                found.setdefault(row["dedupe_key"], from_row(row))
        return found

    @one_at_a_time("marking a memory superseded")
    def _mark_superseded(self, owner: str, memory_id: str, successor: str) -> None:
        self._writable()
        self._table.update(where=where(owner, id=memory_id), values={"superseded_by": successor})
        self._cache.update(owner, lambda rows: rows.superseding(memory_id, successor))

    @one_at_a_time("optimizing")
    def _optimize(self, full: bool) -> None:
        """Lay the memories out by owner in small files and index them by owner.

        It lays out what was written since its last run: those rows grouped by owner
        in new files of at most 512 rows, indexed in new segments of the owner
        index; files where an update or an erasure deleted rows are rewritten one
        at a time. Every other file is left as it was, so its cost
        follows the writes, not the table (when four small index segments have
        gathered, their files are laid out again with the new rows). A table never
        laid out (written by an older statekeep, or holding a vector index, which it
        drops: vector search is exact) is rewritten whole. Then erasing an owner
        rewrites only the files that hold its rows and their index segments.

        ``full``: rewrite the whole table even when it is laid out, so that each owner's
        rows, spread over the files of many runs, are together again.
        """
        self._writable()
        dataset = self._table.to_lance()
        version = dataset.version
        if dataset.count_rows():
            done = None if full else lay_out_new(dataset)
            dataset = done or index_segments(lay_out(dataset))
        if dataset.version != version:
            # now, not days later: an erasure would otherwise pay for deleting the old files; unverified
            # files too (the index segments built before their merge): this store is the only writer
            dataset.cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
        self._reopen()
        self._indexed = self._has_vector_index()

    # --- reads ----------------------------------------------------------------------------

    def _has_vector_index(self) -> bool:
        return any(ix.name == "vector_idx" for ix in self._table.list_indices())

    def _rows_of(self, owner: str) -> int:
        if self.read_only or owner not in self._owner_rows:  # another process writes: never cached
            self._owner_rows[owner] = int(self._table.count_rows(where(owner)))
        return self._owner_rows[owner]

    def _vector_query(self, vectors: Any, owner: str, clause: str, k: int, columns: list[str]) -> Any:
        query = self._table.search(vectors, vector_column_name="vector").distance_type("cosine")
        query = query.where(clause, prefilter=True).select(columns).limit(k)
        if not self._indexed:
            return query
        if self._rows_of(owner) <= self.exact_below:  # a selective filter: exact, never too few
            return query.bypass_vector_index()
        return query.nprobes(self.nprobes).refine_factor(4)

    @one_at_a_time("searching memories")
    def _nearest(
        self, owner: str, vector: Vectors, k: int, filters: Filters, now: datetime
    ) -> list[SearchResult]:
        if self._dimension != vector.shape[0]:
            return []  # no vector of this model can be stored yet
        if self.read_only and narrows(filters):  # else _held looks
            self._latest()
        held = None if narrows(filters) else self._held(owner)
        if held is not None:
            return nearest(
                held.memories, held.matrix, vector, k, held.current(filters, now, self.embedder.name)
            )
        clause = where(owner, filters, now, model=self.embedder.name)

        def fetch(n: int) -> list[SearchResult]:
            # ranked on the vector and filter columns alone; the other columns only for the hits
            ranked = self._vector_query(vector, owner, clause, n, ["_distance"]).with_row_id(True).to_arrow()
            ids = ranked.column("_rowid").to_pylist()
            if not ids:
                return []
            rows = self._table.take_row_ids(ids).select(list(COLUMNS)).with_row_id().to_arrow()
            by_id = dict(
                zip(rows.column("_rowid").to_pylist(), rows.drop_columns(["_rowid"]).to_pylist(), strict=True)
            )
            scores = ranked.column("_distance").to_pylist()
            return [
                SearchResult(from_row(by_id[i]), 1.0 - float(d)) for i, d in zip(ids, scores, strict=True)
            ]

        return top_k(fetch, k)

    def _latest(self) -> Any:
        """A reader: the table's latest version, letting go of every owner held when it has moved."""
        dataset = self._table.to_lance()
        if dataset.version != self._read_version:  # another process committed
            self._cache.drop()
            self._read_version = dataset.version
        return dataset

    def _held(self, owner: str) -> OwnerRows | None:
        """The owner's rows from the cache, read into it first when they fit; None when they do not."""
        if self.read_only:
            self._latest()
        held = self._cache.get(owner)
        if held is not None or not self._cache.fits(owner, self._rows_of(owner), self._dimension):
            return held
        generation = self._cache.generation
        columns = [*COLUMNS, "vector", *self._sentence_column()]
        table = self._table.to_lance().to_table(columns=columns, filter=where(owner))
        held = owner_rows(table, self._dimension)
        self._cache.put(owner, held, generation)
        return held

    def _sentence_column(self) -> list[str]:
        """The sentence column, if the table has it (a reader of an older statekeep's table: not)."""
        return [SENTENCES] if SENTENCES in self._table.schema.names else []

    @one_at_a_time("searching memories")
    def _vectors_of(self, owner: str, ids: list[str]) -> dict[str, tuple[Vectors, Vectors | None]]:
        model = self.embedder.name
        held = self._held(owner)
        if held is not None:
            rows = held.rows_of(ids)
            return {
                i: (held.matrix[n], held.sentences.get(i)) for i, n in rows.items() if held.models[n] == model
            }
        if not ids:
            return {}
        clause = f"{where(owner)} AND model = {quote(model)} AND {in_list('id', ids)}"
        columns = ["id", "vector", *self._sentence_column()]
        found = self._table.to_lance().to_table(columns=columns, filter=clause)
        dimension = self._dimension
        out: dict[str, tuple[Vectors, Vectors | None]] = {}
        for row in found.to_pylist():
            parts = sentence_vectors(row.get(SENTENCES), dimension)
            out[row["id"]] = (np.asarray(row["vector"], dtype=np.float32), parts)
        return out

    @one_at_a_time("looking for similar memories")
    def _nearest_each(self, owner: str, vectors: Vectors, now: datetime) -> list[SearchResult | None]:
        if self._dimension != vectors.shape[1]:
            return [None] * len(vectors)
        clause = where(owner, None, now, model=self.embedder.name)
        rows = self._vector_query(list(vectors), owner, clause, 1, [*COLUMNS, "_distance"]).to_list()
        found: list[SearchResult | None] = [None] * len(vectors)
        for r in rows:
            found[int(r.get("query_index", 0))] = SearchResult(from_row(r), 1.0 - float(r["_distance"]))
        return found

    @one_at_a_time("searching memories")
    def _first_writes(self, owner: str, sessions: list[str]) -> dict[str, int]:
        held = self._held(owner)
        if held is not None:
            return held.first_seq  # every session's: the ones not asked about are never looked up
        rows = self._rows(f"{where(owner)} AND {in_list('session_id', sessions)}", ["session_id", "seq"])
        return first_writes((r["session_id"], r["seq"]) for r in rows)

    @one_at_a_time("searching memories")
    def _text(self, owner: str, query: str, k: int, filters: Filters, now: datetime) -> list[SearchResult]:
        """BM25 with the statistics of the memories searched (see :mod:`._bm25`), not the whole index's.

        The owner's memories held in process keep their words indexed; otherwise (a
        read-only store, an owner too big to hold) the memories the search may return
        are read and their words counted for this search alone.
        """
        held = self._held(owner)
        if held is not None:
            searchable = held.searchable(filters, now)
            return ranked(held.text_index(), held.memories, query, searchable, k)
        memories = [from_row(r) for r in self._rows(where(owner, filters, now), list(COLUMNS))]
        everything = np.ones(len(memories), dtype=bool)
        return ranked(TextIndex(m.content for m in memories), memories, query, everything, k)

    def _rows(self, clause: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
        """The rows ``clause`` selects, all read from one version of the table.

        (Not a count, then a search limited to it: another process's commit could
        fall between them and cut rows off.)
        """
        rows: list[dict[str, Any]] = (
            self._table.to_lance().to_table(columns=columns, filter=clause).to_pylist()
        )
        return rows

    @one_at_a_time("reading a memory")
    def _get(self, owner: str, memory_id: str, now: datetime) -> Memory | None:
        clause = f"{where(owner, id=memory_id)} AND (expires_us IS NULL OR expires_us > {to_us(now)})"
        rows = self._rows(clause)
        return from_row(rows[0]) if rows else None

    @one_at_a_time("listing memories")
    def _list(self, owner: str, now: datetime) -> list[Memory]:
        clause = f"{where(owner)} AND (expires_us IS NULL OR expires_us > {to_us(now)})"
        return [from_row(r) for r in self._rows(clause, list(COLUMNS))]

    # --- erasure --------------------------------------------------------------------------

    @one_at_a_time("erasing memories")
    def _erase(self, owner: str, ids: list[str] | None) -> tuple[list[str], list[str], list[str]]:
        self._writable()
        clause = where(owner) if ids is None else f"{where(owner)} AND {in_list('id', ids)}"
        dataset = self._dataset()
        removed = dataset.to_table(columns=["id"], filter=clause).column("id").to_pylist()
        self._cache.drop(owner)
        if removed:
            dataset.delete(clause)
        self._rewrite(owner, dataset)  # always: it also finishes an erasure that stopped after its delete
        return removed, self._locations(), list(NOT_REACHED)

    def _dataset(self) -> Any:
        """The table as a Lance dataset of its own, without the table's index cache (an erasure is
        faster so: docs/memory.md, backends); :meth:`_rewrite` reopens the table after writing through it."""
        import lance

        return lance.dataset(str(self.path / f"{TABLE}.lance"))

    def _locations(self) -> list[str]:
        root = self.path / f"{TABLE}.lance"
        return [
            f"{root / 'data'}: every data file that held a deleted row was rewritten",
            f"{root / '_indices'}: the owner index segments of those files remapped past the deleted rows",
            f"{root / '_versions'}: every older version deleted",
        ]

    def _rewrite(self, owner: str, dataset: Any = None) -> None:
        """Rewrite the files holding deleted rows (remapping their index segments), drop every old version."""
        step = "compaction"
        try:
            dataset = self._dataset() if dataset is None else dataset
            erase(dataset)
            step = "cleanup of old versions"
            dataset.cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
        except (OSError, RuntimeError, ValueError) as exc:
            raise ErasureError(owner, step, str(exc)) from exc
        finally:  # the table object does not see versions written through the dataset
            self._reopen()
            self._owner_rows.clear()
        self._indexed = self._indexed and self._has_vector_index()  # a rewrite never adds one

    @one_at_a_time("erasing expired memories")
    def _purge(self, now: datetime) -> int:
        self._writable()
        clause = f"expires_us IS NOT NULL AND expires_us <= {to_us(now)}"
        count = int(self._table.count_rows(clause))
        if count:
            self._cache.drop()
            self._table.delete(clause)
            self._rewrite("(expired)")
        return count

    # --- re-embedding ---------------------------------------------------------------------

    @one_at_a_time("counting memories to re-embed")
    def _count_stale(self, model: str) -> int:
        return int(self._table.count_rows(f"model != {quote(model)}"))

    @one_at_a_time("reading memories to re-embed")
    def _stale(self, model: str, limit: int) -> list[tuple[str, str, str]]:
        q = self._table.search().where(f"model != {quote(model)}").select(["owner", "id", "content"])
        return [(r["owner"], r["id"], r["content"]) for r in q.limit(limit).to_list()]

    @one_at_a_time("storing re-embedded vectors")
    def _set_vectors(
        self, model: str, rows: list[tuple[str, str, str]], vectors: Vectors, parts: Parts | None = None
    ) -> None:
        self._writable()
        self._cache.drop()
        if self._dimension != vectors.shape[1]:
            self._resize(vectors.shape[1])
        by_key = {key: i for i, key in enumerate(rows)}
        found = [from_row(r) for r in self._rows_still(rows, "true", list(COLUMNS))]
        if not found:
            return
        updated = [Memory(**{**_fields(m), "model": model}) for m in found]
        order = [by_key[(m.owner, m.id, m.content)] for m in found]
        stacked = vectors[order]
        batch = arrow_rows(updated, stacked, vectors.shape[1], take(parts, order))
        self._table.merge_insert(["owner", "id"]).when_matched_update_all().execute(batch)

    def _unsplit_clause(self, model: str, most_chars: int) -> str:
        return f"model = {quote(model)} AND sentences IS NULL AND char_length(content) <= {int(most_chars)}"

    @one_at_a_time("counting memories to split into sentences")
    def _count_unsplit(self, model: str, most_chars: int) -> int:
        self._writable()  # before anything is embedded
        return int(self._table.count_rows(self._unsplit_clause(model, most_chars)))

    @one_at_a_time("reading memories to split into sentences")
    def _unsplit(self, model: str, most_chars: int, limit: int) -> list[tuple[str, str, str]]:
        found = self._table.search().where(self._unsplit_clause(model, most_chars))
        rows = found.select(["owner", "id", "content"]).limit(limit).to_list()
        return [(r["owner"], r["id"], r["content"]) for r in rows]

    @one_at_a_time("storing sentence vectors")
    def _set_sentences(
        self, model: str, rows: list[tuple[str, str, str]], parts: list[Vectors]
    ) -> set[tuple[str, str]]:
        self._writable()
        self._cache.drop()
        by_key = {key: n for n, key in enumerate(rows)}
        unsplit = f"model = {quote(model)} AND sentences IS NULL"
        found = self._rows_still(rows, unsplit, [*COLUMNS, "vector"])
        if not found:
            return set()
        memories = [from_row(r) for r in found]
        vectors = np.asarray([r["vector"] for r in found], dtype=np.float32)
        cells: Parts = [parts[by_key[(m.owner, m.id, m.content)]] for m in memories]
        batch = arrow_rows(memories, vectors, vectors.shape[1], cells)
        self._table.merge_insert(["owner", "id"]).when_matched_update_all().execute(batch)
        return {(m.owner, m.id) for m in memories}

    def _rows_still(
        self, rows: list[tuple[str, str, str]], clause: str, columns: list[str]
    ) -> list[dict[str, Any]]:
        """The rows named by (owner, id, content) that ``clause`` selects and still hold that content.

        Ids are unique per owner only: each row is found by its owner and id, and it must still
        hold the text embedded (not be another memory under a forgotten one's id).
        """
        ids: dict[str, list[str]] = {}
        for owner, mid, _ in rows:
            ids.setdefault(owner, []).append(mid)
        mine = " OR ".join(f"({where(owner)} AND {in_list('id', mids)})" for owner, mids in ids.items())
        wanted = set(rows)
        return [
            r
            for r in self._rows(f"({mine}) AND {clause}", columns)
            if (r["owner"], r["id"], r["content"]) in wanted
        ]

    def _resize(self, dimension: int) -> None:
        """Rewrite the table for vectors of another length; every memory becomes stale ('' model)."""
        rows = [from_row(r) for r in self._rows("true", list(COLUMNS))]
        stale = [Memory(**{**_fields(m), "model": ""}) for m in rows]
        data = arrow_rows(stale, np.zeros((len(stale), dimension), dtype=np.float32), dimension)
        self._table = self._db.create_table(TABLE, data=data, schema=schema(dimension), mode="overwrite")
        self._cache.drop()
        self._dim = dimension
        self._indexed = False
        self._table.to_lance().cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)


def _fields(memory: Memory) -> dict[str, Any]:
    return {name: getattr(memory, name) for name in Memory.__dataclass_fields__}
