"""The context-store conformance suite on every backend: SQLite, PostgreSQL and the in-memory reference."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from statekeep.context import InMemoryContextStore, SQLContextStore
from statekeep.testing import ContextStoreFactory, ContextStoreSuite


def _sql(url: str) -> Iterator[ContextStoreFactory]:
    opened: list[SQLContextStore] = []

    def make(**options: Any) -> SQLContextStore:
        opened.append(SQLContextStore(url, **options))
        return opened[-1]

    yield make
    for store in opened:
        store.db.dispose()


class TestSQLiteContext(ContextStoreSuite):
    @pytest.fixture
    def make_store(self, sqlite_url: str) -> Iterator[ContextStoreFactory]:
        yield from _sql(sqlite_url)


class TestPostgresContext(ContextStoreSuite):
    @pytest.fixture
    def make_store(self, postgres_url: str) -> Iterator[ContextStoreFactory]:
        yield from _sql(postgres_url)


class TestInMemoryContext(ContextStoreSuite):
    @pytest.fixture
    def make_store(self) -> ContextStoreFactory:
        first: list[InMemoryContextStore] = []

        def make(**options: Any) -> InMemoryContextStore:
            store = InMemoryContextStore(**options)
            if first:  # "reopening" in one process: another store object over the same sessions
                store._sessions, store._lock = first[0]._sessions, first[0]._lock
            first.append(store)
            return store

        return make
