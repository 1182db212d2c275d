"""The shared SQL layer: pooled connections are pinged only after sitting idle, and dead ones replaced."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from statekeep.db import Database
from statekeep.errors import StorageError
from statekeep.working import SQLWorkingStateStore
from tests.conftest import _admin


def _drop_the_pooled_connection(db: Database, admin_url: str) -> int:
    """Terminate, from the server side, the backend of the connection ``db`` pools; return its pid."""
    with db.read() as conn:
        pid = int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())
    with _admin(admin_url) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return pid


def _count_pings(db: Database, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    pings: list[int] = []
    real = db.engine.dialect.do_ping

    def counted(dbapi_conn: Any) -> bool:
        pings.append(1)
        return bool(real(dbapi_conn))

    monkeypatch.setattr(db.engine.dialect, "do_ping", counted)
    return pings


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_busy_connection_is_not_pinged_an_idle_one_is(
    request: pytest.FixtureRequest, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Back-to-back transactions skip the ping round trip; after the idle window, checkout pings."""
    db = Database(request.getfixturevalue(f"{backend}_url"), ping_after=0.5)
    pings = _count_pings(db, monkeypatch)
    try:
        for _ in range(5):
            with db.read() as conn:
                conn.execute(sa.text("SELECT 1"))
        assert pings == []
        time.sleep(0.6)
        with db.read() as conn:
            conn.execute(sa.text("SELECT 1"))
        assert pings == [1]
    finally:
        db.dispose()


def test_a_connection_the_server_dropped_is_replaced_before_use(
    postgres_url: str, postgres_admin_url: str
) -> None:
    """After a server-side disconnect (a restart, an idle timeout), the next use gets a live connection."""
    db = Database(postgres_url, ping_after=0.1)
    store = SQLWorkingStateStore(db)
    try:
        pid = _drop_the_pooled_connection(db, postgres_admin_url)
        time.sleep(0.2)
        assert store.latest_version("run") == 0  # pinged, found dead, replaced: no error
        with db.read() as conn:
            assert conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one() != pid
    finally:
        db.dispose()


def test_inside_the_window_a_dropped_connection_fails_once_then_heals(
    postgres_url: str, postgres_admin_url: str
) -> None:
    """The trade of the idle window: a drop within it surfaces once as StorageError, then the pool heals."""
    db = Database(postgres_url, ping_after=3600)
    store = SQLWorkingStateStore(db)
    try:
        _drop_the_pooled_connection(db, postgres_admin_url)
        time.sleep(0.1)
        with pytest.raises(StorageError, match="reading from Database"):
            store.latest_version("run")
        assert store.latest_version("run") == 0
    finally:
        db.dispose()


def test_connections_opening_a_new_sqlite_file_together_all_get_in(tmp_path: Path) -> None:
    """Eight threads open one new file at once, 150 times: none is told ``database is locked``.

    Switching a new file to WAL needs it to itself, and SQLite refuses a second
    switcher at once instead of waiting (as workers starting together on a new
    database do); the connect hook waits its turn. Before it did, about one
    connection in a hundred failed here.
    """
    failures: list[BaseException] = []
    for trial in range(150):
        url = f"sqlite:///{tmp_path}/new-{trial}.db"
        start = threading.Barrier(8)

        def open_and_read(url: str = url, start: threading.Barrier = start) -> None:
            db = Database(url)
            start.wait()
            try:
                with db.read() as conn:
                    assert conn.execute(sa.text("PRAGMA journal_mode")).scalar_one() == "wal"
            except BaseException as exc:  # collected and reported below
                failures.append(exc)
            finally:
                db.dispose()

        threads = [threading.Thread(target=open_and_read) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == []


def test_an_in_memory_sqlite_database_is_told_apart_from_a_file_and_a_server(tmp_path: Path) -> None:
    """`in_memory` is true only for SQLite without a file; a file's folder is created, a server has none."""
    for url in ("sqlite://", "sqlite:///:memory:"):
        db = Database(url)
        assert db.in_memory
        assert db.dialect.file_of(db.url) is None
        db.dispose()
    path = tmp_path / "new" / "statekeep.db"
    on_file = Database(f"sqlite:///{path}")
    assert not on_file.in_memory
    assert on_file.dialect.file_of(on_file.url) == path
    assert path.parent.is_dir()
    on_file.dispose()
    server = Database("postgresql://someone@localhost/nothing")  # no connection is made
    assert not server.in_memory
    assert server.dialect.file_of(server.url) is None
    server.dispose()
