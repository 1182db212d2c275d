"""The saver's SQL: statements built once per saver, and the reads and deletes it composes.

Building an upsert (its ``excluded`` columns above all) costs more than running it on
SQLite, so :class:`Statements` builds each write once and the saver only binds rows.
Checkpoints and writes are inserted under the guards of ``_deleted`` (a deleted thread
stays deleted); their rows carry ``thread_key`` beside their columns.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.integrations.langgraph import _deleted, _delta
from statekeep.integrations.langgraph._tables import blobs, checkpoints
from statekeep.integrations.langgraph._tables import writes as writes_t

#: The blob type of a grown list stored as the items it added, and of a channel without value.
DELTA, EMPTY = "delta", "empty"
_CHECKPOINT_KEY = ("thread_id", "checkpoint_ns", "checkpoint_id")
_WRITE_KEY = (*_CHECKPOINT_KEY, "task_id", "idx")


@dataclass(frozen=True, slots=True)
class Statements:
    """The saver's writes, each built once for its dialect; rows are bound at execution."""

    put_checkpoint: Any
    put_blobs: Any
    put_writes: Any
    replace_write: Any
    copy: dict[str, Any]

    @classmethod
    def build(cls, insert: Callable[[sa.Table], Any]) -> Statements:
        """The statements for a dialect's ``insert`` (one that has ``on_conflict_do_*``)."""
        upsert = _deleted.guarded(insert, checkpoints, _deleted.checkpoint_guard)
        upsert = upsert.on_conflict_do_update(
            index_elements=list(_CHECKPOINT_KEY[:3]),
            set_={
                c.name: upsert.excluded[c.name] for c in checkpoints.c if c.name not in _CHECKPOINT_KEY[:2]
            },
        )
        replace = _deleted.guarded(insert, writes_t, _deleted.writes_guard)
        replace = replace.on_conflict_do_update(
            index_elements=list(_WRITE_KEY),
            set_={c: replace.excluded[c] for c in ("channel", "type", "blob")},
        )
        return cls(
            # RETURNING says whether the guard let the row in (psycopg gives no rowcount here)
            put_checkpoint=upsert.returning(checkpoints.c.checkpoint_id),
            put_blobs=insert(blobs).on_conflict_do_nothing(),
            # a write already stored for (task, idx) stays as it is
            put_writes=_deleted.guarded(insert, writes_t, _deleted.writes_guard).on_conflict_do_nothing(),
            # errors, interrupts...: the newest replaces the previous one
            replace_write=replace.returning(writes_t.c.idx),
            copy={t.name: insert(t).on_conflict_do_nothing() for t in (checkpoints, blobs, writes_t)},
        )


_EXISTS = sa.select(sa.literal(1)).where(
    blobs.c.thread_id == sa.bindparam("thread_id"),
    blobs.c.checkpoint_ns == sa.bindparam("ns"),
    blobs.c.channel == sa.bindparam("channel"),
    blobs.c.version == sa.bindparam("version"),
)
_VERSIONS = sa.select(checkpoints.c.versions).where(
    checkpoints.c.thread_id == sa.bindparam("thread_id"),
    checkpoints.c.checkpoint_ns == sa.bindparam("ns"),
    checkpoints.c.checkpoint_id == sa.bindparam("checkpoint_id"),
)


def stored(conn: Connection, table: sa.Table, key: dict[str, Any]) -> bool:
    """Whether ``table`` has a row whose columns equal ``key``."""
    where = [table.c[k] == v for k, v in key.items()]
    return conn.execute(sa.select(sa.literal(1)).where(*where).limit(1)).first() is not None


def blob_exists(conn: Connection, thread_id: str, ns: str, channel: str, version: str) -> bool:
    """Whether a blob row is (still) there: another process may have pruned a cached base."""
    params = {"thread_id": thread_id, "ns": ns, "channel": channel, "version": version}
    return conn.execute(_EXISTS, params).first() is not None


def channel_version(
    conn: Connection, thread_id: str, ns: str, checkpoint_id: str, channel: str
) -> str | None:
    """The version of ``channel`` that a stored checkpoint names, None if none (or no such checkpoint)."""
    params = {"thread_id": thread_id, "ns": ns, "checkpoint_id": checkpoint_id}
    versions = conn.execute(_VERSIONS, params).scalar_one_or_none()
    found = None if versions is None else json.loads(versions).get(channel)
    return None if found is None else str(found)


def load_channels(
    conn: Connection, thread_id: str, ns: str, versions: dict[str, str]
) -> dict[str, tuple[str, bytes]]:
    """The serialized value of each channel at its version, deltas joined back into whole lists."""
    if not versions:
        return {}
    keys = [(k, str(v)) for k, v in versions.items()]
    columns = (
        blobs.c.channel,
        blobs.c.version,
        blobs.c.type,
        blobs.c.blob,
        blobs.c.base_version,
        blobs.c.added,
    )
    where = (blobs.c.thread_id == thread_id, blobs.c.checkpoint_ns == ns)
    rows = conn.execute(
        sa.select(*columns).where(*where, sa.tuple_(blobs.c.channel, blobs.c.version).in_(keys))
    ).all()
    out: dict[str, tuple[str, bytes]] = {}
    chained = []
    for channel, _version, type_, blob, _base, _items in rows:
        if type_ == DELTA:
            chained.append(channel)
        else:
            out[channel] = (type_, blob or b"")
    if chained:
        history: dict[str, dict[str, tuple[str, bytes, str | None, int | None]]] = defaultdict(dict)
        for channel, version, type_, blob, base, items in conn.execute(
            sa.select(*columns).where(*where, blobs.c.channel.in_(chained))
        ):
            history[channel][version] = (type_, blob or b"", base, items)
        for channel in chained:
            out[channel] = ("msgpack", rebuild(history[channel], str(versions[channel])))
    return out


def rebuild(history: dict[str, tuple[str, bytes, str | None, int | None]], version: str) -> bytes:
    """Walk a delta chain back to a whole list, then join the item bytes forward."""
    parts: list[tuple[int, bytes | memoryview]] = []
    current: str | None = version
    while current is not None:
        type_, blob, base, items = history[current]
        if type_ != DELTA:
            array = _delta.split_array(blob)
            if array is None:  # pragma: no cover - a delta's root is always an array
                raise ValueError(f"the base {current!r} of a list delta is not a list")
            parts.append(array)
            break
        parts.append((int(items or 0), blob))
        current = base
    return _delta.join(reversed(parts))


def pending_writes(conn: Connection, rows: list[Any]) -> dict[tuple[str, str, str], list[Any]]:
    """The stored writes of each checkpoint row, keyed by (thread, ns, checkpoint id), unsorted."""
    if not rows:
        return {}
    keys = [(r["thread_id"], r["checkpoint_ns"], r["checkpoint_id"]) for r in rows]
    found: dict[tuple[str, str, str], list[Any]] = defaultdict(list)
    q = sa.select(writes_t).where(
        writes_t.c.thread_id.in_({k[0] for k in keys}),
        sa.tuple_(writes_t.c.thread_id, writes_t.c.checkpoint_ns, writes_t.c.checkpoint_id).in_(keys),
    )
    for w in conn.execute(q).mappings():
        found[(w["thread_id"], w["checkpoint_ns"], w["checkpoint_id"])].append(w)
    return found


def delete_checkpoints(conn: Connection, doomed: list[Any]) -> None:
    """Delete these (thread, ns, checkpoint id) checkpoints and their writes (not their blobs)."""
    keys = [tuple(d) for d in doomed]
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        for table in (writes_t, checkpoints):
            conn.execute(
                table.delete().where(
                    sa.tuple_(table.c.thread_id, table.c.checkpoint_ns, table.c.checkpoint_id).in_(chunk)
                )
            )


def collect_garbage(conn: Connection, thread_id: str) -> None:
    """Delete the thread's blobs that no remaining checkpoint reaches (directly, or as a delta's base)."""
    reached: set[tuple[str, str, str]] = set()
    for ns, versions in conn.execute(
        sa.select(checkpoints.c.checkpoint_ns, checkpoints.c.versions).where(
            checkpoints.c.thread_id == thread_id
        )
    ):
        reached.update((ns, k, str(v)) for k, v in json.loads(versions).items())
    stored = {
        (ns, ch, ver): base
        for ns, ch, ver, base in conn.execute(
            sa.select(blobs.c.checkpoint_ns, blobs.c.channel, blobs.c.version, blobs.c.base_version).where(
                blobs.c.thread_id == thread_id
            )
        )
    }
    todo = [k for k in reached if k in stored]
    while todo:
        ns, ch, ver = todo.pop()
        base = stored.get((ns, ch, ver))
        if base is not None and (ns, ch, base) not in reached:
            reached.add((ns, ch, base))
            todo.append((ns, ch, base))
    doomed = [k for k in stored if k not in reached]
    for start in range(0, len(doomed), 500):
        chunk = doomed[start : start + 500]
        conn.execute(
            blobs.delete().where(
                blobs.c.thread_id == thread_id,
                sa.tuple_(blobs.c.checkpoint_ns, blobs.c.channel, blobs.c.version).in_(chunk),
            )
        )


def thread_checkpoints(conn: Connection, thread_id: str) -> list[tuple[str, str]]:
    """(ns, checkpoint id) of every checkpoint of a thread."""
    q = sa.select(checkpoints.c.checkpoint_ns, checkpoints.c.checkpoint_id).where(
        checkpoints.c.thread_id == thread_id
    )
    return [(ns, cid) for ns, cid in conn.execute(q)]


def delete_thread(conn: Connection, thread_id: str) -> dict[str, int]:
    """Delete every checkpoint, blob and write of a thread; how many rows of each table went."""
    return {
        table.name: int(conn.execute(table.delete().where(table.c.thread_id == thread_id)).rowcount)
        for table in (writes_t, blobs, checkpoints)
    }


def run_checkpoints(conn: Connection, run_ids: list[str]) -> list[tuple[str, str, str]]:
    """(thread, ns, checkpoint id) of the checkpoints these LangGraph runs wrote."""
    q = sa.select(checkpoints.c.thread_id, checkpoints.c.checkpoint_ns, checkpoints.c.checkpoint_id).where(
        checkpoints.c.run_id.in_(run_ids)
    )
    return [(t, ns, cid) for t, ns, cid in conn.execute(q)]


def copy_thread(conn: Connection, statements: Statements, source: str, target: str) -> None:
    """Copy every row of ``source`` to ``target`` (rows ``target`` already has stay)."""
    for table in (checkpoints, blobs, writes_t):
        rows = [
            {**r, "thread_id": target}
            for r in conn.execute(sa.select(table).where(table.c.thread_id == source)).mappings()
        ]
        if rows:
            conn.execute(statements.copy[table.name], rows)
