"""What rewrites the LanceDB memories table: erasure, and storing vectors of another model.

Part of :class:`~statekeep.memory.lancedb.LanceDBMemoryStore` (:class:`Rewrites`), which
sets the fields. Erasure deletes the rows, then rewrites each data file that held one
and deletes every old version (:mod:`statekeep.memory.lancedb._layout`); re-embedding
merges the new vectors in by (owner, id), or rewrites the table for vectors of another
length.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from statekeep.errors import ErasureError
from statekeep.memory._rows import COLUMNS, from_row, to_us
from statekeep.memory._types import Memory
from statekeep.memory.embedders import Vectors
from statekeep.memory.lancedb._layout import arrow_rows, erase, schema
from statekeep.memory.lancedb._lock import one_at_a_time
from statekeep.memory.lancedb._owner_cache import OwnerCache
from statekeep.memory.lancedb._sql import in_list, quote, where
from statekeep.memory.recall._sentences import Parts, take

TABLE = "memories"
NOT_REACHED = ("copies of the folder made outside statekeep (backups, snapshots, synced or copied folders)",)


class Rewrites:
    """Erasure and re-embedding of the LanceDB store (which sets the fields and the methods below)."""

    path: Path
    read_only: bool
    _write_lock: Any
    _db: Any
    _table: Any
    _cache: OwnerCache
    _owner_rows: dict[str, int]
    _indexed: bool
    _dim: int | None

    @property
    def _dimension(self) -> int:
        raise NotImplementedError

    def _writable(self) -> None:
        raise NotImplementedError

    def _reopen(self) -> None:
        raise NotImplementedError

    def _has_vector_index(self) -> bool:
        raise NotImplementedError

    def _rows(self, clause: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
        raise NotImplementedError

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
