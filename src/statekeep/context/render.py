"""Rendering: pinned state and summaries as text, and messages in provider formats.

Pure functions. The memory block is rendered by :mod:`statekeep._memory_block`,
which the memory store shares.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from statekeep.context._types import Message, Summary


def render_pinned(pinned: str | Mapping[str, Any]) -> str:
    """The pinned task state as a system section."""
    body = pinned if isinstance(pinned, str) else json.dumps(pinned, indent=2, sort_keys=True, default=str)
    return f"Current task state (pinned):\n{body}"


def render_summary(summary: Summary) -> str:
    """The rolling summary as a system section."""
    span = f"events {summary.covers_from}-{summary.covers_to}"
    return f"Summary of the earlier conversation ({span}):\n{summary.text}"


def to_openai(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages in the OpenAI chat-completions format.

    Examples:
        >>> to_openai([Message.user("hi")])
        [{'role': 'user', 'content': 'hi'}]
    """
    return [_openai(m) for m in messages]


def _openai(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id
    elif m.name and m.role in ("user", "system"):
        out["name"] = m.name
    if m.tool_calls:
        out["content"] = m.content or None
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments), sort_keys=True)},
            }
            for c in m.tool_calls
        ]
    return out


def to_anthropic(messages: Sequence[Message]) -> dict[str, Any]:
    """Messages in the Anthropic messages format: ``{"system": str, "messages": [...]}``.

    System messages are joined into the top-level ``system`` string; tool
    results become ``tool_result`` blocks of a user turn; consecutive turns of
    the same role are merged, as the API requires.
    """
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    turns: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            continue
        role = "assistant" if m.role == "assistant" else "user"
        blocks = _anthropic_blocks(m)
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return {"system": system, "messages": turns}


def _anthropic_blocks(m: Message) -> list[dict[str, Any]]:
    if m.role == "tool":
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}
        if m.is_error:
            block["is_error"] = True
        return [block]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
    blocks.extend(
        {"type": "tool_use", "id": c.id, "name": c.name, "input": dict(c.arguments)} for c in m.tool_calls
    )
    return blocks
