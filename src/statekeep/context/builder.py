"""Building the context for one model call: sections, the tail window, and compaction.

The builder reads the session's head row, its latest summary (by the seq the
head row points at) and the log backwards from the newest event, page by
page, only until the window budget is exceeded: O(window), never O(history).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from statekeep._check import check_id, check_int, check_json, check_unicode
from statekeep._memory_block import MemoryItem, render_memories
from statekeep.context import compaction
from statekeep.context._log import Append, Head, LogReader, LogView, check_reader, summary_event
from statekeep.context._types import (
    MARKER,
    MESSAGE_KINDS,
    TOOL_CALL,
    TOOL_RESULT,
    ContextReport,
    LogEntry,
    Message,
    to_memory,
)
from statekeep.context.render import render_pinned, render_summary, to_anthropic, to_openai
from statekeep.context.tokens import REPLY_OVERHEAD, TokenCounter, message_tokens, text_tokens
from statekeep.context.window import TokensOf, Window, select_window, window_messages
from statekeep.errors import (
    ContextBudgetError,
    EventsPrunedError,
    InvalidInputError,
    SummaryConflictError,
    SummaryError,
)


@dataclass(frozen=True, slots=True)
class BuiltContext:
    """The messages for one model call, and the report of tokens per section.

    Examples:
        >>> from statekeep.context import InMemoryContextStore, Message
        >>> store = InMemoryContextStore()
        >>> _ = store.append("s", Message.user("hi"))
        >>> store.build("s", 1000).to_openai()
        [{'role': 'user', 'content': 'hi'}]
    """

    messages: tuple[Message, ...]
    report: ContextReport

    def to_openai(self) -> list[dict[str, Any]]:
        """The messages in the OpenAI chat-completions format."""
        return to_openai(self.messages)

    def to_anthropic(self) -> dict[str, Any]:
        """``{"system": ..., "messages": [...]}`` in the Anthropic messages format."""
        return to_anthropic(self.messages)


@dataclass(slots=True)
class _Sections:
    messages: list[Message] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)
    memories_dropped: int = 0
    summary_dropped: bool = False

    def add(self, section: str, text: str, counter: TokenCounter) -> int:
        self.messages.append(Message.system(text))
        self.tokens[section] = section_tokens(counter, text)
        return self.tokens[section]

    @property
    def used(self) -> int:
        return REPLY_OVERHEAD + sum(self.tokens.values())


#: Counts of recent section texts: a system prompt or pinned state repeats from call to call.
#: Keyed by counter name, which the TokenCounter protocol says fixes the count.
_COUNTS: dict[tuple[str, str], int] = {}
_COUNTS_MAX, _COUNT_TEXT_MAX = 256, 65_536


def section_tokens(counter: TokenCounter, text: str) -> int:
    """:func:`text_tokens`, remembered for the last few hundred texts of up to 64k characters."""
    key = (counter.name, text)
    tokens = _COUNTS.get(key)
    if tokens is None:
        tokens = text_tokens(counter, text)
        if len(text) <= _COUNT_TEXT_MAX:
            if len(_COUNTS) >= _COUNTS_MAX:
                _COUNTS.clear()
            _COUNTS[key] = tokens
    return tokens


def build(
    log: LogReader,
    append: Append,
    session_id: str,
    budget: int,
    *,
    system: str | None = None,
    pinned: str | Mapping[str, Any] | None = None,
    memories: Sequence[object] = (),
    compact: bool = True,
    counter: TokenCounter | None = None,
    owner: str | None = None,
) -> tuple[BuiltContext, float]:
    """See :meth:`ContextStore.build`: the context from ``log``, compacted through ``append``.

    ``counter`` defaults to the log's. Returns the context and the tokens per
    event its reads saw (the next build's :attr:`LogReader.tokens_per_event`).
    """
    check_id(session_id, "session_id")
    check_int(budget, "budget", minimum=1)
    request = _Request(
        session_id,
        budget,
        system,
        check_pinned(pinned),
        _memories(memories),
        log.counter if counter is None else counter,
        owner,
    )
    rounds = MAX_ROUNDS if compact else 0
    compacted = False
    per_event = log.tokens_per_event
    while True:
        built, tail, needs, room, per_event = _build_once(log, request, per_event)
        if not (rounds and needs):
            return _mark(built, compacted, None), per_event
        done, error = _compact(log, append, session_id, tail, room, request.counter)
        if not done:
            return _mark(built, compacted, error), per_event
        compacted, rounds = True, rounds - 1


#: Compactions one build may run: a grown summary can squeeze the window and call for one more.
MAX_ROUNDS = 3


@dataclass(frozen=True, slots=True)
class _Request:
    """What one build was asked for, checked."""

    session_id: str
    budget: int
    system: str | None
    pinned: str | Mapping[str, Any] | None
    items: list[MemoryItem]
    counter: TokenCounter
    owner: str | None


def _build_once(
    log: LogReader, request: _Request, per_event: float
) -> tuple[BuiltContext, list[LogEntry], bool, int, float]:
    """One build from the log: (result, tail read, whether to compact, window room, tokens per event)."""
    session_id, budget, counter = request.session_id, request.budget, request.counter
    sections = _fixed_sections(session_id, budget, request.system, request.pinned, counter)
    _fit_memories(sections, request.items, budget, counter)
    tokens_of = _tokens_of(counter)
    with log.snapshot() as view:
        found = view.head(session_id)
        check_reader(session_id, found, request.owner)  # before any event of the session is read
        head = found or Head(0, 0, 0)
        floor = _add_summary(sections, view, session_id, head, budget, counter)
        room = budget - sections.used
        tail, complete, per_event, marker = _read_tail(view, session_id, floor, room, tokens_of, per_event)
        if marker is not None and head.summary_seq and head.summary_seq < marker:
            # the summary tells of a conversation the marker ended: build without it
            _drop_summary(sections)
            room = budget - sections.used
            tail, complete, per_event, _ = _read_tail(view, session_id, marker, room, tokens_of, per_event)
    window = select_window(tail, room, tokens_of, lambda m: message_tokens(counter, m))
    needs = _needs_compaction(tail, complete, room, log.high_water, tokens_of)
    return _assemble(sections, window, head, budget, counter), tail, needs, room, per_event


def _fixed_sections(
    session_id: str,
    budget: int,
    system: str | None,
    pinned: str | Mapping[str, Any] | None,
    counter: TokenCounter,
) -> _Sections:
    if system is not None and not isinstance(system, str):
        raise InvalidInputError("must be text or None", field="system")
    sections = _Sections()
    if system:
        sections.add("system", check_unicode(system, "system"), counter)
    if pinned is not None and pinned != "":
        sections.add("pinned", render_pinned(pinned), counter)
    if sections.used > budget:
        raise ContextBudgetError(session_id, budget, sections.used)
    return sections


def _memories(memories: Sequence[object]) -> list[MemoryItem]:
    if isinstance(memories, str | bytes | Mapping) or not isinstance(memories, Sequence):
        raise InvalidInputError("must be a sequence of memories", field="memories")
    return [to_memory(m) for m in memories]


def _fit_memories(sections: _Sections, items: list[MemoryItem], budget: int, counter: TokenCounter) -> None:
    """Keep the leading memories (the caller's order is its ranking) whose block fits."""
    keep = len(items)
    while keep and sections.used + section_tokens(counter, render_memories(items[:keep])) > budget:
        keep -= 1
    sections.memories_dropped = len(items) - keep
    if keep:
        sections.add("memories", render_memories(items[:keep]), counter)  # counted above


def _add_summary(
    sections: _Sections, view: LogView, session_id: str, head: Head, budget: int, counter: TokenCounter
) -> int:
    """Add the latest summary if it fits; return the seq the window starts after."""
    event = summary_event(view, session_id, head)
    if event is None:
        return head.pruned_to
    summary = event.summary
    text = render_summary(summary)
    tokens = event.tokens if event.counter == counter.name else text_tokens(counter, text)
    if sections.used + tokens <= budget:
        sections.messages.append(Message.system(text))
        sections.tokens["summary"] = tokens
    else:
        sections.summary_dropped = True
    return max(summary.covers_to, head.pruned_to)


def _drop_summary(sections: _Sections) -> None:
    if sections.tokens.pop("summary", None) is not None:
        sections.messages.pop()  # the summary is the last section added
    sections.summary_dropped = False


def _tokens_of(counter: TokenCounter) -> TokensOf:
    """What an event costs, counted by ``counter``: the same function for every counter of its name.

    The same function object from build to build lets a cached entry reuse the
    window unit it opened (counters with the same name count alike).
    """
    name = counter.name
    held = _TOKENS_OF.get(name)
    if held is not None:
        return held

    def tokens_of(event: LogEntry) -> int:
        if event.kind not in _MESSAGES:
            return 0
        if event.counter == name:
            return event.tokens
        return message_tokens(counter, event.message)

    if len(_TOKENS_OF) >= 64:
        _TOKENS_OF.clear()
    _TOKENS_OF[name] = tokens_of
    return tokens_of


_MESSAGES = frozenset(MESSAGE_KINDS)
_TOKENS_OF: dict[str, TokensOf] = {}


def _read_tail(
    view: LogView, session_id: str, floor: int, room: int, tokens_of: TokensOf, per_event: float
) -> tuple[list[LogEntry], bool, float, int | None]:
    """Newest events after ``floor`` until the units they open pass ``room``, or a marker.

    Returns the events (oldest first), True if all were read, the tokens
    per event read, and the seq of the marker the read stopped at (None if none).
    Pages are sized to what is still missing, at ``per_event``
    tokens per event (then at the rate read so far) plus a margin, so a build
    usually reads one page about the window's length: no second round trip,
    and few rows decoded for nothing.

    A tool result counts only once its call is read: until then it may belong
    to a unit that opens before messages read after it.
    """
    events: list[LogEntry] = []
    waiting: dict[str, int] = {}
    total = seen = 0
    before: int | None = None
    complete = False
    marker = None
    while not complete and total <= room:
        limit = min(PAGE_MAX, PAGE_MIN + int(1.25 * (room - total) / per_event))
        page = view.tail(session_id, after=floor, before=before, limit=limit)
        for event in page:
            kind = event.kind
            if kind == MARKER:
                marker = event.seq
                break
            events.append(event)
            tokens = tokens_of(event)
            seen += tokens
            if kind == TOOL_RESULT:  # counts once its call is read
                call_id = str(event.payload.get("tool_call_id"))
                waiting[call_id] = waiting.get(call_id, 0) + tokens
                continue
            if kind == TOOL_CALL:
                tokens += sum([waiting.pop(i, 0) for i in event.call_ids()])
            total += tokens
            if total > room:
                break
        complete = len(page) < limit or marker is not None
        if page and events:
            before, per_event = page[-1].seq, max(1.0, seen / len(events))
    events.reverse()
    return events, complete and total <= room, per_event, marker


#: Bounds of one page of the tail read (rows).
PAGE_MIN, PAGE_MAX = 16, 4096


def _needs_compaction(
    tail: list[LogEntry], complete: bool, room: int, high_water: float, tokens_of: TokensOf
) -> bool:
    if not complete:
        return True
    return sum(tokens_of(e) for e in tail) > high_water * room


def _compact(
    log: LogReader, append: Append, session_id: str, tail: list[LogEntry], room: int, counter: TokenCounter
) -> tuple[bool, str | None]:
    """Fold the oldest part of the tail into the summary: (folded, error text if it failed).

    A failed or empty summary is not saved; the raw window is kept instead.
    """
    upto = compaction.plan_cut(tail, room, log.low_water, _tokens_of(counter))
    if upto is None:
        return False, None
    try:
        with log.snapshot() as view:
            head = view.head(session_id) or Head(0, 0, 0)
            plan = compaction.fold_plan(view, session_id, head, upto)
        if not plan.events:
            return False, None
        compaction.fold(append, session_id, plan, log.summarizer, log.counter)
    except (SummaryError, SummaryConflictError, EventsPrunedError) as exc:
        return False, str(exc)
    return True, None


def _mark(built: BuiltContext, done: bool, error: str | None) -> BuiltContext:
    report = replace(built.report, compacted=done, compaction_error=error)
    return BuiltContext(built.messages, report)


def _assemble(
    sections: _Sections, window: Window, head: Head, budget: int, counter: TokenCounter
) -> BuiltContext:
    messages, removed = window_messages(sections.messages, window)
    t = sections.tokens
    report = ContextReport(
        budget=budget,
        counter=counter.name,
        system=t.get("system", 0),
        pinned=t.get("pinned", 0),
        memories=t.get("memories", 0),
        summary=t.get("summary", 0),
        window=window.tokens,
        reply_overhead=REPLY_OVERHEAD,
        window_events=sum(u.events for u in window.units),
        first_seq=window.first_seq,
        last_seq=head.last_seq,
        memories_dropped=sections.memories_dropped,
        summary_dropped=sections.summary_dropped,
        oversized_seq=window.oversized_seq,
        orphans_dropped=window.dropped_events + removed,
    )
    return BuiltContext(tuple(messages), report)


def check_pinned(pinned: object) -> str | Mapping[str, Any] | None:
    """Pinned state: None, text, or a JSON-safe mapping."""
    if pinned is None:
        return pinned
    if isinstance(pinned, str):
        return check_unicode(pinned, "pinned")
    if not isinstance(pinned, Mapping):
        raise InvalidInputError(f"must be text or a mapping, got {type(pinned).__name__}", field="pinned")
    check_json(pinned, "pinned")
    try:
        json.dumps(pinned, allow_nan=False, sort_keys=True, default=_no_default, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"not JSON-safe: {exc}", field="pinned") from exc
    return pinned


def _no_default(value: object) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON-safe")
