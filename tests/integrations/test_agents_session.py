"""The Agents SDK session over the context log: clear and pop append markers that every reader honours."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("agents", reason="the agents extra")

from statekeep.context import SQLContextStore
from statekeep.integrations.agents import StatekeepSession
from statekeep.integrations.agents.session import CLEARED, REWOUND


def _said(store: SQLContextStore, session_id: str) -> list[str]:
    return [m.content for m in store.build(session_id, 4000).messages]


def test_clear_appends_a_marker_the_builder_and_the_session_start_after(database_url: str) -> None:
    """clear_session deletes nothing: it appends a marker event; get_items and build both start after it."""
    store = SQLContextStore(database_url)
    session = StatekeepSession("c1", store, owner="alice")
    asyncio.run(
        session.add_items(
            [{"role": "user", "content": "my pin is 1234"}, {"role": "assistant", "content": "noted"}]
        )
    )
    store.compact("c1")  # a summary of the cleared conversation must not reach the model either
    before = store.events("c1")
    asyncio.run(session.clear_session())
    after = store.events("c1")
    assert after[: len(before)] == before  # append-only
    assert [e.kind for e in after[len(before) :]] == ["marker"]
    assert after[-1].marker.reason == CLEARED
    assert asyncio.run(session.get_items()) == []
    assert _said(store, "c1") == []
    asyncio.run(session.add_items([{"role": "user", "content": "hello again"}]))
    assert asyncio.run(session.get_items()) == [{"role": "user", "content": "hello again"}]
    assert _said(store, "c1") == ["hello again"]


def test_pop_appends_a_rewind_marker_and_the_rest_again(database_url: str) -> None:
    """pop_item returns the newest item; the log gains a marker and the remaining items, and loses nothing."""
    store = SQLContextStore(database_url)
    session = StatekeepSession("p1", store)
    items = [{"role": "user", "content": f"message {i}"} for i in range(3)]
    asyncio.run(session.add_items(items))
    count = len(store.events("p1"))
    assert asyncio.run(session.pop_item()) == items[-1]
    events = store.events("p1")
    assert [e.kind for e in events[count:]] == ["marker", "user", "user"]
    assert events[count].marker.reason == REWOUND
    assert asyncio.run(session.get_items()) == items[:2]
    assert _said(store, "p1") == ["message 0", "message 1"]
    assert (
        asyncio.run(StatekeepSession("p1", store).get_items()) == items[:2]
    )  # another process sees the same
