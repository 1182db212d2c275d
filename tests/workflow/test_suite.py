"""The workflow-store conformance suite on SQLite, PostgreSQL and the in-memory backend.

On SQL the working state lives in the same database, so each step's completion
commits in one transaction with the state version it produced.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from statekeep.db import Database
from statekeep.testing import WorkflowStoreFactory, WorkflowStoreSuite
from statekeep.workflow import InMemoryWorkflowStore, SQLWorkflowStore
from statekeep.working import SQLWorkingStateStore, WorkingStateStore


class _SQLSuite(WorkflowStoreSuite):
    @pytest.fixture
    def db(self, database_url: str) -> Iterator[Database]:
        db = Database(database_url)
        yield db
        db.dispose()

    @pytest.fixture
    def make_store(self, db: Database) -> WorkflowStoreFactory:
        return lambda: SQLWorkflowStore(db)

    @pytest.fixture
    def state_store(self, db: Database) -> WorkingStateStore:
        return SQLWorkingStateStore(db)


class TestSQLiteWorkflow(_SQLSuite):
    @pytest.fixture
    def database_url(self, sqlite_url: str) -> str:
        return sqlite_url


class TestPostgresWorkflow(_SQLSuite):
    @pytest.fixture
    def database_url(self, postgres_url: str) -> str:
        return postgres_url


class TestInMemoryWorkflow(WorkflowStoreSuite):
    @pytest.fixture
    def make_store(self) -> WorkflowStoreFactory:
        store = InMemoryWorkflowStore()
        return lambda: store  # one process: every "reopening" is the same store
