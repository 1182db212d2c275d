"""Conformance tests of the log's markers and event copies (part of ``ContextStoreSuite``)."""

from __future__ import annotations

import pytest

from statekeep.context import Message
from statekeep.errors import EventKeyConflictError, InvalidInputError, SessionOwnerError
from statekeep.testing._context_kit import ContextStoreFactory as _Factory


class MarkerSuite:
    """Markers end a conversation without deleting it; copies keep what each event was."""

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
