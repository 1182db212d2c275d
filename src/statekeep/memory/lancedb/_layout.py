"""The LanceDB memories table: its schema, and the layout that makes erasure follow the owner, not the table.

``optimize`` writes the rows grouped by owner into data files of at most
:data:`FRAGMENT_ROWS` rows (whole owners packed together; an owner bigger than
that gets files of its own), and builds the owner index in segments of
:data:`SEGMENT_FILES` consecutive files. Erasing then deletes the rows and
rewrites only the data files that have deleted rows, one at a time: Lance remaps
just the index segments that cover those files (dropping the erased rows). A
file whose rows were all deleted is gone without a rewrite, but the segments
that covered it still hold its rows: those segments are rebuilt over the files
they still cover. Every other file, data or index, is left untouched.

Once the table is laid out, ``optimize`` lays out only what changed since
(:func:`lay_out_new`): the files no owner index segment covers (each write adds
one) are replaced by files of their rows grouped by owner, indexed in new
segments, and the laid-out files with deleted rows (updates) are rewritten as an
erasure rewrites them. Each pass leaves at most one small segment (its last
group of files); when :data:`SMALL_SEGMENTS` have gathered, their files are laid
out again with the new rows, so the number of segments stays near the table's
rows over ``SEGMENT_FILES * FRAGMENT_ROWS`` at a bounded cost per pass. No
search depends on how the files are grouped into segments (full-text search is
BM25 computed in process over the owner's memories, :mod:`._bm25`), so an
incremental layout searches exactly as a full one.

There is no full-text index: LanceDB's ranks with the statistics of the whole
table (every owner's words), and it would be one more copy of every memory's
tokens for erasure to clean. A table of an older statekeep that has one
(:data:`OLD_TEXT`) has it dropped when a writer opens it (:func:`drop_old_text_index`).
There is no vector (ANN) index: remapping one costs about as much as the rest
of an erasure for each file it covers, and an ANN index segment per file was
slower to search than an exact scan of the owner's rows, which this layout
keeps together (the writer's owner cache is faster still).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np

from statekeep.memory._dedupe import identity
from statekeep.memory._rows import COLUMNS, to_row
from statekeep.memory._types import Memory
from statekeep.memory.embedders import Vectors
from statekeep.memory.recall._sentences import Parts

#: The memories table of the folder.
TABLE = "memories"
#: The most rows a data file holds after ``optimize``.
FRAGMENT_ROWS = 512
#: The most data files an owner index segment covers.
SEGMENT_FILES = 8
OWNER = "owner_idx"
#: The full-text index of older statekeep versions (dropped by :func:`drop_old_text_index`).
OLD_TEXT = "content_idx"
#: The column of each memory's sentence vectors.
SENTENCES = "sentences"
#: Each index ``optimize`` builds: its column and Lance index type.
INDEXES = {OWNER: ("owner", "BTREE")}
#: An owner index segment over fewer rows is small: a layout leaves at most one (its last group).
SMALL_ROWS = SEGMENT_FILES * FRAGMENT_ROWS // 2
#: When this many small segments have gathered, ``optimize`` lays their files out again.
SMALL_SEGMENTS = 4


def schema(dimension: int) -> Any:
    """The Arrow schema of the memories table, vectors of ``dimension`` floats."""
    import pyarrow as pa

    text = pa.string()
    return pa.schema(
        [
            ("id", text),
            ("owner", text),
            ("content", text),
            ("kind", text),
            ("tags", pa.list_(text)),
            ("metadata", text),
            ("source", text),
            ("session_id", text),
            ("run_id", text),
            ("event_id", text),
            ("trust", pa.float64()),
            ("model", text),
            ("created_us", pa.int64()),
            ("expires_us", pa.int64()),
            ("superseded_by", text),
            ("duplicate_of", text),
            ("key", text),
            ("dedupe_key", text),
            ("duplicate_score", pa.float64()),
            ("seq", pa.int64()),
            ("vector", pa.list_(pa.float32(), dimension)),
            # a memory's sentence vectors (:mod:`._sentences`) one after the other, or null
            (SENTENCES, pa.list_(pa.float32())),
        ]
    )


def add_sentences(table: Any) -> None:
    """Give a table of an older statekeep the sentence column (null for every memory it holds)."""
    import pyarrow as pa

    table.add_columns(pa.field(SENTENCES, pa.list_(pa.float32())))


def sentence_vectors(flat: Any, dimension: int) -> Vectors | None:
    """A memory's sentence vectors from its ``sentences`` cell (a list of floats or null)."""
    if flat is None or not len(flat):
        return None
    return np.asarray(flat, dtype=np.float32).reshape(-1, dimension)


def drop_old_text_index(table: Any) -> bool:
    """Drop the full-text index of an older statekeep and every old version (its files); True if it had one.

    Only a writer may (the folder lock makes it the only one): erasure rebuilds no
    segment of that index, so a stale one would keep an erased owner's tokens.
    """
    if OLD_TEXT not in {index.name for index in table.list_indices()}:
        return False
    table.drop_index(OLD_TEXT)
    table.to_lance().cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
    return True


def upgrade(db: Any, name: str, table: Any) -> Any:
    """Rewrite a table of an older statekeep with the columns of deduplication and ranking.

    Each memory gets its identity (from its text), and a ``seq`` in the order it
    was written (creation time, then id); ``optimize`` builds the owner index again.
    """
    import pyarrow as pa

    old = table.to_arrow()
    created, ids, contents = (old.column(c).to_pylist() for c in ("created_us", "id", "content"))
    seq = [0] * old.num_rows
    for rank, i in enumerate(sorted(range(old.num_rows), key=lambda i: (created[i], ids[i])), start=1):
        seq[i] = rank
    dimension = int(old.schema.field("vector").type.list_size)
    into = schema(dimension)
    added = {
        "key": pa.nulls(old.num_rows, pa.string()),
        "dedupe_key": pa.array([identity(c, None) for c in contents], pa.string()),
        "duplicate_score": pa.nulls(old.num_rows, pa.float64()),
        "seq": pa.array(seq, pa.int64()),
        SENTENCES: pa.nulls(old.num_rows, pa.list_(pa.float32())),
    }
    data = pa.table({n: added[n] if n in added else old.column(n) for n in into.names}, schema=into)
    table = db.create_table(name, data=data, schema=into, mode="overwrite")
    table.to_lance().cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
    return table


def arrow_rows(memories: list[Memory], vectors: Vectors, dimension: int, parts: Parts | None = None) -> Any:
    """These memories, their vectors and sentence vectors as an Arrow table of the memories table's schema."""
    import pyarrow as pa

    rows = [to_row(m) for m in memories]
    columns = {c: [r[c] for r in rows] for c in COLUMNS}
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
    columns["vector"] = pa.FixedSizeListArray.from_arrays(flat, dimension)
    cells = [None if p is None else np.asarray(p, dtype=np.float32).reshape(-1) for p in parts or ()]
    columns[SENTENCES] = pa.array(cells or [None] * len(rows), pa.list_(pa.float32()))
    return pa.table(columns, schema=schema(dimension))


def packed(owners: list[str], size: int = FRAGMENT_ROWS) -> list[tuple[int, int]]:
    """(start, stop) of each data file over rows sorted by owner: whole owners packed up to ``size`` rows.

    An owner that does not fit beside the rows already in a file starts the next
    one; an owner bigger than ``size`` fills files of its own (its last rows may
    share a file with the owners after it).

    Examples:
        >>> packed(["a", "a", "b", "c", "c", "c"], size=3)
        [(0, 3), (3, 6)]
        >>> packed(["a"] * 7 + ["b"], size=3)
        [(0, 3), (3, 6), (6, 8)]
    """
    chunks, start, i = [], 0, 0
    while i < len(owners):
        j = i
        while j < len(owners) and owners[j] == owners[i]:
            j += 1
        if j - start > size and i > start:  # the owner does not fit beside what the file holds
            chunks.append((start, i))
            start = i
        while j - start > size:  # a big owner: full files of its own
            chunks.append((start, start + size))
            start += size
        i = j
    if start < len(owners):
        chunks.append((start, len(owners)))
    return chunks


def lay_out(dataset: Any) -> Any:
    """Rewrite the table grouped by owner (then write order) into bounded data files; return the new version.

    Indexes are not carried over: build them with :func:`index_segments`.
    """
    import lance

    data = dataset.to_table()
    operation = lance.LanceOperation.Overwrite(data.schema, _written(dataset, data))
    return lance.LanceDataset.commit(dataset, operation, read_version=dataset.version)


def _written(dataset: Any, data: Any) -> list[Any]:
    """New, uncommitted data files of ``dataset`` holding these rows grouped by owner (then write order)."""
    from lance.fragment import write_fragments

    data = data.sort_by([("owner", "ascending"), ("seq", "ascending")])
    fragments = []
    for start, stop in packed(data.column("owner").to_pylist()):
        fragments.extend(
            write_fragments(
                data.slice(start, stop - start),
                dataset,
                schema=data.schema,
                max_rows_per_file=FRAGMENT_ROWS,
                data_storage_version=dataset.data_storage_version,
            )
        )
    return fragments


def lay_out_new(dataset: Any) -> Any | None:
    """Lay out only what changed since the table was laid out; return the new version, or None.

    None (nothing written) when the table is not laid out by ``optimize``
    (:func:`_laid_out_indexes`): lay it out whole. Otherwise the laid-out files
    with deleted rows are rewritten one at a time and the stale index segments
    rebuilt (:func:`erase`); the rows of the files no index segment covers (the
    writes since) are grouped by owner into new files, indexed in new segments
    added to the owner index. Every other data and index file is
    left untouched, except that when :data:`SMALL_SEGMENTS` small segments (each
    pass leaves at most one) have gathered, their files are laid out again with
    the new rows, so that writes in small batches do not pile up segments.
    """
    indexes = _laid_out_indexes(dataset)
    if indexes is None:
        return None
    covered = _covered(indexes[OWNER])
    if any(
        f.fragment_id in covered and f.metadata.physical_rows > FRAGMENT_ROWS for f in dataset.get_fragments()
    ):
        return None  # an older statekeep's bigger files
    rewrite_deleted(dataset, covered)
    rebuild_stale(dataset)
    return _lay_out_uncovered(dataset)


def _laid_out_indexes(dataset: Any) -> dict[str, Any] | None:
    """The owner index of a table laid out by ``optimize``, by name; None when it is not.

    Laid out: just that index, its segments over groups of at most
    :data:`SEGMENT_FILES` files, at least one file covered.
    """
    indexes = {index.name: index for index in dataset.describe_indices()}
    if set(indexes) != set(INDEXES):  # no index yet, or a vector or text index of an older statekeep
        return None
    if not _covered(indexes[OWNER]):
        return None
    return None if any(len(s.fragment_ids) > SEGMENT_FILES for s in indexes[OWNER].segments) else indexes


def _covered(index: Any) -> set[int]:
    return {i for segment in index.segments for i in segment.fragment_ids}


def _lay_out_uncovered(dataset: Any) -> Any:
    """Lay out the files no index segment covers (and the small segments' files when enough have gathered)."""
    from lance import LanceDataset, LanceOperation

    indexes = {index.name: index for index in dataset.describe_indices()}
    live = {f.fragment_id: f for f in dataset.get_fragments()}
    rows = {i: live[i].metadata.physical_rows for i in live}
    small = [s for s in indexes[OWNER].segments if sum(rows.get(i, 0) for i in s.fragment_ids) < SMALL_ROWS]
    merged = small if len(small) >= SMALL_SEGMENTS else []
    files = [i for i in live if i not in _covered(indexes[OWNER])]
    files += [i for s in merged for i in s.fragment_ids if i in live]
    if not files:
        return dataset
    data = dataset.scanner(fragments=[live[i] for i in files]).to_table()
    replaced = LanceOperation.Update(removed_fragment_ids=files, new_fragments=_written(dataset, data))
    dataset = LanceDataset.commit(dataset, replaced, read_version=dataset.version)
    added = [f.fragment_id for f in dataset.get_fragments() if f.fragment_id not in live]
    groups = [added[i : i + SEGMENT_FILES] for i in range(0, len(added), SEGMENT_FILES)]
    built = [_built(dataset, name, group) for name in INDEXES for group in groups]
    gone = [set(s.fragment_ids) for s in merged]
    removed = [
        _entry(index, s) for index in indexes.values() for s in index.segments if set(s.fragment_ids) in gone
    ]
    indexed = LanceOperation.CreateIndex(new_indices=built, removed_indices=removed)
    return LanceDataset.commit(dataset, indexed, read_version=dataset.version)


def index_segments(dataset: Any) -> Any:
    """Build the owner index in segments of a few data files; return the new version.

    An index already present is rebuilt.
    """
    files = [f.fragment_id for f in dataset.get_fragments()]
    groups = [files[i : i + SEGMENT_FILES] for i in range(0, len(files), SEGMENT_FILES)]
    for name, (column, _) in INDEXES.items():
        if groups:
            segments = [_segment(dataset, name, group) for group in groups]
            dataset = dataset.commit_existing_index_segments(name, column, segments)
    return dataset


def _segment(dataset: Any, name: str, fragment_ids: list[int]) -> Any:
    """One uncommitted segment of index ``name`` over these data files."""
    column, kind = INDEXES[name]
    return dataset.create_index_uncommitted(column, kind, name=name, replace=True, fragment_ids=fragment_ids)


def erase(dataset: Any) -> None:
    """Leave no deleted row in any data or index file of the current version (old versions are not touched).

    Rewrites each data file with deleted rows (:func:`rewrite_deleted`), then
    rebuilds each index segment that still covers a file deleted whole
    (:func:`rebuild_stale`).
    """
    rewrite_deleted(dataset)
    rebuild_stale(dataset)


def rewrite_deleted(dataset: Any, among: set[int] | None = None) -> int:
    """Rewrite, one at a time, every data file with deleted rows (of ``among``, when given); return how many.

    Each compaction excludes every other file, so it merges nothing and Lance
    remaps only the index segments over the rewritten file, dropping the deleted
    rows from them (a file whose rows were all deleted is already gone: see
    :func:`rebuild_stale`).
    """
    pending = [
        f.fragment_id
        for f in dataset.get_fragments()
        if f.metadata.deletion_file is not None and (among is None or f.fragment_id in among)
    ]
    for fragment in pending:
        others = [f.fragment_id for f in dataset.get_fragments() if f.fragment_id != fragment]
        dataset.optimize.compact_files(materialize_deletions_threshold=0.0, excluded_fragment_ids=others)
        dataset.checkout_latest()
    return len(pending)


def rebuild_stale(dataset: Any) -> int:
    """Rebuild every index segment that covers a data file no longer in the table; return how many.

    Lance drops a data file whose rows are all deleted without rewriting the
    index segments that cover it, which still hold those rows (their row ids, their
    owner). Each such segment is replaced by one built over the files it still
    covers (or just removed when it covers none), in one commit.
    """
    from lance import LanceDataset, LanceOperation

    live = {f.fragment_id for f in dataset.get_fragments()}
    built, removed = [], []
    for index in dataset.describe_indices():
        for segment in index.segments if index.name in INDEXES else []:
            covered = set(segment.fragment_ids)
            if covered <= live:
                continue
            removed.append(_entry(index, segment))
            if covered & live:
                built.append(_built(dataset, index.name, sorted(covered & live)))
    if removed:
        operation = LanceOperation.CreateIndex(new_indices=built, removed_indices=removed)
        LanceDataset.commit(dataset, operation, read_version=dataset.version)
        dataset.checkout_latest()
    return len(removed)


def _built(dataset: Any, name: str, fragment_ids: list[int]) -> Any:
    """One segment of index ``name`` over these data files, ready for a ``CreateIndex`` commit."""
    # "merged" alone: its files laid out as a committed segment's
    return dataset.merge_existing_index_segments([_segment(dataset, name, fragment_ids)])


def _entry(index: Any, segment: Any) -> Any:
    """The manifest entry of one segment of ``index`` (as described), to name it in a commit."""
    from lance.dataset import Index

    return Index(
        uuid=segment.uuid,
        name=index.name,
        fields=list(index.fields),
        dataset_version=segment.dataset_version_at_last_update,
        fragment_ids=segment.fragment_ids,
        index_version=segment.index_version,
    )
