"""A vector per sentence of a short memory: split, embedded with the memory, stored, scored, re-embedded.

On every backend with the real embedder: what a store keeps is checked against the
cosines computed here from the embedder itself, after the store is opened again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from statekeep.errors import InvalidInputError
from statekeep.memory import MemoryStore, SentenceTransformerEmbedder
from statekeep.memory._types import Filters, Memory
from statekeep.memory.embedders import normalize
from statekeep.memory.recall._sentences import (
    MAX_SENTENCES,
    SENTENCE_CHARS,
    best_cosines,
    embed_with_sentences,
    sentences,
)
from tests.memory.conftest import StoreFactory

SHORT = (
    "Can you suggest some upbeat workout playlists for my runs? By the way, I take Zumba classes on Tuesdays."
)
LONG = " ".join(f"Sentence {i} of a long assistant reply about playlists and running." for i in range(14))
QUERY = "Which dance class do I go to every week?"


def test_a_text_is_split_after_its_sentences_and_short_pieces_join_the_one_before() -> None:
    assert sentences("One fact is here. Another fact is there!  A third one, is it?") == [
        "One fact is here.",
        "Another fact is there!",
        "A third one, is it?",
    ]
    assert sentences("I moved to Lisbon last spring. Yes. Thanks!") == []  # one sentence and its tail
    assert sentences("Line one has words\nline two has words") == ["Line one has words", "line two has words"]
    assert sentences("Just one sentence, no matter how long it is.") == []
    many = " ".join(f"This is sentence {i} here." for i in range(40))
    assert len(sentences(many)) == MAX_SENTENCES
    said = "Caroline: I went to a support group. It was powerful to hear their stories."
    assert sentences(said) == [
        "Caroline: I went to a support group.",
        "Caroline: It was powerful to hear their stories.",
    ], "who said it stays with each sentence"
    assert sentences("See https://example.com for more. It lists every one of them.")[1].startswith("It")
    labelled = sentences("Bob: " + many)
    assert len(labelled) == MAX_SENTENCES
    assert all(s.startswith("Bob: ") for s in labelled)


def test_sentences_are_embedded_in_the_same_call_as_the_texts_and_only_for_short_texts() -> None:
    calls: list[list[str]] = []

    def embed(texts: Any) -> npt.NDArray[np.float32]:
        calls.append(list(texts))
        return normalize(np.arange(1, 4 * len(texts) + 1, dtype=np.float32).reshape(-1, 4))

    vectors, parts = embed_with_sentences(embed, [SHORT, LONG, "Alone."], SENTENCE_CHARS)
    assert len(calls) == 1
    assert calls[0][:3] == [SHORT, LONG, "Alone."]
    assert calls[0][3:] == sentences(SHORT), "the long text and the one-sentence text have none"
    assert vectors.shape == (3, 4)
    assert parts[1] is None, "too long: never split"
    assert parts[2] is not None
    assert parts[2].shape == (0, 4), "split, and fewer than two sentences: none (not to be split again)"
    assert parts[0] is not None
    assert parts[0].shape == (2, 4)
    np.testing.assert_array_equal(parts[0], embed(calls[0])[3:5])
    assert embed_with_sentences(embed, [SHORT], 0)[1] == [None], "0 characters: no sentences"


def test_each_memory_scores_its_best_cosine_and_equal_vectors_score_alike_anywhere() -> None:
    rng = np.random.default_rng(3)
    wholes = normalize(rng.standard_normal((6, 32)))
    wholes[4] = wholes[1]
    query = normalize(rng.standard_normal((1, 32)))[0]
    near = normalize((query + 0.1 * rng.standard_normal(32))[None])
    parts = [None, normalize(rng.standard_normal((3, 32))), near, None, None, np.zeros((0, 32), np.float32)]
    parts[4] = parts[1]
    got = best_cosines(wholes, parts, query)
    q = query.astype(np.float64)
    want = [
        max([float(wholes[i].astype(np.float64) @ q), *(float(r.astype(np.float64) @ q) for r in p)])
        if p is not None
        else float(wholes[i].astype(np.float64) @ q)
        for i, p in enumerate(parts)
    ]
    assert got == pytest.approx(want, abs=1e-12)
    assert got[1] == got[4], "the same vectors in another row: exactly the same score"
    assert got[2] > float(wholes[2].astype(np.float64) @ q), "the sentence near the query wins"


def expected(embedder: SentenceTransformerEmbedder, text: str, query: str, *, short: bool) -> float:
    """The best cosine of the text's vector and, for a short text, its sentences' vectors with the query."""
    texts = [text, *(sentences(text) if short else [])]
    vectors = normalize(embedder.embed([query, *texts])).astype(np.float64)
    return float((vectors[1:] @ vectors[0]).max())


def cosines(store: MemoryStore, owner: str, ids: list[str], query: str) -> dict[str, float]:
    vector = normalize(store.embedder.embed([query]))[0]
    return store._cosines(owner, vector, ids)


def test_a_short_memory_is_scored_by_its_best_sentence_and_a_long_one_by_its_whole_text(
    make_store: StoreFactory, real_embedder: SentenceTransformerEmbedder
) -> None:
    store = make_store(real_embedder)
    short = store.remember("alice", SHORT)
    long = store.remember("alice", LONG)
    assert len(LONG) > SENTENCE_CHARS >= len(SHORT)
    whole = expected(real_embedder, SHORT, QUERY, short=False)
    best = expected(real_embedder, SHORT, QUERY, short=True)
    assert best > whole + 0.05, "the fact's own sentence is nearer the question than the whole message"
    store = make_store(real_embedder)  # opened again: what was stored, not what a cache holds
    got = cosines(store, "alice", [short.id, long.id, "no-such-id"], QUERY)
    assert set(got) == {short.id, long.id}
    assert got[short.id] == pytest.approx(best, abs=1e-5)
    assert got[long.id] == pytest.approx(expected(real_embedder, LONG, QUERY, short=False), abs=1e-5)
    assert cosines(store, "bob", [short.id], QUERY) == {}, "another owner's memory is not scored"


def test_hybrid_search_scores_every_candidate_of_either_ranking_by_its_meaning(
    make_store: StoreFactory, real_embedder: SentenceTransformerEmbedder
) -> None:
    """With one candidate of each ranking, the vector ranking holds both: the one found by its words too."""
    store = make_store(real_embedder)
    near = store.remember("alice", "Alice takes Zumba classes on Tuesday evenings.")
    worded = store.remember("alice", "The weekly newsletter mentions a class schedule.")
    query = "What dance does Alice do?"
    vector = normalize(real_embedder.embed([query]))[0]
    now = datetime.now(UTC)
    assert [h.memory.id for h in store._nearest("alice", vector, 1, Filters(), now)] == [near.id]
    ranked, text = store._hybrid("alice", vector, "weekly newsletter", 1, Filters(), now)
    assert [h.memory.id for h in text] == [worded.id]
    scores = {h.memory.id: h.score for h in ranked}
    assert set(scores) == {near.id, worded.id}
    for memory in (near, worded):
        want = expected(real_embedder, memory.content, query, short=True)
        assert scores[memory.id] == pytest.approx(want, abs=1e-5)


def test_every_write_path_stores_the_sentences_and_given_vectors_store_none(
    make_store: StoreFactory, real_embedder: SentenceTransformerEmbedder
) -> None:
    """remember_many, insert (embedded by the store) and supersede keep sentence vectors as remember
    does; insert with the caller's vectors keeps none (it has no sentences' vectors to store)."""
    store = make_store(real_embedder)
    many = store.remember_many("alice", [SHORT, "Alice's sister lives in Lyon."])[0]
    old = store.remember("alice", "Alice takes salsa classes. She goes on Mondays after work.")
    superseding = store.supersede("alice", old.id, SHORT.replace("Tuesdays", "Thursdays"))
    embedded = store.insert([replace(many, id="imported", seq=0, content=SHORT.replace("Zumba", "tango"))])[0]
    given = replace(many, id="given", seq=0, content=SHORT.replace("Zumba", "ballet"))
    store.insert([given], normalize(real_embedder.embed([given.content])))
    store = make_store(real_embedder)  # opened again: what was stored
    got = cosines(store, "alice", [many.id, superseding.id, embedded.id, "given"], QUERY)
    for memory in (many, superseding, embedded):
        best = expected(real_embedder, memory.content, QUERY, short=True)
        assert best > expected(real_embedder, memory.content, QUERY, short=False) + 0.05
        assert got[memory.id] == pytest.approx(best, abs=1e-5), memory.id
    assert got["given"] == pytest.approx(expected(real_embedder, given.content, QUERY, short=False), abs=1e-5)


def test_memories_stored_without_sentence_vectors_gain_them_and_keep_their_whole_vectors(
    make_store: StoreFactory, real_embedder: SentenceTransformerEmbedder
) -> None:
    """embed_sentences gives the short memories of two or more sentences written without sentence
    vectors theirs, of every owner, a batch at a time; the caller's whole vectors stay; once only."""
    store = make_store(real_embedder)
    store.sentence_chars = 0  # as a store before sentence vectors wrote them
    old = store.remember("alice", SHORT)
    single = store.remember("alice", "Alice's sister lives in Lyon.")
    long = store.remember("alice", LONG)
    bobs = store.remember("bob", SHORT.replace("Zumba", "tango"))
    unrelated = normalize(real_embedder.embed(["The ferry to the island leaves at noon."]))
    given = replace(old, id="given", seq=0, content=SHORT.replace("Zumba", "ballet"))
    store.insert([given], unrelated)
    store = make_store(real_embedder)
    assert cosines(store, "alice", [old.id], QUERY)[old.id] == pytest.approx(
        expected(real_embedder, SHORT, QUERY, short=False), abs=1e-5
    )
    seen: list[tuple[int, int]] = []
    assert store.embed_sentences(batch_size=2, progress=lambda done, total: seen.append((done, total))) == 3
    assert seen == [(2, 4), (4, 4)], "the long memory is not read; the single sentence is, and marked"
    store = make_store(real_embedder)  # opened again: what was stored
    got = cosines(store, "alice", [old.id, single.id, long.id, "given"], QUERY)
    assert got[old.id] == pytest.approx(expected(real_embedder, SHORT, QUERY, short=True), abs=1e-5)
    for memory in (single, long):
        assert got[memory.id] == pytest.approx(
            expected(real_embedder, memory.content, QUERY, short=False), abs=1e-5
        )
    query = normalize(real_embedder.embed([QUERY]))[0].astype(np.float64)
    parts = normalize(real_embedder.embed(sentences(given.content))).astype(np.float64)
    caller = float(unrelated[0].astype(np.float64) @ query)
    assert got["given"] == pytest.approx(max(caller, float((parts @ query).max())), abs=1e-5)
    ferry = "When does the ferry leave for the island?"
    kept = cosines(store, "alice", ["given"], ferry)["given"]
    assert kept > expected(real_embedder, given.content, ferry, short=True) + 0.2, "the caller's vector stays"
    bob = cosines(store, "bob", [bobs.id], QUERY)[bobs.id]
    assert bob == pytest.approx(expected(real_embedder, bobs.content, QUERY, short=True), abs=1e-5)
    again: list[int] = []
    assert store.embed_sentences(progress=lambda done, total: again.append(done)) == 0
    assert again == [], "every memory read was marked split: none is read again"
    assert {m.id for m in store.list_memories("alice")} == {old.id, single.id, long.id, "given"}


#: An erased memory's text, a question about it, and the text of another memory given its id after.
SECRET = "Alice: my PIN is 4711. I keep the spare key under the flowerpot."
ASKED_SECRET = "Where is the spare key?"
HARMLESS = "Alice: nothing to see here."


def reuse_id_at_the_first_embedding(
    monkeypatch: pytest.MonkeyPatch, store: MemoryStore, old: Memory, other: Memory, vectors: Any = None
) -> None:
    """At the store's next embedding (after it read ``old``), forget ``old`` and insert ``other``
    under its id, as a caller reusing the id may."""
    embed = store._embed

    def forget_and_reuse_first(texts: Sequence[str]) -> Any:
        monkeypatch.setattr(store, "_embed", embed)
        store.forget_one(old.owner, old.id)
        store.insert([other], vectors)
        return embed(texts)

    monkeypatch.setattr(store, "_embed", forget_and_reuse_first)


def test_a_memory_forgotten_while_its_sentences_are_embedded_gives_them_to_no_other(
    make_store: StoreFactory, real_embedder: SentenceTransformerEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forgotten, and its id reused by another memory, between the read and the write: the new
    memory does not get the erased text's sentence vectors, and it is not counted."""
    store = make_store(real_embedder)
    store.sentence_chars = 0
    old = store.remember("alice", SECRET)
    store.sentence_chars = SENTENCE_CHARS
    other = replace(old, content=HARMLESS, seq=0)
    reuse_id_at_the_first_embedding(
        monkeypatch, store, old, other, normalize(real_embedder.embed([HARMLESS]))
    )
    assert store.embed_sentences() == 0
    got = cosines(make_store(real_embedder), "alice", [old.id], ASKED_SECRET)[old.id]
    assert got == pytest.approx(expected(real_embedder, HARMLESS, ASKED_SECRET, short=False), abs=1e-5)
    assert got < expected(real_embedder, SECRET, ASKED_SECRET, short=True) - 0.1, (
        "the erased text's sentences"
    )


def test_a_read_only_store_refuses_to_embed_sentences_before_embedding_anything(
    tmp_path: Path, real_embedder: SentenceTransformerEmbedder
) -> None:
    from statekeep.memory.lancedb import LanceDBMemoryStore

    with LanceDBMemoryStore(tmp_path / "m", real_embedder) as writer:
        writer.sentence_chars = 0
        writer.remember("alice", SHORT)
    calls: list[int] = []

    class Counting:
        name, dimension = real_embedder.name, real_embedder.dimension

        def embed(self, texts: Sequence[str]) -> Any:
            calls.append(len(texts))
            return real_embedder.embed(texts)

    with (
        LanceDBMemoryStore(tmp_path / "m", Counting(), read_only=True) as reader,
        pytest.raises(InvalidInputError) as refused,
    ):
        reader.embed_sentences()
    assert refused.value.field == "read_only"
    assert calls == [], "nothing was embedded for nothing"


def test_embed_sentences_refuses_a_bad_batch_size_and_a_store_without_sentences_does_nothing(
    make_store: StoreFactory, real_embedder: SentenceTransformerEmbedder
) -> None:
    store = make_store(real_embedder)
    store.sentence_chars = 0
    store.remember("alice", SHORT)
    for bad in (0, -1, True, 2.5, "10"):
        with pytest.raises(InvalidInputError) as refused:
            store.embed_sentences(batch_size=bad)  # type: ignore[arg-type]
        assert refused.value.field == "batch_size"
    assert store.embed_sentences() == 0, "sentence_chars 0: no memory keeps sentences"
    store.sentence_chars = SENTENCE_CHARS
    assert store.embed_sentences() == 1


class Renamed:
    """The real embedder under another model name: re-embedding gives every memory new vectors."""

    def __init__(self, real: SentenceTransformerEmbedder) -> None:
        self.real, self.name, self.dimension = real, "renamed-minilm", real.dimension

    def embed(self, texts: Any) -> npt.NDArray[np.float32]:
        return self.real.embed(texts)


def test_re_embedding_stores_the_sentence_vectors_of_the_new_model(
    make_store: StoreFactory, real_embedder: SentenceTransformerEmbedder
) -> None:
    old = make_store(real_embedder)
    short = old.remember("alice", SHORT)
    store = make_store(Renamed(real_embedder))
    assert cosines(store, "alice", [short.id], QUERY) == {}, "another model's vectors are never compared"
    assert store.reembed() == 1
    got = cosines(make_store(Renamed(real_embedder)), "alice", [short.id], QUERY)
    assert got[short.id] == pytest.approx(expected(real_embedder, SHORT, QUERY, short=True), abs=1e-5)


def test_a_memory_forgotten_while_it_is_re_embedded_gives_its_vectors_to_no_other(
    make_store: StoreFactory, real_embedder: SentenceTransformerEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forgotten, and its id reused, between reembed's read and its write: the new memory keeps
    its own vectors, not the erased text's."""
    old = make_store(real_embedder).remember("alice", SECRET)
    store = make_store(Renamed(real_embedder))
    other = replace(old, content=HARMLESS, seq=0, model="renamed-minilm")
    reuse_id_at_the_first_embedding(monkeypatch, store, old, other)
    store.reembed()
    got = cosines(make_store(Renamed(real_embedder)), "alice", [old.id], ASKED_SECRET)[old.id]
    assert got == pytest.approx(expected(real_embedder, HARMLESS, ASKED_SECRET, short=True), abs=1e-5)
    assert got < expected(real_embedder, SECRET, ASKED_SECRET, short=False) - 0.1, "the erased text's vector"


def test_a_store_without_sentences_scores_by_the_whole_text(
    make_store: StoreFactory, real_embedder: SentenceTransformerEmbedder
) -> None:
    store = make_store(real_embedder)
    store.sentence_chars = 0
    short = store.remember("alice", SHORT)
    got = cosines(store, "alice", [short.id], QUERY)
    assert got[short.id] == pytest.approx(expected(real_embedder, SHORT, QUERY, short=False), abs=1e-5)


def test_a_lancedb_folder_of_the_previous_version_gains_the_sentence_column(
    tmp_path: Path, real_embedder: SentenceTransformerEmbedder
) -> None:
    """A table without the column: a reader reads it as it is; a writer adds the column, null for old rows."""
    import lancedb
    import pyarrow as pa

    from statekeep.memory.lancedb import LanceDBMemoryStore
    from statekeep.memory.lancedb._layout import SENTENCES, TABLE, arrow_rows, schema

    with LanceDBMemoryStore(tmp_path / "scratch", real_embedder) as scratch:
        memory = scratch.remember("alice", SHORT)
    vectors = normalize(real_embedder.embed([SHORT]))
    rows = arrow_rows([memory], vectors, real_embedder.dimension).drop_columns([SENTENCES])
    old = pa.schema([f for f in schema(real_embedder.dimension) if f.name != SENTENCES])
    lancedb.connect(str(tmp_path / "old")).create_table(TABLE, data=rows.cast(old))
    whole = expected(real_embedder, SHORT, QUERY, short=False)
    with LanceDBMemoryStore(tmp_path / "old", real_embedder, read_only=True) as reader:
        assert cosines(reader, "alice", [memory.id], QUERY)[memory.id] == pytest.approx(whole, abs=1e-5)
        assert [h.memory.id for h in reader.search("alice", QUERY, k=1)] == [memory.id]
    with LanceDBMemoryStore(tmp_path / "old", real_embedder) as store:
        assert SENTENCES in lancedb.connect(str(tmp_path / "old")).open_table(TABLE).schema.names
        assert cosines(store, "alice", [memory.id], QUERY)[memory.id] == pytest.approx(whole, abs=1e-5)
        again = store.remember("alice", SHORT + " ")  # the same fact: nothing new
        assert again.id == memory.id
        new = store.remember("bob", SHORT)
        best = expected(real_embedder, SHORT, QUERY, short=True)
        assert cosines(store, "bob", [new.id], QUERY)[new.id] == pytest.approx(best, abs=1e-5)
        assert store.embed_sentences() == 1, "the memory of the previous version gains its sentences"
        assert cosines(store, "alice", [memory.id], QUERY)[memory.id] == pytest.approx(best, abs=1e-5)


def test_a_postgres_store_of_schema_5_gains_the_sentence_column(postgres_url: str) -> None:
    """Migration 6 adds the column: a memory written before is scored by its whole text, a new one
    by its sentences too."""
    import psycopg

    from statekeep.db import Database, upgrade
    from statekeep.memory import FakeEmbedder
    from statekeep.memory._dedupe import identity
    from statekeep.memory.pgvector import PgVectorMemoryStore
    from statekeep.memory.pgvector import _sql as q
    from tests.memory.test_pgvector import libpq

    db = Database(postgres_url)
    upgrade(db, "memory", q.SCHEMA, q.MIGRATIONS[:5])
    db.dispose()
    fake = FakeEmbedder()
    vector = "[" + ",".join(str(float(x)) for x in normalize(fake.embed([SHORT]))[0]) + "]"
    with psycopg.connect(libpq(postgres_url)) as conn:
        conn.execute(
            f"INSERT INTO {q.TABLE} (owner, id, content, kind, source, trust, model, created_us, "
            "embedding, dedupe_key) VALUES ('alice', 'm0', %s, 'semantic', 'imported', 0.5, %s, 1, "
            "CAST(%s AS vector), %s)",
            (SHORT, fake.name, vector, identity(SHORT, None)),
        )
    store = PgVectorMemoryStore(postgres_url, fake)
    try:
        asked = "Zumba classes on Tuesdays?"  # the fake embedder is lexical: the words of one sentence
        query = normalize(fake.embed([asked])).astype(np.float64)[0]
        texts = normalize(fake.embed([SHORT, *sentences(SHORT)])).astype(np.float64)
        assert cosines(store, "alice", ["m0"], asked)["m0"] == pytest.approx(texts[0] @ query, abs=1e-5)
        new = store.remember("bob", SHORT)
        best = float((texts @ query).max())
        assert best > texts[0] @ query, (
            "a sentence is nearer the query than the whole (else this proves nothing)"
        )
        assert cosines(store, "bob", [new.id], asked)[new.id] == pytest.approx(best, abs=1e-5)
        assert store.embed_sentences() == 1, "the memory written before migration 6 gains its sentences"
        assert cosines(store, "alice", ["m0"], asked)["m0"] == pytest.approx(best, abs=1e-5)
    finally:
        store.close()


@pytest.mark.parametrize("value", [-1, 1.5, True, "600", None, float("nan")])
def test_sentence_chars_out_of_range_is_refused_when_set(value: object) -> None:
    from statekeep.errors import InvalidInputError
    from statekeep.memory import FakeEmbedder, InMemoryMemoryStore

    store = InMemoryMemoryStore(FakeEmbedder())
    with pytest.raises(InvalidInputError) as refused:
        store.sentence_chars = value  # type: ignore[assignment]
    assert refused.value.field == "sentence_chars"
    assert store.sentence_chars == 600  # unchanged
    store.sentence_chars = 0
    assert store.sentence_chars == 0


def test_a_few_memories_are_embedded_a_few_texts_a_call_however_many_sentences() -> None:
    """One ``remember`` of a memory of 12 sentences makes calls of at most FEW texts (the default
    embedder runs them in numpy, without loading torch), with the same vectors as one call."""
    from statekeep.memory import FakeEmbedder
    from statekeep.memory.embedders import FEW
    from statekeep.memory.recall._sentences import embed_with_sentences

    embedder = FakeEmbedder()
    calls: list[int] = []

    def embed(texts: Sequence[str]) -> np.ndarray:
        calls.append(len(texts))
        return embedder.embed(list(texts))

    text = " ".join(f"I walked to the lake number {n} today." for n in range(12))
    wholes, parts = embed_with_sentences(embed, [text], 600)
    assert calls == [FEW, 13 - FEW]
    one_call_whole, one_call_parts = embed_with_sentences(embedder.embed, [text], 600)
    assert np.array_equal(wholes, one_call_whole)
    assert parts[0] is not None
    assert one_call_parts[0] is not None
    assert np.array_equal(parts[0], one_call_parts[0])
    calls.clear()
    embed_with_sentences(embed, [text] * (FEW + 1), 600)  # a batch: one call, as before
    assert calls == [(FEW + 1) * 13]
