"""The context conformance suite, idempotency keys, building, summaries and retention."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest

from statekeep.context import (
    CharCounter,
    ContextStore,
    LLMSummarizer,
    Message,
    OfflineSummarizer,
    TiktokenCounter,
    ToolCall,
    message_tokens,
    select_window,
)
from statekeep.context._log import LogView
from statekeep.context._types import Event
from statekeep.context.summarize import input_hash
from statekeep.context.tokens import REPLY_OVERHEAD
from statekeep.context.window import is_well_paired
from statekeep.errors import (
    EventKeyConflictError,
    EventsPrunedError,
    SummaryConflictError,
    SummaryError,
    SummaryNotFoundError,
)
from statekeep.testing._context_kit import (
    C1,
    ContextStoreFactory,
    CountingView,
    FailingSummarizer,
    chat,
    request,
    tool_history,
    total_tokens,
)


class KeysBuildsSummaries:
    """Idempotency keys, building, summaries and retention: a part of :class:`ContextStoreSuite`."""

    # --- idempotency keys ----------------------------------------------------------------

    def test_an_idempotency_key_makes_a_retried_append_a_no_op(self, make_store: ContextStoreFactory) -> None:
        """Appending the same message with the same key returns the stored event; nothing is logged twice."""
        store = make_store()
        first = store.append("s", Message.user("book it"), key="run-1:step-3:0")
        again = make_store().append("s", Message.user("book it"), key="run-1:step-3:0")
        assert again == first
        assert again.key == "run-1:step-3:0"
        assert store.last_seq("s") == 1
        assert store.append("other", Message.user("book it"), key="run-1:step-3:0").seq == 1  # per session
        assert store.append("s", Message.user("book it")).seq == 2  # without a key, every append is new

    def test_find_returns_the_event_logged_under_a_key(self, make_store: ContextStoreFactory) -> None:
        """find(session, key) sees what an earlier attempt logged, from any store instance; None otherwise."""
        store = make_store()
        assert store.find("s", "run-1/model-0") is None
        logged = store.append("s", Message.assistant("hello"), key="run-1/model-0")
        assert make_store().find("s", "run-1/model-0") == logged
        assert store.find("other", "run-1/model-0") is None
        assert store.find("s", "run-1/model-1") is None

    def test_a_key_reused_for_another_message_conflicts_and_writes_nothing(self, store: ContextStore) -> None:
        """A key names one message: reusing it for a different one raises EventKeyConflictError."""
        store.append("s", Message.user("book it"), key="k")
        with pytest.raises(EventKeyConflictError) as err:
            store.append("s", Message.user("cancel it"), key="k")
        assert (err.value.key, err.value.seq) == ("k", 1)
        assert store.last_seq("s") == 1
        assert store.find("s", "k") == store.events("s")[0]

    def test_concurrent_appends_with_one_key_store_one_event(self, make_store: ContextStoreFactory) -> None:
        """Threads racing to append the same keyed message all get the same single event."""
        store = make_store(counter=C1)
        results: list[int] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(6)

        def work() -> None:
            barrier.wait()
            try:
                results.append(store.append("s", Message.user("once"), key="only-once").seq)
            except BaseException as exc:  # collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert results == [1] * 6
        assert [e.seq for e in store.events("s")] == [1]

    # --- building ------------------------------------------------------------------------

    def test_sections_come_in_order_and_the_report_adds_up(self, store: ContextStore) -> None:
        """System, pinned state, memories, summary, then the window; the report counts each exactly."""
        chat(store, "s", 3)
        store.compact("s", upto=2)
        store.append("s", Message.user("and now?"))
        built = store.build(
            "s", 4000, system="You help.", pinned={"goal": "check items"}, memories=[{"content": "likes tea"}]
        )
        texts = [m.content for m in built.messages]
        assert texts[0] == "You help."
        assert texts[1].startswith("Current task state (pinned):")
        assert "<memories>" in texts[2]
        assert texts[3].startswith("Summary of the earlier conversation (events 1-2)")
        window = [e.message.content for e in store.events("s", after=2) if e.kind != "summary_updated"]
        assert texts[4:] == window
        report, counter = built.report, TiktokenCounter()
        for i, section in enumerate(["system", "pinned", "memories", "summary"]):
            assert report.sections()[section] == message_tokens(counter, built.messages[i])
        assert report.total == total_tokens(built.messages, counter) <= 4000
        assert (report.first_seq, report.last_seq, report.window_events) == (3, 8, 5)

    def test_the_window_keeps_the_newest_events_that_fit(self, make_store: ContextStoreFactory) -> None:
        """With a small budget only the newest whole messages are kept, and the total never exceeds it."""
        store = make_store(counter=C1)
        chat(store, "s", 20)
        events = store.events("s")
        for budget in (40, 100, 333):
            built = store.build("s", budget, compact=False)
            assert built.report.total == total_tokens(built.messages, C1) <= budget
            assert list(built.messages) == [e.message for e in events][-len(built.messages) :]
            assert (
                built.report.total + events[-len(built.messages) - 1].tokens > budget
            )  # the next one won't fit

    def test_invariant_7_a_tool_result_is_never_separated_from_its_call(
        self, make_store: ContextStoreFactory
    ) -> None:
        """At every budget the window is well paired, within budget, and the newest whole units of the log."""
        store = make_store(counter=C1)
        store.extend("s", tool_history())
        events = store.events("s")

        def recount(message: Message) -> int:
            return message_tokens(C1, message)

        for budget in range(4, 400, 7):
            built = store.build("s", budget, compact=False)
            got = list(built.messages)
            assert is_well_paired(got), budget
            assert built.report.total == total_tokens(got, C1) <= budget
            full = select_window(events, budget - REPLY_OVERHEAD, lambda e: e.tokens, recount).messages
            assert got == full[len(full) - len(got) :]  # the tail read is a suffix of the whole log's
        whole = list(store.build("s", 10_000, compact=False).messages)
        assert [m.tool_call_id for m in whole if m.role == "tool"] == ["a", "b", "d"]  # in call order
        assert not any(c.id == "c" for m in whole for c in m.tool_calls)  # the interrupted call is left out

    def test_counts_of_another_counter_are_recounted_for_a_build_not_mixed(
        self, make_store: ContextStoreFactory
    ) -> None:
        """A build with counter B recounts the events stored with counter A, and stores nothing new."""
        store = make_store(counter=C1)
        store.append("s", Message.user("x" * 40))
        built = store.build("s", 1000, counter=CharCounter(4))
        assert built.report.counter == "chars:4"
        assert built.report.window == message_tokens(CharCounter(4), Message.user("x" * 40)) == 13
        assert [(e.counter, e.tokens) for e in store.events("s")] == [("chars:1", 43)]

    def test_invariant_6_a_build_reads_only_the_tail_it_needs(self, make_store: ContextStoreFactory) -> None:
        """Rows read by build depend on the budget, not on the history's length."""
        reads: list[int] = []
        store = make_store(counter=C1)
        for session, n in (("short", 100), ("long", 1500)):
            store.extend(session, [Message.user(f"message {i:05d}") for i in range(n)])
        store.build("short", 300, compact=False)  # page sizes follow the tokens per event seen so far
        real = store._view

        @contextmanager
        def view() -> Iterator[LogView]:
            with real() as inner:
                yield CountingView(inner, reads)

        store._view = view  # type: ignore[method-assign]
        counts = []
        for session in ("short", "long"):
            reads.clear()
            store.build(session, 300, compact=False)
            counts.append(sum(reads))
        assert counts[0] == counts[1] < 100

    def test_invariant_6_context_is_rebuilt_from_the_store(self, make_store: ContextStoreFactory) -> None:
        """A store opened afresh (as after a restart) builds exactly what the first one built."""
        first = make_store()
        chat(first, "s", 30)
        first.append("s", Message.assistant("ok", tool_calls=[ToolCall("t", "lookup", {"k": 1})]))
        first.append("s", Message.tool_result("t", "found"))
        first.build("s", 300, system="sys", pinned="step 3")  # may compact once
        before = first.build("s", 300, system="sys", pinned="step 3")
        after = make_store().build("s", 300, system="sys", pinned="step 3")
        assert after.messages == before.messages
        assert after.report == before.report

    # --- summaries and retention ---------------------------------------------------------

    def test_a_summary_is_recorded_with_its_range_summarizer_and_input_hash(
        self, make_store: ContextStoreFactory
    ) -> None:
        """compact() logs a summary_updated event with range, summarizer and input hash; raw events stay."""
        store = make_store(counter=C1)
        store.extend("s", [request(i) for i in range(4)])
        summary = store.compact("s", upto=3)
        event = store.events("s")[-1]
        assert (event.kind, event.seq) == ("summary_updated", 5)
        assert event.summary == summary == store.latest_summary("s")
        assert (summary.covers_from, summary.covers_to) == (1, 3)
        assert (summary.summarizer, summary.summarizer_version) == ("offline", "1")
        assert summary.input_hash == input_hash(None, store.events("s", upto=3))
        assert [e.kind for e in store.events("s")[:4]] == ["user"] * 4
        rolled = store.compact("s")
        assert (rolled.covers_from, rolled.covers_to) == (1, 5)
        assert rolled.input_hash == input_hash(summary.text, store.events("s", after=3, upto=4))
        assert store.compact("s") == rolled  # nothing new to fold: the current summary, no new event
        assert store.last_seq("s") == 6
        assert make_store().latest_summary("s") == rolled
        assert store.latest_summary("other") is None

    def test_compaction_starts_above_high_water_and_stops_at_low_water(
        self, make_store: ContextStoreFactory
    ) -> None:
        """Below the high-water mark nothing is folded; above it the tail is folded to the low-water mark."""
        terse = LLMSummarizer(lambda prompt: "tickets requested", name="terse")
        store = make_store(counter=C1, summarizer=terse, high_water=0.8, low_water=0.5)
        budget = 1003  # a 1000-token room for the window before any summary
        n = 0
        while sum(message_tokens(C1, request(i)) for i in range(n + 1)) <= 800:
            n += 1
        store.extend("s", [request(i) for i in range(n)])  # as much as fits under the high-water mark
        assert not store.build("s", budget).report.compacted
        assert store.latest_summary("s") is None
        store.append("s", request(n))  # one more passes it
        built = store.build("s", budget)
        summary = store.latest_summary("s")
        assert built.report.compacted
        assert summary is not None
        assert (summary.covers_from, summary.summarizer) == (1, "terse")
        assert 0.5 * 1000 - 40 < built.report.window <= 0.5 * 1000  # folded down to the mark, not further
        assert built.report.first_seq == summary.covers_to + 1  # no gap between summary and window
        assert built.report.total <= budget

    def test_a_failed_or_empty_summary_is_never_saved(self, make_store: ContextStoreFactory) -> None:
        """compact() raises SummaryError and writes nothing; build() keeps the raw window and says why."""
        for i, summarizer in enumerate(
            [FailingSummarizer(), FailingSummarizer(""), FailingSummarizer("   \n")]
        ):
            session = f"s{i}"
            store = make_store(counter=C1, summarizer=summarizer)
            store.extend(session, [request(j) for j in range(40)])
            with pytest.raises(SummaryError) as err:
                store.compact(session)
            assert err.value.summarizer == "failing"
            assert store.last_seq(session) == 40
            built = store.build(session, 1000)
            assert not built.report.compacted
            assert "failing" in (built.report.compaction_error or "")
            assert store.latest_summary(session) is None
            assert store.last_seq(session) == 40
            assert built.report.total <= 1000

    def test_concurrent_compactions_never_both_land(self, make_store: ContextStoreFactory) -> None:
        """If another writer saves a summary mid-compaction, this one is refused, not interleaved."""
        store = make_store(counter=C1)
        store.extend("s", [request(i) for i in range(6)])
        other = make_store(counter=C1)

        class Racing:
            name, version = "racing", "1"

            def summarize(self, previous: str | None, messages: Sequence[Message]) -> str:
                other.compact("s", upto=2)  # the other writer wins meanwhile
                return "late summary"

        with pytest.raises(SummaryConflictError):
            store.compact("s", summarizer=Racing())
        summary = store.latest_summary("s")
        assert summary is not None
        assert (summary.summarizer, summary.covers_to) == ("offline", 2)
        assert [e.kind for e in store.events("s")].count("summary_updated") == 1

    def test_a_summary_is_regenerated_from_the_raw_events_it_covers(
        self, make_store: ContextStoreFactory
    ) -> None:
        """regenerate_summary rebuilds the latest summary over the same range with another summarizer."""
        store = make_store(counter=C1)
        with pytest.raises(SummaryNotFoundError):
            store.regenerate_summary("s", OfflineSummarizer())
        store.extend("s", [request(i) for i in range(6)])
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
        user_events: list[Event] = [e for e in store.events("s", upto=6) if e.kind == "user"]
        assert again.input_hash == input_hash(None, user_events)
        assert "ticket 0000" in prompts[0]
        assert "ticket 0005" in prompts[0]
        assert store.latest_summary("s") == again

    def test_retention_deletes_only_the_raw_events_a_summary_covers(
        self, make_store: ContextStoreFactory
    ) -> None:
        """prune_summarized removes raw events under the latest summary; summaries and newer events stay."""
        store = make_store(counter=C1)
        store.extend("s", [request(i) for i in range(5)])
        store.append("other", request(0))
        assert store.prune_summarized("s") == 0  # nothing is covered yet
        store.compact("s", upto=3)
        assert store.prune_summarized("s") == 3
        assert [(e.seq, e.kind) for e in store.events("s")] == [
            (4, "user"),
            (5, "user"),
            (6, "summary_updated"),
        ]
        assert [(e.seq, e.kind) for e in make_store().events("s")] == [
            (4, "user"),
            (5, "user"),
            (6, "summary_updated"),
        ]
        assert store.last_seq("s") == 6
        built = store.build("s", 600)
        assert built.messages[0].content.startswith("Summary of the earlier conversation (events 1-3)")
        assert [m.content[:9] for m in built.messages[1:]] == ["request 3", "request 4"]
        with pytest.raises(EventsPrunedError):
            store.regenerate_summary("s", OfflineSummarizer())
        assert store.compact("s").covers_to == 6  # rolling on from the pruned summary still works
        assert store.append("s", request(9)).seq == 8  # numbering never goes back
        assert len(store.events("other")) == 1
