"""Erasure on PostgreSQL while a transaction older than it is open: no dead row may survive it.

``VACUUM FULL`` copies a deleted row into the rewritten files while a transaction that
began before the delete may still see it; a wrapped data key (and a memory's text) would
then outlive the erasure. The erasure waits for such transactions, and when one outlasts
the wait it fails, naming it, and erasing again finishes the job.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy.engine import make_url

from statekeep.config import Settings
from statekeep.db import rewrite
from statekeep.errors import ErasureError
from statekeep.runtime import Runtime
from tests.privacy.conftest import Person, populate
from tests.privacy.scan import plain_hits, postgres_files, recoverable_hits

pytestmark = pytest.mark.parametrize("settings", ["postgres"], indirect=True)


@pytest.fixture
def older(settings: Settings) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A session of the same database in a REPEATABLE READ transaction that has read something."""
    libpq = make_url(settings.database_url).set(drivername="postgresql").render_as_string(False)
    conn = psycopg.connect(libpq)
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute("SELECT count(*) FROM pg_class").fetchone()
    yield conn
    conn.close()


def _recovered(settings: Settings, person: Person) -> set[str]:
    files = postgres_files(settings.database_url)
    key_file = settings.home / "keys.json"
    return recoverable_hits(files, key_file, ["alice", "bob"], person.markers.values()) | plain_hits(
        files, person.markers.values()
    )


def test_erasure_waits_for_an_older_transaction_and_then_leaves_nothing(
    settings: Settings, runtime: Runtime, older: psycopg.Connection[tuple[object, ...]]
) -> None:
    """The erasure does not finish while the older snapshot is open; once it ends, nothing is left."""
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
    assert erasing.is_alive(), "the erasure rewrote the files while an older snapshot could see the rows"
    older.rollback()
    erasing.join(30)
    assert not erasing.is_alive()
    [receipt] = outcome
    assert not isinstance(receipt, Exception), receipt
    assert _recovered(settings, alice) == set()
    assert {bob.markers["memory"], bob.markers["task"]} <= _recovered(settings, bob)


def test_an_older_transaction_that_outlasts_the_wait_fails_the_erasure_and_erasing_again_finishes(
    settings: Settings,
    runtime: Runtime,
    older: psycopg.Connection[tuple[object, ...]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The error names the backend that held the rows; after it ends, a second erasure leaves nothing."""
    monkeypatch.setattr(rewrite, "WAIT", 0.3)
    alice = Person("alice")
    populate(runtime, alice, gated=False)
    with pytest.raises(ErasureError, match=rf"backend {older.info.backend_pid}\b.*erase again"):
        runtime.erase_owner("alice")
    assert alice.markers["memory"] in _recovered(settings, alice)  # the older snapshot kept its rows
    older.rollback()
    runtime.erase_owner("alice")
    assert _recovered(settings, alice) == set()
