"""LanceDB specifics: physical erasure in every Lance file, one writer per folder, safe filters, the index."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeep.errors import ConfigError, MemoryLockedError
from statekeep.memory import FakeEmbedder, Memory, Provenance, SearchMode, SentenceTransformerEmbedder
from statekeep.memory.lancedb import LanceDBMemoryStore
from statekeep.memory.lancedb._files import decode_folder
from statekeep.memory.lancedb._owner_cache import OWNER_BYTES, OwnerCache, held_rows
from statekeep.memory.lancedb._sql import quote


def files_with(folder: Path, marker: str) -> list[str]:
    """Every file of the folder whose decoded content (deleted rows included) holds ``marker``."""
    return [str(f.relative_to(folder)) for f, text in decode_folder(folder) if marker in text]


def test_invariant_8_forget_leaves_the_owner_in_no_lance_file(
    tmp_path: Path, real_embedder: SentenceTransformerEmbedder
) -> None:
    """After forget, no Lance data, deletion or index file (old versions included) decodes to the marker."""
    folder = tmp_path / "memory"
    store = LanceDBMemoryStore(folder, real_embedder)
    store.remember_many("bob", [f"Bob's note number {i} about gardening." for i in range(300)])
    marker = f"zq{uuid.uuid4().hex}"
    store.remember("alice", f"Alice's locker code is {marker}.")
    store.optimize()  # one file shared with bob's rows, plus the owner index
    assert any(name.startswith("memories.lance/_indices") for name, _ in _names(folder))
    # a plain delete only writes a deletion file: the row still decodes from its data file (under 10% deleted)
    store._table.delete("owner = 'alice'")
    assert files_with(folder, marker), "the reader must see deleted rows, or this test proves nothing"
    receipt = store.forget("alice")
    assert files_with(folder, marker) == []
    assert receipt.locations
    assert receipt.not_reached
    assert len(store.list_memories("bob")) == 300
    assert store.search("bob", "gardening", k=3)[0].memory.owner == "bob"
    store.close()


def _digests(folder: Path) -> dict[str, str]:
    """sha256 of every data and index file of the table, by path relative to the folder."""
    table = folder / "memories.lance"
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for sub in ("data", "_indices")
        for p in (table / sub).rglob("*")
        if p.is_file()
    }


def test_forget_rewrites_only_the_files_that_held_the_owner(tmp_path: Path) -> None:
    """After optimize, forget replaces the data files that held the owner's rows and the index segments
    covering them; every other data and index file is left byte for byte as it was."""
    folder = tmp_path / "memory"
    store = LanceDBMemoryStore(folder, FakeEmbedder())
    for owner in ("ann", "bob", "cid", "dee", "fay"):  # 3,000 rows: several files and index segments
        store.remember_many(owner, [f"{owner}'s note number {i} about gardening." for i in range(600)])
    marker = f"zq{uuid.uuid4().hex}"
    store.remember("eve", f"Eve's locker code is {marker}.")
    store.remember("eve", "Eve waters the ferns on Sundays.")
    store.optimize()
    dataset = store._table.to_lance()
    held = files_with(folder, marker)
    held_data = [f for f in held if f.startswith("memories.lance/data/")]
    assert len(held_data) == 1, "eve's two rows are laid out in one data file"
    fragments = [
        f.fragment_id for f in dataset.get_fragments() if held_data[0].endswith(f.data_files()[0].path)
    ]
    covering = {
        seg.uuid
        for index in dataset.describe_indices()
        for seg in index.segments
        if set(seg.fragment_ids) & set(fragments)
    }
    before = _digests(folder)
    assert len([f for f in before if "/data/" in f]) >= 5
    assert len({f.split("/")[2] for f in before if "/_indices/" in f}) > len(covering), (
        "some segments cover others"
    )

    store.forget("eve")

    after = _digests(folder)
    assert files_with(folder, marker) == []
    untouched = {f: d for f, d in before.items() if f not in held and not any(u in f for u in covering)}
    assert {f: after.get(f) for f in untouched} == untouched  # still there, byte-identical
    assert all(f not in after for f in held_data)  # the file that held eve's rows was replaced
    assert len([f for f in after if "/data/" in f]) == len([f for f in before if "/data/" in f])
    assert store.list_memories("eve") == []
    assert len(store.list_memories("dee")) == 600
    assert store.search("dee", "gardening", k=1, mode="text")[0].memory.owner == "dee"
    store.close()


def test_forget_of_an_owner_with_whole_files_leaves_no_index_segment_holding_them(tmp_path: Path) -> None:
    """Lance drops a data file whose rows are all deleted without touching the index segments over it;
    forget rebuilds those segments, so no index file keeps the owner's rows (row ids, owner value)."""
    folder = tmp_path / "memory"
    store = LanceDBMemoryStore(folder, FakeEmbedder())
    store.remember_many("ann", [f"ann's note {i} about tea." for i in range(300)])
    store.remember_many("bob", [f"bob's note {i} about jazz." for i in range(1100)])  # two whole files of 512
    store.remember_many("cid", [f"cid's note {i} about tea." for i in range(2000)])
    store.optimize()
    dataset = store._table.to_lance()
    files_of_bob = [
        f.fragment_id
        for f in dataset.get_fragments()
        if f.to_table(columns=["owner"]).column(0).to_pylist() == ["bob"] * 512
    ]
    assert len(files_of_bob) == 2
    segments = [set(seg.fragment_ids) for ix in dataset.describe_indices() for seg in ix.segments]
    assert any(len(seg) > 1 and seg & set(files_of_bob) for seg in segments), "a segment shares files"

    store.forget("bob")

    dataset = store._table.to_lance()
    live = {f.fragment_id for f in dataset.get_fragments()}
    assert not live & set(files_of_bob)
    for index in dataset.describe_indices():
        assert all(set(seg.fragment_ids) <= live for seg in index.segments), index.name
    index_files = [(f, text) for f, text in decode_folder(folder) if "_indices" in f.parts]
    assert index_files
    assert not [f for f, text in index_files if "bob" in text]  # the owner index held the owner's name
    row_ids = [
        r["ids"] for f, text in index_files if f.name.endswith("page_data.lance") for r in json.loads(text)
    ]
    assert row_ids
    assert {r >> 32 for r in row_ids} <= live  # the owner index lists no row of a dropped file
    assert store.list_memories("bob") == []
    assert len(store.list_memories("cid")) == 2000
    assert len(store.search("ann", "tea", k=500, mode="text")) == 300
    store.close()


def _names(folder: Path) -> list[tuple[str, int]]:
    return [(str(p.relative_to(folder)), p.stat().st_size) for p in folder.rglob("*") if p.is_file()]


def test_a_second_writer_on_the_same_folder_fails_clearly(tmp_path: Path) -> None:
    """LanceDB is for one writer: a second store on the folder gets MemoryLockedError, a ConfigError."""
    first = LanceDBMemoryStore(tmp_path / "m", FakeEmbedder())
    with pytest.raises(MemoryLockedError) as info:
        LanceDBMemoryStore(tmp_path / "m", FakeEmbedder())
    assert isinstance(info.value, ConfigError)
    assert "pgvector" in str(info.value)
    first.close()
    with LanceDBMemoryStore(tmp_path / "m", FakeEmbedder()) as again:
        assert again.list_memories("anyone") == []


def test_quote_doubles_single_quotes_only() -> None:
    """A filter literal doubles quotes and leaves backslashes and wildcards alone."""
    assert quote("a' OR '1'='1") == "'a'' OR ''1''=''1'"
    assert quote("%_\\") == "'%_\\'"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    owner=st.text(
        st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), min_size=1, max_size=24
    )
)
def test_any_owner_string_sees_exactly_its_own_memories(
    tmp_path_factory: pytest.TempPathFactory, owner: str
) -> None:
    """For any owner string, list and search return that owner's memories and nobody else's."""
    folder = tmp_path_factory.mktemp("lance")
    with LanceDBMemoryStore(folder, FakeEmbedder(16)) as store:
        store.remember("control", "control note")
        store.remember(owner, "owner note")
        assert [m.owner for m in store.list_memories(owner)] == [owner]
        assert [r.memory.owner for r in store.search(owner, "note", k=10, mode="hybrid")] == [owner]
        assert store.forget(owner).removed == 1
        assert len(store.list_memories("control")) == (0 if owner == "control" else 1)


def test_optimize_lays_out_a_table_an_older_statekeep_indexed_one_owner_per_file(tmp_path: Path) -> None:
    """A table compacted into one file with a vector index (what optimize did before) is rewritten by
    optimize: the vector index is gone, each file holds whole owners, and search still finds them."""
    from lancedb.index import IvfHnswSq

    folder = tmp_path / "memory"
    store = LanceDBMemoryStore(folder, FakeEmbedder())
    for owner in ("bob", "ann"):
        store.remember_many(owner, [f"{owner}'s note number {i} about gardening." for i in range(300)])
    store._table.optimize()
    config = IvfHnswSq(distance_type="cosine", num_partitions=2)
    store._table.create_index("vector", config=config, name="vector_idx")
    store.close()
    store = LanceDBMemoryStore(folder, FakeEmbedder())
    assert store._indexed
    assert len(store._table.to_lance().get_fragments()) == 1
    store.optimize()
    assert not store._indexed
    assert {ix.name for ix in store._table.list_indices()} == {"owner_idx"}
    files = store._table.to_lance().get_fragments()
    owners = [set(f.to_table(columns=["owner"]).column("owner").to_pylist()) for f in files]
    assert owners == [{"ann"}, {"bob"}]  # 300 + 300 rows do not fit in one file of 512: one owner each
    hits = store.search("ann", "ann's note about gardening.", k=5, mode="vector")
    assert [h.memory.owner for h in hits] == ["ann"] * 5
    store.close()


def test_a_folder_of_an_earlier_version_is_upgraded_with_identities_and_write_order(tmp_path: Path) -> None:
    """A table without the deduplication and ordering columns is rewritten with them on open."""
    import lancedb
    import pyarrow as pa

    from statekeep.memory.lancedb._layout import TABLE, schema

    new = ("key", "dedupe_key", "duplicate_score", "seq", "sentences")
    old_schema = pa.schema([f for f in schema(16) if f.name not in new])
    contents = ["Alice has a dog.", "Alice drinks tea.", "Bye!"]
    none = [None] * 3
    columns = {
        "id": ["c", "b", "a"], "owner": ["alice"] * 3, "content": contents, "kind": ["semantic"] * 3,
        "tags": [[]] * 3, "metadata": ["{}"] * 3, "source": ["imported"] * 3, "session_id": none,
        "run_id": none, "event_id": none, "trust": [0.5] * 3, "model": [FakeEmbedder(16).name] * 3,
        "created_us": [1, 2, 2], "expires_us": none, "superseded_by": none, "duplicate_of": none,
        "vector": list(FakeEmbedder(16).embed(contents)),
    }  # fmt: skip
    lancedb.connect(str(tmp_path)).create_table(TABLE, data=pa.table(columns, schema=old_schema))
    with LanceDBMemoryStore(tmp_path, FakeEmbedder(16)) as store:
        listed = store.list_memories("alice")
        assert [(m.id, m.seq) for m in listed] == [("c", 1), ("a", 2), ("b", 3)]  # by creation, then id
        again = store.remember("alice", "ALICE drinks tea.")
        assert again.id == "b"
        assert store.remember("alice", "Alice has a cat.").seq == 4
        assert store.search("alice", "Alice has a dog", k=1)[0].memory.id == "c"
        assert store.search("alice", "dog", k=1, mode="hybrid")[0].memory.id == "c"


def _with_old_text_index(folder: Path, layout: str) -> set[str]:
    """Give a laid-out table the full-text index earlier statekeep versions built; its segments' ids.

    ``whole``: one segment over every file (``FTS()`` on the table, as a new table got it);
    ``segments``: one segment per owner index segment, as ``optimize`` laid it out.
    """
    import lance
    import lancedb
    from lancedb.index import FTS

    if layout == "whole":
        lancedb.connect(str(folder)).open_table("memories").create_index("content", config=FTS())
    else:
        dataset = lance.dataset(str(folder / "memories.lance"))
        (owner,) = [ix for ix in dataset.describe_indices() if ix.name == "owner_idx"]
        built: list[Any] = [
            dataset.create_index_uncommitted(
                "content", "INVERTED", name="content_idx", fragment_ids=list(seg.fragment_ids)
            )
            for seg in owner.segments
        ]
        dataset.commit_existing_index_segments("content_idx", "content", built)
    dataset = lance.dataset(str(folder / "memories.lance"))
    (text,) = [ix for ix in dataset.describe_indices() if ix.name == "content_idx"]
    return {str(seg.uuid) for seg in text.segments}


@pytest.mark.parametrize("layout", ["whole", "segments"])
def test_a_writer_drops_the_full_text_index_of_an_earlier_version_and_forget_leaves_none_of_it(
    tmp_path: Path, layout: str
) -> None:
    """A table an earlier statekeep gave a full-text index (content_idx) is read as it is by a read-only
    store; a writer drops the index and its files on open, so no stale segment of it keeps an erased
    owner's words (erasure rebuilds no segment of it), and the table stays laid out."""
    from statekeep.memory.lancedb import _layout as _lance_layout

    folder = tmp_path / "memory"
    with LanceDBMemoryStore(folder, FakeEmbedder()) as store:
        store.remember_many("bob", [f"Bob's note number {i} about gardening." for i in range(700)])
        marker = f"zq{uuid.uuid4().hex}"
        store.remember("alice", f"Alice's locker code is {marker}.")
        store.optimize()
    text_segments = _with_old_text_index(folder, layout)
    indices = folder / "memories.lance" / "_indices"
    assert text_segments
    assert all((indices / u).is_dir() for u in text_segments)

    reader = LanceDBMemoryStore(folder, FakeEmbedder(), read_only=True)
    assert "content_idx" in {ix.name for ix in reader._table.list_indices()}
    assert reader.search("alice", marker, k=1, mode="text")[0].memory.owner == "alice"
    assert reader.search("alice", marker, k=1, mode="hybrid")[0].memory.owner == "alice"
    reader.close()

    store = LanceDBMemoryStore(folder, FakeEmbedder())
    assert {ix.name for ix in store._table.list_indices()} == {"owner_idx"}
    assert not [u for u in text_segments if (indices / u).exists()]  # its files deleted, not just unlisted
    if layout == "segments":  # still laid out: optimize goes on laying out only what changed
        assert _lance_layout._laid_out_indexes(store._table.to_lance()) is not None
    store.remember("alice", "Alice waters the ferns on Sundays.")
    store.optimize()
    store.forget("alice")

    assert files_with(folder, marker) == []
    dataset = store._table.to_lance()
    owner_segments = {str(seg.uuid) for ix in dataset.describe_indices() for seg in ix.segments}
    assert {p.name for p in indices.iterdir()} == owner_segments  # no index file but the owner index's
    assert store.search("bob", "gardening", k=3, mode="text")[0].memory.owner == "bob"
    store.close()
    reader = LanceDBMemoryStore(folder, FakeEmbedder(), read_only=True)
    assert reader.list_memories("alice") == []
    reader.close()


def test_a_writers_held_rows_rank_as_lancedb_does(tmp_path: Path) -> None:
    """A writer searching its in-process rows returns what a reader holding nothing reads from LanceDB,
    and what a reader holding the rows of the table's latest version returns; a new version is read."""
    folder = tmp_path / "m"
    writer = LanceDBMemoryStore(folder, FakeEmbedder(), duplicate_threshold=None)
    notes = [f"note {i} about {topic}" for i in range(60) for topic in ("tea", "trains")][:90]
    writer.remember_many("alice", notes)
    writer.remember("alice", "a note about tea that lapses", ttl=timedelta(seconds=30))
    old = writer.remember("alice", "the old address is Elm Street")
    writer.remember_many("bob", ["bob's note about tea"] * 3)
    queries = ["tea", "trains", "note 7", "the old address is Elm Street", "the new address is Oak Street"]
    before = {q: _ranked(writer, q) for q in queries}  # reads alice's rows into the writer's cache
    new = writer.supersede("alice", old.id, "the new address is Oak Street")  # applied to the cache
    writer.now = lambda: datetime.now(UTC) + timedelta(minutes=1)  # type: ignore[method-assign]
    reader = LanceDBMemoryStore(folder, FakeEmbedder(), read_only=True, cache_bytes=0)
    holding = LanceDBMemoryStore(folder, FakeEmbedder(), read_only=True)
    reader.now = holding.now = writer.now  # type: ignore[method-assign]
    for q in queries:
        for mode in ("hybrid", "text"):
            held, lance, again = _ranked(writer, q, mode), _ranked(reader, q, mode), _ranked(holding, q, mode)
            assert [i for i, _ in held] == [i for i, _ in lance] == [i for i, _ in again]
            assert [s for _, s in held] == pytest.approx([s for _, s in lance], abs=1e-5)
            assert [s for _, s in again] == pytest.approx([s for _, s in lance], abs=1e-5)
        narrowed = (writer.search("alice", q, mode="text", since=old.created_at) for _ in range(2))
        read = reader.search("alice", q, mode="text", since=old.created_at)
        assert next(narrowed) == read == next(narrowed)
    assert _ranked(writer, "the new address is Oak Street")[0][0] == new.id
    assert old.id not in {i for q in queries for i, _ in _ranked(writer, q)}
    assert any(old.id in {i for i, _ in r} for r in before.values())
    assert writer._cache.get("alice") is not None
    assert reader._cache.get("alice") is None
    assert holding._cache.get("alice") is not None
    later = writer.remember("alice", "the parcel locker code is 4471")
    assert [h.memory.id for h in holding.search("alice", "parcel locker code", k=1)] == [later.id]
    writer.forget("alice")
    # a filtered search, which reads LanceDB, not the held rows, lets them go too
    assert holding.search("alice", "parcel locker code", kinds=["semantic"], mode="vector") == []
    assert holding._cache.get("alice") is None
    assert holding.search("alice", "parcel locker code") == []
    held_now = holding._cache.get("alice")
    assert held_now is not None
    assert held_now.memories == []  # nothing of alice's is held after her erasure
    writer.close()


def _ranked(store: LanceDBMemoryStore, query: str, mode: SearchMode = "hybrid") -> list[tuple[str, float]]:
    return [(h.memory.id, round(h.score, 6)) for h in store.search("alice", query, k=8, mode=mode)]


def test_reembedding_leaves_each_owner_their_own_memory_when_two_share_an_id(tmp_path: Path) -> None:
    """Ids are unique per owner only: re-embedding two owners' memories of the same id keeps each
    owner's text, vector and row, and never writes one owner's memory over the other's."""
    from statekeep.memory import Memory, Provenance

    old, new = FakeEmbedder(8, name="old-model"), FakeEmbedder(8, name="new-model")
    now = datetime.now(UTC)
    store = LanceDBMemoryStore(tmp_path / "m", old)
    for owner in ("ann", "bob"):
        memory = Memory(
            "m1", owner, f"{owner}'s secret", "semantic", (), {}, Provenance("user_supplied"), "", now
        )
        store.insert([memory])
    store.close()
    store = LanceDBMemoryStore(tmp_path / "m", new)
    try:
        assert store.reembed() == 2
        for owner in ("ann", "bob"):
            assert [(m.owner, m.content, m.model) for m in store.list_memories(owner)] == [
                (owner, f"{owner}'s secret", "new-model")
            ]
            [hit] = store.search(owner, "secret", k=5, mode="vector")
            assert hit.memory.content == f"{owner}'s secret"
    finally:
        store.close()


def test_owners_of_no_memories_count_against_the_cache_budget() -> None:
    """Every owner held costs something: an empty owner is not held without limit (nor at all with 0)."""
    empty = held_rows([], np.zeros((0, 8), dtype=np.float32))
    assert not OwnerCache(0).fits("o", 0, 8)
    cache = OwnerCache(3 * OWNER_BYTES)
    for n in range(10):
        cache.put(f"owner-{n}", empty, cache.generation)
    assert sum(cache.get(f"owner-{n}") is not None for n in range(10)) == 3


def test_an_owner_found_too_big_to_hold_is_not_read_whole_again() -> None:
    """The estimate counts no sentence vectors: an owner that fits it but not the budget, once read,
    is not read whole again by every lookup of the next searches, until it has fewer memories."""
    dimension = 8
    memories = [
        Memory(
            id=f"m{n}", owner="o", content=f"memory {n}", kind="episodic", tags=(), metadata={},
            provenance=Provenance("imported"), model="test", created_at=datetime(2026, 1, 1, tzinfo=UTC),
            seq=n,
        )
        for n in range(20)
    ]  # fmt: skip
    sentences = {m.id: np.ones((16, dimension), dtype=np.float32) for m in memories}
    rows = held_rows(memories, np.ones((20, dimension), dtype=np.float32), sentences)
    cache = OwnerCache(rows.nbytes - 1)
    assert cache.fits("o", 20, dimension)  # the estimate, without the sentences
    cache.put("o", rows, cache.generation)
    assert cache.get("o") is None
    assert not cache.fits("o", 20, dimension)
    assert not cache.fits("o", 21, dimension)
    assert cache.fits("o", 19, dimension)  # some were erased: it may fit now
    assert cache.fits("p", 20, dimension)  # another owner is not affected
