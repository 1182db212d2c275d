"""Erasure while another connection reads the database: no old copy of a row may survive it.

PostgreSQL: ``VACUUM FULL`` copies a deleted row into the rewritten files while a
transaction that began before the delete may still see it; a wrapped data key (and a
memory's text) would then outlive the erasure. SQLite: the write-ahead log keeps the
pages from before the delete until it is truncated, which waits for its readers (and
waited a minute per try, twenty tries, before). The erasure waits for them, and when one
outlasts the wait it fails, saying so, and erasing again finishes the job.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from statekeep.config import Settings
from statekeep.db import rewrite
from statekeep.errors import ErasureError
from statekeep.runtime import Runtime
from tests.privacy.conftest import Person, populate
from tests.privacy.scan import plain_hits, postgres_files, recoverable_hits, sqlite_files


@pytest.fixture
def older(settings: Settings) -> Iterator[Any]:
    """A connection of the same database in a transaction that has read something.

    PostgreSQL: a REPEATABLE READ snapshot; SQLite: a read transaction of the WAL.
    """
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite":
        lite = sqlite3.connect(str(url.database), isolation_level=None, check_same_thread=False)
        lite.execute("BEGIN")
        lite.execute("SELECT count(*) FROM sqlite_master").fetchone()
        yield lite
        lite.close()
        return
    conn = psycopg.connect(url.set(drivername="postgresql").render_as_string(False))
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute("SELECT count(*) FROM pg_class").fetchone()
    yield conn
    conn.close()


def _files(settings: Settings) -> list[Path]:
    url = settings.database_url
    return sqlite_files(url) if url.startswith("sqlite") else postgres_files(url)


def _recovered(settings: Settings, person: Person) -> set[str]:
    files = _files(settings)
    key_file = settings.home / "keys.json"
    return recoverable_hits(files, key_file, ["alice", "bob"], person.markers.values()) | plain_hits(
        files, person.markers.values()
    )


def test_erasure_waits_for_an_older_transaction_and_then_leaves_nothing(
    settings: Settings, runtime: Runtime, older: Any
) -> None:
    """The erasure does not finish while the older reader is open; once it ends, nothing is left."""
    alice, bob = Person("alice"), Person("bob")
    populate(runtime, alice, gated=False)
    populate(runtime, bob, gated=False)
    written = {v for k, v in alice.markers.items() if k not in ("gated", "task2")}  # no gated run
    assert written <= _recovered(settings, alice)  # the scan sees what it must
    outcome: list[object] = []

    def erase() -> None:
        try:
            outcome.append(runtime.erase_owner("alice"))
        except Exception as exc:  # handed to the test's thread
            outcome.append(exc)

    erasing = threading.Thread(target=erase)
    erasing.start()
    erasing.join(1.5)
    assert erasing.is_alive(), "the erasure finished while an older reader could keep the rows"
    older.rollback()
    erasing.join(30)
    assert not erasing.is_alive()
    [receipt] = outcome
    assert not isinstance(receipt, Exception), receipt
    assert _recovered(settings, alice) == set()
    assert bob.markers["task"] in _recovered(settings, bob)


def test_an_older_transaction_that_outlasts_the_wait_fails_the_erasure_and_erasing_again_finishes(
    settings: Settings,
    runtime: Runtime,
    older: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The error says what held the rows; after it ends, a second erasure leaves nothing."""
    monkeypatch.setattr(rewrite, "WAIT", 0.5)
    alice = Person("alice")
    populate(runtime, alice, gated=False)
    lite = isinstance(older, sqlite3.Connection)
    holder = "a reader of" if lite else rf"backend {older.info.backend_pid}\b"
    with pytest.raises(ErasureError, match=rf"{holder}.*erase again"):
        runtime.erase_owner("alice")
    kept = _recovered(settings, alice)  # what the reader kept: PostgreSQL's memory text, SQLite's data key
    assert kept
    older.rollback()
    runtime.erase_owner("alice")
    assert _recovered(settings, alice) == set()
