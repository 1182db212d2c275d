"""A pytest plugin that runs peer test suites against statekeep's adapters.

Loaded with ``-p statekeep_peers`` when pytest runs a peer's *own* test files from
its source distribution (see ``tests/integrations/test_peer_suites.py``). For each
test it replaces, in the test module's namespace, the class the suite was written
for with a factory of the adapter on the backend named by ``STATEKEEP_PEER_BACKEND``:

* ``SQLiteSession`` (openai-agents) -> :class:`statekeep.integrations.agents.StatekeepSession`;
* ``InMemoryStore`` (langgraph-checkpoint) -> :class:`statekeep.integrations.langgraph.StatekeepStore`.

``sqlite`` means SQLite (sessions) and LanceDB (stores); ``postgres`` means PostgreSQL
and pgvector, on a fresh database per test of the server ``STATEKEEP_TEST_POSTGRES_URL``.
Tests that inspect the internals of the SDK's own class are deselected, each with its reason.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

BACKEND = os.environ.get("STATEKEEP_PEER_BACKEND", "sqlite")

_SQLITE_INTERNALS = "inspects the SDK's SQLiteSession internals (its sqlite3 connections, locks or tables)"
#: test name -> why it does not apply to an adapter (the suite tests the SDK's own class there)
DESELECTED = {
    "test_sqlite_session_close_closes_worker_thread_connections": _SQLITE_INTERNALS,
    "test_sqlite_session_reaps_connections_from_exited_worker_threads": _SQLITE_INTERNALS,
    "test_sqlite_session_closes_retired_connections_before_the_next_allocation": _SQLITE_INTERNALS,
    "test_sqlite_session_keeps_connections_of_live_worker_threads": _SQLITE_INTERNALS,
    "test_sqlite_session_pop_item_skips_corrupt_most_recent": _SQLITE_INTERNALS
    + ": writes corrupt rows by raw SQL",
    "test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows": _SQLITE_INTERNALS
    + ": writes corrupt rows by raw SQL",
    "test_sqlite_session_get_items_limit_skips_corrupt_newest_rows": _SQLITE_INTERNALS
    + ": writes corrupt rows by raw SQL",
    "test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows": _SQLITE_INTERNALS
    + ": writes corrupt rows by raw SQL",
    "test_sqlite_session_file_lock_is_shared_across_instances": _SQLITE_INTERNALS
    + ": its per-file lock table",
    "test_sqlite_session_failed_add_items_releases_write_lock": _SQLITE_INTERNALS
    + ": probes its agent_sessions table",
    "test_sqlite_session_failed_clear_session_rolls_back": _SQLITE_INTERNALS
    + ": drops its agent_sessions table",
    "test_sqlite_session_failed_pop_item_releases_write_lock": _SQLITE_INTERNALS
    + ": drops its agent_messages table",
    "test_sqlite_session_rollback_failure_evicts_connection": _SQLITE_INTERNALS
    + ": swaps its _get_connection",
    "test_sqlite_session_close_retries_quarantined_connection": _SQLITE_INTERNALS
    + ": its quarantined connections",
    "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome": _SQLITE_INTERNALS
    + ": swaps its _get_connection",
    "test_sqlite_session_closed_rejects_empty_add_items": (
        "asserts the SDK class's own message 'SQLiteSession is closed'"
    ),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        name = getattr(item, "originalname", None) or item.name
        (dropped if name in DESELECTED else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            for name in sorted({getattr(i, "originalname", None) or i.name for i in dropped}):
                reporter.write_line(f"deselected {name}: {DESELECTED[name]}")


# --- databases ---------------------------------------------------------------------------------


@pytest.fixture
def _peer_database() -> Iterator[str | None]:
    """A fresh PostgreSQL database (with pgvector) for one test, on the postgres backend."""
    if BACKEND != "postgres":
        yield None
        return
    admin = os.environ["STATEKEEP_TEST_POSTGRES_URL"]
    name = f"peer_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(admin).set(drivername="postgresql+psycopg", database=name)
    with psycopg.connect(url.set(drivername="postgresql").render_as_string(False), autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS vector")
    yield url.render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(autouse=True)
def _statekeep_adapters(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, _peer_database: str | None
) -> Iterator[None]:
    module = request.module
    scratch = Path(tempfile.mkdtemp(prefix="statekeep-peer-"))
    if hasattr(module, "SQLiteSession"):
        monkeypatch.setattr(module, "SQLiteSession", _session_factory(_peer_database, scratch))
    if hasattr(module, "InMemoryStore"):
        monkeypatch.setattr(module, "InMemoryStore", _store_class(_peer_database, scratch))
    yield
    shutil.rmtree(scratch, ignore_errors=True)


def _session_factory(database: str | None, scratch: Path) -> Any:
    from statekeep.integrations.agents import StatekeepSession

    def SQLiteSession(
        session_id: str, db_path: str | Path = ":memory:", *, session_settings: Any = None, **_: Any
    ) -> StatekeepSession:
        if database is not None:
            url = database
        elif str(db_path) == ":memory:":  # a private database, like SQLite's :memory:
            url = f"sqlite:///{scratch / uuid.uuid4().hex}.db"
        else:
            url = f"sqlite:///{db_path}"
        return StatekeepSession(session_id, url, session_settings=session_settings)

    return SQLiteSession


def _store_class(database: str | None, scratch: Path) -> type:
    from statekeep.integrations.langgraph import LangChainEmbedder, StatekeepStore
    from statekeep.memory import FakeEmbedder

    class InMemoryStore(StatekeepStore):  # stands in for LangGraph's class, spied on by name
        def __init__(self, *, index: Any = None) -> None:
            if index:
                embedder: Any = LangChainEmbedder(index["embed"], index["dims"], name=f"peer-{index['dims']}")
            else:
                embedder = FakeEmbedder(8)
            if database is None:
                from statekeep.memory import LanceDBMemoryStore

                memory: Any = LanceDBMemoryStore(
                    scratch / uuid.uuid4().hex, embedder, duplicate_threshold=None
                )
            else:
                from statekeep.memory import PgVectorMemoryStore

                memory = PgVectorMemoryStore(database, embedder, duplicate_threshold=None)
            # each instance its own scope: stores of one test never see each other's items
            super().__init__(memory, index=index, scope=f"{uuid.uuid4().hex[:8]}:")

    return InMemoryStore
