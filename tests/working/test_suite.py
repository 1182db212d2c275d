"""The working-state conformance suite on every backend: SQLite, PostgreSQL and the in-memory reference."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from statekeep.testing import WorkingStateStoreFactory, WorkingStateStoreSuite
from statekeep.working import InMemoryWorkingStateStore, SQLWorkingStateStore


def _sql(url: str) -> Iterator[WorkingStateStoreFactory]:
    opened: list[SQLWorkingStateStore] = []

    def make() -> SQLWorkingStateStore:
        opened.append(SQLWorkingStateStore(url))
        return opened[-1]

    yield make
    for store in opened:
        store.db.dispose()


class TestSQLiteWorkingState(WorkingStateStoreSuite):
    @pytest.fixture
    def make_store(self, sqlite_url: str) -> Iterator[WorkingStateStoreFactory]:
        yield from _sql(sqlite_url)


class TestPostgresWorkingState(WorkingStateStoreSuite):
    @pytest.fixture
    def make_store(self, postgres_url: str) -> Iterator[WorkingStateStoreFactory]:
        yield from _sql(postgres_url)


class TestInMemoryWorkingState(WorkingStateStoreSuite):
    @pytest.fixture
    def make_store(self) -> WorkingStateStoreFactory:
        store = InMemoryWorkingStateStore()
        return lambda: store  # one process: "reopening" it is the same object
