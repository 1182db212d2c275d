"""``StatekeepSession``: an Agents SDK session whose items are events of the context log.

Each item the SDK adds is appended to the session's context log as a provider-neutral
message (so ``statekeep context show`` and the context builder see the conversation),
with an idempotency key that names the exact item, kept in the integration's own
table (``statekeep_agents.items``): the SDK gets back precisely what it stored.

With a key ring, the items and the events of an owned session are sealed with the
owner's data key, as the runtime seals its rows; erasing the owner deletes both
and shreds the key (:func:`statekeep.erasure.erase_owner`).

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
from typing import Any, Literal, cast

import sqlalchemy as sa

from statekeep._check import check_id, check_json_object, check_optional_id
from statekeep.context import Event, Message, SQLContextStore, ToolCall
from statekeep.context._types import MARKER, MESSAGE_KINDS
from statekeep.db import Database
from statekeep.errors import InvalidInputError, SealedDataError
from statekeep.integrations._agents_items import items_table, setup
from statekeep.integrations._extras import missing
from statekeep.keys import KeyRing, is_sealed, key_id_of

try:
    from agents.memory.session import SessionABC
    from agents.memory.session_settings import SessionSettings, coerce_session_settings, resolve_session_limit
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise missing("agents", "statekeep.integrations.agents", exc) from exc

__all__ = ["CLEARED", "REWOUND", "StatekeepSession"]

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
        keys: the :class:`~statekeep.keys.KeyRing` that seals the items and events of an
            owned session with the owner's data key; ``None`` stores them as plain text.
            By default (``"settings"``), what :meth:`Runtime.open
            <statekeep.runtime.Runtime.open>` does: the ring ``STATEKEEP_KEYS`` names
            (``<STATEKEEP_HOME>/keys.json`` unless it is ``none``), its data keys in the
            settings' workflow database when ``store`` is the settings' context database,
            else in ``store``'s own. A ``SQLContextStore`` brings its own ring (``store.keys``).
        session_settings: the SDK's settings (``limit`` of :meth:`get_items`).

    Raises:
        InvalidInputError: an empty or too long ``session_id`` or ``owner``, a ``store`` of
            another kind, or ``keys`` other than the ring of the ``SQLContextStore`` given.
    """

    def __init__(
        self,
        session_id: str,
        store: SQLContextStore | Database | str,
        *,
        owner: str | None = None,
        keys: KeyRing | Literal["settings"] | None = "settings",
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        self.session_id = check_id(session_id, "session_id")
        self.owner = check_optional_id(owner, "owner")
        if not isinstance(store, SQLContextStore | Database | str):
            kind = type(store).__name__
            raise InvalidInputError(
                f"must be a SQLContextStore, a Database or a URL, not {kind}", field="store"
            )
        if keys != "settings" and not (keys is None or isinstance(keys, KeyRing)):
            raise InvalidInputError(f"must be a KeyRing, None or 'settings', not {keys!r}", field="keys")
        self.session_settings = (
            SessionSettings() if session_settings is None else coerce_session_settings(session_settings)
        )
        self._own = not isinstance(store, SQLContextStore)
        if isinstance(store, SQLContextStore):
            if keys != "settings" and keys is not store.keys:
                raise InvalidInputError(
                    "pass the key ring to the SQLContextStore (keys=) instead", field="keys"
                )
            self.store = store
        else:
            db = store if isinstance(store, Database) else Database(store, setting="STATEKEEP_CONTEXT_URL")
            try:
                ring = _ring_of_settings(db) if keys == "settings" else keys
                self.store = SQLContextStore(db, keys=ring)
            except BaseException:  # a malformed setting, an unreachable server: release what was opened
                db.dispose()
                raise
        self.keys: KeyRing | None = self.store.keys
        self._claimed = False
        self.db: Database = self.store.db
        setup(self.db)

    def close(self) -> None:
        """Release the connections (only those of a store this session opened)."""
        if self._own:
            self.db.dispose()
            if self.keys is not None and self.keys.db is not self.db:
                self.keys.db.dispose()

    # --- the Session protocol -----------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The session's items after its latest marker, oldest first (the newest ``limit``)."""
        return await asyncio.to_thread(self._get_items, resolve_session_limit(limit, self.session_settings))

    async def add_items(self, items: list[Any]) -> None:
        """Append items: one context event each, in order.

        Raises:
            InvalidInputError: ``items`` is not a list, or one of them is not a JSON object
                (the error names it: ``items[2]``); nothing was stored.
            SessionOwnerError: the session belongs to another owner; nothing was stored.
        """
        texts = _encoded(items)
        await asyncio.to_thread(self._add_items, list(items), texts)

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
                out.update({k: self._open(v) for k, v in conn.execute(q)})
        return out

    def _open(self, text: str) -> Any:
        if is_sealed(text):
            if self.keys is None:
                reason = "the item is sealed: open the session with the key ring that sealed it (keys=)"
                raise SealedDataError(key_id_of(text) or "-", reason)
            text = self.keys.open(text)
        return json.loads(text)

    def _holder(self) -> str | None:
        """The owner whose data key seals this session's items (None: plain text)."""
        if self.owner is not None and not self._claimed:  # refuse another owner's session first
            self.store.claim(self.session_id, self.owner)
            self._claimed = True
        if self.keys is None:
            return None
        return self.owner if self.owner is not None else self.store.owner_of(self.session_id)

    def _get_items(self, limit: int | None) -> list[Any]:
        found = [item for _, item in self._current()]
        if limit is None:
            return found
        return found[-limit:] if limit > 0 else []

    def _add_items(self, items: list[Any], texts: list[str]) -> None:
        if not items:
            return
        holder = self._holder()
        if holder is not None:
            assert self.keys is not None
            texts = [self.keys.seal(holder, text) for text in texts]
        rows = [
            {"session_id": self.session_id, "key": f"{_KEY}{uuid.uuid4().hex}", "item": text}
            for text in texts
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
        rest = [item for _, item in found[:-1]]
        self._add_items(rest, _encoded(rest))
        return popped

    def _clear(self) -> None:
        if self._current():
            self._mark(CLEARED)

    def _mark(self, reason: str) -> None:
        self.store.mark(self.session_id, reason, text=_TEXT[reason], owner=self.owner)


def _ring_of_settings(db: Database) -> KeyRing | None:
    """The key ring ``STATEKEEP_KEYS`` names, opened as ``Runtime.open`` opens it.

    Its data keys live in the settings' workflow database when ``db`` is the settings'
    context database (so the runtime's erasure shreds them), else in ``db``.
    """
    from statekeep.config import Settings
    from statekeep.db.engine import normalize_url
    from statekeep.keys import open_key_ring
    from statekeep.stores import declaration

    settings = Settings.load()
    items, keys = declaration("agents").lives_in, declaration("keys").lives_in
    assert items is not None
    assert keys is not None
    url = {s: normalize_url(settings.url_for(s), setting="STATEKEEP_DATABASE_URL") for s in (items, keys)}
    runtimes = url[items] == db.url and url[keys] != db.url
    return open_key_ring(settings, None if runtimes else db)


def _encoded(items: object) -> list[str]:
    """The JSON text of each item: a list of JSON objects is required."""
    if not isinstance(items, list | tuple):
        raise InvalidInputError(f"must be a list of SDK items, not {type(items).__name__}", field="items")
    texts = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            kind = type(item).__name__
            raise InvalidInputError(f"must be an SDK item (a dict), not {kind}", field=f"items[{i}]")
        texts.append(json.dumps(check_json_object(item, f"items[{i}]")))
    return texts


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
