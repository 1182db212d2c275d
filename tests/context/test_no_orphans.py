"""Invariant 7, property-based: a tool result is never separated from its call.

Random histories mix parallel tool calls, results delivered late or never
(interrupted turns), results for calls that do not exist, reused call ids and
single messages larger than the whole budget.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeep.context import (
    CharCounter,
    ContextStore,
    InMemoryContextStore,
    Message,
    SQLContextStore,
    ToolCall,
    enforce_pairing,
    message_tokens,
    select_window,
)
from statekeep.context.tokens import REPLY_OVERHEAD
from statekeep.context.window import group_units

COUNTER = CharCounter(1)
T = TypeVar("T")


@dataclass
class History:
    messages: list[Message]
    clean: bool  # no orphan result and no interrupted turn


class Chooser(Protocol):
    """Where a history's random choices come from: hypothesis (shrinkable) or a seeded Random (fast)."""

    def integer(self, lo: int, hi: int) -> int: ...

    def pick(self, options: Sequence[T]) -> T: ...

    def shuffle(self, items: list[T]) -> list[T]: ...


class _Draw:
    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def pick(self, options: Sequence[T]) -> T:
        return self.draw(st.sampled_from(options))

    def shuffle(self, items: list[T]) -> list[T]:
        return list(self.draw(st.permutations(items)))


class _Seeded:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def pick(self, options: Sequence[T]) -> T:
        return self.rng.choice(options)

    def shuffle(self, items: list[T]) -> list[T]:
        self.rng.shuffle(items)
        return items


ACTIONS = ("user", "assistant", "turn", "turn", "result", "flush", "orphan", "big")


def generate(c: Chooser) -> History:
    """A random session: chat, parallel tool turns, late/missing/orphan results, huge messages."""
    messages: list[Message] = []
    pending: list[Message] = []
    clean = True
    for i in range(c.integer(0, 30)):
        action = c.pick(ACTIONS)
        text = f"{i}:" + "x" * c.integer(0, 60)
        if action in ("user", "assistant"):
            messages.append(Message.user(text) if action == "user" else Message.assistant(text))
        elif action == "big":
            messages.append(Message.user("B" * c.integer(300, 1500)))
        elif action == "turn":
            ids = sorted({c.integer(0, 6) for _ in range(c.integer(1, 4))})
            calls = [ToolCall(f"c{k}", "tool", {"i": i}) for k in ids]
            messages.append(Message.assistant(c.pick(["", text]), tool_calls=calls))
            results = [Message.tool_result(x.id, f"r{i}-{x.id}" + "y" * c.integer(0, 200)) for x in calls]
            pending.extend(c.shuffle(results))
        elif action == "result" and pending:
            messages.append(pending.pop(c.integer(0, len(pending) - 1)))
        elif action == "flush":
            messages.extend(pending)
            pending.clear()
        elif action == "orphan":
            messages.append(Message.tool_result(f"ghost{i}", "lost result"))
            clean = False
    clean = clean and not pending and _ids_not_reused_while_open(messages)
    return History(messages, clean)


@st.composite
def histories(draw: st.DrawFn) -> History:
    """Random histories drawn through hypothesis, so failures shrink to a minimal history."""
    return generate(_Draw(draw))


def _ids_not_reused_while_open(messages: list[Message]) -> bool:
    """True when no call id is reused before the earlier call with that id got its result."""
    open_ids: set[str] = set()
    for m in messages:
        if m.tool_calls and open_ids & {c.id for c in m.tool_calls}:
            return False
        open_ids |= {c.id for c in m.tool_calls}
        open_ids.discard(m.tool_call_id or "")
    return True


def assert_well_formed(messages: list[Message]) -> None:
    """Every call is directly followed by exactly its results; no result stands alone."""
    assert enforce_pairing(messages)[1] == 0
    for i, m in enumerate(messages):
        if m.role == "tool":
            owner = next(p for p in reversed(messages[:i]) if p.role != "tool")
            assert m.tool_call_id in {c.id for c in owner.tool_calls}
        if m.tool_calls:
            following = [r.tool_call_id or "" for r in messages[i + 1 : i + 1 + len(m.tool_calls)]]
            assert sorted(following) == sorted(c.id for c in m.tool_calls)


def check_store(store: ContextStore, session: str, history: History, budget: int) -> None:
    """Append a history, build it, and compare with the pure selection over the full history."""
    if history.messages:
        store.extend(session, history.messages)
    built = store.build(session, budget, compact=False)
    got = list(built.messages)
    assert_well_formed(got)
    assert built.report.orphans_dropped >= 0
    assert sum(message_tokens(COUNTER, m) for m in got) + REPLY_OVERHEAD == built.report.total <= budget
    events = store.events(session)
    full = select_window(events, budget - REPLY_OVERHEAD, _tokens, _recount).messages
    assert got == full[len(full) - len(got) :]  # the tail read is a suffix of the full selection
    if history.clean:
        assert got == full


def _tokens(event: object) -> int:
    return event.tokens  # type: ignore[attr-defined, no-any-return]


def _recount(message: Message) -> int:
    return message_tokens(COUNTER, message)


def check_history(history: History, budget: int) -> None:
    """The window is well paired, within budget, and the maximal suffix of whole units."""
    store = InMemoryContextStore(counter=COUNTER)
    if history.messages:
        store.extend("s", history.messages)
    events = store.events("s")
    window = select_window(events, budget, _tokens, _recount)
    messages = window.messages
    assert_well_formed(messages)
    assert window.tokens == sum(message_tokens(COUNTER, m) for m in messages) <= budget
    units, _ = group_units(events, _tokens, _recount)
    kept = list(window.units)
    assert kept == units[len(units) - len(kept) :]
    if len(kept) < len(units):
        assert window.tokens + units[len(units) - len(kept) - 1].tokens > budget
    check_store(store, "s", history, budget + REPLY_OVERHEAD)


@settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**63), budget=st.integers(1, 800))
def test_invariant_7_no_orphans_over_10000_random_histories(seed: int, budget: int) -> None:
    """Over 10,000 seeded random histories: well paired, within budget, a maximal suffix of whole units."""
    check_history(generate(_Seeded(seed)), budget)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), budget=st.integers(1, 800))
def test_invariant_7_no_orphans_shrinkable_histories(history: History, budget: int) -> None:
    """The same property over histories hypothesis builds choice by choice, so failures shrink."""
    check_history(history, budget)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_invariant_7_no_orphans_on_sql_backends(backend: str, request: pytest.FixtureRequest) -> None:
    """The same property on real SQLite and PostgreSQL, over a smaller number of histories."""
    url = request.getfixturevalue(f"{backend}_url")
    store = SQLContextStore(url, counter=COUNTER)

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(history=histories(), budget=st.integers(4, 800))
    def run(history: History, budget: int) -> None:
        check_store(store, uuid.uuid4().hex, history, budget)

    try:
        run()
    finally:
        store.db.dispose()
