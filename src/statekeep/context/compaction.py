"""Compaction: folding old events into the rolling summary, and regenerating a summary.

Planning is pure (:func:`plan_cut` picks where to cut a tail); folding calls the
summarizer and appends one ``summary_updated`` event, guarded so that two
concurrent compactions of one session never both land.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from statekeep.context._log import Append, Draft, Head, LogView, summary_event
from statekeep.context._types import (
    MARKER,
    MESSAGE_KINDS,
    SUMMARY,
    TOOL_CALL,
    TOOL_RESULT,
    Event,
    LogEntry,
    Summary,
)
from statekeep.context.render import render_summary
from statekeep.context.summarize import Summarizer, input_hash
from statekeep.context.tokens import TokenCounter, text_tokens
from statekeep.errors import SummaryConflictError, SummaryError

#: Events handed to the summarizer per call when folding a long stretch.
CHUNK = 400


@dataclass(frozen=True, slots=True)
class FoldPlan:
    """What one fold reads and writes."""

    previous: str | None
    expect_summary: int
    events: tuple[Event, ...]
    covers_from: int
    covers_to: int


def fold_plan(view: LogView, session_id: str, head: Head, upto: int) -> FoldPlan:
    """Plan folding every unsummarized event up to ``upto`` into the current summary.

    After a marker the fold starts afresh: neither the summary nor the events before it carry over.
    """
    current = summary_event(view, session_id)
    previous = current.summary if current else None
    floor = max(previous.covers_to if previous else 0, head.pruned_to)
    stored = view.range(session_id, floor + 1, upto)
    marker = max((e.seq for e in stored if e.kind == MARKER), default=None)
    if marker is not None:
        previous, floor = None, marker
    events = tuple(e for e in stored if e.seq > floor and e.kind in MESSAGE_KINDS)
    start = previous.covers_from if previous else (events[0].seq if events else floor + 1)
    end = max(upto, floor)
    return FoldPlan(previous.text if previous else None, head.summary_seq, events, start, end)


def regenerate_plan(view: LogView, session_id: str, head: Head, covered: Summary) -> FoldPlan:
    """Plan re-summarizing the raw events a summary covers, from scratch."""
    events = view.range(session_id, covered.covers_from, covered.covers_to)
    raw = tuple(e for e in events if e.kind in MESSAGE_KINDS)
    return FoldPlan(None, head.summary_seq, raw, covered.covers_from, covered.covers_to)


def fold(
    append: Append, session_id: str, plan: FoldPlan, summarizer: Summarizer, counter: TokenCounter
) -> Summary:
    """Run the summarizer over the plan and ``append`` the ``summary_updated`` event, guarded.

    Raises:
        SummaryError: the summarizer raised or returned an empty text; nothing was saved.
        SummaryConflictError: a concurrent compaction saved its summary first.
    """
    if not plan.events:
        raise SummaryError(session_id, summarizer.name, "has no new events to summarize")
    text = _run(session_id, plan, summarizer)
    summary = Summary(
        text,
        plan.covers_from,
        plan.covers_to,
        summarizer.name,
        str(summarizer.version),
        input_hash(plan.previous, plan.events),
    )
    tokens = text_tokens(counter, render_summary(summary))
    draft = Draft(SUMMARY, summary.to_json(), tokens, counter.name, datetime.now(UTC))
    if not append(session_id, [draft], plan.expect_summary):
        raise SummaryConflictError(session_id)
    return summary


def _run(session_id: str, plan: FoldPlan, summarizer: Summarizer) -> str:
    text = plan.previous
    for start in range(0, len(plan.events), CHUNK):
        chunk = [e.message for e in plan.events[start : start + CHUNK]]
        try:
            text = summarizer.summarize(text, chunk)
        except Exception as exc:
            raise SummaryError(session_id, summarizer.name, f"failed: {exc!r}") from exc
        if not isinstance(text, str) or not text.strip():
            raise SummaryError(session_id, summarizer.name, "returned an empty summary")
    assert text is not None  # plan.events is not empty, so the loop ran
    return text.strip()


def plan_cut(
    tail: Sequence[LogEntry], window_budget: int, low_water: float, tokens_of: Callable[[LogEntry], int]
) -> int | None:
    """Where to cut a tail (oldest first) so what is left needs at most ``low_water`` of the window.

    The cut never falls inside a tool call's unit (between a call and its last
    result). It keeps the newest unit whenever that unit alone fits in the
    window. Returns the seq to fold up to, or None when there is nothing to fold.
    """
    if not tail:
        return None
    rest = _remaining(tail, tokens_of)
    valid = [i for i in _boundaries(tail) if i >= 0]
    target = low_water * window_budget
    cut = min(i for i in valid if rest[i] <= target)
    if rest[cut] == 0:
        keep = [i for i in valid if i < cut and 0 < rest[i] <= window_budget]
        cut = max(keep) if keep else cut
    return tail[cut].seq


def _remaining(tail: Sequence[LogEntry], tokens_of: Callable[[LogEntry], int]) -> list[int]:
    """``rest[i]``: tokens of the events after index ``i``."""
    rest = [0] * len(tail)
    total = 0
    for i in range(len(tail) - 1, -1, -1):
        rest[i] = total
        total += tokens_of(tail[i])
    return rest


def _boundaries(tail: Sequence[LogEntry]) -> list[int]:
    """Indexes ``i`` such that cutting after ``tail[i]`` separates no call from its results."""
    call_at: dict[str, int] = {}
    depth = [0] * (len(tail) + 1)
    for i, event in enumerate(tail):
        if event.kind == TOOL_CALL:
            call_at.update((c, i) for c in event.call_ids())
        elif event.kind == TOOL_RESULT:
            j = call_at.pop(str(event.payload.get("tool_call_id")), None)
            if j is not None:
                depth[j] += 1
                depth[i] -= 1
    out, running = [], 0
    for i in range(len(tail)):
        running += depth[i]
        if running == 0:
            out.append(i)
    return out
