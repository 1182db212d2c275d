"""Working-state stores on every backend: SQLite, PostgreSQL, and the in-memory reference."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from statekeep.working import (
    InMemoryWorkingStateStore,
    SQLWorkingStateStore,
    StateMigrations,
    WorkingStateStore,
)

StoreFactory = Callable[..., WorkingStateStore]


@pytest.fixture(params=["sqlite", "postgres", "memory"])
def make_store(request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    """A factory of stores over one fresh database, so a test can open it twice."""
    if request.param == "memory":
        shared = InMemoryWorkingStateStore()

        def _memory(migrations: StateMigrations | None = None) -> WorkingStateStore:
            if migrations is not None:
                shared.migrations = migrations
            return shared

        yield _memory
        return
    url = request.getfixturevalue(f"{request.param}_url")
    opened: list[SQLWorkingStateStore] = []

    def _sql(migrations: StateMigrations | None = None) -> WorkingStateStore:
        store = SQLWorkingStateStore(url, migrations)
        opened.append(store)
        return store

    yield _sql
    for store in opened:
        store.db.dispose()


@pytest.fixture
def store(make_store: StoreFactory) -> WorkingStateStore:
    return make_store()
