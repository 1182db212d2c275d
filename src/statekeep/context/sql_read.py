"""Reading the context log in SQL: the statements, the rows decoded into entries, and their cache.

Every read of a build happens in one read transaction (:class:`SQLView`).
Decoded entries are cached per database and key ring (:func:`shared_cache`), so
a new store object on the same :class:`~statekeep.db.Database` (a worker opening
one per run) reuses what earlier builds decoded.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.context._log import Head
from statekeep.context._types import Event, LogEntry
from statekeep.context.tables import events, sessions
from statekeep.db import Database
from statekeep.errors import SealedDataError, StorageError
from statekeep.keys import KeyRing

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


def events_of(session_id: str, rows: Sequence[Any], keys: KeyRing | None) -> list[Event]:
    return [
        Event(session_id, r[0], r[1], p, r[3], r[4], r[5], r[6])
        for r, p in zip(rows, _payloads(rows, keys), strict=True)
    ]


class EntryCache:
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
        get = cached.get
        out: list[LogEntry | None] = []
        missed: list[int] = []
        for seq, kind, payload, tokens, counter in rows:
            hit = get((session_id, seq))
            if hit is not None and hit[0] == (kind, payload, tokens, counter):
                out.append(hit[1])
            else:
                missed.append(len(out))
                out.append(None)
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


STATEMENTS = _statements()


class SQLView:
    """Reads of the log, all inside one read transaction."""

    def __init__(self, conn: Connection, cache: EntryCache, keys: KeyRing | None) -> None:
        self._conn = conn
        self._cache = cache
        self._keys = keys

    def head(self, session_id: str) -> Head | None:
        row = self._conn.execute(STATEMENTS["head"], {"sid": session_id}).first()
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
        params = {"sid": session_id, "after": after, "limit": limit}
        if before is None:
            return self._cache.entries(session_id, self._conn.execute(STATEMENTS["tail"], params).all())
        rows = self._conn.execute(STATEMENTS["tail_before"], {**params, "before": before}).all()
        return self._cache.entries(session_id, rows)

    def range(self, session_id: str, first: int, last: int) -> list[Event]:
        rows = self._conn.execute(
            STATEMENTS["range"], {"sid": session_id, "first": first, "last": last}
        ).all()
        return events_of(session_id, rows, self._keys)


#: Entry caches by database, then by key ring (None: a store without one); both by identity.
_SHARED: weakref.WeakKeyDictionary[Database, dict[int, tuple[KeyRing | None, EntryCache]]] = (
    weakref.WeakKeyDictionary()
)
_SHARED_LOCK = threading.Lock()


def shared_cache(db: Database, keys: KeyRing | None) -> EntryCache:
    """The entry cache of every context store on ``db`` with this key ring (the same object).

    Entries are decoded with the key ring, so stores with another ring (or none)
    never see them: a store without the ring still refuses sealed rows.
    """
    with _SHARED_LOCK:
        by_ring = _SHARED.setdefault(db, {})
        held = by_ring.get(id(keys))
        if held is None or held[0] is not keys:
            held = (keys, EntryCache(keys=keys))
            by_ring[id(keys)] = held
        return held[1]
