"""The log's internal records and read contract, shared by the store, the builder and compaction."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from statekeep.context._types import SUMMARY, Event, LogEntry
from statekeep.errors import SessionOwnerError

if TYPE_CHECKING:
    from statekeep.context.summarize import Summarizer
    from statekeep.context.tokens import TokenCounter


@dataclass(frozen=True, slots=True)
class Head:
    """A session's bookkeeping row: last seq, the latest summary's seq, retention's mark, its owner."""

    last_seq: int
    summary_seq: int
    pruned_to: int
    #: None for a session created without an owner (and not claimed since)
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class Draft:
    """An event about to be appended; the backend assigns its seq."""

    kind: str
    payload: Mapping[str, Any]
    tokens: int
    counter: str
    created_at: datetime
    key: str | None = None

    def at(self, session_id: str, seq: int) -> Event:
        """The stored event this draft becomes at ``seq``."""
        return Event(
            session_id, seq, self.kind, self.payload, self.tokens, self.counter, self.created_at, self.key
        )


class LogView(Protocol):
    """Reads of one session log, all from one consistent snapshot."""

    def head(self, session_id: str) -> Head | None:
        """The session's head row, None for an unknown session."""
        ...

    def event(self, session_id: str, seq: int) -> Event | None:
        """One event by seq."""
        ...

    def by_key(self, session_id: str, key: str) -> Event | None:
        """The event appended with idempotency key ``key``, if any."""
        ...

    def tail(self, session_id: str, *, after: int, before: int | None, limit: int) -> Sequence[LogEntry]:
        """Up to ``limit`` events with ``after < seq < before``, newest first (no timestamps needed)."""
        ...

    def range(self, session_id: str, first: int, last: int) -> list[Event]:
        """Events with ``first <= seq <= last``, oldest first."""
        ...


#: Stores drafts at a session's next seqs, atomically (see ``ContextStore._append``); with an
#: expected summary seq (0 for none), stores nothing and returns ``[]`` unless it is still the latest.
Append = Callable[[str, Sequence[Draft], int | None], list[Event]]


@dataclass(frozen=True, slots=True)
class LogReader:
    """A read-only view of a store's log: all the builder and compaction read of the store.

    ``snapshot`` opens one consistent read of the log; the rest are the store's
    settings, and ``tokens_per_event``, the tokens per event of the tails read
    so far, which sizes the first page of the next tail read.
    """

    snapshot: Callable[[], AbstractContextManager[LogView]]
    counter: TokenCounter
    summarizer: Summarizer
    high_water: float
    low_water: float
    tokens_per_event: float


def check_reader(session_id: str, head: Head | None, owner: str | None) -> None:
    """Refuse a read by ``owner`` of a session that is not theirs (no check when ``owner`` is None).

    A session that does not exist yet has nothing to read, so it passes; an
    existing session must have been claimed by ``owner``.

    Raises:
        SessionOwnerError: the session belongs to another owner, or to none yet.
    """
    if owner is not None and head is not None and head.owner != owner:
        raise SessionOwnerError(session_id, owner, head.owner)


def summary_event(view: LogView, session_id: str, head: Head | None = None) -> Event | None:
    """The latest ``summary_updated`` event of a session, found through its head row (read if not given)."""
    head = head or view.head(session_id)
    if head is None or not head.summary_seq:
        return None
    event = view.event(session_id, head.summary_seq)
    return event if event is not None and event.kind == SUMMARY else None
