"""The in-memory reference backend: for unit tests and notebooks, not for durability."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from statekeep.context._log import Draft, Head, LogView
from statekeep.context._types import SUMMARY, Event
from statekeep.context.base import ContextStore
from statekeep.context.summarize import Summarizer
from statekeep.context.tokens import TokenCounter
from statekeep.errors import SessionOwnerError


@dataclass(slots=True)
class _Session:
    head: Head = field(default_factory=lambda: Head(0, 0, 0))
    seqs: list[int] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    keys: dict[str, Event] = field(default_factory=dict)


class _MemoryView:
    """Reads under the store's lock; events are immutable, so the lists are a snapshot."""

    def __init__(self, sessions: dict[str, _Session]) -> None:
        self._sessions = sessions

    def head(self, session_id: str) -> Head | None:
        s = self._sessions.get(session_id)
        return s.head if s else None

    def event(self, session_id: str, seq: int) -> Event | None:
        s = self._sessions.get(session_id)
        if s is None:
            return None
        i = bisect.bisect_left(s.seqs, seq)
        return s.events[i] if i < len(s.seqs) and s.seqs[i] == seq else None

    def by_key(self, session_id: str, key: str) -> Event | None:
        s = self._sessions.get(session_id)
        return None if s is None else s.keys.get(key)

    def tail(self, session_id: str, *, after: int, before: int | None, limit: int) -> list[Event]:
        s = self._sessions.get(session_id)
        if s is None:
            return []
        hi = len(s.seqs) if before is None else bisect.bisect_left(s.seqs, before)
        lo = max(bisect.bisect_right(s.seqs, after), hi - limit)
        return s.events[lo:hi][::-1]

    def range(self, session_id: str, first: int, last: int) -> list[Event]:
        s = self._sessions.get(session_id)
        if s is None:
            return []
        return s.events[bisect.bisect_left(s.seqs, first) : bisect.bisect_right(s.seqs, last)]


class InMemoryContextStore(ContextStore):
    """Session logs held in dicts; lost when the process ends.

    Examples:
        >>> from statekeep.context import Message
        >>> store = InMemoryContextStore()
        >>> [e.seq for e in store.extend("s", [Message.user("a"), Message.user("b")])]
        [1, 2]
    """

    def __init__(
        self,
        *,
        counter: TokenCounter | None = None,
        summarizer: Summarizer | None = None,
        high_water: float = 0.8,
        low_water: float = 0.5,
    ) -> None:
        super().__init__(counter=counter, summarizer=summarizer, high_water=high_water, low_water=low_water)
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.RLock()

    @contextmanager
    def _view(self) -> Iterator[LogView]:
        with self._lock:
            yield _MemoryView(self._sessions)

    def _append(
        self,
        session_id: str,
        drafts: Sequence[Draft],
        expect_summary: int | None,
        owner: str | None = None,
    ) -> list[Event]:
        with self._lock:
            s = self._sessions.setdefault(session_id, _Session())
            if owner is not None and s.head.owner not in (None, owner):
                raise SessionOwnerError(session_id, owner, s.head.owner)
            if expect_summary is not None and s.head.summary_seq != expect_summary:
                return []
            if drafts[0].key in s.keys:
                return [s.keys[drafts[0].key]]
            first = s.head.last_seq + 1
            events = [d.at(session_id, first + i) for i, d in enumerate(drafts)]
            summaries = [e.seq for e in events if e.kind == SUMMARY]
            s.seqs.extend(e.seq for e in events)
            s.events.extend(events)
            s.keys.update((e.key, e) for e in events if e.key is not None)
            summary_seq = summaries[-1] if summaries else s.head.summary_seq
            # the first write with an owner claims an unowned session (as the SQL backend does,
            # only when it writes: a guard or key hit above rolls the claim back there)
            s.head = Head(events[-1].seq, summary_seq, s.head.pruned_to, s.head.owner or owner)
            return events

    def _claim(self, session_id: str, owner: str) -> str | None:
        with self._lock:
            s = self._sessions.setdefault(session_id, _Session())
            if s.head.owner is None:
                s.head = replace(s.head, owner=owner)
            return s.head.owner

    def _sessions_of(self, owner: str) -> list[str]:
        with self._lock:
            return sorted(k for k, s in self._sessions.items() if s.head.owner == owner)

    def _delete_owner(self, owner: str) -> tuple[int, int, int]:
        with self._lock:
            doomed = [k for k, s in self._sessions.items() if s.head.owner == owner]
            n_events = sum(len(self._sessions[k].events) for k in doomed)
            n_summaries = sum(1 for k in doomed for e in self._sessions[k].events if e.kind == SUMMARY)
            for k in doomed:
                del self._sessions[k]
            return len(doomed), n_events, n_summaries

    def _delete_covered(self, session_id: str, upto: int) -> int:
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                return 0
            keep = [e for e in s.events if e.seq > upto or e.kind == SUMMARY]
            removed = len(s.events) - len(keep)
            s.events, s.seqs = keep, [e.seq for e in keep]
            s.head = replace(s.head, pruned_to=max(s.head.pruned_to, upto))
            return removed
