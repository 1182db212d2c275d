"""The working-state conformance suite on every backend: SQLite, PostgreSQL and the in-memory reference."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import statekeep
from statekeep.testing import WorkingStateStoreFactory, WorkingStateStoreSuite
from statekeep.working import InMemoryWorkingStateStore, SQLWorkingStateStore
from tests.test_docs import FENCE


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


def test_the_backend_in_the_extending_guide_passes_the_suite(tmp_path: Path) -> None:
    """docs/extending.md's dict backend, saved as a test file outside this project, passes all 14 tests."""
    guide = (Path(__file__).parents[2] / "docs" / "extending.md").read_text()
    (sample,) = [code for code in FENCE.findall(guide) if "class TestDictStore" in code]
    (tmp_path / "test_dict_store.py").write_text(sample)
    env = {**os.environ, "PYTHONPATH": str(Path(statekeep.__file__).parents[1])}
    args = [
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--basetemp={tmp_path / 'tmp'}",
        "test_dict_store.py",
    ]
    out = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "14 passed" in out.stdout
