"""LanceDB specifics: physical erasure in every Lance file, one writer per folder, safe filters, the index."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeep.errors import ConfigError, MemoryLockedError
from statekeep.memory import FakeEmbedder, SentenceTransformerEmbedder
from statekeep.memory.lancedb import LanceDBMemoryStore, decode_folder, quote


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
    store.optimize(min_rows_for_index=100)  # one file shared with bob's rows, plus vector and text indexes
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


def test_a_folder_of_an_earlier_version_is_upgraded_with_identities_and_write_order(tmp_path: Path) -> None:
    """A table without the deduplication and ordering columns is rewritten with them on open."""
    import lancedb
    import pyarrow as pa

    from statekeep.memory.lancedb import TABLE, _schema

    new = ("key", "dedupe_key", "duplicate_score", "seq")
    old_schema = pa.schema([f for f in _schema(16) if f.name not in new])
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


def test_a_writers_held_rows_rank_as_lancedb_does(tmp_path: Path) -> None:
    """A writer searching its in-process rows returns what LanceDB itself returns (a reader holds nothing)."""
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
    reader = LanceDBMemoryStore(folder, FakeEmbedder(), read_only=True)
    reader.now = writer.now  # type: ignore[method-assign]
    for q in queries:
        held, lance = _ranked(writer, q), _ranked(reader, q)
        assert [i for i, _ in held] == [i for i, _ in lance]
        assert [s for _, s in held] == pytest.approx([s for _, s in lance], abs=1e-5)
    assert _ranked(writer, "the new address is Oak Street")[0][0] == new.id
    assert old.id not in {i for q in queries for i, _ in _ranked(writer, q)}
    assert any(old.id in {i for i, _ in r} for r in before.values())
    assert writer._cache.get("alice") is not None
    assert reader._cache.get("alice") is None
    writer.close()


def _ranked(store: LanceDBMemoryStore, query: str) -> list[tuple[str, float]]:
    return [(h.memory.id, round(h.score, 6)) for h in store.search("alice", query, k=8)]
