"""Reading the context log in SQL: the statements, and the rows decoded into entries.

Every read of a build happens in one read transaction (:class:`SQLView`).
Decoded entries are cached per database and key ring (:mod:`.sql_cache`), so
a new store object on the same :class:`~statekeep.db.Database` (a worker opening
one per run) reuses what earlier builds decoded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.context._log import Head
from statekeep.context._types import Event, LogEntry
from statekeep.context.sql_cache import EntryCache, Refetch, payloads
from statekeep.context.tables import events, sessions
from statekeep.keys import KeyRing

__all__ = ["STATEMENTS", "SQLView", "events_of"]

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
#: The same, NULL but the seq in the stretch ``lo..hi`` whose entries are cached.
_CACHED = events.c.seq.between(
    sa.bindparam("lo", None, type_=sa.BigInteger), sa.bindparam("hi", None, type_=sa.BigInteger)
)
_TAIL_COLUMNS = (events.c.seq, *(sa.case((_CACHED, sa.null()), else_=c) for c in _ENTRY_COLUMNS[1:]))


def events_of(session_id: str, rows: Sequence[Any], keys: KeyRing | None) -> list[Event]:
    return [
        Event(session_id, r[0], r[1], p, r[3], r[4], r[5], r[6])
        for r, p in zip(rows, payloads(rows, keys), strict=True)
    ]


def _statements() -> dict[str, sa.Select[Any]]:
    """The view's queries, built once with bound parameters (the hot path skips statement building)."""
    sid, seq = events.c.session_id == sa.bindparam("sid"), events.c.seq
    tail = sa.select(*_TAIL_COLUMNS).where(sid, seq > sa.bindparam("after"))
    newest = seq.desc()
    return {
        "head": sa.select(
            sessions.c.last_seq,
            sessions.c.summary_seq,
            sessions.c.pruned_to,
            sessions.c.owner,
            sessions.c.incarnation,
        ).where(sessions.c.session_id == sa.bindparam("sid")),
        "page": sa.select(*_ENTRY_COLUMNS)
        .where(sid, seq.between(sa.bindparam("first"), sa.bindparam("last")))
        .order_by(seq),
        "event": sa.select(*_COLUMNS).where(sid, seq == sa.bindparam("seq")),
        "key": sa.select(*_COLUMNS).where(sid, events.c.key == sa.bindparam("key")),
        "tail": tail.order_by(newest).limit(sa.bindparam("limit")),
        "tail_before": tail.where(seq < sa.bindparam("before")).order_by(newest).limit(sa.bindparam("limit")),
        "range": sa.select(*_COLUMNS)
        .where(sid, seq.between(sa.bindparam("first"), sa.bindparam("last")))
        .order_by(seq),
    }


STATEMENTS = _statements()


class SQLView:
    """Reads of the log, all inside one read transaction."""

    def __init__(self, conn: Connection, cache: EntryCache, keys: KeyRing | None) -> None:
        self._conn = conn
        self._cache = cache
        self._keys = keys
        self._incarnations: dict[str, int | None] = {}
        # before the transaction's first read: an erasure the snapshot predates changes it
        self._since = cache.erasures

    def head(self, session_id: str) -> Head | None:
        row = self._conn.execute(STATEMENTS["head"], {"sid": session_id}).first()
        self._incarnations[session_id] = None if row is None else row[4]
        return None if row is None else Head(int(row[0]), int(row[1]), int(row[2]), row[3])

    def event(self, session_id: str, seq: int) -> Event | None:
        rows = self._conn.execute(STATEMENTS["event"], {"sid": session_id, "seq": seq}).all()
        found = events_of(session_id, rows, self._keys)
        return found[0] if found else None

    def by_key(self, session_id: str, key: str) -> Event | None:
        rows = self._conn.execute(STATEMENTS["key"], {"sid": session_id, "key": key}).all()
        found = events_of(session_id, rows, self._keys)
        return found[0] if found else None

    def tail(self, session_id: str, *, after: int, before: int | None, limit: int) -> list[LogEntry]:
        if session_id not in self._incarnations:
            self.head(session_id)
        incarnation = self._incarnations[session_id]
        lo, hi = self._cache.span(session_id, incarnation)
        params = {"sid": session_id, "after": after, "limit": limit, "lo": lo, "hi": hi}
        if before is None:
            rows = self._conn.execute(STATEMENTS["tail"], params).all()
        else:
            rows = self._conn.execute(STATEMENTS["tail_before"], {**params, "before": before}).all()
        return self._cache.entries(session_id, rows, incarnation, self._page(session_id), self._since)

    def _page(self, session_id: str) -> Refetch:
        def read(first: int, last: int) -> Sequence[Any]:
            params = {"sid": session_id, "first": first, "last": last}
            return self._conn.execute(STATEMENTS["page"], params).all()

        return read

    def range(self, session_id: str, first: int, last: int) -> list[Event]:
        rows = self._conn.execute(
            STATEMENTS["range"], {"sid": session_id, "first": first, "last": last}
        ).all()
        return events_of(session_id, rows, self._keys)
