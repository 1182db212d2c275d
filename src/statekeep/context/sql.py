"""The SQL backend of the context store (SQLite and PostgreSQL).

Sequence numbers come from a per-session counter row, ``context_sessions``,
incremented by an ``UPDATE ... RETURNING`` in the same transaction as the
event insert. The UPDATE takes the row lock, so concurrent appenders to one
session queue on it (PostgreSQL re-reads the committed row under READ
COMMITTED; SQLite serializes writers with ``BEGIN IMMEDIATE``); a rolled-back
append rolls back its increment too. So seqs have no gaps and no duplicates.
The same row points at the latest summary, so the builder finds it by key,
and records the session's owner: the append's ``UPDATE ... RETURNING`` returns
it, so checking the owner costs no extra statement (the first owned append to
an unowned session records it, under the same row lock).

With a key ring (``keys=``), event payloads (messages and summaries) of an
owned session are sealed with the data key of the session's owner; reads open
them. Payloads of a session without an owner stay plain text.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.context._log import Draft, LogView
from statekeep.context._types import SUMMARY, Event, Message
from statekeep.context.base import ContextStore
from statekeep.context.sql_cache import shared_cache
from statekeep.context.sql_read import STATEMENTS, SQLView, events_of
from statekeep.context.summarize import Summarizer
from statekeep.context.tables import MIGRATIONS, SCHEMA, events, metadata, sessions, setup
from statekeep.context.tokens import TokenCounter
from statekeep.db import Database
from statekeep.db.dialects import Dialect
from statekeep.errors import EventKeyConflictError, SealedDataError, SessionOwnerError
from statekeep.keys import KeyRing

__all__ = [
    "MIGRATIONS",
    "SCHEMA",
    "SQLContextStore",
    "append_events",
    "events",
    "metadata",
    "sessions",
    "setup",
]


class _GuardFailed(Exception):
    """Internal: roll back an append whose summary guard no longer holds."""


class _KeyExists(Exception):
    """Internal: roll back an append whose idempotency key is already stored."""

    def __init__(self, event: Event) -> None:
        self.event = event


class _NeedKey(Exception):
    """Internal: roll back an append to a session whose owner has no data key yet; create it, retry."""

    def __init__(self, owner: str) -> None:
        self.owner = owner


def append_events(
    conn: Connection,
    dialect: Dialect,
    session_id: str,
    drafts: Sequence[Draft],
    expect_summary: int | None,
    owner: str | None = None,
    keys: KeyRing | None = None,
    *,
    key_checked: bool = False,
    bumped: sa.Row[int, int, str | None] | None = None,
) -> list[Event]:
    """Append ``drafts`` inside the caller's transaction; see :meth:`ContextStore._append`.

    With ``keys``, the payloads of an owned session are sealed under its owner's data key.
    ``key_checked``: the caller found the first draft's key absent in this transaction.
    ``bumped``: the caller reserved the seqs already (the row its bump returned).

    Raises:
        SessionOwnerError: the session belongs to another owner (the caller rolls back).
        _GuardFailed: the latest summary is no longer ``expect_summary`` (the caller rolls back).
        _NeedKey: the session's owner has no data key cached yet (the caller rolls back,
            prepares it, and retries).
    """
    last, summary_seq, holder = _bump(conn, dialect, session_id, len(drafts), owner, bumped)
    if expect_summary is not None and summary_seq != expect_summary:
        raise _GuardFailed
    if drafts[0].key is not None and not key_checked:  # checked under the session row lock, so no race
        found = _by_key(conn, session_id, drafts[0].key, keys)
        if found is not None:
            raise _KeyExists(found)
    first = last - len(drafts) + 1
    stored = [d.at(session_id, first + i) for i, d in enumerate(drafts)]
    rows = [_row(e) for e in stored]
    if keys is not None and holder is not None:
        try:
            for row in rows:
                row["payload"] = keys.seal(holder, row["payload"], create=False)
        except SealedDataError:
            raise _NeedKey(holder) from None
    conn.execute(_INSERT_EVENTS, rows)
    summaries = [e.seq for e in stored if e.kind == SUMMARY]
    if summaries:
        where = sessions.c.session_id == session_id
        conn.execute(sessions.update().where(where).values(summary_seq=summaries[-1]))
    return stored


def _by_key(conn: Connection, session_id: str, key: str, keys: KeyRing | None) -> Event | None:
    found = conn.execute(STATEMENTS["key"], {"sid": session_id, "key": key}).all()
    return events_of(session_id, found, keys)[0] if found else None


#: Reserve seqs: built once, values as bind parameters (the hot path skips statement building).
_BUMP = (
    sessions.update()
    .where(sessions.c.session_id == sa.bindparam("sid"))
    .values(last_seq=sessions.c.last_seq + sa.bindparam("n", type_=sa.BigInteger))
    .returning(sessions.c.last_seq, sessions.c.summary_seq, sessions.c.owner)
)
#: The same, only while no event of the session holds ``key``: the key check and the bump in one statement.
_BUMP_UNLESS_KEY = _BUMP.where(
    ~sa.exists().where(events.c.session_id == sa.bindparam("sid"), events.c.key == sa.bindparam("key"))
)
_INSERT_EVENTS = events.insert()


def _bump(
    conn: Connection,
    dialect: Dialect,
    session_id: str,
    n: int,
    owner: str | None,
    row: sa.Row[int, int, str | None] | None = None,
) -> tuple[int, int, str | None]:
    """Reserve ``n`` seqs: lock the session row and advance its counter; (new last, summary seq, owner).

    With ``owner``, refuse another owner's session and claim an unowned one, under the row lock.
    ``row``: the caller reserved them already (the row its bump returned).
    """
    params = {"sid": session_id, "n": n}
    if row is None:
        row = conn.execute(_BUMP, params).first()
    if row is None:
        new = dialect.insert(sessions).values(
            session_id=session_id, last_seq=0, summary_seq=0, pruned_to=0, owner=owner
        )
        conn.execute(new.on_conflict_do_nothing(index_elements=["session_id"]))
        row = conn.execute(_BUMP, params).one()
    if owner is not None and row[2] != owner:
        if row[2] is not None:
            raise SessionOwnerError(session_id, owner, row[2])
        claim = sessions.update().where(sessions.c.session_id == session_id).values(owner=owner)
        conn.execute(claim)  # the first owned write claims it
    return int(row[0]), int(row[1]), owner if owner is not None else row[2]


def _row(e: Event) -> dict[str, Any]:
    return {
        "session_id": e.session_id,
        "seq": e.seq,
        "kind": e.kind,
        "payload": e.payload_json(),
        "tokens": e.tokens,
        "counter": e.counter,
        "created_at": e.created_at,
        "key": e.key,
    }


class SQLContextStore(ContextStore):
    """Session logs in SQLite or PostgreSQL (schema ``statekeep_context``).

    Args:
        db: a :class:`~statekeep.db.Database` (shared with other stores) or a URL.
        keys: seal the payloads of owned sessions with their owner's data key
            (see :mod:`statekeep.keys`); without it payloads are stored as plain JSON.

    Examples:
        >>> from statekeep.context import Message
        >>> store = SQLContextStore("sqlite:///:memory:")
        >>> store.append("s1", Message.user("hello")).seq
        1
    """

    def __init__(
        self,
        db: Database | str,
        *,
        counter: TokenCounter | None = None,
        summarizer: Summarizer | None = None,
        high_water: float = 0.8,
        low_water: float = 0.5,
        keys: KeyRing | None = None,
    ) -> None:
        super().__init__(counter=counter, summarizer=summarizer, high_water=high_water, low_water=low_water)
        self.db = db if isinstance(db, Database) else Database(db, setting="STATEKEEP_CONTEXT_URL")
        self.keys = keys
        self._entry_cache = shared_cache(self.db, keys)
        setup(self.db)

    def close(self) -> None:
        self.db.dispose()

    @contextmanager
    def _view(self) -> Iterator[LogView]:
        with self.db.read("reading the context log") as conn:
            yield SQLView(conn, self._entry_cache, self.keys)

    def _append(
        self,
        session_id: str,
        drafts: Sequence[Draft],
        expect_summary: int | None,
        owner: str | None = None,
    ) -> list[Event]:
        if self.keys is not None and owner is not None and not self.keys.ready(owner):
            self.keys.prepare(owner)  # outside the write transaction: it may create the key
        for attempt in (1, 2):
            try:
                with self.db.begin(f"appending to session {session_id!r}") as conn:
                    return append_events(
                        conn, self.db.dialect, session_id, drafts, expect_summary, owner, self.keys
                    )
            except _GuardFailed:
                return []
            except _KeyExists as existing:
                return [existing.event]
            except _NeedKey as need:
                if attempt == 2 or self.keys is None:
                    raise SealedDataError("-", f"no data key for owner {need.owner!r}") from None
                self.keys.prepare(need.owner)
        raise AssertionError("unreachable")  # pragma: no cover

    def append_in(
        self, conn: Connection, session_id: str, message: Message, *, key: str, owner: str
    ) -> Event:
        """:meth:`append` inside the caller's write transaction on this store's database.

        For a workflow step whose completion commits with its context event (the
        runtime, when the stores share a database): the caller holds the run's
        fence, so the key is looked up before the session row is locked, and an
        event already stored under ``key`` is returned without writing anything.
        The owner's data key must exist already (the fenced transaction prepared it).

        Raises:
            EventKeyConflictError: ``key`` already names a different message.
            SessionOwnerError: the session belongs to another owner (the caller rolls back).
            SealedDataError: the owner has no data key.
        """
        draft = replace(self._draft(message), key=key)
        # the common case in one statement: the key is free and the session exists, so reserve the seq
        bumped = conn.execute(_BUMP_UNLESS_KEY, {"sid": session_id, "key": key, "n": 1}).first()
        stored = None if bumped is not None else _by_key(conn, session_id, key, self.keys)
        if stored is None:
            try:
                stored = append_events(
                    conn,
                    self.db.dialect,
                    session_id,
                    [draft],
                    None,
                    owner,
                    self.keys,
                    key_checked=True,
                    bumped=bumped,
                )[0]
            except _NeedKey as need:
                raise SealedDataError("-", f"no data key for owner {need.owner!r}") from None
        if (stored.kind, stored.payload) != (draft.kind, draft.payload):
            raise EventKeyConflictError(session_id, key, stored.seq)
        return stored

    def _claim(self, session_id: str, owner: str) -> str | None:
        with self._view() as view:
            head = view.head(session_id)
        if head is not None and head.owner is not None:
            return head.owner  # an owner, once recorded, never changes: no write needed
        # Insert-if-absent, then set-if-unowned: on PostgreSQL the second claimer's statements
        # wait for the first one's row lock and then see its owner; SQLite serializes writers.
        where = sessions.c.session_id == session_id
        new = self.db.dialect.insert(sessions).values(
            session_id=session_id, last_seq=0, summary_seq=0, pruned_to=0, owner=owner
        )
        claim = (
            sessions.update()
            .where(where)
            .values(owner=sa.func.coalesce(sessions.c.owner, owner))
            .returning(sessions.c.owner)
        )
        with self.db.begin(f"claiming session {session_id!r}") as conn:
            conn.execute(new.on_conflict_do_nothing(index_elements=["session_id"]))
            actual: str | None = conn.execute(claim).scalar_one()
        return actual

    def _sessions_of(self, owner: str) -> list[str]:
        query = (
            sa.select(sessions.c.session_id).where(sessions.c.owner == owner).order_by(sessions.c.session_id)
        )
        with self.db.read("listing sessions") as conn:
            return [str(r[0]) for r in conn.execute(query)]

    def _delete_owner(self, owner: str) -> tuple[int, int, int]:
        ids = self._sessions_of(owner)
        counted = sa.select(sa.func.count(), sa.func.count().filter(events.c.kind == SUMMARY))
        n_events = n_summaries = 0
        with self.db.begin(f"erasing the sessions of {owner!r}") as conn:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                where = events.c.session_id.in_(chunk)
                total, summaries = conn.execute(counted.where(where)).one()
                n_events, n_summaries = n_events + int(total), n_summaries + int(summaries)
                conn.execute(events.delete().where(where))
                conn.execute(sessions.delete().where(sessions.c.session_id.in_(chunk)))
        self._entry_cache.forget_sessions(set(ids))
        return len(ids), n_events, n_summaries

    def _delete_covered(self, session_id: str, upto: int) -> int:
        mark = sessions.update().where(sessions.c.session_id == session_id, sessions.c.pruned_to < upto)
        raw = events.c.kind != SUMMARY
        drop = events.delete().where(events.c.session_id == session_id, events.c.seq <= upto, raw)
        with self.db.begin() as conn:
            conn.execute(mark.values(pruned_to=upto))
            removed = int(conn.execute(drop).rowcount)
        self._entry_cache.forget(session_id, upto)
        return removed
