"""Full-text search on the real backends: inflections, names, dates, odd characters, common words."""

from __future__ import annotations

import pytest

from statekeep.memory import MemoryStore

from .conftest import StoreFactory

BACKENDS = ["lancedb", "pgvector"]

CHAT = [
    "Melanie: The support group met again on Tuesday, it was lovely.",
    "Caroline: I painted a sunset over the lake last weekend.",
    "Caroline: My O'Brien cousins visited on 9 June, 2023.",
    "Caroline: Adoption agencies called me back about the interviews.",
    *(f"Caroline: Day {n} of my pottery course, and I made bowl number {n}." for n in range(40)),
]


@pytest.fixture
def chat(make_store: StoreFactory) -> MemoryStore:
    store = make_store()
    store.remember_many("c", CHAT)
    return store


@pytest.mark.parametrize("make_store", BACKENDS, indirect=True)
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("Who is painting?", CHAT[1]),  # an inflection of "painted"
        ("adopting", CHAT[3]),
        ("What did the O'Brien family do?", CHAT[2]),  # a name with an apostrophe
        ("June 9 2023", CHAT[2]),  # a date, its words in another order
    ],
)
def test_full_text_finds_inflections_names_and_dates(chat: MemoryStore, query: str, expected: str) -> None:
    hits = chat.search("c", query, k=3, mode="text")
    assert hits, query
    assert hits[0].memory.content == expected


@pytest.mark.parametrize("make_store", BACKENDS, indirect=True)
def test_a_name_said_in_most_memories_does_not_decide_the_ranking(chat: MemoryStore) -> None:
    """Caroline said 43 of 44 turns: the question's subject (the support group) ranks first."""
    hits = chat.search("c", "When did Caroline go to the support group?", k=5, mode="text")
    assert hits[0].memory.content == CHAT[0]


@pytest.mark.parametrize("make_store", ["pgvector"], indirect=True)
def test_postgres_leaves_out_a_query_word_most_memories_hold(chat: MemoryStore) -> None:
    """The name is in 43 of 44 memories: only memories with a rarer word of the query are ranked."""
    hits = chat.search("c", "Caroline and the lake", k=20, mode="text")
    assert [h.memory.content for h in hits] == [CHAT[1]]
    # a query of common words only keeps them all
    assert len(chat.search("c", "Caroline", k=50, mode="text")) == len(CHAT) - 1


@pytest.mark.parametrize("make_store", BACKENDS, indirect=True)
def test_a_small_owner_has_no_common_words(make_store: StoreFactory) -> None:
    store = make_store()
    store.remember_many("d", ["Dana: green tea", "Dana: black tea", "Dana: coffee"])
    found = {h.memory.content for h in store.search("d", "green tea", k=5, mode="text")}
    assert found == {"Dana: green tea", "Dana: black tea"}


@pytest.mark.parametrize("make_store", BACKENDS, indirect=True)
@pytest.mark.parametrize(
    "query",
    [r"O'Brien \ slash\es", "a & b | !c <-> (d) :* 'x'", '"unbalanced', "what: 100%", "the and of"],
)
def test_any_query_text_is_searched_as_words(chat: MemoryStore, query: str) -> None:
    """Quotes, backslashes and full-text operators in a query are just characters; no error."""
    for mode in ("text", "hybrid"):
        hits = chat.search("c", query, k=3, mode=mode)
        assert all(h.memory.owner == "c" for h in hits)
    if "O'Brien" in query:
        assert chat.search("c", query, k=1, mode="text")[0].memory.content == CHAT[2]


@pytest.mark.parametrize("make_store", BACKENDS, indirect=True)
def test_a_rare_word_of_the_query_outweighs_a_frequent_one(make_store: StoreFactory) -> None:
    """The word "garden" is in 9 of 100 memories (not common enough to be left out), "orchid" in one: the
    memory with the rare word ranks first, though the other says "garden" twice in fewer words."""
    store = make_store()
    twice = "user: I water the garden daily; the garden is big."
    rare = "user: An orchid bloomed on the windowsill this morning, pale pink and white."
    memories = [twice, rare, *(f"user: The garden party on day {n}." for n in range(8))]
    memories += [f"user: Day {n} of my pottery course, bowl number {n}." for n in range(90)]
    store.remember_many("g", memories)
    hits = store.search("g", "orchid garden", k=3, mode="text")
    assert [h.memory.content for h in hits[:2]] == [rare, twice]
    assert hits[0].score > hits[1].score


@pytest.mark.parametrize("make_store", BACKENDS, indirect=True)
@pytest.mark.parametrize(
    ("memories", "query"),
    [
        # the past tense of a memory, the base form of a question (after "did")
        (["Caroline: I went to the museum with my kids.", "Caroline: The museum was closed."],
         "When did Caroline go to the museum?"),
        # and the other way round
        (["Melanie: I want to buy a kayak for the lake.", "Melanie: The kayak is red."],
         "Which kayak was it that Melanie bought?"),
        # an irregular plural
        (["Jon: My children love the zoo on Sundays.", "Jon: The zoo was full."],
         "Does Jon have a child who likes the zoo?"),
    ],
)  # fmt: skip
def test_irregular_forms_find_their_base_form(
    make_store: StoreFactory, memories: list[str], query: str
) -> None:
    """The distractor is shorter and shares the rest: without the base form it would rank first."""
    store = make_store()
    store.remember_many("c", [*memories, *CHAT[4:]])
    hits = store.search("c", query, k=3, mode="text")
    assert hits[0].memory.content == memories[0]
