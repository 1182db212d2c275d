"""The model protocol, and its adapters.

A model takes chat messages in the OpenAI chat format (a list of dicts with
``role`` and ``content``, ``tool_calls`` on assistant turns and ``tool_call_id``
on tool results), plus the tools it may call, and returns a
:class:`ModelResponse`. That format is the lingua franca: the context store
converts its provider-neutral events to it, and most providers accept it.

* :class:`Model` / :class:`AsyncModel`: the protocols, sync and async;
  :class:`StreamingModel` / :class:`AsyncStreamingModel` add text deltas.
* :class:`ScriptedModel`: deterministic answers for tests and the demo.
* :class:`OpenAIChatModel`: any OpenAI-compatible ``/chat/completions`` endpoint
  (OpenAI, vLLM, Ollama, LM Studio...), on the official ``openai`` package
  (``pip install 'statekeep[openai]'``).
* :class:`AnthropicModel`: the Anthropic messages API, on the official
  ``anthropic`` package (``pip install 'statekeep[anthropic]'``).

The adapters raise :class:`~statekeep.errors.ModelError` with the provider's own
message, the HTTP status, whether the call may succeed later (``retryable``:
timeouts, reset connections, 408, 409, 429, 5xx) and the ``Retry-After`` the
provider asked for. They do not retry by themselves: the runtime retries durably,
each attempt journaled.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import importlib
import json
import math
import os
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from statekeep._check import check_int, check_seconds
from statekeep.errors import ConfigError, InvalidInputError, MissingDependencyError, ModelError

Message = dict[str, Any]

#: The key under which an argument string that is not JSON reaches the runtime (answered as an error).
INVALID_ARGUMENTS = "$invalid_json"

#: HTTP statuses a later identical request may get past: timeout, conflict, rate limit, server errors.
RETRYABLE_STATUS = frozenset({408, 409, 425, 429})


def retryable_status(status: int) -> bool:
    """True for an HTTP status that a later identical request may get past."""
    return status in RETRYABLE_STATUS or status >= 500


@dataclass(frozen=True)
class ToolCall:
    """One call the model asks for: an id, a tool name and JSON arguments."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call: name, description and a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this tool."""
        fn = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": fn}

    def to_anthropic(self) -> dict[str, Any]:
        """The Anthropic ``tools`` entry for this tool."""
        return {"name": self.name, "description": self.description, "input_schema": self.parameters}


@dataclass(frozen=True)
class ModelResponse:
    """What a model answered: text, tool calls, or both; and the tokens it used.

    ``input_tokens`` counts the whole prompt, ``cached_tokens`` the part of it the
    provider read from its prompt cache.
    """

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0

    @property
    def usage(self) -> dict[str, int]:
        """Tokens of this call: ``prompt``, ``completion`` and ``cached`` (part of the prompt)."""
        return {"prompt": self.input_tokens, "completion": self.output_tokens, "cached": self.cached_tokens}

    def to_message(self) -> Message:
        """The assistant message, in the OpenAI chat format."""
        msg: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in self.tool_calls
            ]
        return msg


@runtime_checkable
class Model(Protocol):
    """A synchronous chat model."""

    name: str

    def complete(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> ModelResponse:
        """Answer the conversation ``messages``."""
        ...


@runtime_checkable
class AsyncModel(Protocol):
    """An asynchronous chat model."""

    name: str

    async def acomplete(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> ModelResponse:
        """Answer the conversation ``messages``."""
        ...


@runtime_checkable
class StreamingModel(Protocol):
    """A model that streams: text deltas (``str``) as they come, then the whole :class:`ModelResponse`."""

    name: str

    def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> Iterator[str | ModelResponse]:
        """Answer ``messages``, yielding text deltas and, last, the complete response."""
        ...


@runtime_checkable
class AsyncStreamingModel(Protocol):
    """The async twin of :class:`StreamingModel`."""

    name: str

    def astream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> AsyncIterator[str | ModelResponse]:
        """Answer ``messages``, yielding text deltas and, last, the complete response."""
        ...


#: Anything the runtime can call: a model with at least one of the four methods.
AnyModel = Model | AsyncModel | StreamingModel | AsyncStreamingModel


Script = Callable[[Sequence[Message]], ModelResponse]


class ScriptedModel:
    """A deterministic model for tests and the demo: no network, no randomness.

    Give it either a function of the messages, or a list of responses; with a
    list, the answer is the entry whose index is the number of assistant turns
    already in the messages, so the same conversation always gets the same
    answer, in any process. :meth:`stream` yields the answer word by word.

    Examples:
        >>> m = ScriptedModel([ModelResponse(content="hello world")])
        >>> m.complete([{"role": "user", "content": "hi"}]).content
        'hello world'
        >>> list(m.stream([{"role": "user", "content": "hi"}]))[:2]
        ['hello', ' world']
    """

    def __init__(self, script: Script | Sequence[ModelResponse], *, name: str = "scripted") -> None:
        if not callable(script):
            if isinstance(script, str | bytes) or not isinstance(script, Sequence):
                raise InvalidInputError("must be a list of ModelResponse or a function", field="script")
            if not script:
                raise InvalidInputError("a scripted model needs at least one response", field="script")
            if any(not isinstance(r, ModelResponse) for r in script):
                raise InvalidInputError("every scripted answer must be a ModelResponse", field="script")
        self.name = name
        self._script = script
        self.calls: list[list[Message]] = []

    def complete(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> ModelResponse:
        """The scripted answer for ``messages``."""
        self.calls.append(list(messages))
        if callable(self._script):
            return self._script(messages)
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        return self._script[min(turn, len(self._script) - 1)]

    def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> Iterator[str | ModelResponse]:
        """The scripted answer, its text word by word, then the response."""
        response = self.complete(messages, tools)
        words = (response.content or "").split(" ")
        for i, word in enumerate(words):
            if word or i:
                yield word if i == 0 else f" {word}"
        yield response


# --- shared by the HTTP adapters ------------------------------------------------------------


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds a provider asked to wait, from ``retry-after-ms`` or ``retry-after`` (seconds or a date).

    Examples:
        >>> parse_retry_after({"retry-after": "2"})
        2.0
        >>> parse_retry_after({"retry-after-ms": "1500"})
        1.5
        >>> parse_retry_after({}) is None
        True
    """
    if not headers:
        return None
    lower = {str(k).lower(): str(v) for k, v in headers.items()}
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = lower.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                continue
            seconds = when.timestamp() - time.time()
        if math.isfinite(seconds):
            return max(0.0, seconds)
    return None


def _check_common(
    model: object, base_url: object, api_key: object, timeout: object, max_retries: object, extra_body: object
) -> None:
    if not isinstance(model, str) or not model.strip():
        raise InvalidInputError("must name the model", field="model")
    if base_url is not None and (
        not isinstance(base_url, str) or not base_url.startswith(("http://", "https://"))
    ):
        raise InvalidInputError("must be a URL starting with http:// or https://, or None", field="base_url")
    if api_key is not None and (not isinstance(api_key, str) or not api_key.isprintable()):
        raise InvalidInputError("must be a printable string or None", field="api_key")
    check_seconds(timeout, "timeout", positive=True)
    check_int(max_retries, "max_retries", maximum=10)
    if extra_body is not None and not isinstance(extra_body, dict):
        raise InvalidInputError("must be a dict or None", field="extra_body")


def _check_tool_choice(tool_choice: object) -> None:
    if tool_choice is not None and not isinstance(tool_choice, str | dict):
        raise InvalidInputError(
            "must be 'auto', 'none', 'required', a tool name, or a dict", field="tool_choice"
        )
    if isinstance(tool_choice, str) and not tool_choice.strip():
        raise InvalidInputError("must not be empty", field="tool_choice")


def _provider_message(body: object, fallback: str) -> str:
    """The provider's own explanation in an error body (``{"error": {"message": ...}}`` and kin)."""
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]:
            return str(error["message"])
        if isinstance(error, str) and error:
            return error
        if isinstance(body.get("message"), str) and body["message"]:
            return str(body["message"])
    if isinstance(body, str) and body.strip():
        return body.strip()[:2000]
    return fallback


def _transport_error(exc: BaseException) -> bool:
    """A timeout, reset or refused connection, or a cut stream, from any HTTP stack."""
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(
        names & {"TransportError", "TimeoutException", "NetworkError", "ProtocolError", "StreamError"}
    )


def _import_async_backend() -> None:
    """Import the HTTP stack's asyncio backend now, off the loop (its first request would, on it)."""
    with contextlib.suppress(ImportError):
        importlib.import_module("anyio._backends._asyncio")


class _PerLoop:
    """One async client per event loop: an HTTP connection pool belongs to the loop that opened it."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()

    async def get(self) -> Any:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:  # built off the loop: creating a client loads certificates
            client = await asyncio.to_thread(self._make)
            self._clients.setdefault(loop, client)
            client = self._clients[loop]
        return client


# --- OpenAI and compatible servers ----------------------------------------------------------


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise MissingDependencyError("statekeep[openai]", "OpenAIChatModel") from exc
    return openai


class OpenAIChatModel:
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
        _check_common(model, base_url, api_key, timeout, max_retries, extra_body)
        if temperature is not None and (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not 0 <= temperature <= 2
        ):
            raise InvalidInputError("must be a number from 0 to 2, or None", field="temperature")
        if max_tokens is not None:
            check_int(max_tokens, "max_tokens", minimum=1)
        _check_tool_choice(tool_choice)
        self._openai = _import_openai()
        self.name = model
        self.base_url = None if base_url is None else base_url.rstrip("/")
        self.timeout = float(timeout)
        self.temperature, self.max_tokens, self.tool_choice = temperature, max_tokens, tool_choice
        self.extra_body = dict(extra_body or {})
        self.max_retries = max_retries
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if key is None and self.base_url is None:
            raise ConfigError("OPENAI_API_KEY", "", "not set: pass api_key=, or base_url= for a local server")
        self._api_key = key or "no-key"  # a local server usually takes no key; the client insists on one
        self._client: Any = None
        self._aclients = _PerLoop(self._new_async_client)

    @property
    def where(self) -> str:
        """The endpoint, for error messages."""
        return self.base_url or "the OpenAI API"

    def _client_options(self) -> dict[str, Any]:
        return {
            "api_key": self._api_key,
            "base_url": self.base_url,
            "timeout": self.timeout,
            "max_retries": self.max_retries,
        }

    def _sync_client(self) -> Any:
        if self._client is None:
            self._client = self._openai.OpenAI(**self._client_options())
        return self._client

    def _new_async_client(self) -> Any:
        client = self._openai.AsyncOpenAI(**self._client_options())
        _ = client.chat.completions  # imports its modules here, in a thread, not on the caller's loop
        _import_async_backend()
        return client

    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *, stream: bool = False
    ) -> dict[str, Any]:
        """The fields of the chat-completions request (``extra_body`` is sent alongside)."""
        body: dict[str, Any] = {"model": self.name, "messages": list(messages)}
        if tools:
            body["tools"] = [t.to_openai() for t in tools]
            if self.tool_choice is not None:
                body["tool_choice"] = _openai_tool_choice(self.tool_choice)
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def _kwargs(self, messages: Sequence[Message], tools: Sequence[ToolSpec], stream: bool) -> dict[str, Any]:
        kwargs = self.request_body(messages, tools, stream=stream)
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        return kwargs

    def complete(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> ModelResponse:
        """Send the conversation and parse the first choice."""
        try:
            completion = self._sync_client().chat.completions.create(**self._kwargs(messages, tools, False))
        except Exception as exc:
            raise self.error(exc) from exc
        return parse_openai_response(_as_dict(completion))

    def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> Iterator[str | ModelResponse]:
        """Stream the answer: text deltas as the server sends them, then the whole response."""
        acc = _OpenAIStream(self.name)
        try:
            chunks = self._sync_client().chat.completions.create(**self._kwargs(messages, tools, True))
            with chunks:
                for chunk in chunks:
                    text = acc.add(_as_dict(chunk))
                    if text:
                        yield text
        except Exception as exc:
            raise self.error(exc) from exc
        yield acc.response()

    async def acomplete(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> ModelResponse:
        """Awaitable :meth:`complete`."""
        client = await self._aclients.get()
        try:
            completion = await client.chat.completions.create(**self._kwargs(messages, tools, False))
        except Exception as exc:
            raise self.error(exc) from exc
        return parse_openai_response(_as_dict(completion))

    async def astream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> AsyncIterator[str | ModelResponse]:
        """Async :meth:`stream`."""
        client = await self._aclients.get()
        acc = _OpenAIStream(self.name)
        try:
            chunks = await client.chat.completions.create(**self._kwargs(messages, tools, True))
            async with chunks:
                async for chunk in chunks:
                    text = acc.add(_as_dict(chunk))
                    if text:
                        yield text
        except Exception as exc:
            raise self.error(exc) from exc
        yield acc.response()

    def error(self, exc: BaseException) -> ModelError:
        """What the ``openai`` client raised, as a :class:`ModelError` in the provider's words."""
        openai = self._openai
        if isinstance(exc, ModelError):
            return exc
        if isinstance(exc, openai.APIStatusError):
            status = int(exc.status_code)
            message = _provider_message(exc.body, str(exc.message))
            return ModelError(
                f"{self.name}: HTTP {status} from {self.where}: {message}",
                status=status,
                retryable=retryable_status(status),
                retry_after=parse_retry_after(exc.response.headers),
            )
        if isinstance(exc, openai.APITimeoutError):
            return ModelError(
                f"{self.name}: no answer from {self.where} within {self.timeout:g} s", retryable=True
            )
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc
            return ModelError(f"{self.name}: cannot reach {self.where}: {cause}", retryable=True)
        if isinstance(exc, openai.APIError):  # an error event in the middle of a stream
            message = _provider_message(exc.body, str(exc.message))
            return ModelError(f"{self.name}: {self.where} broke off the answer: {message}", retryable=True)
        if _transport_error(exc):
            return ModelError(f"{self.name}: connection to {self.where} failed: {exc!r}", retryable=True)
        return ModelError(f"{self.name}: {type(exc).__name__}: {exc}")


def _openai_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, dict) or choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _as_dict(obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return obj
    dumped = obj.model_dump()
    if not isinstance(dumped, dict):  # pragma: no cover - pydantic models dump to dicts
        raise ModelError(f"unexpected answer object {type(obj).__name__}")
    return dumped


def _arguments(text: str | None) -> dict[str, Any]:
    """Tool-call arguments as the model sent them; text that is not a JSON object is kept for the error."""
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {INVALID_ARGUMENTS: text}
    return value if isinstance(value, dict) else {INVALID_ARGUMENTS: text}


def _openai_usage(usage: Any) -> tuple[int, int, int]:
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
            ToolCall(c["id"], c["function"]["name"], _arguments(c["function"].get("arguments")))
            for c in message.get("tool_calls") or ()
        )
    except (KeyError, IndexError, TypeError) as exc:
        raise ModelError(f"malformed chat-completions answer: {exc!r}") from exc
    prompt, completion, cached = _openai_usage(payload.get("usage"))
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

    def add(self, chunk: dict[str, Any]) -> str:
        if chunk.get("usage"):
            self.usage = _openai_usage(chunk["usage"])
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

    def response(self) -> ModelResponse:
        if not self.finished:
            raise ModelError(f"{self.model}: the stream ended before the answer was complete", retryable=True)
        calls = tuple(
            ToolCall(c["id"], c["name"], _arguments(c["arguments"])) for _, c in sorted(self.calls.items())
        )
        prompt, completion, cached = self.usage
        return ModelResponse(
            content="".join(self.text) or None,
            tool_calls=calls,
            input_tokens=prompt,
            output_tokens=completion,
            cached_tokens=cached,
        )


# --- Anthropic ------------------------------------------------------------------------------


def _import_anthropic() -> Any:
    try:
        import anthropic
    except ImportError as exc:
        raise MissingDependencyError("statekeep[anthropic]", "AnthropicModel") from exc
    return anthropic


class AnthropicModel:
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
        _check_common(model, base_url, api_key, timeout, max_retries, extra_body)
        check_int(max_tokens, "max_tokens", minimum=1)
        _check_tool_choice(tool_choice)
        self._anthropic = _import_anthropic()
        self.name = model
        self.base_url = None if base_url is None else base_url.rstrip("/")
        self.timeout = float(timeout)
        self.max_tokens, self.tool_choice = max_tokens, tool_choice
        self.extra_body = dict(extra_body or {})
        self.max_retries = max_retries
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if key is None and self.base_url is None:
            raise ConfigError(
                "ANTHROPIC_API_KEY", "", "not set: pass api_key=, or base_url= for a local server"
            )
        self._api_key = key or "no-key"
        self._client: Any = None
        self._aclients = _PerLoop(self._new_async_client)

    @property
    def where(self) -> str:
        """The endpoint, for error messages."""
        return self.base_url or "the Anthropic API"

    def _client_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "api_key": self._api_key,
            "timeout": self.timeout,
            "max_retries": self.max_retries,
        }
        if self.base_url is not None:
            options["base_url"] = self.base_url
        return options

    def _sync_client(self) -> Any:
        if self._client is None:
            self._client = self._anthropic.Anthropic(**self._client_options())
        return self._client

    def _new_async_client(self) -> Any:
        client = self._anthropic.AsyncAnthropic(**self._client_options())
        _ = client.messages  # imports its modules here, in a thread, not on the caller's loop
        _import_async_backend()
        return client

    def request_body(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> dict[str, Any]:
        """The fields of the messages request, converted from the OpenAI format."""
        system, turns = openai_to_anthropic(messages)
        body: dict[str, Any] = {"model": self.name, "max_tokens": self.max_tokens, "messages": turns}
        if system:
            body["system"] = system
        if tools:
            body["tools"] = [t.to_anthropic() for t in tools]
            if self.tool_choice is not None:
                body["tool_choice"] = _anthropic_tool_choice(self.tool_choice)
        return body

    def _kwargs(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        kwargs = self.request_body(messages, tools)
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        return kwargs

    def complete(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> ModelResponse:
        """Send the conversation and parse the answer."""
        try:
            message = self._sync_client().messages.create(**self._kwargs(messages, tools))
        except Exception as exc:
            raise self.error(exc) from exc
        return parse_anthropic_response(_as_dict(message))

    def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> Iterator[str | ModelResponse]:
        """Stream the answer: text deltas, then the whole response."""
        try:
            with self._sync_client().messages.stream(**self._kwargs(messages, tools)) as events:
                for event in events:
                    text = _anthropic_text(event)
                    if text:
                        yield text
                final = events.get_final_message()
        except Exception as exc:
            raise self.error(exc) from exc
        yield parse_anthropic_response(_as_dict(final))

    async def acomplete(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> ModelResponse:
        """Awaitable :meth:`complete`."""
        client = await self._aclients.get()
        try:
            message = await client.messages.create(**self._kwargs(messages, tools))
        except Exception as exc:
            raise self.error(exc) from exc
        return parse_anthropic_response(_as_dict(message))

    async def astream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> AsyncIterator[str | ModelResponse]:
        """Async :meth:`stream`."""
        client = await self._aclients.get()
        try:
            async with client.messages.stream(**self._kwargs(messages, tools)) as events:
                async for event in events:
                    text = _anthropic_text(event)
                    if text:
                        yield text
                final = await events.get_final_message()
        except Exception as exc:
            raise self.error(exc) from exc
        yield parse_anthropic_response(_as_dict(final))

    def error(self, exc: BaseException) -> ModelError:
        """What the ``anthropic`` client raised, as a :class:`ModelError` in the provider's words."""
        anthropic = self._anthropic
        if isinstance(exc, ModelError):
            return exc
        if isinstance(exc, anthropic.APIStatusError):
            status = int(exc.status_code)
            message = getattr(exc, "api_message", None) or _provider_message(exc.body, str(exc.message))
            return ModelError(
                f"{self.name}: HTTP {status} from {self.where}: {message}",
                status=status,
                retryable=retryable_status(status),
                retry_after=parse_retry_after(exc.response.headers),
            )
        if isinstance(exc, anthropic.APITimeoutError):
            return ModelError(
                f"{self.name}: no answer from {self.where} within {self.timeout:g} s", retryable=True
            )
        if isinstance(exc, anthropic.APIConnectionError):
            cause = exc.__cause__ or exc
            return ModelError(f"{self.name}: cannot reach {self.where}: {cause}", retryable=True)
        if isinstance(exc, anthropic.APIError):
            message = _provider_message(exc.body, str(exc.message))
            return ModelError(f"{self.name}: {self.where} broke off the answer: {message}", retryable=True)
        if _transport_error(exc):
            return ModelError(f"{self.name}: connection to {self.where} failed: {exc!r}", retryable=True)
        return ModelError(f"{self.name}: {type(exc).__name__}: {exc}")


def _anthropic_text(event: Any) -> str:
    if getattr(event, "type", None) != "content_block_delta":
        return ""
    delta: Any = getattr(event, "delta", None)
    return str(delta.text) if getattr(delta, "type", None) == "text_delta" else ""


def _anthropic_tool_choice(choice: str | dict[str, Any]) -> dict[str, Any]:
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
                        "input": _arguments(fn.get("arguments")),
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
