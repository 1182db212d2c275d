"""Context stores on every backend: SQLite, PostgreSQL, and the in-memory reference."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from statekeep.context import ContextStore, InMemoryContextStore, SQLContextStore

StoreFactory = Callable[..., ContextStore]


@pytest.fixture(params=["sqlite", "postgres", "memory"])
def make_store(request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    """A factory of stores over one fresh database, so a test can open it twice."""
    if request.param == "memory":
        shared: dict[str, InMemoryContextStore] = {}

        def _memory(**kw: Any) -> ContextStore:
            store = shared.setdefault("store", InMemoryContextStore(**kw))
            fresh = InMemoryContextStore(**kw)
            fresh._sessions, fresh._lock = store._sessions, store._lock
            return fresh

        yield _memory
        return
    url = request.getfixturevalue(f"{request.param}_url")
    opened: list[SQLContextStore] = []

    def _sql(**kw: Any) -> ContextStore:
        store = SQLContextStore(url, **kw)
        opened.append(store)
        return store

    yield _sql
    for store in opened:
        store.db.dispose()


@pytest.fixture
def store(make_store: StoreFactory) -> ContextStore:
    """A store with the default (tiktoken) counter and offline summarizer."""
    return make_store()


@pytest.fixture(params=["sqlite", "postgres"])
def sql_url(request: pytest.FixtureRequest) -> str:
    """A fresh database URL on each SQL backend."""
    return str(request.getfixturevalue(f"{request.param}_url"))
