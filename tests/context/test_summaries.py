"""Rolling summaries: the offline and LLM summarizers, and where compaction cuts.

The store's summary invariants (high/low water, ranges and hashes, failures never
saved, regeneration, retention, racing compactions) are in the conformance suite.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeep.context import (
    CharCounter,
    InMemoryContextStore,
    LLMSummarizer,
    Message,
    OfflineSummarizer,
    ToolCall,
)
from statekeep.context.compaction import plan_cut

from .conftest import StoreFactory
from .test_no_orphans import _Seeded, generate

C1 = CharCounter(1)


def _request(i: int) -> Message:
    return Message.user(f"request {i}: please handle ticket {i:04d}")


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
