"""The model protocol, and its adapters.

A model takes chat messages in the OpenAI chat format (a list of dicts with
``role`` and ``content``, ``tool_calls`` on assistant turns and ``tool_call_id``
on tool results), plus the tools it may call, and returns a
:class:`ModelResponse`. That format is the lingua franca: the context store
converts its provider-neutral events to it, and most providers accept it.

* :class:`Model` / :class:`AsyncModel`: the protocols, sync and async.
* :class:`ScriptedModel`: deterministic answers for tests and the demo.
* :class:`OpenAIChatModel`: any OpenAI-compatible ``/chat/completions`` endpoint,
  used only when configured.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from statekeep._numbers import check_seconds
from statekeep.errors import InvalidInputError, ModelError

Message = dict[str, Any]


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


@dataclass(frozen=True)
class ModelResponse:
    """What a model answered: text, tool calls, or both; and the tokens it used."""

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    input_tokens: int = 0
    output_tokens: int = 0

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


Script = Callable[[Sequence[Message]], ModelResponse]


class ScriptedModel:
    """A deterministic model for tests and the demo: no network, no randomness.

    Give it either a function of the messages, or a list of responses; with a
    list, the answer is the entry whose index is the number of assistant turns
    already in the messages, so the same conversation always gets the same
    answer, in any process.

    Examples:
        >>> m = ScriptedModel([ModelResponse(content="hello")])
        >>> m.complete([{"role": "user", "content": "hi"}]).content
        'hello'
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


class OpenAIChatModel:
    """An OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama, LM Studio...).

    Uses only the standard library. Nothing is sent until :meth:`complete` runs.

    Examples:
        >>> m = OpenAIChatModel("gpt-4o-mini", base_url="http://127.0.0.1:8000/v1", api_key="k")
    """

    def __init__(
        self, model: str, *, base_url: str, api_key: str | None = None, timeout: float = 60.0
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise InvalidInputError("must name the model", field="model")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise InvalidInputError("must be a URL starting with http:// or https://", field="base_url")
        if api_key is not None and (not isinstance(api_key, str) or not api_key.isprintable()):
            raise InvalidInputError("must be a printable string or None", field="api_key")
        check_seconds(timeout, "timeout", positive=True)
        self.name = model
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.timeout = timeout

    def request_body(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> dict[str, Any]:
        """The JSON body :meth:`complete` sends."""
        body: dict[str, Any] = {"model": self.name, "messages": list(messages)}
        if tools:
            body["tools"] = [t.to_openai() for t in tools]
        return body

    def complete(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> ModelResponse:
        """POST the conversation to ``/chat/completions`` and parse the first choice."""
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        data = json.dumps(self.request_body(messages, tools)).encode()
        req = urllib.request.Request(f"{self.base_url}/chat/completions", data, headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                payload = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise ModelError(f"{self.name}: HTTP {exc.code} from {self.base_url}") from exc
        except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as exc:
            raise ModelError(f"{self.name}: no valid answer from {self.base_url}: {exc}") from exc
        return parse_openai_response(payload)


def parse_openai_response(payload: dict[str, Any]) -> ModelResponse:
    """Turn a chat-completions JSON answer into a :class:`ModelResponse`."""
    try:
        message = payload["choices"][0]["message"]
        calls = tuple(
            ToolCall(c["id"], c["function"]["name"], json.loads(c["function"].get("arguments") or "{}"))
            for c in message.get("tool_calls") or ()
        )
    except (KeyError, IndexError, TypeError, json.JSONDecodeError) as exc:
        raise ModelError(f"malformed chat-completions answer: {exc!r}") from exc
    usage = payload.get("usage") or {}
    return ModelResponse(
        content=message.get("content"),
        tool_calls=calls,
        input_tokens=int(usage.get("prompt_tokens", 0)),
        output_tokens=int(usage.get("completion_tokens", 0)),
    )
