"""Input checks for the context store's public entry points. Pure; nothing here writes."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, cast

from statekeep._json import check_json
from statekeep._numbers import MAX_INT
from statekeep._text import check_id, check_unicode
from statekeep.context._types import MEMORY_SOURCES, MemoryItem, MemorySource, Message, ToolCall
from statekeep.errors import InvalidInputError

MAX_ID = 255
ROLES = ("system", "user", "assistant", "tool")


def check_session_id(session_id: object) -> str:
    """A session id: a non-empty string of at most 255 characters that every backend can store."""
    return check_id(session_id, "session_id", MAX_ID)


def check_owner(owner: object) -> str | None:
    """A session owner: None (no check), or a non-empty string of at most 255 characters."""
    return None if owner is None else check_id(owner, "owner", MAX_ID)


def check_key(key: object) -> str | None:
    """An idempotency key: None, or a non-empty string of at most 255 characters."""
    return None if key is None else check_id(key, "key", MAX_ID)


def check_budget(budget: object) -> int:
    """A token budget: a positive int."""
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise InvalidInputError(f"must be an int >= 1, got {budget!r}", field="budget")
    return budget


def check_seq(value: object, field: str) -> int:
    """A sequence number: an int from 0 to 2**63 - 1 (a 64-bit column)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_INT:
        raise InvalidInputError(f"must be an int >= 0 (64-bit), got {value!r}", field=field)
    return value


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
    if trust is not None and (
        isinstance(trust, bool) or not isinstance(trust, int | float) or not 0 <= trust <= 1
    ):
        raise InvalidInputError("must be a number from 0 to 1, or None", field="memories.trust")
    return MemoryItem(content, cast(MemorySource, source), **ids, kind=kind, trust=trust)


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


def check_fraction(value: object, field: str) -> float:
    """A fraction in (0, 1]."""
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or math.isnan(value)
        or not 0 < value <= 1
    ):
        raise InvalidInputError(f"must be a number in (0, 1], got {value!r}", field=field)
    return float(value)


def check_counter(counter: object, field: str = "counter") -> Any:
    """A token counter: has a string ``name`` and a ``count`` method."""
    if not isinstance(getattr(counter, "name", None), str) or not callable(getattr(counter, "count", None)):
        raise InvalidInputError("must have a str 'name' and a count(text) -> int method", field=field)
    return counter


def check_summarizer(summarizer: object, field: str = "summarizer") -> Any:
    """A summarizer: has string ``name`` and ``version`` and a ``summarize`` method."""
    named = isinstance(getattr(summarizer, "name", None), str)
    if not named or not callable(getattr(summarizer, "summarize", None)):
        raise InvalidInputError("must have a str 'name', a 'version' and a summarize() method", field=field)
    if not hasattr(summarizer, "version"):
        raise InvalidInputError("must have a 'version'", field=field)
    return summarizer
