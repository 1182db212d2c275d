"""Store 1: the session event log, token counting, and the context builder.

Append every message, tool call and tool result of a session; before each
model call, :meth:`ContextStore.build` returns what fits in the token budget:
system prompt, pinned task state, memories (as a delimited data block), the
rolling summary, and the newest events, never separating a tool call from its
results. See ``docs/context.md``.
"""

from statekeep._memory_block import MemoryItem
from statekeep.context._types import (
    ContextReport,
    Event,
    Message,
    Summary,
    ToolCall,
)
from statekeep.context.base import ContextStore
from statekeep.context.builder import BuiltContext
from statekeep.context.inmemory import InMemoryContextStore
from statekeep.context.render import to_anthropic, to_openai
from statekeep.context.sql import SQLContextStore
from statekeep.context.summarize import LLMSummarizer, OfflineSummarizer, Summarizer
from statekeep.context.tokens import CharCounter, TiktokenCounter, TokenCounter, message_tokens
from statekeep.context.window import enforce_pairing, select_window

__all__ = [
    "BuiltContext",
    "CharCounter",
    "ContextReport",
    "ContextStore",
    "Event",
    "InMemoryContextStore",
    "LLMSummarizer",
    "MemoryItem",
    "Message",
    "OfflineSummarizer",
    "SQLContextStore",
    "Summarizer",
    "Summary",
    "TiktokenCounter",
    "TokenCounter",
    "ToolCall",
    "enforce_pairing",
    "message_tokens",
    "select_window",
    "to_anthropic",
    "to_openai",
]
