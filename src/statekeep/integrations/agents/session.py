"""``StatekeepSession``: an Agents SDK session whose items are events of the context log.

Each item the SDK adds is appended to the session's context log as a provider-neutral
message (so ``statekeep context show`` and the context builder see the conversation),
with an idempotency key that names the exact item, kept in the integration's own
table (``statekeep_agents.items``): the SDK gets back precisely what it stored.

The log stays append-only. ``clear_session`` appends a ``marker`` event (reason
``cleared``, :meth:`ContextStore.mark <statekeep.context.ContextStore.mark>`): the
context builder, compaction and :meth:`get_items` all start after the latest marker.
``pop_item`` appends a marker (reason ``rewound``) and then the items that remain, again.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, cast

import sqlalchemy as sa

from statekeep.context import Event, Message, SQLContextStore, ToolCall
from statekeep.context._types import MARKER, MESSAGE_KINDS
from statekeep.db import Database, Migration, upgrade
from statekeep.db.migrations import create_tables
from statekeep.integrations._extras import missing

try:
    from agents.memory.session import SessionABC
    from agents.memory.session_settings import SessionSettings, coerce_session_settings, resolve_session_limit
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise missing("agents", "statekeep.integrations.agents", exc) from exc

__all__ = ["CLEARED", "REWOUND", "StatekeepSession"]

SCHEMA = "statekeep_agents"
_metadata = sa.MetaData(schema=SCHEMA)
items_table = sa.Table(
    "items",
    _metadata,
    sa.Column("session_id", sa.String(255), primary_key=True),
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("item", sa.Text, nullable=False),
)
MIGRATIONS = [
    Migration(1, "items: the exact SDK item of each logged event", create_tables(_metadata, "items"))
]

#: The reasons of the markers ``clear_session`` and ``pop_item`` append.
CLEARED, REWOUND = "cleared", "rewound"
_TEXT = {
    CLEARED: "The conversation before this point was cleared.",
    REWOUND: "The conversation was rewound: it continues with the messages below.",
}
_KEY = "sdk:"


class StatekeepSession(SessionABC):
    """An OpenAI Agents SDK session stored in the context store (SQLite or PostgreSQL).

    Examples:
        >>> import asyncio
        >>> session = StatekeepSession("s1", "sqlite:///agents-session.db")
        >>> asyncio.run(session.add_items([{"role": "user", "content": "Hi"}]))
        >>> asyncio.run(session.get_items())
        [{'role': 'user', 'content': 'Hi'}]

    Args:
        session_id: the context session (the same id ``statekeep context show`` takes).
        store: a :class:`~statekeep.context.SQLContextStore`, a
            :class:`~statekeep.db.Database` or a database URL.
        owner: when given, the session must be this owner's (or is claimed for them).
        session_settings: the SDK's settings (``limit`` of :meth:`get_items`).
    """

    def __init__(
        self,
        session_id: str,
        store: SQLContextStore | Database | str,
        *,
        owner: str | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        self.session_id = session_id
        self.session_settings = (
            SessionSettings() if session_settings is None else coerce_session_settings(session_settings)
        )
        self.owner = owner
        self._own = not isinstance(store, SQLContextStore)
        self.store = store if isinstance(store, SQLContextStore) else SQLContextStore(store)
        self.db: Database = self.store.db
        upgrade(self.db, "agents", SCHEMA, MIGRATIONS)

    def close(self) -> None:
        """Release the connections (only those of a store this session opened)."""
        if self._own:
            self.db.dispose()

    # --- the Session protocol -----------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The session's items after its latest marker, oldest first (the newest ``limit``)."""
        return await asyncio.to_thread(self._get_items, resolve_session_limit(limit, self.session_settings))

    async def add_items(self, items: list[Any]) -> None:
        """Append items: one context event each, in order."""
        await asyncio.to_thread(self._add_items, list(items))

    async def pop_item(self) -> Any | None:
        """Remove and return the newest item (a marker, then the rest again), None when empty."""
        return await asyncio.to_thread(self._pop_item)

    async def clear_session(self) -> None:
        """Append a marker after which the session has no items."""
        await asyncio.to_thread(self._clear)

    # --- the same, synchronous ------------------------------------------------------------------

    def _current(self) -> list[tuple[Event, Any]]:
        events = self.store.events(self.session_id, owner=self.owner)
        keys = [e.key for e in events if e.key and e.key.startswith(_KEY)]
        raw = self._raw(keys)
        found: list[tuple[Event, Any]] = []
        for event in events:
            if event.kind == MARKER:
                found = []
                continue
            if event.kind not in MESSAGE_KINDS:
                continue
            item = raw.get(event.key) if event.key else None
            found.append((event, item if item is not None else to_item(event.message)))
        return found

    def _raw(self, keys: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        with self.db.read("reading agent session items") as conn:
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                q = sa.select(items_table.c.key, items_table.c.item).where(
                    items_table.c.session_id == self.session_id, items_table.c.key.in_(chunk)
                )
                out.update({k: json.loads(v) for k, v in conn.execute(q)})
        return out

    def _get_items(self, limit: int | None) -> list[Any]:
        found = [item for _, item in self._current()]
        if limit is None:
            return found
        return found[-limit:] if limit > 0 else []

    def _add_items(self, items: list[Any]) -> None:
        if not items:
            return
        rows = [
            {"session_id": self.session_id, "key": f"{_KEY}{uuid.uuid4().hex}", "item": json.dumps(item)}
            for item in items
        ]
        # the exact items first: a crash before the events leaves rows no event names (ignored)
        with self.db.begin("storing agent session items") as conn:
            conn.execute(items_table.insert(), rows)
        for row, item in zip(rows, items, strict=True):
            self.store.append(self.session_id, to_message(item), key=row["key"], owner=self.owner)

    def _pop_item(self) -> Any | None:
        found = self._current()
        if not found:
            return None
        popped = found[-1][1]
        self._mark(REWOUND)
        self._add_items([item for _, item in found[:-1]])
        return popped

    def _clear(self) -> None:
        if self._current():
            self._mark(CLEARED)

    def _mark(self, reason: str) -> None:
        self.store.mark(self.session_id, reason, text=_TEXT[reason], owner=self.owner)


# --- items and messages -------------------------------------------------------------------------


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                text = part.get("text") or part.get("refusal") or part.get("transcript")
                parts.append(str(text) if text else f"[{part.get('type', 'part')}]")
        return "\n".join(parts)
    return "" if content is None else json.dumps(content)


def to_message(item: Any) -> Message:
    """The provider-neutral message the context log and the builder see for an SDK item."""
    data = cast(Mapping[str, Any], item if isinstance(item, Mapping) else {"content": str(item)})
    kind = data.get("type")
    role = data.get("role")
    if kind == "function_call" or kind == "custom_tool_call":
        raw = data.get("arguments", data.get("input", ""))
        try:
            args = json.loads(raw) if isinstance(raw, str) and raw else {}
        except ValueError:
            args = {"input": raw}
        args = args if isinstance(args, dict) else {"input": args}
        call_id = str(data.get("call_id") or data.get("id") or "call")
        return Message.assistant("", tool_calls=[ToolCall(call_id, str(data.get("name") or "tool"), args)])
    if kind in ("function_call_output", "custom_tool_call_output"):
        output = data.get("output")
        return Message.tool_result(
            str(data.get("call_id") or "call"), output if isinstance(output, str) else _text(output)
        )
    if role in ("user", "system", "developer", "assistant"):
        text = _text(data.get("content")) or "[empty]"
        if role == "user":
            return Message.user(text)
        if role == "assistant":
            return Message.assistant(text)
        return Message.system(text)
    # reasoning, hosted tool calls...: the builder sees a short note of what happened
    summary = _text(data.get("summary") or data.get("content") or "")
    return Message.assistant(f"[{kind or 'item'}] {summary}".strip())


def to_item(message: Message) -> Any:
    """An SDK input item for a message another writer (the runtime, a person) put in the log."""
    if message.role == "tool":
        return {"type": "function_call_output", "call_id": message.tool_call_id, "output": message.content}
    if message.tool_calls:
        call = message.tool_calls[0]
        return {
            "type": "function_call",
            "call_id": call.id,
            "name": call.name,
            "arguments": json.dumps(dict(call.arguments)),
        }
    return {"role": message.role, "content": message.content}
