"""Deleted threads stay deleted: the guards on the saver's writes, and what a delete leaves behind.

A stale worker (a graph still running, a task that wakes late) holds a config naming a
checkpoint of a thread that was deleted since. Its writes must not bring the thread back:

* a checkpoint is not stored when its id is not past the thread's *horizon* (the
  greater of the greatest checkpoint id the thread had and the id of the delete's
  moment): it was made before the delete. Nor when the thread was deleted, it names a
  parent, and that parent is gone: it continues a deleted history. A checkpoint without
  a parent made after the delete starts a new conversation and is stored;
* writes are stored unless the thread was deleted, their checkpoint is missing, and its
  id is not past the horizon or is one of the late checkpoints refused since. LangGraph saves a
  task's writes and their checkpoint in parallel, so writes may come first; a new
  conversation's checkpoint ids are newer than the horizon (LangGraph's ids grow with
  time), so its writes are never taken for late ones. A refused checkpoint is kept by
  its exact id, not by raising the horizon: a new conversation's checkpoint made just
  before it, whose writes come first, keeps them.

Both guards are part of the INSERT itself (no extra statement on the hot path). A delete
locks the saver's tables for writing (:meth:`~statekeep.db.dialects.Dialect.lock_tables`),
so on PostgreSQL a write that started before waits to commit and is deleted with the
rest, and one that starts after sees the delete.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from langgraph.checkpoint.base.id import uuid6
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import BindParameter, ColumnElement

from statekeep.integrations.langgraph._tables import (
    blobs,
    checkpoints,
    deleted_threads,
    refused_checkpoints,
    writes,
)

#: The tables a delete holds against writers, always in this order (no lock-order deadlock).
TABLES = (writes, checkpoints, blobs)
#: The bound parameter that carries :func:`thread_key` beside a row's columns.
KEY = "thread_key"

_Guard = Callable[[dict[str, BindParameter[Any]]], ColumnElement[bool]]


def thread_key(thread_id: str) -> str:
    """How ``deleted_threads`` names a thread: the SHA-256 of its id, so the id itself is not kept."""
    return hashlib.sha256(thread_id.encode()).hexdigest()


def guarded(insert: Callable[[sa.Table], Any], table: sa.Table, guard: _Guard) -> Any:
    """``INSERT INTO table SELECT <the row> WHERE guard``: the row goes in only if the guard holds."""
    params: dict[str, BindParameter[Any]] = {c.name: sa.bindparam(c.name, type_=c.type) for c in table.c}
    row = sa.select(*params.values()).where(guard({**params, KEY: sa.bindparam(KEY, type_=sa.String(64))}))
    return insert(table).from_select(list(params), row)


def _exists(p: dict[str, BindParameter[Any]], checkpoint_id: BindParameter[Any]) -> ColumnElement[bool]:
    return sa.exists().where(
        checkpoints.c.thread_id == p["thread_id"],
        checkpoints.c.checkpoint_ns == p["checkpoint_ns"],
        checkpoints.c.checkpoint_id == checkpoint_id,
    )


def checkpoint_guard(p: dict[str, BindParameter[Any]]) -> ColumnElement[bool]:
    """A checkpoint may be stored: it was not made before its thread's delete, and it has no parent,
    or its thread was not deleted, or its parent is there."""
    parent = p["parent_checkpoint_id"]
    deleted = sa.exists().where(deleted_threads.c.thread_key == p[KEY])
    made_before = sa.exists().where(
        deleted_threads.c.thread_key == p[KEY], deleted_threads.c.horizon >= p["checkpoint_id"]
    )
    return sa.and_(~made_before, sa.or_(parent.is_(None), ~deleted, _exists(p, parent)))


def writes_guard(p: dict[str, BindParameter[Any]]) -> ColumnElement[bool]:
    """Writes may be stored: their checkpoint is not within a deleted history nor refused, or it is there."""
    late = sa.exists().where(
        deleted_threads.c.thread_key == p[KEY], deleted_threads.c.horizon >= p["checkpoint_id"]
    )
    refused = sa.exists().where(
        refused_checkpoints.c.thread_key == p[KEY],
        refused_checkpoints.c.checkpoint_ns == p["checkpoint_ns"],
        refused_checkpoints.c.checkpoint_id == p["checkpoint_id"],
    )
    return sa.or_(sa.and_(~late, ~refused), _exists(p, p["checkpoint_id"]))


def horizon(conn: Connection, thread_id: str) -> str:
    """The id a checkpoint made now would get, or the thread's greatest if greater (checkpoints, and
    writes that came before theirs): every checkpoint made before the delete is at most this.

    LangGraph's checkpoint ids are UUIDv6, which sort by the time they were made: a stale graph's
    first checkpoint, still being saved when the delete came, is refused by it, while a new
    conversation's ids are greater.
    """
    found = [
        conn.execute(sa.select(sa.func.max(t.c.checkpoint_id)).where(t.c.thread_id == thread_id)).scalar()
        for t in (checkpoints, writes)
    ]
    return max([str(uuid6()), *(str(f) for f in found if f is not None)])


def record(conn: Connection, insert: Callable[[sa.Table], Any], thread_id: str, upto: str) -> None:
    """Mark the thread deleted up to the checkpoint id ``upto`` (a horizon never goes down)."""
    upsert = insert(deleted_threads).values(thread_key=thread_key(thread_id), horizon=upto)
    higher = sa.case(
        (upsert.excluded.horizon > deleted_threads.c.horizon, upsert.excluded.horizon),
        else_=deleted_threads.c.horizon,
    )
    conn.execute(upsert.on_conflict_do_update(index_elements=[KEY], set_={"horizon": higher}))


def refused(conn: Connection, insert: Callable[[sa.Table], Any], where: tuple[str, str, str]) -> None:
    """A late checkpoint was not stored: its writes that came first go, and later ones will not be stored."""
    thread_id, ns, checkpoint_id = where
    row = {"thread_key": thread_key(thread_id), "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
    conn.execute(insert(refused_checkpoints).values(**row).on_conflict_do_nothing())
    conn.execute(
        writes.delete().where(
            writes.c.thread_id == thread_id,
            writes.c.checkpoint_ns == ns,
            writes.c.checkpoint_id == checkpoint_id,
        )
    )
