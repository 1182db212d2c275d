"""OpenAI-compatible chat completions, on the official ``openai`` package."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from statekeep._check import check_int
from statekeep.errors import InvalidInputError, ModelError
from statekeep.models._client import ClientModel, arguments, as_dict
from statekeep.models._types import Message, ModelResponse, ToolCall, ToolSpec


class OpenAIChatModel(ClientModel):
    """An OpenAI-compatible chat-completions endpoint, on the official ``openai`` package.

    ``base_url`` points it at any compatible server (vLLM, Ollama, LM Studio, a
    proxy); without it, OpenAI itself (``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``
    are read as the ``openai`` client reads them). ``temperature``, ``max_tokens``
    and ``tool_choice`` (``"auto"``, ``"none"``, ``"required"`` or a tool name) go
    into every request; ``extra_body`` adds provider-specific fields. Sync
    (:meth:`complete`, :meth:`stream`) and async (:meth:`acomplete`,
    :meth:`astream`). The client does not retry (``max_retries=0``): the runtime
    does, durably. Nothing is sent until a call is made.

    Examples:
        >>> m = OpenAIChatModel("qwen2.5:7b", base_url="http://127.0.0.1:11434/v1", temperature=0.2)
        >>> m.request_body([{"role": "user", "content": "hi"}])["temperature"]
        0.2
    """

    sdk: ClassVar[str] = "openai"
    extra: ClassVar[str] = "statekeep[openai]"
    key_env: ClassVar[str] = "OPENAI_API_KEY"
    clients: ClassVar[tuple[str, str]] = ("OpenAI", "AsyncOpenAI")
    default_where: ClassVar[str] = "the OpenAI API"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        temperature: float | None = None,
        max_tokens: int | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        extra_body: dict[str, Any] | None = None,
        max_retries: int = 0,
    ) -> None:
        if temperature is not None and (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not 0 <= temperature <= 2
        ):
            raise InvalidInputError("must be a number from 0 to 2, or None", field="temperature")
        if max_tokens is not None:
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
        self.temperature, self.max_tokens = temperature, max_tokens

    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *, stream: bool = False
    ) -> dict[str, Any]:
        """The fields of the chat-completions request (``extra_body`` is sent alongside)."""
        body: dict[str, Any] = {"model": self.name, "messages": list(messages)}
        if tools:
            body["tools"] = [t.to_openai() for t in tools]
            if self.tool_choice is not None:
                body["tool_choice"] = _tool_choice(self.tool_choice)
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def _endpoint(self, client: Any) -> Any:
        return client.chat.completions

    def _parse(self, payload: dict[str, Any]) -> ModelResponse:
        return parse_openai_response(payload)

    def _open_stream(self, endpoint: Any, kwargs: dict[str, Any]) -> Any:
        return endpoint.create(**kwargs)  # a Stream (AsyncStream, once awaited) is its own context manager

    def _accumulator(self) -> _OpenAIStream:
        return _OpenAIStream(self.name)


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, dict) or choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _usage(usage: Any) -> tuple[int, int, int]:
    if not isinstance(usage, dict):
        return 0, 0, 0
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0), int(cached or 0)


def parse_openai_response(payload: dict[str, Any]) -> ModelResponse:
    """Turn a chat-completions JSON answer into a :class:`ModelResponse`."""
    try:
        message = payload["choices"][0]["message"]
        calls = tuple(
            ToolCall(c["id"], c["function"]["name"], arguments(c["function"].get("arguments")))
            for c in message.get("tool_calls") or ()
        )
    except (KeyError, IndexError, TypeError) as exc:
        raise ModelError(f"malformed chat-completions answer: {exc!r}") from exc
    prompt, completion, cached = _usage(payload.get("usage"))
    return ModelResponse(
        content=message.get("content"),
        tool_calls=calls,
        input_tokens=prompt,
        output_tokens=completion,
        cached_tokens=cached,
    )


class _OpenAIStream:
    """Accumulates chat-completion chunks into one response."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.usage: tuple[int, int, int] = (0, 0, 0)
        self.finished = False

    def add(self, event: Any) -> str:
        chunk = as_dict(event)
        if chunk.get("usage"):
            self.usage = _usage(chunk["usage"])
        text = ""
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content") or ""
            if text:
                self.text.append(text)
            for call in delta.get("tool_calls") or ():
                slot = self.calls.setdefault(
                    int(call.get("index") or 0), {"id": "", "name": "", "arguments": ""}
                )
                fn = call.get("function") or {}
                slot["id"] = call.get("id") or slot["id"]
                slot["name"] = slot["name"] or fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finished = True
        return text

    def finish(self, events: Any) -> None:
        return None  # every part of the answer came in the chunks

    def response(self, final: Any = None) -> ModelResponse:
        if not self.finished:
            raise ModelError(f"{self.model}: the stream ended before the answer was complete", retryable=True)
        calls = tuple(
            ToolCall(c["id"], c["name"], arguments(c["arguments"])) for _, c in sorted(self.calls.items())
        )
        prompt, completion, cached = self.usage
        return ModelResponse(
            content="".join(self.text) or None,
            tool_calls=calls,
            input_tokens=prompt,
            output_tokens=completion,
            cached_tokens=cached,
        )
