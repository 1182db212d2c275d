"""Shared pieces of the context conformance suite: workloads and helpers its tests use."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from statekeep.context import (
    CharCounter,
    ContextStore,
    Message,
    ToolCall,
    message_tokens,
)
from statekeep.context._log import LogView
from statekeep.context.tokens import REPLY_OVERHEAD

#: Opens a store over the test's data; options are :class:`ContextStore`'s keyword arguments.
ContextStoreFactory = Callable[..., ContextStore]

C1 = CharCounter(1)
SECRET = Message.user("My PIN is 4711.")


class FailingSummarizer:
    """A summarizer that raises, or returns blank text."""

    name, version = "failing", "0"

    def __init__(self, reply: str | None = None) -> None:
        self.reply = reply

    def summarize(self, previous: str | None, messages: Sequence[Message]) -> str:
        if self.reply is None:
            raise RuntimeError("model unavailable")
        return self.reply


def request(i: int) -> Message:
    return Message.user(f"request {i}: please handle ticket {i:04d}")


def chat(store: ContextStore, session: str, turns: int) -> None:
    for i in range(turns):
        store.append(session, Message.user(f"question {i}: what about item {i}?"))
        store.append(session, Message.assistant(f"answer {i}: item {i} is fine."))


def total_tokens(messages: Sequence[Message], counter: Any) -> int:
    return sum(message_tokens(counter, m) for m in messages) + REPLY_OVERHEAD


def tool_history() -> list[Message]:
    """Parallel calls answered out of order, an interrupted turn, a stray result and a large result."""
    return [
        Message.user("weather in Oslo and Bergen?"),
        Message.assistant(
            "checking both",
            tool_calls=[
                ToolCall("a", "weather", {"city": "Oslo"}),
                ToolCall("b", "weather", {"city": "Bergen"}),
            ],
        ),
        Message.tool_result("b", "rain in Bergen"),
        Message.tool_result("a", "sun in Oslo"),
        Message.assistant("Oslo has sun, Bergen rain."),
        Message.user("and Tromsø?"),
        Message.assistant("", tool_calls=[ToolCall("c", "weather", {"city": "Tromsø"})]),  # never answered
        Message.user("never mind, book a table"),
        Message.tool_result("zz", "a result whose call is not in the log"),
        Message.assistant("booking", tool_calls=[ToolCall("d", "book", {"n": 4})]),
        Message.tool_result("d", "booked: " + "details " * 20),
        Message.assistant("Booked for four."),
    ]


class CountingView:
    """A read view that counts the rows each call returns."""

    def __init__(self, inner: LogView, reads: list[int]) -> None:
        self.inner, self.reads = inner, reads

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        def counted(*args: Any, **kw: Any) -> Any:
            out = method(*args, **kw)
            self.reads.append(len(out) if isinstance(out, list) else 1)
            return out

        return counted
