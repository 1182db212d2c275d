"""The model protocol and its records: what every model takes and answers, and a scripted model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from statekeep.errors import InvalidInputError

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
