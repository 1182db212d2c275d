"""Hybrid fusion's length prior: a long memory that only shares the topic does not crowd out the short
statement that says what was asked, and it still lends its match to its session neighbours."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from statekeep.errors import InvalidInputError
from statekeep.memory import Memory, MemoryInput, Provenance, SearchResult
from statekeep.memory.recall._ranking import LENGTH_PIVOT, Fusion, fuse_scores, length_penalty

from .conftest import StoreFactory

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def memory(n: int, content: str, session: str | None = None, speaker: object = None) -> Memory:
    return Memory(
        id=f"m{n}",
        owner="o",
        content=content,
        kind="episodic",
        tags=(),
        metadata={} if speaker is None else {"speaker": speaker},
        provenance=Provenance("imported", session_id=session),
        model="test",
        created_at=NOW,
        seq=n,
    )


def test_the_penalty_is_one_up_to_the_pivot_then_grows_with_the_log_of_the_length() -> None:
    assert length_penalty(1, LENGTH_PIVOT, 1.0) == 1.0
    assert length_penalty(LENGTH_PIVOT, LENGTH_PIVOT, 1.0) == 1.0
    assert length_penalty(LENGTH_PIVOT * 4, LENGTH_PIVOT, 1.0) == pytest.approx(1 + math.log(4))
    assert length_penalty(LENGTH_PIVOT * 4, LENGTH_PIVOT, 0.5) == pytest.approx(1 + 0.5 * math.log(4))
    lengths = [LENGTH_PIVOT * f for f in (1, 2, 5, 20)]
    penalties = [length_penalty(n, LENGTH_PIVOT, 1.0) for n in lengths]
    assert penalties == sorted(penalties)
    assert len(set(penalties)) == len(lengths)


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("length_pivot", 0),  # would divide by zero at the first long memory
        ("length_weight", -1.0),
        ("length_weight", math.inf),
        ("pool", 0),
        ("context_span", -1),
        ("vector_weight", 1.5),
        ("context_weight", math.nan),
        ("pool", "30"),
        ("assistant_weight", 1.5),  # it may only weigh the agent's words down
        ("assistant_weight", -0.1),
    ],
)
def test_a_fusion_knob_out_of_range_is_refused_when_the_fusion_is_made(knob: str, value: object) -> None:
    with pytest.raises(InvalidInputError) as refused:
        Fusion(**{knob: value})  # type: ignore[arg-type]
    assert refused.value.field == knob
    assert Fusion(length_weight=0).length_weight == 0.0  # what the docs suggest stays allowed


def test_a_long_memory_first_in_both_rankings_yields_to_a_short_one_close_behind() -> None:
    long, short, other = memory(1, "x" * 3000), memory(2, "the fact"), memory(3, "unrelated")
    vector = [SearchResult(long, 0.62), SearchResult(short, 0.58), SearchResult(other, 0.10)]
    text = [SearchResult(long, 9.0), SearchResult(short, 8.0), SearchResult(other, 1.0)]
    plain = fuse_scores(vector, text, 3, Fusion(context_weight=0, length_weight=0))
    assert [h.memory.id for h in plain] == ["m1", "m2", "m3"]
    hits = fuse_scores(vector, text, 3, Fusion(context_weight=0))
    assert [h.memory.id for h in hits] == ["m2", "m1", "m3"]
    assert hits[1].score == pytest.approx(plain[0].score / length_penalty(3000, LENGTH_PIVOT, 1.0))
    assert hits[0].score == pytest.approx(plain[1].score)  # short memories keep their score


def test_a_long_memory_lends_its_whole_match_to_its_session_neighbour() -> None:
    """Context is added before the prior: a short turn next to a long, well-matched reply gains its share."""
    ask, reply, far = memory(1, "the question", "s"), memory(2, "y" * 6000, "s"), memory(9, "far away", "t")
    vector = [SearchResult(reply, 0.9), SearchResult(far, 0.5), SearchResult(ask, 0.1)]
    text = [SearchResult(reply, 5.0), SearchResult(far, 3.0), SearchResult(ask, 1.0)]
    fusion = Fusion()
    hits = {h.memory.id: h.score for h in fuse_scores(vector, text, 3, fusion)}
    assert hits["m1"] == pytest.approx(fusion.context_weight * 1.0)  # its own score is 0 after min-max
    assert hits["m2"] == pytest.approx(1 / length_penalty(6000, LENGTH_PIVOT, 1))  # its neighbour's is 0
    assert all(0 <= s <= 1 + fusion.context_weight for s in hits.values())


def test_the_agents_own_words_weigh_less_unless_the_query_addresses_it() -> None:
    """Two memories as well matched: the user's statement and the agent's reply. A question about the
    person puts the statement first and multiplies the reply's score by the weight; a question that
    says "you" leaves both as they were; a speaker that is not the assistant (or not a string) counts
    as the user's."""
    reply = memory(1, "a: same words", speaker="Assistant")
    said, odd = memory(2, "b: same words", speaker="user"), memory(3, "c: same words", speaker=7)
    other = memory(4, "unrelated", speaker="user")
    vector = [SearchResult(m, 0.8) for m in (reply, said, odd)] + [SearchResult(other, 0.1)]
    text = [SearchResult(m, 4.0) for m in (reply, said, odd)] + [SearchResult(other, 1.0)]
    fusion = Fusion(context_weight=0, length_weight=0)
    about_me = fuse_scores(vector, text, 4, fusion, query="What did I buy?")
    assert [h.memory.id for h in about_me] == ["m2", "m3", "m1", "m4"]
    assert about_me[2].score == pytest.approx(fusion.assistant_weight * about_me[0].score)
    to_you = fuse_scores(vector, text, 4, fusion, query="What did YOU suggest I buy?")
    assert [h.memory.id for h in to_you] == ["m1", "m2", "m3", "m4"]  # tied: by content
    assert to_you[0].score == pytest.approx(about_me[0].score)
    off = fuse_scores(vector, text, 4, Fusion(context_weight=0, length_weight=0, assistant_weight=1))
    assert [h.memory.id for h in off] == ["m1", "m2", "m3", "m4"]


@pytest.mark.parametrize("make_store", ["lancedb", "pgvector"], indirect=True)
def test_the_agents_words_are_told_by_the_speaker_in_metadata_on_every_backend(
    make_store: StoreFactory,
) -> None:
    """With the real embedder and each backend's full text: the agent's reply repeats the user's
    words and ranks first, well ahead; a weight of 0.3 puts the user's statement first for a question
    about them (the reply's score is multiplied by it), and a question to the agent ("did you") still
    finds the reply first."""
    store = make_store()
    said = "user: I adopted a rescue greyhound called Biscuit last spring."
    reply = "assistant: Congratulations on adopting Biscuit, your rescue greyhound!"
    filler = [f"user: Day {n} of my pottery course: bowl number {n}." for n in range(20)]
    items = [MemoryInput(t, metadata={"speaker": "user"}) for t in [*filler, said]]
    items.append(MemoryInput(reply, metadata={"speaker": "assistant"}))
    store.remember_many("u", items)
    about_me = "Which rescue greyhound did I adopt?"
    to_you = "Which rescue greyhound did you congratulate me on?"
    store.fusion = Fusion(assistant_weight=1)
    plain = store.search("u", about_me, k=2)
    assert [h.memory.content for h in plain] == [reply, said]
    store.fusion = Fusion(assistant_weight=0.3)
    weighed = store.search("u", about_me, k=2)
    assert [h.memory.content for h in weighed] == [said, reply]
    assert weighed[1].score == pytest.approx(0.3 * plain[0].score)
    assert weighed[0].score == pytest.approx(plain[1].score)
    assert store.search("u", to_you, k=1)[0].memory.content == reply


REPLY = (
    "assistant: Making your own coffee creamer is a great idea! Homemade coffee creamer lets you choose "
    "what goes into your coffee. Here are some coffee creamer ideas: a classic vanilla coffee creamer "
    "with milk and vanilla; a cinnamon coffee creamer with a pinch of spice; a mocha coffee creamer with "
    "cocoa powder; a hazelnut coffee creamer with hazelnut syrup; a pumpkin spice coffee creamer for the "
    "autumn; a coconut coffee creamer with coconut cream; a caramel coffee creamer with a little caramel "
    "sauce. Keep your homemade coffee creamer in a sealed jar in the fridge, shake it before you pour "
    "it, and use it within a week. You can also froth your coffee creamer for a cafe-style drink, or try "
    "an oat milk coffee creamer if you prefer something lighter. For a sweeter coffee creamer, add maple "
    "syrup or condensed milk; for a richer coffee creamer, use half cream and half milk. A coffee creamer "
    "made with cashews blends smooth; soak them overnight first. Many people like a seasonal coffee "
    "creamer: peppermint in winter, lavender in spring, berry in summer. If your coffee creamer separates, "
    "that is normal for homemade ones without stabilisers: just shake the jar. You can flavour a coffee "
    "creamer with almond extract, orange zest or cardamom too. To keep a coffee creamer fresh longer, "
    "sterilise the jar with boiling water, cool it, and pour the creamer in while it is cold. Label each "
    "coffee creamer with the date you made it. A dairy-free coffee creamer from oats is best blended and "
    "strained through a cloth; a nut-based coffee creamer needs a fine sieve. If you want a foamy coffee "
    "creamer, warm it gently before frothing it, but never boil it. A spiced coffee creamer tastes best "
    "after a night in the fridge, once the spices have infused. For iced coffee, a thicker coffee creamer "
    "with a little more cream holds up better against the ice. Try one new coffee creamer each week, keep "
    "notes on what you liked, and soon you will have a favourite. Enjoy experimenting with your coffee!"
)
SAID = "user: I have started making homemade coffee creamer, with almond milk, vanilla and honey."


@pytest.mark.parametrize("make_store", ["lancedb", "pgvector"], indirect=True)
def test_the_statement_that_answers_outranks_a_long_reply_on_its_topic(make_store: StoreFactory) -> None:
    """A short user statement and a long assistant reply full of the query's words, with the real
    embedder and each backend's full text: the prior puts the reply after the statement. (A statement
    without the query's rarest word, "homemade", stays behind the reply on PostgreSQL even with the
    prior: its full text weighs that word most, and the statement's text score is then a third of the
    reply's; on LanceDB, half.)"""
    assert len(REPLY) > 3 * LENGTH_PIVOT > 3 * len(SAID)
    store = make_store()
    filler = [f"user: Day {n} of my pottery course: a coffee first, then bowl number {n}." for n in range(30)]
    filler += [
        f"user: On day {n} of the course we talked about glazes, kilns, clay, wheels and trimming tools; "
        "someone had brought a jug of creamer."
        for n in range(5)
    ]
    # each in a session of its own: no memory lends another context
    turns = [*filler, SAID, REPLY]
    sessions = [Provenance("imported", session_id=f"s{n}") for n in range(len(turns))]
    store.remember_many("u", [MemoryInput(t, provenance=p) for t, p in zip(turns, sessions, strict=True)])
    query = "What do I put in my homemade coffee creamer?"
    store.fusion = Fusion(length_weight=0)
    plain = store.search("u", query, k=2)
    store.fusion = Fusion()
    prior = store.search("u", query, k=2)
    assert [h.memory.content for h in prior] == [SAID, REPLY]
    assert {h.memory.content for h in plain} == {SAID, REPLY}
    # the prior divides the long reply's score and leaves the short statement's as it was
    scores = {h.memory.content: h.score for h in plain}
    assert prior[1].score < scores[REPLY]
    assert prior[0].score == pytest.approx(scores[SAID])
