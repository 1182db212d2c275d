"""Records of the context store: messages, events, summaries, memories and build results.

Everything here is a frozen dataclass over JSON-safe values, so an event's
payload round-trips through the database unchanged (no pickle anywhere).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, cast

from statekeep._check import check_json, check_number, check_unicode

# The memory item is defined beside its renderer, which the memory store shares.
from statekeep._memory_block import MEMORY_SOURCES as MEMORY_SOURCES
from statekeep._memory_block import MemoryItem
from statekeep._memory_block import MemorySource as MemorySource
from statekeep.errors import InvalidInputError

Role = Literal["system", "user", "assistant", "tool"]

#: Event kinds. Message kinds follow from the message; ``summary_updated`` is written by
#: compaction; a ``marker`` (:meth:`ContextStore.mark`) ends the conversation before it.
SYSTEM, USER, ASSISTANT, TOOL_CALL, TOOL_RESULT, SUMMARY, MARKER = (
    "system",
    "user",
    "assistant",
    "tool_call",
    "tool_result",
    "summary_updated",
    "marker",
)
MESSAGE_KINDS = (SYSTEM, USER, ASSISTANT, TOOL_CALL, TOOL_RESULT)
KINDS = (*MESSAGE_KINDS, SUMMARY, MARKER)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call requested by the model: a call id, a tool name and JSON arguments."""

    id: str
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The call as a JSON-safe dict."""
        return {"id": self.id, "name": self.name, "arguments": dict(self.arguments)}


@dataclass(frozen=True, slots=True)
class Message:
    """A provider-neutral chat message.

    ``role`` is ``system``, ``user``, ``assistant`` or ``tool``. An assistant
    message may carry ``tool_calls`` (all the parallel calls of one turn); a
    ``tool`` message is the result of the call named by ``tool_call_id``.

    Examples:
        >>> Message.user("Book a flight to Oslo").role
        'user'
        >>> Message.tool_result("call-1", "booked", name="book").tool_call_id
        'call-1'
    """

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False

    @classmethod
    def system(cls, content: str) -> Message:
        """A system message."""
        return cls("system", content)

    @classmethod
    def user(cls, content: str, *, name: str | None = None) -> Message:
        """A user message."""
        return cls("user", content, name=name)

    @classmethod
    def assistant(
        cls, content: str = "", *, tool_calls: tuple[ToolCall, ...] | list[ToolCall] = ()
    ) -> Message:
        """An assistant message, optionally with the tool calls of this turn."""
        return cls("assistant", content, tool_calls=tuple(tool_calls))

    @classmethod
    def tool_result(
        cls, tool_call_id: str, content: str, *, name: str | None = None, is_error: bool = False
    ) -> Message:
        """The result of one tool call."""
        return cls("tool", content, tool_call_id=tool_call_id, name=name, is_error=is_error)

    @property
    def kind(self) -> str:
        """The event kind this message is stored as."""
        if self.role == "tool":
            return TOOL_RESULT
        if self.role == "assistant" and self.tool_calls:
            return TOOL_CALL
        return self.role

    def to_json(self) -> dict[str, Any]:
        """The message as a JSON-safe dict (the stored payload)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_json() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        if self.is_error:
            out["is_error"] = True
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Message:
        """Rebuild a message from :meth:`to_json` output (unchecked; ``append`` validates its input)."""
        raw = data.get("tool_calls")
        calls = (
            tuple(ToolCall(c["id"], c["name"], dict(c.get("arguments") or {})) for c in raw) if raw else ()
        )
        get = data.get
        return cls(
            data["role"], get("content") or "", calls, get("tool_call_id"), get("name"), bool(get("is_error"))
        )

    def without_tool_calls(self) -> Message:
        """The same assistant message with its tool calls stripped (for interrupted turns)."""
        return Message("assistant", self.content)


@dataclass(frozen=True, slots=True)
class Summary:
    """A rolling summary, as recorded by a ``summary_updated`` event.

    It covers the raw events ``covers_from..covers_to`` (inclusive) of its
    session; those raw events stay in the log until :meth:`prune_summarized`.
    """

    text: str
    covers_from: int
    covers_to: int
    summarizer: str
    summarizer_version: str
    input_hash: str

    def to_json(self) -> dict[str, Any]:
        """The summary as a JSON-safe dict (the stored payload)."""
        return {
            "text": self.text,
            "covers_from": self.covers_from,
            "covers_to": self.covers_to,
            "summarizer": self.summarizer,
            "summarizer_version": self.summarizer_version,
            "input_hash": self.input_hash,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Summary:
        """Rebuild a summary from :meth:`to_json` output."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class Marker:
    """A ``marker`` event: the conversation before it is over (cleared, or rewound and re-told).

    The log keeps every event; the context builder and compaction start after the
    latest marker, so neither the events nor a summary from before it reach the model.
    """

    reason: str
    text: str = ""

    def to_json(self) -> dict[str, Any]:
        """The marker as a JSON-safe dict (the stored payload)."""
        return {"reason": self.reason, "text": self.text}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Marker:
        """Rebuild a marker from :meth:`to_json` output."""
        return cls(str(data["reason"]), str(data.get("text") or ""))


@dataclass(frozen=True, slots=True)
class LogEntry:
    """An event as the context builder reads it: what it is, and its tokens, without timestamp or key.

    The builder reads only these columns of the log's tail; :class:`Event` is
    the full stored record.
    """

    session_id: str
    seq: int
    kind: str
    payload: Mapping[str, Any]
    tokens: int
    counter: str
    _message: Message | None = field(default=None, init=False, repr=False, compare=False)
    _call_ids: tuple[str, ...] | None = field(default=None, init=False, repr=False, compare=False)
    #: the window unit this entry opened in the last build (``window.py``), reused while it still fits
    _window_unit: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def message(self) -> Message:
        """The message of a message event (built once: entries and messages are immutable)."""
        message = self._message
        if message is None:
            if self.kind not in MESSAGE_KINDS:
                raise InvalidInputError(f"event {self.seq} is a {self.kind}, not a message", field="kind")
            message = Message.from_json(self.payload)
            object.__setattr__(self, "_message", message)
        return message

    @property
    def summary(self) -> Summary:
        """The summary of a ``summary_updated`` event."""
        if self.kind != SUMMARY:
            raise InvalidInputError(f"event {self.seq} is a {self.kind}, not a summary", field="kind")
        return Summary.from_json(self.payload)

    @property
    def marker(self) -> Marker:
        """The marker of a ``marker`` event."""
        if self.kind != MARKER:
            raise InvalidInputError(f"event {self.seq} is a {self.kind}, not a marker", field="kind")
        return Marker.from_json(self.payload)

    def call_ids(self) -> tuple[str, ...]:
        """The ids of the tool calls a ``tool_call`` event carries (without building the message)."""
        ids = self._call_ids
        if ids is None:
            ids = tuple(c["id"] for c in self.payload.get("tool_calls") or ())
            object.__setattr__(self, "_call_ids", ids)
        return ids

    def payload_json(self) -> str:
        """The payload as canonical JSON text (sorted keys), as stored and hashed."""
        return json.dumps(self.payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Event(LogEntry):
    """One stored event of a session's log.

    ``tokens`` was counted once, at append, by the counter named ``counter``.
    ``key`` is the caller's idempotency key, if the event was appended with one.
    """

    created_at: datetime
    key: str | None = None


SECTIONS = ("system", "pinned", "memories", "summary", "window")


@dataclass(frozen=True, slots=True)
class ContextReport:
    """Tokens per section of a built context, and what was left out.

    ``total`` includes ``reply_overhead`` (the tokens a chat format adds to
    prime the reply) and never exceeds ``budget``.
    """

    budget: int
    counter: str
    system: int
    pinned: int
    memories: int
    summary: int
    window: int
    reply_overhead: int
    window_events: int
    first_seq: int | None
    last_seq: int
    memories_dropped: int = 0
    summary_dropped: bool = False
    oversized_seq: int | None = None
    orphans_dropped: int = 0
    compacted: bool = False
    compaction_error: str | None = None

    @property
    def total(self) -> int:
        """All tokens of the built context."""
        return self.system + self.pinned + self.memories + self.summary + self.window + self.reply_overhead

    def sections(self) -> dict[str, int]:
        """Tokens per section, in prompt order."""
        return {s: getattr(self, s) for s in SECTIONS}


# -- checks of records from callers (a Message or a mapping in the same shape) ------------

ROLES = ("system", "user", "assistant", "tool")


def to_message(message: object) -> Message:
    """Accept a :class:`Message` or a mapping in the same (provider-neutral) shape, and check it."""
    if isinstance(message, Mapping):
        message = _from_mapping(message)
    if not isinstance(message, Message):
        raise InvalidInputError(
            f"expected a Message or a mapping, got {type(message).__name__}", field="message"
        )
    _check_shape(message)
    _check_json(message.to_json())
    return message


def _from_mapping(data: Mapping[str, Any]) -> Message:
    if "role" not in data:
        raise InvalidInputError("a message mapping needs a 'role'", field="message.role")
    calls = data.get("tool_calls") or ()
    if not isinstance(calls, list | tuple) or not all(isinstance(c, Mapping) for c in calls):
        raise InvalidInputError(
            "must be a list of {id, name, arguments} mappings", field="message.tool_calls"
        )
    if data.get("is_error") is not None and not isinstance(data["is_error"], bool):
        raise InvalidInputError("must be True or False", field="message.is_error")
    for call in calls:
        arguments = call.get("arguments")
        if arguments is not None and not isinstance(arguments, Mapping):
            raise InvalidInputError(
                "must be a mapping (decode a JSON string of arguments first)", field="tool_call.arguments"
            )
    try:
        return Message.from_json(data)
    except (KeyError, TypeError) as exc:
        raise InvalidInputError(f"malformed message: missing or bad {exc}", field="message") from exc


def _check_shape(m: Message) -> None:
    if m.role not in ROLES:
        raise InvalidInputError(f"must be one of {ROLES}, got {m.role!r}", field="message.role")
    if not isinstance(m.content, str):
        raise InvalidInputError("must be a string", field="message.content")
    if m.tool_calls and m.role != "assistant":
        raise InvalidInputError("only assistant messages carry tool calls", field="message.tool_calls")
    if (m.role == "tool") != (m.tool_call_id is not None):
        raise InvalidInputError(
            "a tool message, and only a tool message, names a call", field="message.tool_call_id"
        )
    if m.tool_call_id is not None and (not isinstance(m.tool_call_id, str) or not m.tool_call_id):
        raise InvalidInputError("must be a non-empty string", field="message.tool_call_id")
    if m.name is not None and (not isinstance(m.name, str) or not m.name):
        raise InvalidInputError("must be a non-empty string or None", field="message.name")
    if not isinstance(m.is_error, bool):
        raise InvalidInputError("must be True or False", field="message.is_error")
    if m.role == "assistant" and not m.content and not m.tool_calls:
        raise InvalidInputError("an assistant message needs content or tool calls", field="message")
    _check_calls(m.tool_calls)


def _check_calls(calls: tuple[ToolCall, ...]) -> None:
    ids: set[str] = set()
    for call in calls:
        if not isinstance(call, ToolCall):
            raise InvalidInputError("each tool call must be a ToolCall", field="message.tool_calls")
        if not isinstance(call.id, str) or not call.id or call.id in ids:
            raise InvalidInputError(
                f"call ids must be unique non-empty strings, got {call.id!r}", field="tool_call.id"
            )
        if not isinstance(call.name, str) or not call.name:
            raise InvalidInputError("must be a non-empty string", field="tool_call.name")
        if not isinstance(call.arguments, Mapping):
            raise InvalidInputError("must be a mapping", field="tool_call.arguments")
        ids.add(call.id)


def _check_json(payload: dict[str, Any]) -> None:
    check_json(payload, "message")  # depth and lone surrogates, before json.dumps can recurse
    try:
        text = json.dumps(payload, allow_nan=False, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"not JSON-safe: {exc}", field="message") from exc
    if json.loads(text) != payload:
        raise InvalidInputError("does not survive a JSON round trip unchanged", field="message")


def to_memory(item: object) -> MemoryItem:
    """Accept a :class:`MemoryItem`, a mapping, or any object with the same attribute names."""
    if isinstance(item, MemoryItem):
        data: Mapping[str, Any] = {f: getattr(item, f) for f in MemoryItem.__dataclass_fields__}
    elif isinstance(item, Mapping):
        data = item
    else:
        data = {f: getattr(item, f, None) for f in MemoryItem.__dataclass_fields__}
    content, source = data.get("content"), data.get("source") or "agent_inferred"
    if not isinstance(content, str) or not content.strip():
        raise InvalidInputError("a memory needs non-empty text content", field="memories.content")
    check_unicode(content, "memories.content")
    if source not in MEMORY_SOURCES:
        raise InvalidInputError(f"must be one of {MEMORY_SOURCES}, got {source!r}", field="memories.source")
    ids = {k: data.get(k) for k in ("session_id", "run_id", "event_id", "memory_id")}
    for key, value in ids.items():
        if value is not None and not isinstance(value, str | int):
            raise InvalidInputError("must be a string, an int or None", field=f"memories.{key}")
        if isinstance(value, str):
            check_unicode(value, f"memories.{key}")
    kind, trust = data.get("kind"), data.get("trust")
    if kind is not None and (not isinstance(kind, str) or not kind):
        raise InvalidInputError("must be a non-empty string or None", field="memories.kind")
    if kind is not None:
        check_unicode(kind, "memories.kind")
    if trust is not None:
        check_number(trust, "memories.trust")
    return MemoryItem(content, cast(MemorySource, source), **ids, kind=kind, trust=trust)
