"""BM25 over one owner's memories, with that owner's statistics only (LanceDB's full-text ranking).

LanceDB's own full-text index ranks with the statistics of the whole index: every
owner's memories count in a word's document frequency, so one owner's scores
(and order) moved with what other owners wrote, and with whether ``optimize`` had
indexed it yet. Here a word's weight comes from the memories the search may
return (the owner's current memories, narrowed by the search's filters), so the
same memories and query rank the same, whatever else the table holds.

Words: case-folded runs of letters, digits and the marks within words (accents of
Latin letters folded away by NFKD) of at most :data:`MAX_WORD` characters, English
stop words dropped, irregular forms read as their base ("went" as "go":
:mod:`._irregular`), stemmed by the Snowball English stemmer (as LanceDB's ``FTS()``
did). Stems are memoised per index, so that an owner's words go with their index.
Scores: BM25 with ``k1`` = :data:`K1` and ``b`` = :data:`B`.
"""

from __future__ import annotations

import math
import re
import sys
import unicodedata
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

import statekeep.memory.recall._irregular as irregular
from statekeep.memory._types import Memory, SearchResult
from statekeep.memory.recall._ranking import rank_key

K1, B = 1.2, 0.75
#: Longer runs of letters (a pasted key, a base64 blob) are not words.
MAX_WORD = 40
#: The English stop words LanceDB's full-text index dropped, contractions split into their parts
#: (but "won", "don" and "let", which are words too: "who won", "Don").
STOP_WORDS = frozenset(
    """
    i me my myself we our ours ourselves you your yours yourself yourselves he him his himself she her
    hers herself it its itself they them their theirs themselves what which who whom this that these
    those am is are was were be been being have has had having do does did doing would should could
    ought a an the and but if or because as until while of at by for with about against between into
    through during before after above below to from up down in out on off over under again further then
    once here there when where why how all any both each few more most other some such no nor not only
    own same so than too very s t can will just ll m re ve d isn aren wasn weren hasn haven hadn
    doesn didn wouldn shan shouldn couldn mustn
    """.split()  # noqa: SIM905 - 150 words read best as words
)
#: Combining marks left by NFKD (the accents of "café", "naïve"), dropped to fold to the base letter.
_MARKS = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]")
#: ASCII text: everything but letters and digits becomes a space (as ``_word`` splits it, faster).
_ASCII_SPACES = str.maketrans({chr(c): " " for c in range(128) if not chr(c).isalnum()})


@lru_cache(maxsize=1)
def _word() -> re.Pattern[str]:
    """Runs of letters, digits and the marks within words (the vowel signs of Devanagari, Tamil...).

    The marks go into the class as ranges of code points (2,408 marks, 299 ranges): as
    single characters they made matching four times slower.
    """
    ranges: list[list[int]] = []
    for c in range(0x80, sys.maxunicode + 1):
        if unicodedata.category(chr(c)) in ("Mn", "Mc", "Me"):
            if ranges and ranges[-1][1] == c - 1:
                ranges[-1][1] = c
            else:
                ranges.append([c, c])
    marks = "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)
    return re.compile(f"(?:[^\\W_]|[{marks}])+")


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    import Stemmer  # PyStemmer: the Snowball stemmers, compiled

    stemmer = Stemmer.Stemmer("english")
    stemmer.maxCacheSize = 0  # its own cache would keep words of erased memories; TextIndex memoises
    return stemmer


def words(text: str, stems: dict[str, str] | None = None) -> list[str]:
    """The indexed words of ``text``, in order, repeats kept; ``stems`` memoises the stemmer."""
    if text.isascii():
        tokens = irregular.unwont(text.lower()).translate(_ASCII_SPACES).split()
    else:
        folded = irregular.unwont(text.casefold())
        tokens = _word().findall(_MARKS.sub("", unicodedata.normalize("NFKD", folded)))
    stems = {} if stems is None else stems
    get = stems.get
    out = []
    for token in tokens:
        stem = get(token)
        if stem is None:  # '' for a token that is no word: memoised too
            stem = stems[token] = "" if len(token) > MAX_WORD or token in STOP_WORDS else _stem(token)
        if stem:
            out.append(stem)
    return out


def _stem(token: str) -> str:
    return str(_stemmer().stemWord(irregular.BASE.get(token, token)))


class TextIndex:
    """The words of memories ``0..n-1`` of one owner, appended to as the owner writes.

    Several snapshots of an owner's rows may share one index: each reads only the
    memories it holds (the first ``n``), since writes only append.
    """

    def __init__(self, contents: Iterable[str] = ()) -> None:
        #: word -> (memory positions, ascending; the word's count in each)
        self.postings: dict[str, tuple[list[int], list[int]]] = {}
        self.lengths: list[int] = []
        #: the stems of the words seen, memoised with the index so that they go with it
        self._stems: dict[str, str] = {}
        self._lengths_array: npt.NDArray[np.float64] = np.zeros(0)
        self.add(contents)

    def add(self, contents: Iterable[str]) -> None:
        """Index the next memories' contents."""
        for content in contents:
            position = len(self.lengths)
            counts = Counter(words(content, self._stems))
            self.lengths.append(sum(counts.values()))
            for word, count in counts.items():
                rows, tfs = self.postings.setdefault(word, ([], []))
                rows.append(position)
                tfs.append(count)

    def _lengths(self, n: int) -> npt.NDArray[np.float64]:
        if len(self._lengths_array) != n:
            self._lengths_array = np.asarray(self.lengths[:n], dtype=np.float64)
        return self._lengths_array

    def scores(self, query: str, searchable: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
        """BM25 of each of the first ``len(searchable)`` memories, with the statistics of ``searchable``."""
        n = len(searchable)
        scores = np.zeros(n)
        count = int(searchable.sum())
        if not count:
            return scores
        lengths = self._lengths(n)
        average = float(lengths[searchable].mean()) or 1.0
        for word in sorted(set(words(query, self._stems))):  # a fixed order: the same sums to the last bit
            posting = self.postings.get(word)
            if posting is None:
                continue
            end = bisect_left(posting[0], n)
            rows = np.asarray(posting[0][:end], dtype=np.int64)
            tfs = np.asarray(posting[1][:end], dtype=np.float64)
            kept = searchable[rows]
            rows, tfs = rows[kept], tfs[kept]
            if not len(rows):
                continue
            df = len(rows)
            idf = math.log(1 + (count - df + 0.5) / (df + 0.5))
            norm = K1 * (1 - B + B * lengths[rows] / average)
            scores[rows] += idf * tfs * (K1 + 1) / (tfs + norm)
        return scores


def ranked(
    index: TextIndex, memories: Sequence[Memory], query: str, searchable: npt.NDArray[np.bool_], k: int
) -> list[SearchResult]:
    """The ``k`` best of ``memories`` (those ``searchable``) for ``query``; ties by :func:`rank_key`."""
    scores = index.scores(query, searchable)
    hits = np.flatnonzero(scores > 0)
    if len(hits) > k:  # every memory tied with the k-th stays, for rank_key to order
        kth = np.partition(scores[hits], len(hits) - k)[len(hits) - k]
        hits = hits[scores[hits] >= kth]
    found = [SearchResult(memories[int(i)], float(scores[i])) for i in hits]
    return sorted(found, key=rank_key)[:k]
