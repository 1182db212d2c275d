"""Window selection: pure functions over events, no I/O.

A *unit* is what the window keeps or drops as a whole: one plain message, or a
tool-calling assistant turn together with the results of all its parallel
calls. A turn whose results are not all in the log (an interrupted turn) keeps
only its text, if any; a result whose call is not in the tail is dropped.
:func:`enforce_pairing` is the final check on what is returned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from statekeep.context._types import MESSAGE_KINDS, TOOL_CALL, TOOL_RESULT, LogEntry, Message

TokensOf = Callable[[LogEntry], int]
Recount = Callable[[Message], int]


@dataclass(frozen=True, slots=True)
class Unit:
    """Messages kept or dropped together; ``seq`` is the event that opens the unit.

    ``paired``: :func:`enforce_pairing` returns the messages unchanged (then it
    also does for any run of such units: each starts a block of its own).
    """

    seq: int
    messages: tuple[Message, ...]
    tokens: int
    events: int
    paired: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        out, _ = enforce_pairing(self.messages)
        same = len(out) == len(self.messages) and all(a is b for a, b in zip(out, self.messages, strict=True))
        object.__setattr__(self, "paired", same)


@dataclass(frozen=True, slots=True)
class Window:
    """The units chosen for a window, newest last, and what was left out."""

    units: tuple[Unit, ...]
    tokens: int
    dropped_events: int
    oversized_seq: int | None

    @property
    def messages(self) -> list[Message]:
        """The window's messages in prompt order."""
        return [m for u in self.units for m in u.messages]

    @property
    def first_seq(self) -> int | None:
        """The seq of the oldest unit kept, None when the window is empty."""
        return self.units[0].seq if self.units else None


@dataclass(slots=True)
class _Turn:
    call: LogEntry
    results: dict[str, LogEntry]


def group_units(events: Sequence[LogEntry], tokens_of: TokensOf, recount: Recount) -> tuple[list[Unit], int]:
    """Group events (oldest first) into units; return them and the number of events dropped."""
    slots, dropped = _slots(events)
    units = []
    for slot in slots:
        unit, lost = _unit(slot, tokens_of, recount)
        dropped += lost
        if unit is not None:
            units.append(unit)
    return units, dropped


def _slots(events: Sequence[LogEntry]) -> tuple[list[LogEntry | _Turn], int]:
    """Events (oldest first) as unit slots, each tool call with the results read so far; and orphans."""
    slots: list[LogEntry | _Turn] = []
    open_calls: dict[str, _Turn] = {}
    dropped = 0
    for event in events:
        kind = event.kind
        if kind == TOOL_RESULT:
            dropped += not _attach(open_calls, event)
        elif kind == TOOL_CALL:
            turn = _Turn(event, {})
            open_calls.update(dict.fromkeys(event.call_ids(), turn))
            slots.append(turn)
        elif kind in _MESSAGES:  # summaries and markers are no messages
            slots.append(event)
    return slots, dropped


_MESSAGES = frozenset(MESSAGE_KINDS)


def _attach(open_calls: dict[str, _Turn], event: LogEntry) -> bool:
    call_id = event.payload.get("tool_call_id")
    turn = open_calls.pop(call_id, None) if isinstance(call_id, str) else None
    if turn is None:
        return False
    turn.results[call_id] = event  # type: ignore[index]  # call_id is a str when turn is found
    return True


def _unit(slot: LogEntry | _Turn, tokens_of: TokensOf, recount: Recount) -> tuple[Unit | None, int]:
    if not isinstance(slot, _Turn):
        return _single(slot, tokens_of), 0
    call, results = slot.call, slot.results
    message = call.message
    try:
        found = tuple([results[c.id] for c in message.tool_calls])
    except KeyError:  # interrupted: not every call has its result
        lost = _lost(slot)
        if not message.content:
            return None, lost
        text = message.without_tool_calls()
        return Unit(call.seq, (text,), recount(text), 1), lost
    held = call._window_unit  # a cached entry's turn, built again only if its results are other entries
    if type(held) is tuple and held[0] is tokens_of and held[1] == found:
        return held[2], 0
    tokens = tokens_of(call) + sum(map(tokens_of, found))
    unit = Unit(call.seq, (message, *[r.message for r in found]), tokens, 1 + len(found))
    object.__setattr__(call, "_window_unit", (tokens_of, found, unit))
    return unit, 0


def _single(entry: LogEntry, tokens_of: TokensOf) -> Unit:
    """The unit of one plain message: built once per entry and ``tokens_of`` (both are immutable)."""
    held = entry._window_unit
    if type(held) is tuple and held[0] is tokens_of:
        unit: Unit = held[1]
        return unit
    unit = Unit(entry.seq, (entry.message,), tokens_of(entry), 1)
    object.__setattr__(entry, "_window_unit", (tokens_of, unit))
    return unit


def _lost(slot: LogEntry | _Turn) -> int:
    """Events of a slot no unit carries: an interrupted turn's results, and its call if it has no text."""
    if isinstance(slot, LogEntry) or all(i in slot.results for i in slot.call.call_ids()):
        return 0
    return len(slot.results) + (0 if slot.call.payload.get("content") else 1)


def select_window(events: Sequence[LogEntry], budget: int, tokens_of: TokensOf, recount: Recount) -> Window:
    """The newest whole units of ``events`` (oldest first) that fit in ``budget`` tokens.

    Units are taken newest first and selection stops at the first unit that
    does not fit, so the window is always a contiguous recent stretch.
    ``tokens_of`` must be a pure function of the event: an entry keeps the
    unit it opened, with the function that counted it, for the next call.
    """
    slots, dropped = _slots(events)
    chosen: list[Unit] = []
    total = 0
    oversized = None
    for k in range(len(slots) - 1, -1, -1):
        slot = slots[k]
        if isinstance(slot, _Turn):
            turn, lost = _unit(slot, tokens_of, recount)
            dropped += lost
            if turn is None:
                continue
            unit = turn
        else:  # one plain message: the common case, without the call
            unit = _single(slot, tokens_of)
        if total + unit.tokens > budget:
            oversized = unit.seq if unit.tokens > budget else None
            dropped += sum(_lost(s) for s in slots[:k])  # older slots are not built at all
            break
        chosen.append(unit)
        total += unit.tokens
    chosen.reverse()
    return Window(tuple(chosen), total, dropped, oversized)


def window_messages(head: Sequence[Message], window: Window) -> tuple[list[Message], int]:
    """:func:`enforce_pairing` of ``head`` (system messages) and the window's messages.

    The pass over every message is skipped when each unit passed it alone (as
    units are built): it would return them unchanged.
    """
    messages = [*head, *window.messages]
    if all(m.role == "system" and not m.tool_calls for m in head) and all(u.paired for u in window.units):
        return messages, 0
    return enforce_pairing(messages)


def enforce_pairing(messages: Sequence[Message]) -> tuple[list[Message], int]:
    """The final check: drop any tool result without its call and any call without its results.

    A tool-calling assistant message must be followed directly by exactly one
    result for each of its calls. Returns the repaired list and how many
    messages were removed (0 whenever :func:`select_window` did its job).
    """
    out: list[Message] = []
    removed = 0
    n = len(messages)
    i = 0
    while i < n:
        message = messages[i]
        i += 1
        if message.role == "tool":
            removed += 1
        elif message.role != "assistant" or not message.tool_calls:
            out.append(message)
        else:
            j = i
            while j < n and messages[j].role == "tool":
                j += 1
            results = messages[i:j]
            if _paired(message, results):
                out.append(message)
                out.extend(results)
            else:
                removed += len(results) + 1 - bool(message.content)
                out.extend([message.without_tool_calls()] if message.content else [])
            i = j
    return out, removed


def _paired(call: Message, results: Sequence[Message]) -> bool:
    ids = [c.id for c in call.tool_calls]
    got = [r.tool_call_id for r in results]
    if len(set(ids)) != len(ids):
        return False
    return got == ids or sorted(ids) == sorted(x or "" for x in got)


def is_well_paired(messages: Sequence[Message]) -> bool:
    """True when :func:`enforce_pairing` would remove nothing."""
    return enforce_pairing(messages)[1] == 0
