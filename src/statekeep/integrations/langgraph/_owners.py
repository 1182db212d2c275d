"""The owner of a LangGraph thread: named by the config, recorded once, and no other owner's writes.

A LangGraph application passes who it serves in the config it invokes a graph with
(``config["configurable"]["user_id"]`` in LangGraph's own guides), and LangGraph hands
that config to every ``put`` and ``put_writes`` of the run, subgraphs included. The
saver reads the owner from the key it is told (``owner_key``, ``"owner"`` by default),
in ``configurable`` or else in the config's ``metadata``. The thread's first stored
checkpoint with an owner records it in ``threads``; from then on a write that names
another owner is refused, and one that names none is the thread's as before (LangGraph's
``update_state`` or a tool may write without the application's keys).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep._check import check_id
from statekeep.errors import ConflictError
from statekeep.integrations.langgraph._tables import threads


def owner_in(config: Mapping[str, Any], key: str | None) -> str | None:
    """The owner a config names under ``key`` (``configurable`` first, then ``metadata``), checked.

    Raises:
        InvalidInputError: the value is not an owner id (empty, too long, not a string...).
    """
    if key is None:
        return None
    for part in ("configurable", "metadata"):
        value = (config.get(part) or {}).get(key)
        if value is not None:
            return check_id(value, f"config.{part}.{key}")
    return None


def owner_of(conn: Connection, thread_id: str) -> str | None:
    """The recorded owner of a thread, None if it has none."""
    q = sa.select(threads.c.owner).where(threads.c.thread_id == thread_id)
    found = conn.execute(q).scalar_one_or_none()
    return None if found is None else str(found)


def check(conn: Connection, thread_id: str, owner: str | None) -> str | None:
    """Refuse a write that names another owner than the thread's; the thread's owner (None: none yet).

    Raises:
        ConflictError: the thread belongs to another owner; the transaction rolls back.
    """
    if owner is None:
        return None
    actual = owner_of(conn, thread_id)
    if actual is not None and actual != owner:
        raise ConflictError(
            f"LangGraph thread {thread_id!r} belongs to another owner, not to {owner!r}; nothing was written"
        )
    return actual


def claim(conn: Connection, insert: Callable[[sa.Table], Any], thread_id: str, owner: str | None) -> None:
    """Record the thread as ``owner``'s unless it has an owner already: the same one, or the write fails.

    Two owners' first writes of a new thread may both find it unowned (PostgreSQL): the
    second one's insert waits for the first to commit, finds its row, and is refused.

    Raises:
        ConflictError: another owner claimed the thread meanwhile; the transaction rolls back.
    """
    if owner is None:
        return
    upsert = insert(threads).values(thread_id=thread_id, owner=owner).on_conflict_do_nothing()
    if conn.execute(upsert.returning(threads.c.thread_id)).first() is None:
        check(conn, thread_id, owner)


def threads_of(conn: Connection, owner: str) -> list[str]:
    """Every thread recorded as ``owner``'s."""
    q = sa.select(threads.c.thread_id).where(threads.c.owner == owner).order_by(threads.c.thread_id)
    return [str(t) for t in conn.execute(q).scalars()]


def forget(conn: Connection, thread_ids: list[str]) -> int:
    """Delete the owner records of these threads; how many there were."""
    removed = 0
    for start in range(0, len(thread_ids), 500):
        chunk = thread_ids[start : start + 500]
        removed += int(conn.execute(threads.delete().where(threads.c.thread_id.in_(chunk))).rowcount)
    return removed
