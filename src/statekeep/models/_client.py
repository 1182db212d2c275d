"""What the adapters on official clients share: checks, clients, the four calls, and errors.

:class:`ClientModel` holds everything :class:`~statekeep.models.OpenAIChatModel` and
:class:`~statekeep.models.AnthropicModel` do alike; each provider names its SDK, its
endpoint, its request body, its answer parser and its stream accumulator. Both SDKs
raise the same family of errors (``APIStatusError``, ``APITimeoutError``,
``APIConnectionError``, ``APIError``), mapped once here onto
:class:`~statekeep.errors.ModelError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import importlib
import inspect
import json
import math
import os
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any, ClassVar, Protocol

from statekeep._check import check_int, check_seconds
from statekeep.errors import ConfigError, InvalidInputError, MissingDependencyError, ModelError
from statekeep.models._types import INVALID_ARGUMENTS, Message, ModelResponse, ToolSpec, retryable_status


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


def check_tool_choice(tool_choice: object) -> None:
    """``"auto"``, ``"none"``, ``"required"``, a tool name, a dict, or None."""
    if tool_choice is not None and not isinstance(tool_choice, str | dict):
        raise InvalidInputError(
            "must be 'auto', 'none', 'required', a tool name, or a dict", field="tool_choice"
        )
    if isinstance(tool_choice, str) and not tool_choice.strip():
        raise InvalidInputError("must not be empty", field="tool_choice")


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


def provider_message(body: object, fallback: str) -> str:
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


def as_dict(obj: Any) -> dict[str, Any]:
    """An SDK's answer object (pydantic) as the JSON dict the parsers read."""
    if isinstance(obj, dict):
        return obj
    dumped = obj.model_dump()
    if not isinstance(dumped, dict):  # pragma: no cover - pydantic models dump to dicts
        raise ModelError(f"unexpected answer object {type(obj).__name__}")
    return dumped


def arguments(text: str | None) -> dict[str, Any]:
    """Tool-call arguments as the model sent them; text that is not a JSON object is kept for the error."""
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {INVALID_ARGUMENTS: text}
    return value if isinstance(value, dict) else {INVALID_ARGUMENTS: text}


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


class Accumulator(Protocol):
    """Gathers a provider's stream events into one answer."""

    def add(self, event: Any) -> str:
        """Take one event; return the text it adds (empty for none)."""
        ...

    def finish(self, events: Any) -> Any:
        """What :meth:`response` needs once the stream ended (may be awaitable, for an async stream)."""
        ...

    def response(self, final: Any) -> ModelResponse:
        """The whole answer."""
        ...


class ClientModel:
    """A model on a provider's official client: sync and async, streaming or not.

    A subclass names the SDK (:attr:`sdk`, :attr:`extra`, :attr:`key_env`, :attr:`clients`)
    and provides :meth:`request_body`, :meth:`_endpoint`, :meth:`_parse`,
    :meth:`_open_stream` and :meth:`_accumulator`. The client does not retry
    (``max_retries=0``): the runtime does, durably. Nothing is sent until a call is made.
    """

    #: the SDK's module, the extra that installs it, its API-key variable, (sync, async) client classes
    sdk: ClassVar[str]
    extra: ClassVar[str]
    key_env: ClassVar[str]
    clients: ClassVar[tuple[str, str]]
    #: the endpoint's name in messages when no ``base_url`` is given
    default_where: ClassVar[str]

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None,
        api_key: str | None,
        timeout: float,
        tool_choice: str | dict[str, Any] | None,
        extra_body: dict[str, Any] | None,
        max_retries: int,
    ) -> None:
        _check_common(model, base_url, api_key, timeout, max_retries, extra_body)
        check_tool_choice(tool_choice)
        try:
            self._sdk: ModuleType = importlib.import_module(self.sdk)
        except ImportError as exc:
            raise MissingDependencyError(self.extra, type(self).__name__) from exc
        self.name = model
        self.base_url = None if base_url is None else base_url.rstrip("/")
        self.timeout = float(timeout)
        self.tool_choice = tool_choice
        self.extra_body = dict(extra_body or {})
        self.max_retries = max_retries
        key = api_key or os.environ.get(self.key_env)
        if key is None and self.base_url is None:
            raise ConfigError(self.key_env, "", "not set: pass api_key=, or base_url= for a local server")
        self._api_key = key or "no-key"  # a local server usually takes no key; the client insists on one
        self._client: Any = None
        self._aclients = _PerLoop(self._new_async_client)

    @property
    def where(self) -> str:
        """The endpoint, for error messages."""
        return self.base_url or self.default_where

    # --- what a provider says ---------------------------------------------------------------

    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *, stream: bool = False
    ) -> dict[str, Any]:
        """The fields of the request (``extra_body`` is sent alongside)."""
        raise NotImplementedError

    def _endpoint(self, client: Any) -> Any:
        """The client's resource whose ``create`` sends a request."""
        raise NotImplementedError

    def _parse(self, payload: dict[str, Any]) -> ModelResponse:
        raise NotImplementedError

    def _open_stream(self, endpoint: Any, kwargs: dict[str, Any]) -> Any:
        """A context manager over the stream's events (for an async client, or an awaitable of one)."""
        raise NotImplementedError

    def _accumulator(self) -> Accumulator:
        raise NotImplementedError

    # --- clients ----------------------------------------------------------------------------

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
            self._client = getattr(self._sdk, self.clients[0])(**self._client_options())
        return self._client

    def _new_async_client(self) -> Any:
        client = getattr(self._sdk, self.clients[1])(**self._client_options())
        self._endpoint(client)  # imports its modules here, in a thread, not on the caller's loop
        with contextlib.suppress(ImportError):  # the HTTP stack's asyncio backend, likewise
            importlib.import_module("anyio._backends._asyncio")
        return client

    def _kwargs(self, messages: Sequence[Message], tools: Sequence[ToolSpec], stream: bool) -> dict[str, Any]:
        kwargs = self.request_body(messages, tools, stream=stream)
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        return kwargs

    # --- the four calls -----------------------------------------------------------------------

    def complete(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> ModelResponse:
        """Send the conversation and parse the answer."""
        with self._errors():
            raw = self._endpoint(self._sync_client()).create(**self._kwargs(messages, tools, False))
        return self._parse(as_dict(raw))

    async def acomplete(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> ModelResponse:
        """Awaitable :meth:`complete`."""
        client = await self._aclients.get()
        with self._errors():
            raw = await self._endpoint(client).create(**self._kwargs(messages, tools, False))
        return self._parse(as_dict(raw))

    def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> Iterator[str | ModelResponse]:
        """Stream the answer: text deltas as the server sends them, then the whole response."""
        acc = self._accumulator()
        with self._errors():
            endpoint = self._endpoint(self._sync_client())
            with self._open_stream(endpoint, self._kwargs(messages, tools, True)) as events:
                for event in events:
                    if text := acc.add(event):
                        yield text
                final = acc.finish(events)
        yield acc.response(final)

    async def astream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> AsyncIterator[str | ModelResponse]:
        """Async :meth:`stream`."""
        client = await self._aclients.get()
        acc = self._accumulator()
        with self._errors():
            opened = self._open_stream(self._endpoint(client), self._kwargs(messages, tools, True))
            async with await opened if inspect.isawaitable(opened) else opened as events:
                async for event in events:
                    if text := acc.add(event):
                        yield text
                final = acc.finish(events)
                final = await final if inspect.isawaitable(final) else final
        yield acc.response(final)

    # --- errors -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            raise self.error(exc) from exc

    def error(self, exc: BaseException) -> ModelError:
        """What the client raised, as a :class:`ModelError` in the provider's words."""
        sdk = self._sdk
        if isinstance(exc, ModelError):
            return exc
        if isinstance(exc, sdk.APIStatusError):
            status = int(exc.status_code)
            message = getattr(exc, "api_message", None) or provider_message(exc.body, str(exc.message))
            return ModelError(
                f"{self.name}: HTTP {status} from {self.where}: {message}",
                status=status,
                retryable=retryable_status(status),
                retry_after=parse_retry_after(exc.response.headers),
            )
        if isinstance(exc, sdk.APITimeoutError):
            return ModelError(
                f"{self.name}: no answer from {self.where} within {self.timeout:g} s", retryable=True
            )
        if isinstance(exc, sdk.APIConnectionError):
            cause = exc.__cause__ or exc
            return ModelError(f"{self.name}: cannot reach {self.where}: {cause}", retryable=True)
        if isinstance(exc, sdk.APIError):  # an error event in the middle of a stream
            message = provider_message(exc.body, str(exc.message))
            return ModelError(f"{self.name}: {self.where} broke off the answer: {message}", retryable=True)
        if _transport_error(exc):
            return ModelError(f"{self.name}: connection to {self.where} failed: {exc!r}", retryable=True)
        return ModelError(f"{self.name}: {type(exc).__name__}: {exc}")
