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

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.context._log import Draft, Head, LogView
from statekeep.context._types import SUMMARY, Event, LogEntry, Message
from statekeep.context.base import ContextStore
from statekeep.context.summarize import Summarizer
from statekeep.context.tokens import TokenCounter
from statekeep.db import Database, Migration, upgrade
from statekeep.db.dialects import Dialect
from statekeep.db.migrations import create_tables
from statekeep.db.types import UTCDateTime
from statekeep.errors import EventKeyConflictError, SealedDataError, SessionOwnerError, StorageError
from statekeep.keys import KeyRing

SCHEMA = "statekeep_context"
metadata = sa.MetaData(schema=SCHEMA)

sessions = sa.Table(
    "context_sessions",
    metadata,
    sa.Column("session_id", sa.String(255), primary_key=True),
    sa.Column("last_seq", sa.BigInteger, nullable=False),
    sa.Column("summary_seq", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("pruned_to", sa.BigInteger, nullable=False, server_default="0"),
    # NULL: created without an owner (or before owners were recorded) and not claimed since
    sa.Column("owner", sa.String(255), nullable=True),
)
sa.Index("context_sessions_owner", sessions.c.owner)

events = sa.Table(
    "context_events",
    metadata,
    sa.Column("session_id", sa.String(255), primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("tokens", sa.Integer, nullable=False),
    sa.Column("counter", sa.String(64), nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("key", sa.String(255), nullable=True),
)

# Partial, so the tail query never mistakes it for a path to a session's events.
sa.Index(
    "context_events_key",
    events.c.session_id,
    events.c.key,
    unique=True,
    postgresql_where=events.c.key.isnot(None),
    sqlite_where=events.c.key.isnot(None),
)


def _add_session_owner(conn: Connection) -> None:
    # Version 1 had no owner column. Tables created since (by migration 1, from the
    # current metadata) already have it, hence the check. Existing sessions stay
    # unowned (NULL): the context store does not know runs, so the first write with
    # an owner, or claim(), records one (the runtime claims a session it finds
    # unowned for the owner of the session's first run, see Runtime.claim_session).
    schema = conn.get_execution_options().get("schema_translate_map", {}).get(SCHEMA, SCHEMA)
    columns = {c["name"] for c in sa.inspect(conn).get_columns(sessions.name, schema=schema)}
    if "owner" not in columns:
        quote = conn.dialect.identifier_preparer.quote
        table = f"{quote(schema)}.{quote(sessions.name)}" if schema else quote(sessions.name)
        kind = sessions.c.owner.type.compile(dialect=conn.dialect)
        conn.execute(sa.text(f"ALTER TABLE {table} ADD COLUMN owner {kind}"))
    for index in sessions.indexes:
        index.create(conn, checkfirst=True)


def _no_statistics(conn: Connection) -> None:
    # PostgreSQL's ANALYZE would copy sampled payloads (and owner ids) into pg_statistic,
    # which erasure does not rewrite; the planner needs neither.
    if conn.dialect.name == "postgresql":
        for table, column in (("context_events", "payload"), ("context_sessions", "owner")):
            conn.exec_driver_sql(f"ALTER TABLE {SCHEMA}.{table} ALTER COLUMN {column} SET STATISTICS 0")


MIGRATIONS = [
    Migration(
        1, "context_sessions, context_events", create_tables(metadata, "context_sessions", "context_events")
    ),
    Migration(2, "context_sessions.owner: a session belongs to one owner", _add_session_owner),
    Migration(3, "no statistics on payloads and owners (PostgreSQL)", _no_statistics),
]


def setup(db: Database) -> None:
    """Create or upgrade the context tables (idempotent)."""
    upgrade(db, "context", SCHEMA, MIGRATIONS)


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
) -> list[Event]:
    """Append ``drafts`` inside the caller's transaction; see :meth:`ContextStore._append`.

    With ``keys``, the payloads of an owned session are sealed under its owner's data key.
    ``key_checked``: the caller found the first draft's key absent in this transaction.

    Raises:
        SessionOwnerError: the session belongs to another owner (the caller rolls back).
        _GuardFailed: the latest summary is no longer ``expect_summary`` (the caller rolls back).
        _NeedKey: the session's owner has no data key cached yet (the caller rolls back,
            prepares it, and retries).
    """
    last, summary_seq, holder = _bump(conn, dialect, session_id, len(drafts), owner)
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
    found = conn.execute(_Q["key"], {"sid": session_id, "key": key}).all()
    return _events(session_id, found, keys)[0] if found else None


#: Reserve seqs: built once, values as bind parameters (the hot path skips statement building).
_BUMP = (
    sessions.update()
    .where(sessions.c.session_id == sa.bindparam("sid"))
    .values(last_seq=sessions.c.last_seq + sa.bindparam("n", type_=sa.BigInteger))
    .returning(sessions.c.last_seq, sessions.c.summary_seq, sessions.c.owner)
)
_INSERT_EVENTS = events.insert()


def _bump(
    conn: Connection, dialect: Dialect, session_id: str, n: int, owner: str | None
) -> tuple[int, int, str | None]:
    """Reserve ``n`` seqs: lock the session row and advance its counter; (new last, summary seq, owner).

    With ``owner``, refuse another owner's session and claim an unowned one, under the row lock.
    """
    where = sessions.c.session_id == session_id
    params = {"sid": session_id, "n": n}
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
        conn.execute(sessions.update().where(where).values(owner=owner))  # the first owned write claims it
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


#: The columns a read needs; the session id is known, so it is not read back.
_COLUMNS = (
    events.c.seq,
    events.c.kind,
    events.c.payload,
    events.c.tokens,
    events.c.counter,
    events.c.created_at,
    events.c.key,
)


#: What the builder reads of the tail: no timestamp or key, so no per-row datetime parsing.
_ENTRY_COLUMNS = _COLUMNS[:5]

_decode = json.JSONDecoder().decode


def _payloads(rows: Sequence[Any], keys: KeyRing | None) -> list[Any]:
    """Every row's payload (column 2), opened and decoded in one call: a page is one JSON array.

    Each stored payload is one JSON object (``Event.payload_json``), sealed or
    not; a row that is not one would shift the array, so the count and the types
    are checked. A sealed payload read without a key ring is refused.
    """
    if not rows:
        return []
    texts = [r[2] for r in rows] if keys is None else [keys.open(r[2]) for r in rows]
    if keys is None and any(t.startswith("sk1:") for t in texts):
        raise SealedDataError("-", "this context store has no key ring: open it with keys=")
    try:
        decoded: list[Any] = _decode("[" + ",".join(texts) + "]")
    except ValueError:
        decoded = []
    if len(decoded) != len(rows) or any(type(p) is not dict for p in decoded):
        first, last = sorted((rows[0][0], rows[-1][0]))
        raise StorageError(f"a context payload is not one JSON object (seqs {first}..{last})")
    return decoded


def _events(session_id: str, rows: Sequence[Any], keys: KeyRing | None) -> list[Event]:
    return [
        Event(session_id, r[0], r[1], p, r[3], r[4], r[5], r[6])
        for r, p in zip(rows, _payloads(rows, keys), strict=True)
    ]


class _EntryCache:
    """Entries decoded by earlier builds, by (session, seq), checked against the row read now.

    A run's turns are built one after another in the same worker, and each
    build reads nearly the same tail as the last; decoding its payloads and
    building its messages again was half the build. A row is reused only when
    its kind, payload text, tokens and counter are the ones cached, so a
    session rewritten under the same id is decoded afresh. Bounded: the
    cache is emptied before it would hold more than ``size`` entries or
    ``chars`` characters of payload (tool results can be large); a read
    bigger than that alone is decoded but not kept.
    """

    def __init__(self, size: int = 16_384, chars: int = 4_000_000, keys: KeyRing | None = None) -> None:
        self.size, self.chars, self.keys = size, chars, keys
        self._rows: dict[tuple[str, int], tuple[tuple[Any, ...], LogEntry]] = {}
        self._chars = 0

    def clear(self) -> None:
        """Forget every cached entry."""
        self._rows.clear()
        self._chars = 0

    def forget_sessions(self, session_ids: set[str]) -> None:
        """Drop every entry of these sessions (erased)."""
        for key in list(self._rows):
            if key[0] in session_ids:
                dropped = self._rows.pop(key, None)
                self._chars -= len(dropped[0][1]) if dropped else 0

    def forget(self, session_id: str, upto: int) -> None:
        """Drop a session's entries with ``seq <= upto`` (deleted by retention: not kept in memory either)."""
        keys = list(self._rows)  # one C-level copy: other threads' builds may insert meanwhile
        for key in keys:
            if key[0] == session_id and key[1] <= upto:
                dropped = self._rows.pop(key, None)
                self._chars -= len(dropped[0][1]) if dropped else 0

    def entries(self, session_id: str, rows: Sequence[Any]) -> list[LogEntry]:
        """Rows of ``(seq, kind, payload, tokens, counter)`` as entries, decoding only what is new."""
        cached = self._rows
        out: list[LogEntry | None] = []
        missed: list[int] = []
        for i, r in enumerate(rows):
            hit = cached.get((session_id, r[0]))
            if hit is not None and hit[0] == (r[1], r[2], r[3], r[4]):
                out.append(hit[1])
            else:
                out.append(None)
                missed.append(i)
        if missed:
            fresh = [rows[i] for i in missed]
            chars = sum(len(r[2]) for r in fresh)
            keep = len(fresh) <= self.size and chars <= self.chars
            if keep and (len(cached) + len(fresh) > self.size or self._chars + chars > self.chars):
                self.clear()
            for i, r, p in zip(missed, fresh, _payloads(fresh, self.keys), strict=True):
                entry = LogEntry(session_id, r[0], r[1], p, r[3], r[4])
                if keep:
                    cached[(session_id, r[0])] = ((r[1], r[2], r[3], r[4]), entry)
                out[i] = entry
            self._chars += chars if keep else 0
        return out  # type: ignore[return-value]  # every None was filled


def _statements() -> dict[str, sa.Select[Any]]:
    """The view's queries, built once with bound parameters (the hot path skips statement building)."""
    sid, seq = events.c.session_id == sa.bindparam("sid"), events.c.seq
    tail = sa.select(*_ENTRY_COLUMNS).where(sid, seq > sa.bindparam("after"))
    newest = seq.desc()
    return {
        "head": sa.select(
            sessions.c.last_seq, sessions.c.summary_seq, sessions.c.pruned_to, sessions.c.owner
        ).where(sessions.c.session_id == sa.bindparam("sid")),
        "event": sa.select(*_COLUMNS).where(sid, seq == sa.bindparam("seq")),
        "key": sa.select(*_COLUMNS).where(sid, events.c.key == sa.bindparam("key")),
        "tail": tail.order_by(newest).limit(sa.bindparam("limit")),
        "tail_before": tail.where(seq < sa.bindparam("before")).order_by(newest).limit(sa.bindparam("limit")),
        "range": sa.select(*_COLUMNS)
        .where(sid, seq.between(sa.bindparam("first"), sa.bindparam("last")))
        .order_by(seq),
    }


_Q = _statements()


class _SQLView:
    """Reads of the log, all inside one read transaction."""

    def __init__(self, conn: Connection, cache: _EntryCache, keys: KeyRing | None) -> None:
        self._conn = conn
        self._cache = cache
        self._keys = keys

    def head(self, session_id: str) -> Head | None:
        row = self._conn.execute(_Q["head"], {"sid": session_id}).first()
        return None if row is None else Head(int(row[0]), int(row[1]), int(row[2]), row[3])

    def event(self, session_id: str, seq: int) -> Event | None:
        rows = self._conn.execute(_Q["event"], {"sid": session_id, "seq": seq}).all()
        found = _events(session_id, rows, self._keys)
        return found[0] if found else None

    def by_key(self, session_id: str, key: str) -> Event | None:
        return _by_key(self._conn, session_id, key, self._keys)

    def tail(self, session_id: str, *, after: int, before: int | None, limit: int) -> list[LogEntry]:
        params = {"sid": session_id, "after": after, "limit": limit}
        if before is None:
            return self._cache.entries(session_id, self._conn.execute(_Q["tail"], params).all())
        rows = self._conn.execute(_Q["tail_before"], {**params, "before": before}).all()
        return self._cache.entries(session_id, rows)

    def range(self, session_id: str, first: int, last: int) -> list[Event]:
        rows = self._conn.execute(_Q["range"], {"sid": session_id, "first": first, "last": last}).all()
        return _events(session_id, rows, self._keys)


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
        self._entry_cache = _EntryCache(keys=keys)
        setup(self.db)

    def close(self) -> None:
        self.db.dispose()

    @contextmanager
    def _view(self) -> Iterator[LogView]:
        with self.db.read("reading the context log") as conn:
            yield _SQLView(conn, self._entry_cache, self.keys)

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
        stored = _by_key(conn, session_id, key, self.keys)
        if stored is None:
            try:
                stored = append_events(
                    conn, self.db.dialect, session_id, [draft], None, owner, self.keys, key_checked=True
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
