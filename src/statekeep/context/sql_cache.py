"""Decoded context entries, kept between builds and shared by the store objects of one database.

A run's turns are built one after another in the same worker, and each build
reads nearly the same tail as the last: decoding its payloads and building its
messages again was most of the build. :class:`EntryCache` keeps the decoded
entries by (session, seq); :func:`shared_cache` gives every store object on
one :class:`~statekeep.db.Database` with the same key ring the same cache.

A build still reads which rows its window has, but only the seq of rows whose
entries are cached: the cache tells the read which stretch of seqs it holds
(:meth:`EntryCache.span`), and the tail query returns NULL for the other
columns there. Such a row is taken from the cache when it was cached from the
same incarnation of the session: events are never rewritten in place
(re-sealing keeps their text), and a session erased and started again under
the same id has another incarnation. A row read whole is taken from the cache
only when its kind, payload text, tokens and counter are the cached ones. A
row read without its columns whose entry is not (or no longer) cached is read
again, in the same read transaction.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from statekeep.context._types import LogEntry
from statekeep.db import Database
from statekeep.errors import StorageError
from statekeep.keys import KeyRing, is_sealed, no_key_ring

#: Reads the rows ``(seq, kind, payload, tokens, counter)`` with ``first <= seq <= last``.
Refetch = Callable[[int, int], Sequence[Any]]

_decode = json.JSONDecoder().decode


def payloads(rows: Sequence[Any], keys: KeyRing | None) -> list[Any]:
    """Every row's payload (column 2), opened and decoded in one call: a page is one JSON array.

    Each stored payload is one JSON object (``Event.payload_json``), sealed or
    not; a row that is not one would shift the array, so the count and the types
    are checked. A sealed payload read without a key ring is refused.
    """
    if not rows:
        return []
    texts = [r[2] for r in rows] if keys is None else [keys.open(r[2]) for r in rows]
    sealed = None if keys is not None else next((t for t in texts if is_sealed(t)), None)
    if sealed is not None:
        raise no_key_ring(sealed, "context", "the session")
    try:
        decoded: list[Any] = _decode("[" + ",".join(texts) + "]")
    except ValueError:
        decoded = []
    if len(decoded) != len(rows) or any(type(p) is not dict for p in decoded):
        first, last = sorted((rows[0][0], rows[-1][0]))
        raise StorageError(f"a context payload is not one JSON object (seqs {first}..{last})")
    return decoded


class EntryCache:
    """Entries decoded by earlier builds, by (session, seq), checked against the row read now.

    A row is reused only when it was cached from the same session incarnation,
    and, when the read returned its columns, its kind, payload text, tokens and
    counter are the cached ones.
    Bounded: the cache is emptied before it would hold more than ``size``
    entries or ``chars`` characters of payload (tool results can be large); a
    read bigger than that alone is decoded but not kept.
    """

    def __init__(self, size: int = 16_384, chars: int = 4_000_000, keys: KeyRing | None = None) -> None:
        self.size, self.chars, self.keys = size, chars, keys
        #: (session, seq) -> (incarnation, (kind, payload text, tokens, counter), entry)
        self._rows: dict[tuple[str, int], tuple[int | None, tuple[Any, ...], LogEntry]] = {}
        #: session -> (incarnation, first, last): every row of the session in first..last is cached
        self._spans: dict[str, tuple[int | None, int, int]] = {}
        #: session -> the incarnation its cached rows are of
        self._incarnations: dict[str, int | None] = {}
        self._chars = 0
        #: how many times rows were dropped as deleted (:meth:`forget`, :meth:`forget_sessions`)
        self.erasures = 0
        # held to store what a read decoded, and to drop: no drop passes between a store's check and itself
        self._lock = threading.RLock()

    def clear(self) -> None:
        """Forget every cached entry."""
        with self._lock:
            self._spans.clear()
            self._incarnations.clear()
            self._rows.clear()
            self._chars = 0

    def forget_sessions(self, session_ids: set[str]) -> None:
        """Drop every entry of these sessions (erased)."""
        self._drop(lambda sid, seq: sid in session_ids, session_ids)

    def forget(self, session_id: str, upto: int) -> None:
        """Drop a session's entries with ``seq <= upto`` (deleted by retention: not kept in memory either)."""
        self._drop(lambda sid, seq: sid == session_id and seq <= upto, {session_id})

    def _drop(self, match: Callable[[str, int], bool], session_ids: set[str]) -> None:
        with self._lock:
            self.erasures += 1  # a read begun before keeps nothing it read (:meth:`entries`)
            self._remove(match, session_ids)

    def _remove(self, match: Callable[[str, int], bool], session_ids: set[str]) -> None:
        for sid in session_ids:
            self._spans.pop(sid, None)
            self._incarnations.pop(sid, None)
        for key in list(self._rows):
            if match(*key):
                dropped = self._rows.pop(key)
                self._chars -= len(dropped[1][1])

    def span(self, session_id: str, incarnation: int | None) -> tuple[int | None, int | None]:
        """The stretch of seqs of this incarnation of the session whose entries are cached, or (None, None).

        Advisory: another thread may empty the cache meanwhile; :meth:`entries`
        reads again what it then misses.
        """
        held = self._spans.get(session_id)
        if held is None or held[0] != incarnation:
            return None, None
        return held[1], held[2]

    def entries(
        self,
        session_id: str,
        rows: Sequence[Any],
        incarnation: int | None = None,
        refetch: Refetch | None = None,
        since: int | None = None,
    ) -> list[LogEntry]:
        """Rows of ``(seq, kind, payload, tokens, counter)`` as entries, decoding only what is new.

        ``rows`` hold every row of the session between their lowest and highest
        seq (a page of the tail). All but the seq may be None where :meth:`span`
        said the entry is cached; if it is not, ``refetch`` reads the row again.
        ``since``: :attr:`erasures` when the read transaction of ``rows`` began.
        Rows read before an erasure committed may be rows it deleted: they are
        returned (the read's snapshot) but not kept.
        """
        get = self._rows.get
        out: list[LogEntry | None] = []
        missed: list[int] = []
        for seq, kind, payload, tokens, counter in rows:
            hit = get((session_id, seq))
            if (
                hit is not None
                and hit[0] == incarnation
                and (kind is None or hit[1] == (kind, payload, tokens, counter))
            ):
                out.append(hit[2])
            else:
                missed.append(len(out))
                out.append(None)
        fresh = _with_payloads([rows[i] for i in missed], refetch) if missed else []
        decoded = [
            LogEntry(session_id, r[0], r[1], p, r[3], r[4])
            for r, p in zip(fresh, payloads(fresh, self.keys), strict=True)
        ]
        for i, entry in zip(missed, decoded, strict=True):
            out[i] = entry
        with self._lock:
            if rows and (since is None or since == self.erasures):
                self._keep(session_id, incarnation, rows, fresh, decoded)
        return out  # type: ignore[return-value]  # every None was filled

    def _keep(
        self,
        session_id: str,
        incarnation: int | None,
        rows: Sequence[Any],
        fresh: list[Any],
        decoded: list[LogEntry],
    ) -> None:
        """Keep the entries ``decoded`` from the rows ``fresh`` (of the read ``rows``); record the
        stretch of ``rows`` as cached when every one of them now is."""
        chars = sum(len(r[2]) for r in fresh)
        keep = len(fresh) <= self.size and chars <= self.chars
        if self._incarnations.setdefault(session_id, incarnation) != incarnation:
            # erased (in another process, or by older code) and started again: the entries of
            # the erased incarnation would never be served; they are not kept either
            self._remove(lambda sid, seq: sid == session_id, {session_id})
            self._incarnations[session_id] = incarnation
        cached = self._rows
        cleared = keep and (len(cached) + len(fresh) > self.size or self._chars + chars > self.chars)
        if cleared:
            self.clear()  # the rows found cached went too
            self._incarnations[session_id] = incarnation  # the rows kept below are of it
        if keep:
            for r, entry in zip(fresh, decoded, strict=True):
                cached[(session_id, r[0])] = (incarnation, (r[1], r[2], r[3], r[4]), entry)
            self._chars += chars
        if keep and (not cleared or len(fresh) == len(rows)):
            self._cover(session_id, incarnation, *sorted((rows[0][0], rows[-1][0])))

    def _cover(self, session_id: str, incarnation: int | None, first: int, last: int) -> None:
        """Record that every row of the session in ``first..last`` is cached (merged with a touching span)."""
        held = self._spans.get(session_id)
        if held is not None and held[0] == incarnation and first <= held[2] + 1 and last >= held[1] - 1:
            first, last = min(first, held[1]), max(last, held[2])
        self._spans[session_id] = (incarnation, first, last)


def _with_payloads(rows: list[Any], refetch: Refetch | None) -> list[Any]:
    """``rows``, each whole: those read with their seq only are read again."""
    missing = [r[0] for r in rows if r[1] is None]
    if not missing:
        return rows
    again = {r[0]: r for r in refetch(min(missing), max(missing))} if refetch is not None else {}
    if not all(seq in again for seq in missing):
        raise StorageError(f"context events {min(missing)}..{max(missing)} could not be read again")
    return [again[r[0]] if r[1] is None else r for r in rows]


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
