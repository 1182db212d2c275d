"""The Anthropic messages API, on the official ``anthropic`` package."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar

from statekeep._check import check_int
from statekeep.errors import ModelError
from statekeep.models._client import ClientModel, arguments, as_dict
from statekeep.models._types import Message, ModelResponse, ToolCall, ToolSpec


class AnthropicModel(ClientModel):
    """The Anthropic messages API, on the official ``anthropic`` package.

    Takes the same OpenAI-format messages as every model here and converts them
    (system messages join the top-level ``system``; tool results become
    ``tool_result`` blocks). ``max_tokens`` is required by the API (default
    1024); ``tool_choice`` is ``"auto"``, ``"none"``, ``"required"`` or a tool
    name; ``extra_body`` adds fields. Sync and async, streaming or not; the
    client does not retry (the runtime does, durably).

    Examples:
        >>> m = AnthropicModel("claude-sonnet-4-5", api_key="k", max_tokens=512)
        >>> body = m.request_body([{"role": "system", "content": "Brief."}, {"role": "user", "content": "x"}])
        >>> body["system"], body["max_tokens"]
        ('Brief.', 512)
    """

    sdk: ClassVar[str] = "anthropic"
    extra: ClassVar[str] = "statekeep[anthropic]"
    key_env: ClassVar[str] = "ANTHROPIC_API_KEY"
    clients: ClassVar[tuple[str, str]] = ("Anthropic", "AsyncAnthropic")
    default_where: ClassVar[str] = "the Anthropic API"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = 1024,
        tool_choice: str | dict[str, Any] | None = None,
        timeout: float = 60.0,
        extra_body: dict[str, Any] | None = None,
        max_retries: int = 0,
    ) -> None:
        check_int(max_tokens, "max_tokens", minimum=1)
        super().__init__(
            model,
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            tool_choice=tool_choice,
            extra_body=extra_body,
            max_retries=max_retries,
        )
        self.max_tokens = max_tokens

    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *, stream: bool = False
    ) -> dict[str, Any]:
        """The fields of the messages request, converted from the OpenAI format (a stream asks alike)."""
        system, turns = openai_to_anthropic(messages)
        body: dict[str, Any] = {"model": self.name, "max_tokens": self.max_tokens, "messages": turns}
        if system:
            body["system"] = system
        if tools:
            body["tools"] = [t.to_anthropic() for t in tools]
            if self.tool_choice is not None:
                body["tool_choice"] = _tool_choice(self.tool_choice)
        return body

    def _endpoint(self, client: Any) -> Any:
        return client.messages

    def _parse(self, payload: dict[str, Any]) -> ModelResponse:
        return parse_anthropic_response(payload)

    def _open_stream(self, endpoint: Any, kwargs: dict[str, Any]) -> Any:
        return endpoint.stream(**kwargs)  # a stream manager: its context is the stream of events

    def _accumulator(self) -> _AnthropicStream:
        return _AnthropicStream()


class _AnthropicStream:
    """Relays text deltas; the SDK's stream assembles the final message itself."""

    def add(self, event: Any) -> str:
        if getattr(event, "type", None) != "content_block_delta":
            return ""
        delta: Any = getattr(event, "delta", None)
        return str(delta.text) if getattr(delta, "type", None) == "text_delta" else ""

    def finish(self, events: Any) -> Any:
        return events.get_final_message()  # awaitable on an async stream

    def response(self, final: Any) -> ModelResponse:
        return parse_anthropic_response(as_dict(final))


def _tool_choice(choice: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(choice, dict):
        return choice
    if choice in ("auto", "none"):
        return {"type": choice}
    if choice == "required":
        return {"type": "any"}
    return {"type": "tool", "name": choice}


def openai_to_anthropic(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """OpenAI-format messages as Anthropic's ``system`` string and ``messages`` list.

    System messages join the system string; assistant tool calls become
    ``tool_use`` blocks and tool messages ``tool_result`` blocks of a user turn;
    consecutive turns of one role are merged, as the API requires.

    Examples:
        >>> openai_to_anthropic([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}])
        ('S', [{'role': 'user', 'content': [{'type': 'text', 'text': 'hi'}]}])
    """
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        content = m.get("content")
        text = content if isinstance(content, str) else ("" if content is None else json.dumps(content))
        if role == "system":
            if text:
                system.append(text)
            continue
        blocks: list[dict[str, Any]]
        if role == "tool":
            blocks = [{"type": "tool_result", "tool_use_id": m.get("tool_call_id"), "content": text}]
        else:
            blocks = [{"type": "text", "text": text}] if text else []
            for call in m.get("tool_calls") or ():
                fn = call.get("function") or {}
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.get("id"),
                        "name": fn.get("name"),
                        "input": arguments(fn.get("arguments")),
                    }
                )
        if not blocks:
            continue
        speaker = "assistant" if role == "assistant" else "user"
        if turns and turns[-1]["role"] == speaker:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": speaker, "content": blocks})
    return "\n\n".join(system), turns


def parse_anthropic_response(payload: dict[str, Any]) -> ModelResponse:
    """Turn a messages-API answer into a :class:`ModelResponse`."""
    try:
        blocks = payload["content"]
        text = "".join(b["text"] for b in blocks if b.get("type") == "text")
        calls = tuple(
            ToolCall(b["id"], b["name"], b.get("input") if isinstance(b.get("input"), dict) else {})
            for b in blocks
            if b.get("type") == "tool_use"
        )
    except (KeyError, TypeError) as exc:
        raise ModelError(f"malformed messages answer: {exc!r}") from exc
    usage = payload.get("usage") or {}
    fresh = int(usage.get("input_tokens") or 0)
    read = int(usage.get("cache_read_input_tokens") or 0)
    written = int(usage.get("cache_creation_input_tokens") or 0)
    return ModelResponse(
        content=text or None,
        tool_calls=calls,
        input_tokens=fresh + read + written,
        output_tokens=int(usage.get("output_tokens") or 0),
        cached_tokens=read,
    )
