"""How search results are ordered and fused (pure functions over :class:`SearchResult` lists).

Ranking is deterministic: results are ordered by score, then content (by code
point), then write order (``seq``), so the same data and query give the same
results on every run and every backend whose scores agree.

Hybrid search fuses the vector and the full-text ranking by their scores, not only their
ranks. Its candidates are the ``POOL`` nearest by vector and the ``POOL`` best by full
text, whatever ``k``; the vector ranking scores every one of them (of the store's model)
by its best cosine, of its whole vector's and its sentences' (:mod:`._sentences`), so a
memory found by its words is also weighed by its meaning. Each ranking's scores are
min-max normalised over its candidates, then averaged with weights (``VECTOR_WEIGHT``,
``1 - VECTOR_WEIGHT``), so a memory far ahead in one ranking stays ahead of memories
mediocre in both. A memory the agent said (``metadata["speaker"] == "assistant"``) is
multiplied by ``ASSISTANT_WEIGHT`` unless the query says "you": what is asked about a
person is mostly what they said. A memory that opens its session (the first the owner
stored in it, which the backend tells: ``_first_writes``) is multiplied by ``1 + OPENER_WEIGHT``:
what a person comes to tell or ask is mostly in their first message. Then each memory
takes a share (``CONTEXT_WEIGHT``) of the best fused score of its neighbours: the memories
written just before and after it in the same session (``provenance.session_id``), so a
short answer ("Yes, last Saturday!") is found through the question it answers. Last, a long memory (more than
``LENGTH_PIVOT`` characters) is scored down by ``1 + LENGTH_WEIGHT * ln(length /
LENGTH_PIVOT)``: a long text (such as a chat assistant's reply) shares words and topic
with many queries, while what a person stated is mostly short; it still lends its whole
match to its neighbours, since context is added before. When the query names a period
("four weeks ago", "in June": :mod:`._when`), the memories written in it are candidates
too, and their score is multiplied by ``1 + TIME_WEIGHT``. The constants were chosen on
the development split of ``bench/retrieval.py`` and are reported on its held-out split.

These steps after the vector score are the named stages of :data:`STAGES`, run in this
order: ``bm25`` (the full-text ranking fused in), ``speaker`` (the agent's words weighed
down), ``opener`` (the session's first memory lifted), ``context`` (neighbours lend their
score), ``length`` (the length prior) and ``time`` (the period the query names, which also
adds its memories as candidates). ``Fusion(without=("opener",))`` leaves a stage out by
name; ``python -m bench.sentences --stages`` measures each one left out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from statekeep._check import MAX_INT, check_int, check_number
from statekeep.errors import InvalidInputError
from statekeep.memory._types import Memory, SearchResult

#: The constant of reciprocal-rank fusion: score = sum(1 / (RRF_K + rank)).
RRF_K = 60
#: Candidates taken from each ranking of a hybrid search, whatever ``k`` (at least ``k``).
POOL = 50
#: The weight of the vector ranking in a hybrid search (the full-text ranking has the rest).
VECTOR_WEIGHT = 0.5
#: The share of its best neighbour's fused score that a memory adds to its own.
CONTEXT_WEIGHT = 0.3
#: Neighbours: memories of the same session at most this far apart in write order.
CONTEXT_SPAN = 1
#: Memories longer than this (characters, about 150 tokens) are scored down by their length.
LENGTH_PIVOT = 600
#: How much: a fused score is divided by ``1 + LENGTH_WEIGHT * ln(length / LENGTH_PIVOT)``.
LENGTH_WEIGHT = 1.0
#: A memory written in the period the query names (:mod:`._when`: "four weeks ago") has its fused
#: score multiplied by ``1 + TIME_WEIGHT``; 0 reads no period from the query.
TIME_WEIGHT = 2.0
#: A memory the agent said (``metadata["speaker"] == "assistant"``, the chat role's name) has its
#: fused score multiplied by this, unless the query addresses the agent (:data:`ADDRESSES_AGENT`):
#: what is asked about a person is mostly what they said, not what the agent answered.
ASSISTANT_WEIGHT = 0.7
#: The memory that opens its session (no memory of the same ``provenance.session_id`` was written before
#: it) has its fused score multiplied by ``1 + OPENER_WEIGHT``, before it lends context: what a person
#: comes to tell or ask is mostly in their first message; 0 turns it off.
OPENER_WEIGHT = 0.35
#: A query with one of these words asks about what the agent said ("what did you suggest?").
ADDRESSES_AGENT = re.compile(r"\b(you|your|yours)\b", re.IGNORECASE)
#: Bounds of :class:`Fusion`'s knobs: candidates (and neighbours) per search, and a weight.
MAX_POOL = 10_000
MAX_WEIGHT = 100.0


@dataclass(frozen=True)
class Fusion:
    """The knobs of hybrid search (defaults: the module constants), a store's ``fusion`` attribute.

    A store of long texts (documents rather than statements) can turn the length
    prior off: ``store.fusion = Fusion(length_weight=0)``.
    """

    pool: int = POOL
    vector_weight: float = VECTOR_WEIGHT
    context_weight: float = CONTEXT_WEIGHT
    context_span: int = CONTEXT_SPAN
    length_pivot: int = LENGTH_PIVOT
    length_weight: float = LENGTH_WEIGHT
    time_weight: float = TIME_WEIGHT
    assistant_weight: float = ASSISTANT_WEIGHT
    opener_weight: float = OPENER_WEIGHT
    #: The stages of :data:`STAGES` left out, by name (``("time",)``: no period read from the query).
    without: tuple[str, ...] = ()

    #: The names of the stages hybrid search runs, in order: :data:`STAGES` less ``without``.
    stages: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Raises InvalidInputError for a knob out of range (a pivot of 0 would divide by zero at search)
        or a stage that is not one of :data:`STAGES`."""
        without = self.without
        if isinstance(without, str) or not isinstance(without, Iterable):
            raise InvalidInputError(f"must be a list of stage names, of {list(STAGES)}", field="without")
        names = list(without)
        if not all(isinstance(n, str) and n in STAGES for n in names):
            raise InvalidInputError(f"must name stages of {list(STAGES)}", field="without")
        object.__setattr__(self, "without", tuple(n for n in STAGES if n in names))
        object.__setattr__(self, "stages", tuple(n for n in STAGES if n not in names))
        ints = {"pool": (1, MAX_POOL), "context_span": (0, MAX_POOL), "length_pivot": (1, MAX_INT)}
        for name, (low, high) in ints.items():
            object.__setattr__(self, name, check_int(getattr(self, name), name, minimum=low, maximum=high))
        weights = {
            "vector_weight": 1.0,
            "context_weight": MAX_WEIGHT,
            "length_weight": MAX_WEIGHT,
            "time_weight": MAX_WEIGHT,
            "assistant_weight": 1.0,
            "opener_weight": MAX_WEIGHT,
        }
        for name, most in weights.items():
            object.__setattr__(self, name, check_number(getattr(self, name), name, maximum=most))


def rank_key(hit: SearchResult) -> tuple[float, str, int]:
    """The order of search results: best score first, then content (by code point), then write order."""
    return (-hit.score, hit.memory.content, hit.memory.seq)


def top_k(
    fetch: Callable[[int], list[SearchResult]], k: int, first: list[SearchResult] | None = None
) -> list[SearchResult]:
    """The ``k`` best of an engine that ranks by score but cuts ties at its limit arbitrarily.

    ``fetch(n)`` returns the ``n`` best by score, ties in any order. Rows tied
    with the k-th could be left out by its limit, so fetch more until the last
    row fetched scores below the k-th: then every tied row was seen, and
    :func:`rank_key` decides among them. ``first``: what ``fetch(k + 1)`` returned
    already (fetched along with something else).
    """
    n = k + 1
    got = fetch(n) if first is None else first
    while True:
        hits = sorted(got, key=rank_key)
        if len(hits) < n or hits[-1].score < hits[k - 1].score:
            return hits[:k]
        n *= 4
        got = fetch(n)


def fuse(rankings: Sequence[Sequence[SearchResult]], k: int) -> list[SearchResult]:
    """Reciprocal-rank fusion of several rankings into the top ``k`` (ties by :func:`rank_key`)."""
    scores: dict[str, float] = {}
    memories: dict[str, Memory] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, start=1):
            scores[hit.memory.id] = scores.get(hit.memory.id, 0.0) + 1.0 / (RRF_K + rank)
            memories[hit.memory.id] = hit.memory
    fused = [SearchResult(memories[i], score) for i, score in scores.items()]
    return sorted(fused, key=rank_key)[:k]


def normalized(ranking: Sequence[SearchResult]) -> dict[str, float]:
    """Each memory's score scaled to [0, 1] over the ranking (min-max; all 1.0 if they are equal)."""
    if not ranking:
        return {}
    scores = [h.score for h in ranking]
    low, high = min(scores), max(scores)
    span = high - low
    return {h.memory.id: (h.score - low) / span if span > 0 else 1.0 for h in ranking}


@dataclass(frozen=True)
class Scoring:
    """What every stage of hybrid search reads: the candidates, both rankings, the query and its knobs."""

    memories: dict[str, Memory]
    text: dict[str, float]  # the full-text ranking's, normalised
    fusion: Fusion
    window: tuple[datetime, datetime] | None
    query: str
    openers: Collection[str]


#: A stage of hybrid search: the fused scores so far, and what it reads, to the next scores.
Stage = Callable[[dict[str, float], Scoring], dict[str, float]]


def bm25_stage(scores: dict[str, float], s: Scoring) -> dict[str, float]:
    """The full-text (BM25) ranking fused in: ``vector_weight`` of the vector score, the rest the text's."""
    w = s.fusion.vector_weight
    return {i: w * v + (1 - w) * s.text.get(i, 0.0) for i, v in scores.items()}


def speaker_stage(scores: dict[str, float], s: Scoring) -> dict[str, float]:
    """The agent's own words multiplied by ``assistant_weight``, unless the query addresses the agent."""
    if s.fusion.assistant_weight >= 1 or ADDRESSES_AGENT.search(s.query):
        return scores
    a = s.fusion.assistant_weight
    return {i: v * a if said_by_agent(s.memories[i]) else v for i, v in scores.items()}


def opener_stage(scores: dict[str, float], s: Scoring) -> dict[str, float]:
    """The memories that open their session multiplied by ``1 + opener_weight``."""
    if s.fusion.opener_weight <= 0 or not s.openers:
        return scores
    lift = 1 + s.fusion.opener_weight
    return {i: v * lift if i in s.openers else v for i, v in scores.items()}


def context_stage(scores: dict[str, float], s: Scoring) -> dict[str, float]:
    """Each memory plus ``context_weight`` of its best session neighbour's score (:func:`with_context`)."""
    if s.fusion.context_weight <= 0:
        return scores
    return with_context(scores, s.memories, s.fusion.context_weight, s.fusion.context_span)


def length_stage(scores: dict[str, float], s: Scoring) -> dict[str, float]:
    """Memories longer than ``length_pivot`` divided by their :func:`length_penalty`."""
    f = s.fusion
    if f.length_weight <= 0:
        return scores
    return {
        i: v / length_penalty(len(s.memories[i].content), f.length_pivot, f.length_weight)
        for i, v in scores.items()
    }


def time_stage(scores: dict[str, float], s: Scoring) -> dict[str, float]:
    """The memories written in the period the query names multiplied by ``1 + time_weight``."""
    if s.window is None:  # a weight of 0 multiplies by 1
        return scores
    since, until = s.window
    boost = 1 + s.fusion.time_weight
    return {i: v * boost if since <= s.memories[i].created_at < until else v for i, v in scores.items()}


#: The stages of hybrid search by name, in the order they run (each one can be left out by name:
#: ``Fusion(without=("opener",))``); the fused score starts as the normalised vector score.
STAGES: dict[str, Stage] = {
    "bm25": bm25_stage,
    "speaker": speaker_stage,
    "opener": opener_stage,
    "context": context_stage,
    "length": length_stage,
    "time": time_stage,
}


def fuse_scores(
    vector: Sequence[SearchResult],
    text: Sequence[SearchResult],
    k: int,
    fusion: Fusion = Fusion(),
    window: tuple[datetime, datetime] | None = None,
    query: str = "",
    openers: Collection[str] = (),
) -> list[SearchResult]:
    """Score-aware fusion of a vector and a full-text ranking, then the other stages of
    :data:`STAGES` that ``fusion`` runs (:attr:`Fusion.stages`): the agent's own words weighed
    down unless ``query`` addresses the agent, the session's first memory lifted, session
    context, a length prior and the period the query names (``window``, ``[since, until)``);
    the top ``k``.

    Scores are in [0, (1 + ``opener_weight``) * (1 + ``context_weight``) * (1 + ``time_weight``)];
    ties are broken by :func:`rank_key`. ``openers``: the ids of the memories that open their
    session (``_openers``).
    """
    memories = {h.memory.id: h.memory for h in (*text, *vector)}
    v = normalized(vector)
    scoring = Scoring(memories, normalized(text), fusion, window, query, openers)
    fused = {i: v.get(i, 0.0) for i in memories}
    for name in fusion.stages:
        fused = STAGES[name](fused, scoring)
    hits = [SearchResult(memories[i], score) for i, score in fused.items()]
    return sorted(hits, key=rank_key)[:k]


def said_by_agent(memory: Memory) -> bool:
    """Whether the memory is the agent's own turn: its ``metadata["speaker"]`` is ``"assistant"``."""
    speaker = memory.metadata.get("speaker")
    return isinstance(speaker, str) and speaker.lower() == "assistant"


def with_context(
    scores: dict[str, float], memories: dict[str, Memory], weight: float, span: int
) -> dict[str, float]:
    """Each score plus ``weight`` times the best score of its session neighbours among the candidates."""
    by_session: dict[str, list[Memory]] = {}
    for m in memories.values():
        if m.provenance.session_id is not None:
            by_session.setdefault(m.provenance.session_id, []).append(m)
    out = dict(scores)
    for group in by_session.values():
        group.sort(key=lambda m: m.seq)
        for i, m in enumerate(group):
            near = [
                scores[n.id]
                for n in group[max(0, i - span) : i + span + 1]
                if n.id != m.id and abs(n.seq - m.seq) <= span
            ]
            if near:
                out[m.id] = scores[m.id] + weight * max(near)
    return out


def first_writes(sessions: Iterable[tuple[str | None, int]]) -> dict[str, int]:
    """The lowest write order (``seq``) of each session, from (session id, seq) pairs (no session: none)."""
    first: dict[str, int] = {}
    for session, seq in sessions:
        if session is not None and seq < first.get(session, seq + 1):
            first[session] = seq
    return first


def openers_of(memories: Iterable[Memory], first: dict[str, int]) -> set[str]:
    """The ids of ``memories`` written first in their session, ``first`` the lowest ``seq`` of each."""
    return {m.id for m in memories if (s := m.provenance.session_id) is not None and first.get(s) == m.seq}


def openers_among(stored: Iterable[Memory], memories: Iterable[Memory]) -> set[str]:
    """The ids of ``memories`` that open their session among ``stored`` (an owner's memories, in any
    order) and themselves: none of the same ``provenance.session_id`` has a lower ``seq``."""
    memories = list(memories)
    first = first_writes((m.provenance.session_id, m.seq) for m in (*memories, *stored))
    return openers_of(memories, first)


def length_penalty(length: int, pivot: int, weight: float) -> float:
    """The divisor of a fused score: 1 up to ``pivot`` characters, then 1 + weight * ln(length / pivot)."""
    return 1.0 + weight * math.log(length / pivot) if length > pivot else 1.0
