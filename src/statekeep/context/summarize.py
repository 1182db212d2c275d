"""Summarizers: a tiny protocol, an offline default, and an adapter for any LLM callable.

A summarizer folds messages into a rolling summary: it gets the previous
summary text (or None) and the messages leaving the window, and returns the new
text. The store records its ``name`` and ``version`` with every summary, and
never saves an empty one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from statekeep.context._types import Event, Message, ToolCall
from statekeep.errors import InvalidInputError

SECTIONS = ("Task", "Requests", "Decisions", "Tool outcomes", "Open items")


@runtime_checkable
class Summarizer(Protocol):
    """Folds messages into a rolling summary."""

    name: str
    version: str

    def summarize(self, previous: str | None, messages: Sequence[Message]) -> str:
        """The new summary of ``previous`` followed by ``messages``."""
        ...


class OfflineSummarizer:
    """The default: a deterministic, rule-based summarizer that needs no model.

    It keeps task-relevant facts in five sections: the task (the first request),
    who asked for what, the assistant's decisions, each tool's outcome, and
    open items (calls without a result, a request not answered yet). Each
    section keeps its newest ``max_items`` lines of at most ``max_chars`` characters.

    Examples:
        >>> s = OfflineSummarizer()
        >>> print(s.summarize(None, [Message.user("Find flights to Oslo")]))
        Task:
        - Find flights to Oslo
        Requests:
        - user: Find flights to Oslo
        Open items:
        - awaiting a reply to: Find flights to Oslo
    """

    name = "offline"
    version = "1"

    def __init__(self, *, max_items: int = 12, max_chars: int = 200) -> None:
        self.max_items = max_items
        self.max_chars = max_chars

    def summarize(self, previous: str | None, messages: Sequence[Message]) -> str:
        """Fold ``messages`` into ``previous`` (a text this summarizer wrote, or None)."""
        sections = parse_sections(previous or "")
        calls = {c.id: c for m in messages for c in m.tool_calls}
        for message in messages:
            self._fold(sections, message, calls)
        return format_sections({k: v[-self.max_items :] for k, v in sections.items()})

    def _fold(self, sections: dict[str, list[str]], m: Message, calls: Mapping[str, ToolCall]) -> None:
        line = self._clip(m.content)
        if m.role == "user" and line:
            if not sections["Task"]:
                sections["Task"].append(line)
            who = m.name or "user"
            sections["Requests"].append(f"{who}: {line}")
            _resolve(sections, "awaiting a reply")
            sections["Open items"].append(f"awaiting a reply to: {line}")
        elif m.role == "assistant":
            if line:
                sections["Decisions"].append(self._clip(_first_sentence(m.content)))
                _resolve(sections, "awaiting a reply")
            for c in m.tool_calls:
                args = self._clip(json.dumps(dict(c.arguments), sort_keys=True))
                sections["Open items"].append(f"no result yet for {c.name}({args}) [{c.id}]")
        elif m.role == "tool":
            _resolve(sections, f"[{m.tool_call_id}]")
            call = calls.get(m.tool_call_id or "")
            name = m.name or (call.name if call else "tool")
            outcome = "error" if m.is_error else "ok"
            first = self._clip(m.content.strip().splitlines()[0] if m.content.strip() else "(empty)")
            sections["Tool outcomes"].append(f"{name} -> {outcome}: {first}")

    def _clip(self, text: str) -> str:
        flat = " ".join(text.split())
        return flat if len(flat) <= self.max_chars else flat[: self.max_chars - 1] + "…"


def _first_sentence(text: str) -> str:
    match = re.search(r"(?<=[.!?])\s", text)
    return text[: match.start()] if match else text


def _resolve(sections: dict[str, list[str]], marker: str) -> None:
    sections["Open items"] = [x for x in sections["Open items"] if marker not in x]


def parse_sections(text: str) -> dict[str, list[str]]:
    """Read a summary written by :func:`format_sections` back into its sections."""
    sections: dict[str, list[str]] = {s: [] for s in SECTIONS}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.endswith(":") and line[:-1] in sections:
            current = sections[line[:-1]]
        elif line.startswith("- ") and current is not None:
            current.append(line[2:])
    return sections


def format_sections(sections: dict[str, list[str]]) -> str:
    """Render non-empty sections as ``Header:`` followed by ``- item`` lines."""
    parts = []
    for name in SECTIONS:
        if sections.get(name):
            parts.append(f"{name}:\n" + "\n".join(f"- {x}" for x in sections[name]))
    return "\n".join(parts)


DEFAULT_INSTRUCTIONS = (
    "You maintain a running summary of a conversation between a user, an assistant and tools. "
    "Update the previous summary with the new messages. Keep every task-relevant fact: who asked "
    "for what, decisions taken, each tool's outcome (including errors), and open items. "
    "Be concise. Reply with the summary text only."
)


class LLMSummarizer:
    """Adapts any LLM callable ``prompt -> text`` into a :class:`Summarizer`.

    Examples:
        >>> fake_llm = lambda prompt: "User wants flights to Oslo."
        >>> LLMSummarizer(fake_llm, name="my-model").summarize(None, [Message.user("Oslo?")])
        'User wants flights to Oslo.'
    """

    def __init__(
        self,
        complete: Callable[[str], str],
        *,
        name: str = "llm",
        version: str = "1",
        instructions: str = DEFAULT_INSTRUCTIONS,
    ) -> None:
        self.complete = complete
        self.name = name
        self.version = version
        self.instructions = instructions

    def summarize(self, previous: str | None, messages: Sequence[Message]) -> str:
        """Ask the model for the new summary; its reply is returned stripped."""
        prompt = (
            f"{self.instructions}\n\n<previous_summary>\n{previous or '(none)'}\n</previous_summary>\n\n"
            f"<new_messages>\n{transcript(messages)}\n</new_messages>"
        )
        reply = self.complete(prompt)
        return reply.strip() if isinstance(reply, str) else ""


def transcript(messages: Sequence[Message]) -> str:
    """A plain-text transcript of messages, one per line, for a model to read."""
    lines = []
    for m in messages:
        if m.role == "tool":
            status = "error" if m.is_error else "result"
            lines.append(f"[tool {status} {m.name or ''} {m.tool_call_id}] {m.content}")
            continue
        calls = "".join(f" [calls {c.name}({json.dumps(dict(c.arguments))}) id={c.id}]" for c in m.tool_calls)
        lines.append(f"[{m.role}] {m.content}{calls}")
    return "\n".join(lines)


def input_hash(previous: str | None, events: Sequence[Event]) -> str:
    """SHA-256 over the previous summary text and each input event's seq, kind and payload."""
    digest = hashlib.sha256()
    digest.update(json.dumps(previous).encode())
    for event in events:
        digest.update(f"\n{event.seq}\t{event.kind}\t".encode())
        digest.update(event.payload_json().encode())
    return digest.hexdigest()


def check_summarizer(summarizer: object, field: str = "summarizer") -> Any:
    """A summarizer: has string ``name`` and ``version`` and a ``summarize`` method."""
    named = isinstance(getattr(summarizer, "name", None), str)
    if not named or not callable(getattr(summarizer, "summarize", None)):
        raise InvalidInputError("must have a str 'name', a 'version' and a summarize() method", field=field)
    if not hasattr(summarizer, "version"):
        raise InvalidInputError("must have a 'version'", field=field)
    return summarizer
