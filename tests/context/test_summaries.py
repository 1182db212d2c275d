"""Rolling summaries: high/low-water compaction, regeneration, failures never saved, retention."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeep.context import (
    CharCounter,
    ContextStore,
    InMemoryContextStore,
    LLMSummarizer,
    Message,
    OfflineSummarizer,
    ToolCall,
    message_tokens,
)
from statekeep.context.compaction import plan_cut
from statekeep.context.summarize import input_hash
from statekeep.errors import EventsPrunedError, SummaryConflictError, SummaryError, SummaryNotFoundError

from .conftest import StoreFactory
from .test_no_orphans import _Seeded, generate

C1 = CharCounter(1)


class Failing:
    """A summarizer that raises, or returns blank text."""

    name, version = "failing", "0"

    def __init__(self, reply: str | None = None) -> None:
        self.reply = reply

    def summarize(self, previous: str | None, messages: Sequence[Message]) -> str:
        if self.reply is None:
            raise RuntimeError("model unavailable")
        return self.reply


def _request(i: int) -> Message:
    return Message.user(f"request {i}: please handle ticket {i:04d}")


def _fill(store: ContextStore, n: int, start: int = 0) -> None:
    store.extend("s", [_request(i) for i in range(start, start + n)])


def test_compaction_starts_above_high_water_and_stops_at_low_water(make_store: StoreFactory) -> None:
    """Below the high-water mark nothing is folded; above it the tail is folded down to the low-water mark."""
    terse = LLMSummarizer(lambda prompt: "tickets requested", name="terse")
    store = make_store(counter=C1, summarizer=terse, high_water=0.8, low_water=0.5)
    budget = 1003  # a 1000-token room for the window before any summary
    n = 0
    while sum(message_tokens(C1, _request(i)) for i in range(n + 1)) <= 800:
        n += 1
    _fill(store, n)  # as much as fits under the high-water mark
    quiet = store.build("s", budget)
    assert not quiet.report.compacted
    assert store.latest_summary("s") is None
    _fill(store, 1, start=n)  # one more passes it
    built = store.build("s", budget)
    assert built.report.compacted
    summary = store.latest_summary("s")
    assert summary is not None
    assert (summary.covers_from, summary.summarizer) == (1, "terse")
    assert built.report.window <= 0.5 * 1000
    assert built.report.window + 40 > 0.5 * 1000  # folded down to the mark, not further
    assert built.report.first_seq == summary.covers_to + 1  # no gap between summary and window
    assert built.report.total <= budget
    _fill(store, 1, start=n + 1)
    assert not store.build("s", budget).report.compacted  # back under the high-water mark


def test_default_compaction_leaves_no_gap(make_store: StoreFactory) -> None:
    """With the offline summarizer and real token counts, every event is in the summary or the window."""
    store = make_store()
    for i in range(60):
        store.append("s", _request(i))
        built = store.build("s", 600, system="You file tickets.")
        summary = store.latest_summary("s")
        covered = summary.covers_to if summary else 0
        assert built.report.first_seq == covered + 1
        assert built.report.total <= 600
    assert summary is not None
    assert "ticket 0000" in built.messages[1].content  # the first request survives as the task


def test_summary_event_records_range_summarizer_and_input_hash(make_store: StoreFactory) -> None:
    """A summary_updated event stores its range, the summarizer's name and version, and the input hash."""
    store = make_store(counter=C1)
    _fill(store, 4)
    summary = store.compact("s", upto=3)
    event = store.events("s")[-1]
    assert (event.kind, event.seq) == ("summary_updated", 5)
    assert event.summary == summary
    assert (summary.covers_from, summary.covers_to) == (1, 3)
    assert (summary.summarizer, summary.summarizer_version) == ("offline", "1")
    assert summary.input_hash == input_hash(None, store.events("s", upto=3))
    assert [e.kind for e in store.events("s")[:4]] == ["user"] * 4  # raw events stay
    rolled = store.compact("s")
    assert (rolled.covers_from, rolled.covers_to) == (1, 5)
    assert rolled.input_hash == input_hash(summary.text, store.events("s", after=3, upto=4))
    assert store.compact("s") == rolled  # nothing new to fold: the current summary, no new event
    assert store.last_seq("s") == 6


@pytest.mark.parametrize("summarizer", [Failing(), Failing(""), Failing("   \n")])
def test_a_failed_or_empty_summary_is_never_saved(make_store: StoreFactory, summarizer: Failing) -> None:
    """compact() raises SummaryError and writes nothing; build() keeps the raw window and reports why."""
    store = make_store(counter=C1, summarizer=summarizer)
    _fill(store, 40)
    with pytest.raises(SummaryError) as err:
        store.compact("s")
    assert err.value.summarizer == "failing"
    assert store.last_seq("s") == 40
    built = store.build("s", 1000)
    assert not built.report.compacted
    assert "failing" in (built.report.compaction_error or "")
    assert store.latest_summary("s") is None
    assert built.report.window_events > 0
    assert built.report.total <= 1000


def test_regenerate_with_another_summarizer_from_raw_events(make_store: StoreFactory) -> None:
    """A summary can be rebuilt from the raw events it covers, by another summarizer, over the same range."""
    store = make_store(counter=C1)
    _fill(store, 6)
    store.compact("s", upto=3)
    first = store.compact("s", upto=6)
    prompts: list[str] = []

    def llm(prompt: str) -> str:
        prompts.append(prompt)
        return "  Six tickets were requested.  "

    again = store.regenerate_summary("s", LLMSummarizer(llm, name="test-llm", version="7"))
    assert (again.covers_from, again.covers_to) == (first.covers_from, first.covers_to) == (1, 6)
    assert (again.summarizer, again.summarizer_version, again.text) == (
        "test-llm",
        "7",
        "Six tickets were requested.",
    )
    assert again.input_hash == input_hash(None, [e for e in store.events("s", upto=6) if e.kind == "user"])
    assert "ticket 0000" in prompts[0]
    assert "ticket 0005" in prompts[0]
    assert store.latest_summary("s") == again
    assert "Six tickets" in store.build("s", 500).messages[0].content


def test_regenerate_needs_a_summary(store: ContextStore) -> None:
    """Regenerating a session without a summary is a not-found error."""
    store.append("s", Message.user("x"))
    with pytest.raises(SummaryNotFoundError):
        store.regenerate_summary("s", OfflineSummarizer())


def test_retention_deletes_only_covered_raw_events(make_store: StoreFactory) -> None:
    """prune_summarized removes raw events under the latest summary; summaries and newer events stay."""
    store = make_store(counter=C1)
    _fill(store, 5)
    assert store.prune_summarized("s") == 0  # nothing is covered yet
    store.compact("s", upto=3)
    assert store.prune_summarized("s") == 3
    assert [(e.seq, e.kind) for e in store.events("s")] == [(4, "user"), (5, "user"), (6, "summary_updated")]
    built = store.build("s", 600)
    assert built.messages[0].content.startswith("Summary of the earlier conversation (events 1-3)")
    assert [m.content[:9] for m in built.messages[1:]] == ["request 3", "request 4"]
    with pytest.raises(EventsPrunedError):
        store.regenerate_summary("s", OfflineSummarizer())
    assert store.compact("s").covers_to == 6  # rolling on from the pruned summary still works


def test_concurrent_compactions_never_both_land() -> None:
    """If another writer saves a summary mid-compaction, this one is refused, not interleaved."""
    store = InMemoryContextStore(counter=C1)
    _fill(store, 6)

    class Racing:
        name, version = "racing", "1"

        def summarize(self, previous: str | None, messages: Sequence[Message]) -> str:
            store.compact("s", upto=2)  # the other writer wins meanwhile
            return "late summary"

    with pytest.raises(SummaryConflictError):
        store.compact("s", summarizer=Racing())
    summary = store.latest_summary("s")
    assert summary is not None
    assert (summary.summarizer, summary.covers_to) == ("offline", 2)


def test_offline_summarizer_keeps_task_relevant_facts() -> None:
    """Who asked for what, decisions, tool outcomes (errors too) and open items survive, rolling."""
    s = OfflineSummarizer()
    first = s.summarize(
        None,
        [
            Message.user("Book a table for four in Oslo", name="ada"),
            Message.assistant(
                "I will check two places. Then book.",
                tool_calls=[ToolCall("a", "find", {"city": "Oslo"}), ToolCall("b", "book", {"n": 4})],
            ),
            Message.tool_result("a", "Maaemo has a table at 19:00\nmore detail"),
        ],
    )
    assert "- Book a table for four in Oslo" in first  # the task
    assert "ada: Book a table for four in Oslo" in first
    assert "- I will check two places." in first
    assert "find -> ok: Maaemo has a table at 19:00" in first
    assert 'no result yet for book({"n": 4}) [b]' in first
    second = s.summarize(
        first, [Message.tool_result("b", "card declined", is_error=True), Message.user("try again")]
    )
    assert "[b]" not in second.split("Open items:")[1]
    assert "tool -> error: card declined" in second
    assert "awaiting a reply to: try again" in second
    assert "- Book a table for four in Oslo" in second


def test_llm_summarizer_prompt_holds_previous_summary_and_transcript() -> None:
    """The LLM adapter sends instructions, the previous summary and a transcript, and strips the reply."""
    seen: list[str] = []

    def model(prompt: str) -> str:
        seen.append(prompt)
        return " new "

    summarizer = LLMSummarizer(model, name="m")
    text = summarizer.summarize(
        "old facts", [Message.assistant("x", tool_calls=[ToolCall("c", "t", {"a": 1})])]
    )
    assert text == "new"
    assert "old facts" in seen[0]
    assert '[calls t({"a": 1}) id=c]' in seen[0]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**63), room=st.integers(1, 2000), low=st.floats(0.05, 0.9))
def test_compaction_never_cuts_between_a_call_and_its_results(seed: int, room: int, low: float) -> None:
    """The fold boundary never separates a call from a result that follows it."""
    store = InMemoryContextStore(counter=C1)
    history = generate(_Seeded(seed))
    if not history.messages:
        return
    events = store.extend("s", history.messages)
    cut = plan_cut(events, room, low, lambda e: e.tokens)
    assert cut is not None
    calls = {c.id: e.seq for e in events for c in (e.message.tool_calls if e.kind == "tool_call" else ())}
    open_at: dict[str, int] = {}
    for e in events:
        for c in e.message.tool_calls:
            open_at[c.id] = e.seq
        if e.kind == "tool_result" and e.message.tool_call_id in open_at:
            call_seq = open_at.pop(e.message.tool_call_id or "")
            assert not (call_seq <= cut < e.seq)
    assert calls is not None
