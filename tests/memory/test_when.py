"""The period a query names ("four weeks ago", "last Saturday", "in June"): read at the search's time,
its memories become candidates of hybrid search and are scored up, on every backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from statekeep.errors import InvalidInputError
from statekeep.memory import Embedder, MemoryInput, MemoryStore, Provenance
from statekeep.memory._types import Filters
from statekeep.memory.recall._ranking import Fusion
from statekeep.memory.recall._when import window

from .conftest import Clock, StoreFactory

#: What was bought four weeks before NOW.
BOUGHT = "user: I bought a blue road bike today, a Trek."
#: A Saturday afternoon.
NOW = datetime(2023, 4, 1, 15, 30, tzinfo=UTC)


def day(iso: str) -> datetime:
    return datetime.fromisoformat(iso).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("query", "since", "until"),
    [
        ("Which bike did I buy four weeks ago?", "2023-02-25", "2023-03-12"),  # 28 days back, 7 each side
        (
            "Which book did I finish a week ago?",
            "2023-03-23T06:00",
            "2023-03-27T18:00",
        ),  # 1.75 days each side
        ("I cooked something for a friend a couple of days ago. What?", "2023-03-29", "2023-04-01"),
        ("What did I do 3 days ago?", "2023-03-28", "2023-03-31"),  # a day each side at least
        ("Where did I go two months ago?", "2023-01-14T21:36", "2023-02-15T08:09:36"),  # 60.88 days back
        ("What did I plant yesterday?", "2023-03-31", "2023-04-01"),
        ("Who did I meet last Saturday?", "2023-03-25", "2023-03-26"),  # today is Saturday: the one before
        ("Who called me last Wednesday?", "2023-03-29", "2023-03-30"),
        ("What did we eat last weekend?", "2023-03-25", "2023-03-27"),
        ("How many plants did I get in the past month?", "2023-02-21T22:48", "2023-04-02"),  # until tomorrow
        ("What did I read during March?", "2023-02-26", "2023-04-04"),
        ("Where was I in June?", "2022-05-29", "2022-07-04"),  # June is still to come: last year's
        ("Where was I in May 2021?", "2021-04-28", "2021-06-04"),
        ("What should I watch tonight?", "2023-04-01", "2023-04-02"),
        ("Which bike did I service the past weekend?", "2023-03-25", "2023-03-27"),
        ("How many classes did I take this week?", "2023-03-27", "2023-04-02"),  # from Monday
        ("What have I earned this month?", "2023-04-01", "2023-04-02"),
        ("How many weddings have I attended this year?", "2023-01-01", "2023-04-02"),
        ("What have I spent since the start of the year?", "2023-01-01", "2023-04-02"),
        ("Which airline did I fly on Valentine\u2019s day?", "2023-02-14", "2023-02-18"),  # and 3 days after
        ("Who came over on Christmas Eve?", "2022-12-24", "2022-12-28"),  # still to come: last year's
        ("What did I cook at Christmas?", "2022-12-25", "2022-12-29"),
        ("Where was I on New Years Day?", "2023-01-01", "2023-01-05"),
    ],
)
def test_a_period_is_read_from_the_query_at_the_searchs_time(query: str, since: str, until: str) -> None:
    assert window(query, NOW) == (day(since), day(until))


@pytest.mark.parametrize(
    "query",
    [
        "What did I buy?",
        "May I ask what my favourite tea is?",  # 'may' without a year is a verb
        "Which agency did I use?",  # 'ago' inside a word
        "What happened 9999 years ago?",  # before the calendar: no period, no error
        "Where was I in March 0000?",
        "Any plans for this weekend?",  # a weekend to come is not a period of memories
        "What are my new year's resolutions?",  # the new year, not its first day
    ],
)
def test_a_query_without_a_period_has_none(query: str) -> None:
    assert window(query, NOW) is None


def test_the_time_weight_is_a_checked_knob() -> None:
    with pytest.raises(InvalidInputError) as refused:
        Fusion(time_weight=-1.0)
    assert refused.value.field == "time_weight"
    assert Fusion(time_weight=0).time_weight == 0


def _diary(make_store: StoreFactory, embedder: Embedder) -> tuple[Clock, MemoryStore]:
    """A store with one purchase four weeks before NOW, and many more like it on other days."""
    clock = Clock()
    store = make_store(embedder, clock=clock)
    said = {
        NOW - timedelta(days=28): BOUGHT,
        **{NOW - timedelta(days=60 + 2 * n): f"user: I bought a bike today, model {n}." for n in range(12)},
    }
    said |= {NOW - timedelta(days=n): f"user: The weather was grey and wet on day {n}." for n in (27, 75, 90)}
    for at, text in sorted(said.items()):
        clock.now = at
        store.remember("u", text, provenance=Provenance("user_supplied", session_id=at.date().isoformat()))
    clock.now = NOW
    return clock, store


def test_the_memory_of_the_named_period_comes_first(
    make_store: StoreFactory, real_embedder: Embedder
) -> None:
    """Twelve purchases match the question better than the one told four weeks ago; the period
    multiplies that one's score by 1 + time_weight (3) and leaves the others' as they were."""
    _, store = _diary(make_store, real_embedder)
    query = "Which bike did I buy four weeks ago?"
    store.fusion = Fusion(time_weight=0)
    plain = store.search("u", query, k=13)
    store.fusion = Fusion()
    timed = store.search("u", query, k=13)
    assert timed[0].memory.content == BOUGHT
    assert plain[0].memory.content != BOUGHT
    before = {h.memory.content: h.score for h in plain}
    after = {h.memory.content: h.score for h in timed}
    assert after.keys() == before.keys()
    assert after.pop(BOUGHT) == pytest.approx(3 * before.pop(BOUGHT))
    assert after == pytest.approx(before)


def test_the_memories_of_the_period_are_searched_for_as_candidates(
    make_store: StoreFactory, real_embedder: Embedder
) -> None:
    """A second pair of rankings, narrowed to the period (and the caller's filters), adds its
    memories to the candidates; with ``time_weight=0`` no period is read and one search is made."""
    _, store = _diary(make_store, real_embedder)
    calls: list[tuple[Filters, set[str]]] = []
    hybrid = store._hybrid

    def spy(*args: Any) -> Any:
        near, text = hybrid(*args)
        calls.append((args[4], {h.memory.content for h in near}))
        return near, text

    store._hybrid = spy  # type: ignore[method-assign,assignment]
    store.fusion = Fusion(time_weight=0)
    store.search("u", "Which bike did I buy four weeks ago?", k=1, tags=())
    assert len(calls) == 1
    calls.clear()
    store.fusion = Fusion()
    store.search("u", "Which bike did I buy four weeks ago?", k=1)
    assert len(calls) == 2
    (plain, _), (during, found) = calls
    assert (plain.since, plain.until) == (None, None)
    assert (during.since, during.until) == window("Which bike did I buy four weeks ago?", NOW)
    assert found == {BOUGHT, "user: The weather was grey and wet on day 27."}  # the period's, and only those


def test_the_callers_filters_still_bound_the_search(
    make_store: StoreFactory, real_embedder: Embedder
) -> None:
    """A period outside the caller's ``since`` adds nothing: no memory before ``since`` is returned."""
    _, store = _diary(make_store, real_embedder)
    since = NOW - timedelta(days=20)
    assert store.search("u", "Which bike did I buy four weeks ago?", since=since) == []
    older = NOW - timedelta(days=70)
    hits = store.search("u", "Which bike did I buy four weeks ago?", k=20, until=older)
    assert hits
    assert all(h.memory.created_at < older for h in hits)


def test_three_weeks_ago_picks_that_weeks_memory_among_alike_ones(
    make_store: StoreFactory, real_embedder: Embedder
) -> None:
    """Six memories that differ by a number only, one a week: the one of three weeks ago comes first."""
    clock = Clock()
    store = make_store(real_embedder, clock=clock)
    texts = [f"user: On day {n} I went to the market and bought apples." for n in range(6)]
    for n, text in enumerate(texts):
        clock.now = NOW - timedelta(days=7 * n)
        store.remember_many("u", [MemoryInput(text, provenance=Provenance("user_supplied"))])
    clock.now = NOW
    hits = store.search("u", "What did I buy at the market three weeks ago?", k=6)
    assert hits[0].memory.content == texts[3]
    assert {h.memory.content for h in hits} == set(texts)
