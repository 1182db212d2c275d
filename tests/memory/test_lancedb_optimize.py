"""LanceDB ``optimize`` on a laid-out table lays out what changed since and leaves every other file alone."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from statekeep.errors import InvalidInputError
from statekeep.memory import FakeEmbedder, SentenceTransformerEmbedder
from statekeep.memory.lancedb import LanceDBMemoryStore
from statekeep.memory.lancedb._layout import FRAGMENT_ROWS, SEGMENT_FILES, SMALL_ROWS, SMALL_SEGMENTS
from tests.memory.test_lancedb import _digests, files_with


def _laid_out_table(folder: Path) -> LanceDBMemoryStore:
    """3,000 memories of five owners, optimized: ten files and two segments of the owner index."""
    store = LanceDBMemoryStore(folder, FakeEmbedder())
    for owner in ("ann", "bob", "cid", "dee", "fay"):
        store.remember_many(owner, [f"{owner}'s note number {i} about gardening." for i in range(600)])
    store.optimize()
    return store


def _segments(store: LanceDBMemoryStore) -> dict[str, list[frozenset[int]]]:
    """Each index's segments, as the sets of data files they cover."""
    return {
        ix.name: [frozenset(s.fragment_ids) for s in ix.segments]
        for ix in store._table.to_lance().describe_indices()
    }


def _files(store: LanceDBMemoryStore) -> dict[int, list[str]]:
    """The owner of each row of each data file, by file id."""
    return {
        f.fragment_id: f.to_table(columns=["owner"]).column("owner").to_pylist()
        for f in store._table.to_lance().get_fragments()
    }


def test_optimize_after_more_writes_leaves_every_laid_out_file_untouched(tmp_path: Path) -> None:
    """New writes are laid out by owner in new files, indexed in a new segment added to the owner index;
    every data file and index segment of the earlier layout stays byte for byte as it was."""
    folder = tmp_path / "memory"
    store = _laid_out_table(folder)
    before, segments, files = _digests(folder), _segments(store), _files(store)
    marker = f"zq{uuid.uuid4().hex}"
    eve = store.remember("eve", f"Eve's locker code is {marker}.")
    store.remember_many("ann", ["Ann planted tulips.", "Ann bought a greenhouse."])
    store.remember("eve", "Eve waters the ferns on Sundays.")

    store.optimize()

    after, now, laid = _digests(folder), _segments(store), _files(store)
    assert {f: after.get(f) for f in before} == before  # still there, byte-identical
    assert {i: laid[i] for i in files} == files
    new = {i: owners for i, owners in laid.items() if i not in files}
    assert sorted(o for owners in new.values() for o in owners) == ["ann", "ann", "eve", "eve"]
    assert all(owners == sorted(owners) for owners in new.values())  # grouped by owner
    assert len(new) == 1, "four rows fit in one file"
    assert set(now) == {"owner_idx"}  # no other index
    assert set(segments["owner_idx"]) <= set(now["owner_idx"])  # the earlier segments are kept
    added = [s for s in now["owner_idx"] if s not in segments["owner_idx"]]
    assert added == [frozenset(new)]  # and one more covers the new file
    assert [f for f in files_with(folder, marker) if "/data/" in f] == [
        f for f in after if f not in before and "/data/" in f
    ]
    assert [r.memory.content for r in store.search("ann", "tulips", k=1, mode="text")] == [
        "Ann planted tulips."
    ]
    assert [r.memory.id for r in store.search("eve", marker, k=1, mode="text")] == [eve.id]
    assert len(store.list_memories("ann")) == 602
    store.close()


def test_optimize_rewrites_only_a_laid_out_file_an_update_left_a_deleted_row_in(tmp_path: Path) -> None:
    """Superseding a laid-out memory deletes its old row from its file: optimize rewrites that file alone
    (remapping the segments over it) and lays out the new row; other files keep their bytes."""
    folder = tmp_path / "memory"
    store = _laid_out_table(folder)
    old = store.list_memories("cid")[0]
    store.remember("cid", "cid now grows only cacti.")
    store._mark_superseded("cid", old.id, "later")  # an update: the old row deleted, a new one appended
    held = {f.fragment_id for f in store._table.to_lance().get_fragments() if f.metadata.deletion_file}
    assert len(held) == 1
    before, files = _digests(folder), _files(store)

    store.optimize()

    after, laid = _digests(folder), _files(store)
    dataset = store._table.to_lance()
    assert all(f.metadata.deletion_file is None for f in dataset.get_fragments())
    kept = {i: owners for i, owners in files.items() if i not in held and len(owners) > 2}
    assert {i: laid.get(i) for i in kept} == kept
    changed = [f for f in before if after.get(f) != before[f]]
    assert [f for f in changed if "/data/" in f]
    assert len(changed) < len(before) / 2
    covered = {i for s in _segments(store)["owner_idx"] for i in s}
    assert covered == set(laid)  # every file, the rewritten one included, is in a segment
    assert sum(len(o) for o in laid.values()) == 3001  # the update replaced its row
    current = store.list_memories("cid")
    assert [m.superseded_by for m in current if m.id == old.id] == ["later"]
    store.close()


def test_forget_after_an_incremental_optimize_rewrites_only_the_owners_files(tmp_path: Path) -> None:
    """An owner written after the layout lives in the new files: forget replaces that file and its
    segments, and every file of the earlier layout is left byte for byte as it was."""
    folder = tmp_path / "memory"
    store = _laid_out_table(folder)
    marker = f"zq{uuid.uuid4().hex}"
    store.remember("eve", f"Eve's locker code is {marker}.")
    store.remember_many("gus", [f"gus's note {i} about chess." for i in range(40)])
    store.optimize()
    held = [f for f in files_with(folder, marker) if "/data/" in f]
    assert len(held) == 1
    before = _digests(folder)
    eve_files = {i for i, owners in _files(store).items() if "eve" in owners}
    eve_segments = {
        s.uuid
        for ix in store._table.to_lance().describe_indices()
        for s in ix.segments
        if set(s.fragment_ids) & eve_files
    }

    store.forget("eve")

    after = _digests(folder)
    assert files_with(folder, marker) == []
    untouched = {f: d for f, d in before.items() if f not in held and not any(u in f for u in eve_segments)}
    assert len(untouched) > len(before) / 2
    assert {f: after.get(f) for f in untouched} == untouched
    assert len(store.search("gus", "chess", k=50, mode="text")) == 40
    store.close()


def _results(store: LanceDBMemoryStore, queries: list[tuple[str, str]]) -> list[list[tuple[str, float]]]:
    return [
        [(r.memory.id, r.score) for r in store.search(owner, text, k=8, mode=mode)]
        for owner, text in queries
        for mode in ("vector", "text", "hybrid")
    ]


def test_search_after_an_incremental_optimize_equals_search_after_a_full_layout(
    tmp_path: Path, real_embedder: SentenceTransformerEmbedder
) -> None:
    """Vector, text and hybrid search return the same memories with the same scores whether the rows
    written since were laid out on their own or the whole table was laid out again."""
    store = LanceDBMemoryStore(tmp_path / "memory", real_embedder)
    store.remember_many("bob", [f"Bob's note number {i} about gardening and roses." for i in range(300)])
    store.remember_many("ann", [f"Ann's recipe {i}: tomato soup with basil." for i in range(250)])
    store.optimize()
    store.remember_many("bob", ["Bob moved his roses to the greenhouse.", "Bob's dog digs up the garden."])
    store.remember_many("ann", ["Ann grows basil on the balcony.", "Ann's soup won a prize."])
    bees = store.remember("cid", "Cid keeps bees beside the roses.")
    store.optimize()
    assert len(_segments(store)["owner_idx"]) == 2  # the earlier one and one over the new rows
    queries = [("bob", "roses in the greenhouse"), ("ann", "basil soup"), ("cid", "bees"), ("bob", "dog")]
    incremental = _results(store, queries)
    # Cid's one memory, written after the first layout, is found by meaning and by its words
    assert [hits[0][0] for hits in incremental[6:9]] == [bees.id] * 3, "the new rows are found"

    store.optimize(full=True)

    assert len(_segments(store)["owner_idx"]) == 1
    full = _results(store, queries)
    assert [[i for i, _ in hits] for hits in incremental] == [[i for i, _ in hits] for hits in full]
    for inc, whole in zip(incremental, full, strict=True):
        assert [s for _, s in inc] == pytest.approx([s for _, s in whole], rel=1e-5)
    store.close()


def _small_batches(folder: Path) -> LanceDBMemoryStore:
    """A laid-out table, then ten rounds of a few writes each followed by optimize."""
    store = _laid_out_table(folder)
    for round_ in range(10):
        store.remember_many(f"new-{round_ % 3}", [f"round {round_} note {i} about tulips." for i in range(3)])
        store.optimize()
    return store


def test_small_optimizes_do_not_pile_up_index_segments_and_lay_out_alike(tmp_path: Path) -> None:
    """After many optimizes of a few writes each, few small segments remain, every file is covered by
    exactly one segment of the owner index, and the same writes give the same layout in another folder."""
    store = _small_batches(tmp_path / "one")
    dataset = store._table.to_lance()
    rows = {f.fragment_id: f.count_rows() for f in dataset.get_fragments()}
    segments = _segments(store)
    assert set(segments) == {"owner_idx"}
    covered = sorted(i for s in segments["owner_idx"] for i in s)
    assert covered == sorted(rows)  # each file in exactly one segment
    assert all(len(s) <= SEGMENT_FILES for s in segments["owner_idx"])
    small = [s for s in segments["owner_idx"] if sum(rows[i] for i in s) < SMALL_ROWS]
    assert len(small) <= SMALL_SEGMENTS  # merged with the new rows when that many have gathered
    assert all(n <= FRAGMENT_ROWS for n in rows.values())
    assert all(f.metadata.deletion_file is None for f in dataset.get_fragments())
    assert len(store.search("new-1", "tulips", k=20, mode="text")) == 9
    other = _small_batches(tmp_path / "two")
    assert list(_files(other).values()) == list(_files(store).values())
    assert _segments(other) == segments
    store.close()
    other.close()


def test_optimize_refuses_a_full_that_is_not_a_bool(tmp_path: Path) -> None:
    """``full`` must be True or False; anything else is an InvalidInputError naming it."""
    store = LanceDBMemoryStore(tmp_path / "memory", FakeEmbedder())
    with pytest.raises(InvalidInputError) as info:
        store.optimize(full="yes")  # type: ignore[arg-type]
    assert info.value.field == "full"
    store.close()


def test_optimize_full_groups_an_owner_spread_over_many_runs_again(tmp_path: Path) -> None:
    """An owner written over several optimizes spans several files; ``full=True`` puts its rows together."""
    store = _laid_out_table(tmp_path / "memory")
    for _ in range(3):
        store.remember_many("ann", [f"more of ann {uuid.uuid4().hex}" for _ in range(5)])
        store.optimize()

    def files_of(owner: str) -> int:
        return sum(owner in owners for owners in _files(store).values())

    assert files_of("ann") >= 3
    store.optimize(full=True)
    assert files_of("ann") == 2  # 615 rows: one full file and the rest
    store.close()
