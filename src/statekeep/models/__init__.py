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

from statekeep.models._anthropic import AnthropicModel, openai_to_anthropic, parse_anthropic_response
from statekeep.models._client import parse_retry_after
from statekeep.models._openai import OpenAIChatModel, parse_openai_response
from statekeep.models._types import (
    INVALID_ARGUMENTS,
    RETRYABLE_STATUS,
    AnyModel,
    AsyncModel,
    AsyncStreamingModel,
    Message,
    Model,
    ModelResponse,
    Script,
    ScriptedModel,
    StreamingModel,
    ToolCall,
    ToolSpec,
    retryable_status,
)

__all__ = [
    "INVALID_ARGUMENTS",
    "RETRYABLE_STATUS",
    "AnthropicModel",
    "AnyModel",
    "AsyncModel",
    "AsyncStreamingModel",
    "Message",
    "Model",
    "ModelResponse",
    "OpenAIChatModel",
    "Script",
    "ScriptedModel",
    "StreamingModel",
    "ToolCall",
    "ToolSpec",
    "openai_to_anthropic",
    "parse_anthropic_response",
    "parse_openai_response",
    "parse_retry_after",
    "retryable_status",
]
