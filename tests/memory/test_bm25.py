"""LanceDB's full-text ranking: BM25 with the statistics of the memories searched, computed in process."""

from __future__ import annotations

import math

import numpy as np
import pytest

from statekeep.memory.recall import _bm25
from statekeep.memory.recall._bm25 import K1, B, TextIndex, _stemmer, ranked, words

from .test_fusion import memory


def test_words_are_folded_lowercased_stemmed_and_stop_words_dropped() -> None:
    assert words("The Café's running DATES, names; naïve_user 2023!") == [
        "cafe",
        "run",
        "date",
        "name",
        "naiv",
        "user",
        "2023",
    ]
    assert words("What did I do when you were there?") == []
    assert words("x" * 41 + " stays") == ["stay"]


def test_scores_are_bm25_of_the_searched_memories_alone() -> None:
    """Hand-computed BM25 of a word in two of three memories; one left out changes N, df and the average."""
    docs = ["apple pie", "apple apple tart crumble", "banana bread"]
    index = TextIndex(docs)
    everything = np.ones(3, dtype=bool)
    lengths = [2, 4, 2]
    average = sum(lengths) / 3

    def bm25(tf: int, length: float, n: int, df: int, avg: float) -> float:
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        return idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / avg))

    scores = index.scores("apples", everything)
    assert scores[0] == pytest.approx(bm25(1, 2, 3, 2, average))
    assert scores[1] == pytest.approx(bm25(2, 4, 3, 2, average))
    assert scores[2] == 0
    without_banana = index.scores("apples", np.array([True, True, False]))
    assert without_banana[0] == pytest.approx(bm25(1, 2, 2, 2, 3.0))
    assert without_banana[0] != pytest.approx(scores[0])


def test_ranked_breaks_ties_by_content_then_write_order_and_keeps_every_tie_at_the_cut() -> None:
    contents = ["b apple", "a apple", "a apple", "c apple", "pear"]
    memories = [memory(seq, c) for seq, c in enumerate(contents, start=1)]
    index = TextIndex(contents)
    hits = ranked(index, memories, "apple", np.ones(5, dtype=bool), k=3)
    expected = [("a apple", 2), ("a apple", 3), ("b apple", 1)]
    assert [(h.memory.content, h.memory.seq) for h in hits] == expected
    assert ranked(index, memories, "pear plum", np.array([True] * 4 + [False]), k=3) == []


def test_an_index_shared_by_snapshots_reads_only_the_memories_each_holds() -> None:
    """Writes append: an older snapshot of fewer memories scores just those, with their statistics."""
    index = TextIndex(["apple pie", "apple tart"])
    before = index.scores("apple", np.ones(2, dtype=bool))
    index.add(["apple crumble", "banana"])
    assert len(index.scores("apple", np.ones(4, dtype=bool))) == 4
    assert index.scores("apple", np.ones(2, dtype=bool)).tolist() == before.tolist()


def test_the_marks_inside_words_of_other_scripts_stay_in_their_words() -> None:
    """Devanagari and Tamil vowel signs are marks, not letters: they must not split a word into letters."""
    assert words("हिन्दी में बात") == ["हिन्दी", "में", "बात"]
    assert len(words("தமிழ் மொழி")) == 2
    assert words("தமிழ் மொழி") == words("தமிழ்") + words("மொழி")
    index = TextIndex(["आज दिन अच्छा है", "मुझे हिन्दी पसंद है"])
    assert index.scores("हिन्दी", np.ones(2, dtype=bool)).tolist()[0] == 0


def test_the_words_seen_are_memoised_by_their_index_alone() -> None:
    """An owner's words go with their index (dropped with the owner): no process-wide memo keeps them."""
    index = TextIndex(["the locker code is zebracactus"])
    assert "zebracactus" in index._stems
    assert "zebracactus" not in TextIndex(["other words"])._stems
    assert _stemmer().maxCacheSize == 0
    memos = [n for n, v in vars(_bm25).items() if isinstance(v, dict) and any(isinstance(k, str) for k in v)]
    assert [n for n in memos if not n.startswith("__")] == []


def test_irregular_forms_are_words_of_their_base_form() -> None:
    from statekeep.memory.recall._irregular import base_forms

    assert words("I went and bought two knives; the children ran") == words(
        "I go and buy two knife; the child run"
    )
    assert words("left lit bit rose") == ["left", "lit", "bit", "rose"]  # other meanings: not read as a base
    assert base_forms("When Caroline WENT there, she Bought it.") == "When Caroline go there, she buy it."
    assert words("I won't, WON\u2019T, but I won") == ["win"]  # "won't" is "will not"
    assert base_forms("I won't, WON\u2019T, but I won") == "I will not, will not, but I win"
    # only whole words, as PostgreSQL's parser reads them; the rest of the text as it was
    kept = "sentí ranée went2 sold@shop.com https://made.com/went well-known İstanbul ΣΑΣ"
    assert base_forms(kept) == kept


def test_the_table_of_irregular_forms_is_the_one_memory_migration_7_created() -> None:
    """PostgreSQL's copy is made by a migration: a new table needs a new migration, not an edit."""
    import hashlib
    import json

    from statekeep.memory.recall._irregular import BASE

    digest = hashlib.sha256(json.dumps(sorted(BASE.items())).encode()).hexdigest()
    assert digest == "6f30dfad8ddf2b82906b6b2a93be298ab6a711fcdd6d29ff05b7791c14c8106d", (
        "changing the irregular forms needs a new memory migration"
    )
    assert all(form != base and form.isalpha() for form, base in BASE.items())
