"""Hybrid search is a list of named stages run in order, each of which can be left out by name."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from statekeep.errors import InvalidInputError
from statekeep.memory import FakeEmbedder, InMemoryMemoryStore, Memory, Provenance, SearchResult
from statekeep.memory.recall._ranking import STAGES, Fusion, fuse_scores

from .test_fusion import NOW
from .test_fusion import memory as fusion_memory

WINDOW = (NOW - timedelta(days=1), NOW + timedelta(days=1))


def memory(n: int, content: str, session: str, speaker: str, days: int) -> Memory:
    """test_fusion's memory, written ``days`` before NOW."""
    return dataclasses.replace(
        fusion_memory(n, content, session, speaker), created_at=NOW - timedelta(days=days)
    )


def rankings() -> tuple[list[SearchResult], list[SearchResult]]:
    """Memories that every stage scores differently: agent's words, openers, neighbours, long texts, dates."""
    ms = [
        memory(1, "the first thing said", "s1", "user", 0),
        memory(2, "an answer " * 120, "s1", "assistant", 0),
        memory(3, "yes, last saturday", "s1", "user", 5),
        memory(4, "another session opens", "s2", "user", 9),
        memory(5, "and goes on", "s2", "assistant", 9),
    ]
    vector = [SearchResult(m, s) for m, s in zip(ms, (0.9, 0.7, 0.4, 0.6, 0.2), strict=True)]
    text = [SearchResult(m, s) for m, s in zip(ms, (1.0, 6.0, 3.0, 0.5, 2.0), strict=True)]
    return vector, text


def test_the_stages_run_in_this_order_and_the_default_runs_them_all() -> None:
    """BM25 fused in, the agent's words, the session's opener, neighbour context, length, time."""
    assert list(STAGES) == ["bm25", "speaker", "opener", "context", "length", "time"]
    assert Fusion().stages == tuple(STAGES)
    assert Fusion(without=("time", "bm25")).stages == ("speaker", "opener", "context", "length")
    assert Fusion(without=("time", "bm25", "time")).without == ("bm25", "time")  # in the stages' order, once


@pytest.mark.parametrize("without", ["time", ["nope"], [1], None, ["Time"]])
def test_a_stage_is_left_out_by_its_exact_name_in_a_list(without: Any) -> None:
    with pytest.raises(InvalidInputError) as raised:
        Fusion(without=without)
    assert raised.value.field == "without"


#: Each stage, and the knobs that make it do nothing: leaving it out must rank exactly as they do.
IDLE: dict[str, dict[str, Any]] = {
    "bm25": {"vector_weight": 1.0},
    "speaker": {"assistant_weight": 1.0},
    "opener": {"opener_weight": 0.0},
    "context": {"context_weight": 0.0},
    "length": {"length_weight": 0.0},
    "time": {"time_weight": 0.0},
}


@pytest.mark.parametrize("stage", list(STAGES))
def test_leaving_a_stage_out_by_name_ranks_as_its_knob_at_rest(stage: str) -> None:
    """Scores and order equal, and differ from the default's: each stage changes this ranking."""
    assert set(IDLE) == set(STAGES)
    vector, text = rankings()
    window = None if stage == "time" else WINDOW  # a time weight of 0 reads no period (the store)
    args: dict[str, Any] = {"query": "what was said?", "openers": {"m1", "m4"}}
    left_out = fuse_scores(vector, text, 5, Fusion(without=(stage,)), window=window, **args)
    at_rest = fuse_scores(vector, text, 5, Fusion(**IDLE[stage]), window=window, **args)
    assert left_out == at_rest
    default = fuse_scores(vector, text, 5, Fusion(), window=WINDOW, **args)
    assert [(h.memory.id, h.score) for h in left_out] != [(h.memory.id, h.score) for h in default]


def test_a_store_leaves_a_stage_out_by_name_as_it_does_with_the_knob_at_rest() -> None:
    """Left out by name, ``time`` reads no period (one pair of rankings, no second search) and
    ``opener`` asks the backend for no opener, as with their weights at 0; the results are equal."""
    now = [NOW - timedelta(days=40)]
    store = InMemoryMemoryStore(FakeEmbedder(), clock=lambda: now[0])
    for day in (28, 29, 35, 40):
        now[0] = NOW - timedelta(days=day)
        for n in range(2):
            text = f"I bought bike {day}-{n}"
            store.remember("u", text, provenance=Provenance("user_supplied", session_id=str(day)))
    now[0] = NOW
    calls: list[str] = []
    hybrid, openers = store._hybrid, store._openers

    def counted_hybrid(*args: Any) -> Any:
        calls.append("hybrid")
        return hybrid(*args)

    def counted_openers(*args: Any) -> Any:
        calls.append("openers")
        return openers(*args)

    store._hybrid = counted_hybrid  # type: ignore[method-assign,assignment]
    store._openers = counted_openers  # type: ignore[method-assign,assignment]
    query = "Which bike did I buy four weeks ago?"
    for stage, knob in (("time", {"time_weight": 0.0}), ("opener", {"opener_weight": 0.0})):
        results = []
        for fusion in (Fusion(without=(stage,)), Fusion(**knob)):  # type: ignore[arg-type]
            calls.clear()
            store.fusion = fusion
            results.append((store.search("u", query, k=8), list(calls)))
        assert results[0] == results[1]
        assert ("openers" in results[0][1]) == (stage != "opener")
        assert results[0][1].count("hybrid") == (1 if stage == "time" else 2)
    store.fusion = Fusion()
    calls.clear()
    store.search("u", query, k=8)
    assert calls == ["hybrid", "hybrid", "openers"]
