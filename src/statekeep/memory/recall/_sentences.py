"""A vector per sentence of a short memory, besides the vector of its whole text.

What a person tells an assistant often hides one fact in a longer message ("Can
you suggest workout playlists? By the way, I take Zumba on Tuesdays"): the
vector of the whole is mostly the request, and a question about the fact is far
from it. So a memory of two or more sentences, and of at most
``MemoryStore.sentence_chars`` characters (a long text is scored down by its
length anyway), also keeps a vector per sentence (its first
:data:`MAX_SENTENCES`), embedded in the same batch as the whole. Hybrid search
scores each candidate by the best cosine of its whole vector and its sentences
(:func:`best_cosines`); the candidates still come from the whole vectors and the
full text, so no index holds sentences. A sentence's text repeats the label its
memory starts with ("Caroline: ..."), so that a turn of a conversation keeps its
speaker. ``bench/sentences.py`` takes the search apart, and ``bench/retrieval.py``
measures the store.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from statekeep.memory.embedders import FEW, Vectors

#: A memory's sentences: split after . ! ? and at line breaks.
_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")
#: A label the text starts with ("Caroline: ...", "user: ..."): who said it, repeated on each sentence.
_LABEL = re.compile(r"[^\s:][^:\n]{0,39}:\s")
#: A piece of fewer words joins the sentence before it ("Yes. Thanks!" is one sentence).
MIN_WORDS = 4
#: Memories of at most this many characters keep sentence vectors (``MemoryStore.sentence_chars``):
#: the length prior's pivot (:data:`._ranking.LENGTH_PIVOT`), past which memories are scored down.
SENTENCE_CHARS = 600
#: Sentences embedded per memory, at most (its first ones).
MAX_SENTENCES = 16
#: The sentence vectors of each memory of a batch (rows of unit vectors; none: a memory split into
#: fewer than two sentences), None for a memory never split (too long, or a store without sentences).
Parts = list[Vectors | None]


def sentences(text: str, most: int = MAX_SENTENCES) -> list[str]:
    """The first ``most`` sentences of a text, when it has two or more (else none).

    When the text starts with a label (up to 40 characters and a colon: "Caroline: ..."),
    each sentence after the first starts with it too, so that its vector knows who said it.

    Examples:
        >>> sentences("Mel: I went hiking. The view from the top was amazing!")
        ['Mel: I went hiking.', 'Mel: The view from the top was amazing!']
        >>> sentences("I went hiking. Yes. Thanks!")
        []
    """
    out: list[str] = []
    for piece in (p.strip() for p in _SPLIT.split(text)):
        if not piece:
            continue
        if out and len(piece.split()) < MIN_WORDS:
            out[-1] += " " + piece
        else:
            out.append(piece)
    if len(out) < 2:
        return []
    label = _LABEL.match(text)
    if label is None:
        return out[:most]
    return [out[0], *(label.group(0) + s for s in out[1:most])]


def embed_with_sentences(
    embed: Callable[[Sequence[str]], Vectors], texts: Sequence[str], most_chars: int
) -> tuple[Vectors, Parts]:
    """The vectors of ``texts`` and of the sentences of each text of at most ``most_chars``
    characters (0: no sentences), in one call of ``embed``. A text split into fewer than two
    sentences gets an empty array (split, and none), a longer one None (never split: what
    ``MemoryStore.embed_sentences`` looks for); for at most :data:`.embedders.FEW`
    memories, in calls of at most that many texts, which the default embedder runs in numpy
    (one ``remember`` never loads torch, however many sentences its memory has)."""
    split = [sentences(t) if len(t) <= most_chars else None for t in texts]
    flat = [s for ss in split if ss for s in ss]
    everything = [*texts, *flat]
    if len(texts) <= FEW < len(everything):  # a few memories: FEW texts a call, in numpy, never torch
        vectors = np.concatenate([embed(everything[i : i + FEW]) for i in range(0, len(everything), FEW)])
    else:
        vectors = embed(everything)
    return np.ascontiguousarray(vectors[: len(texts)]), _cut(vectors, split, len(texts))


def sentence_vectors_of(
    embed: Callable[[Sequence[str]], Vectors], texts: Sequence[str], dimension: int
) -> list[Vectors]:
    """The sentence vectors of each text (an empty array for one of fewer than two sentences),
    in one call of ``embed`` (none when no text has sentences)."""
    split = [sentences(t) for t in texts]
    flat = [s for ss in split for s in ss]
    vectors = embed(flat) if flat else np.zeros((0, dimension), dtype=np.float32)
    return [p for p in _cut(vectors, split, 0) if p is not None]


def _cut(vectors: Vectors, split: Sequence[list[str] | None], at: int) -> Parts:
    """Each text's rows of ``vectors`` (its sentences', from row ``at`` on, in order), or None for a
    text not split (too long); an empty array for one split into fewer than two sentences."""
    parts: Parts = []
    for ss in split:
        parts.append(None if ss is None else vectors[at : at + len(ss)].copy())
        at += len(ss or ())
    return parts


def best_cosines(wholes: Vectors, parts: Sequence[Vectors | None], vector: Vectors) -> list[float]:
    """Memories' scores against a query: the best cosine of each one's whole vector (a row of
    ``wholes``) and its sentences' (``parts``). Unit vectors; each row summed alone in float64,
    so that equal vectors score exactly alike wherever they are."""
    query = vector.astype(np.float64)
    best = (wholes.astype(np.float64) * query).sum(axis=1)
    held = [(i, p) for i, p in enumerate(parts) if p is not None and len(p)]
    if held:
        flat = np.concatenate([p for _, p in held]).astype(np.float64)
        starts = np.cumsum([0, *(len(p) for _, p in held[:-1])])
        each = np.maximum.reduceat((flat * query).sum(axis=1), starts)
        rows = [i for i, _ in held]
        best[rows] = np.maximum(best[rows], each)
    return [float(b) for b in best]


def take(parts: Parts | None, rows: Sequence[int]) -> Parts | None:
    """The parts of the given rows of a batch (None stays None: a write without sentences)."""
    return None if parts is None else [parts[i] for i in rows]
