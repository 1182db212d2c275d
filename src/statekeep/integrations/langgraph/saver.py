"""``StatekeepSaver``: a LangGraph checkpointer on statekeep's SQL databases.

One implementation of each operation, synchronous; the ``a*`` methods run it in a
worker thread. Values go through LangGraph's serde (``JsonPlusSerializer``, pickle
fallback off), never pickle.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import random
import threading
from collections import OrderedDict, defaultdict
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.db import Database
from statekeep.errors import InvalidInputError
from statekeep.integrations._extras import missing

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_checkpoint_metadata,
        writes_sort_key,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise missing("langgraph", "statekeep.integrations.langgraph", exc) from exc

from statekeep.integrations.langgraph import _delta
from statekeep.integrations.langgraph._tables import blobs, checkpoints, setup
from statekeep.integrations.langgraph._tables import writes as writes_t

__all__ = ["StatekeepSaver"]

#: Serialized bytes of the latest value of a list channel kept per (thread, ns, channel), at most.
CACHE_ENTRIES = 256
_DELTA = "delta"
_EMPTY = "empty"


@dataclass(frozen=True, slots=True)
class _Last:
    """The latest stored version of a list channel and its serialized items."""

    version: str
    count: int
    body: bytes


class StatekeepSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer whose checkpoints live in a statekeep SQL database.

    The same SQLite file or PostgreSQL database as the workflow store (the tables
    are the saver's own, in the ``statekeep_langgraph`` schema). Besides LangGraph's
    required operations it implements ``prune``, ``copy_thread`` and
    ``delete_for_runs``.

    A list channel that only grows (``messages`` with ``add_messages``) is stored as
    the items appended since its previous version, so a thread's storage grows
    with the number of steps, not with its square.

    Examples:
        >>> saver = StatekeepSaver("sqlite:///:memory:")
        >>> saver.get_tuple({"configurable": {"thread_id": "t1"}}) is None
        True

    Args:
        db: a :class:`~statekeep.db.Database` or a database URL (SQLite or PostgreSQL).
        serde: LangGraph serializer; default ``JsonPlusSerializer()`` (no pickle).
    """

    def __init__(self, db: Database | str, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde or JsonPlusSerializer(pickle_fallback=False))
        if getattr(self.serde, "pickle_fallback", False):
            raise InvalidInputError("a serializer with a pickle fallback is refused", field="serde")
        self.db = db if isinstance(db, Database) else Database(db, setting="STATEKEEP_DATABASE_URL")
        setup(self.db)
        self._last: OrderedDict[tuple[str, str, str], _Last] = OrderedDict()
        self._lock = threading.Lock()

    def close(self) -> None:
        """Release the database connections."""
        self.db.dispose()

    def __enter__(self) -> StatekeepSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- versions --------------------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Zero-padded counter and a random fraction: sortable, and unique across forks."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # --- writing ---------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        parent_id = conf.get("checkpoint_id")
        copy = cast(dict[str, Any], checkpoint.copy())
        values: dict[str, Any] = copy.pop("channel_values")
        meta = get_checkpoint_metadata(config, metadata)
        type_, data = self.serde.dumps_typed(copy)
        meta_type, meta_data = self.serde.dumps_typed(meta)
        run_id = meta.get("run_id")
        row = {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint["id"],
            "parent_checkpoint_id": parent_id,
            "run_id": None if run_id is None else str(run_id),
            "type": type_,
            "checkpoint": data,
            "metadata_type": meta_type,
            "metadata": meta_data,
            "versions": json.dumps({k: str(v) for k, v in checkpoint["channel_versions"].items()}),
        }
        serialized = {
            k: self.serde.dumps_typed(values[k]) if k in values else (_EMPTY, None) for k in new_versions
        }
        insert = self.db.dialect.insert
        with self.db.begin("saving a LangGraph checkpoint") as conn:
            blob_rows = [
                self._blob_row(conn, thread_id, ns, k, str(v), serialized[k], parent_id)
                for k, v in new_versions.items()
            ]
            if blob_rows:
                conn.execute(insert(blobs).on_conflict_do_nothing(), blob_rows)
            stmt = insert(checkpoints).values(row)
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["thread_id", "checkpoint_ns", "checkpoint_id"],
                    set_={c: stmt.excluded[c] for c in row if c not in ("thread_id", "checkpoint_ns")},
                )
            )
        return {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}
        }

    def _blob_row(
        self,
        conn: Connection,
        thread_id: str,
        ns: str,
        channel: str,
        version: str,
        typed: tuple[str, bytes | None],
        parent_id: str | None,
    ) -> dict[str, Any]:
        type_, data = typed
        row: dict[str, Any] = {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "channel": channel,
            "version": version,
            "type": type_,
            "blob": data,
            "base_version": None,
            "added": None,
        }
        array = _delta.split_array(data) if type_ == "msgpack" and data else None
        if array is None:
            return row
        count, body = array
        key = (thread_id, ns, channel)
        last = self._cached(key) or self._previous(conn, thread_id, ns, channel, parent_id)
        self._remember(key, _Last(version, count, bytes(body)))
        if (
            last is not None
            and last.version != version
            and count >= last.count
            and body[: len(last.body)] == last.body
            and _exists(conn, thread_id, ns, channel, last.version)
        ):
            row.update(type=_DELTA, blob=bytes(body[len(last.body) :]), base_version=last.version)
            row["added"] = count - last.count
        return row

    def _cached(self, key: tuple[str, str, str]) -> _Last | None:
        with self._lock:
            return self._last.get(key)

    def _remember(self, key: tuple[str, str, str], last: _Last) -> None:
        with self._lock:
            self._last[key] = last
            self._last.move_to_end(key)
            while len(self._last) > CACHE_ENTRIES:
                self._last.popitem(last=False)

    def _forget(self, thread_ids: Sequence[str]) -> None:
        drop = set(thread_ids)
        with self._lock:
            for key in [k for k in self._last if k[0] in drop]:
                del self._last[key]

    def _previous(
        self, conn: Connection, thread_id: str, ns: str, channel: str, parent_id: str | None
    ) -> _Last | None:
        """The channel's value at the parent checkpoint, read back (after a restart, or a cache miss)."""
        if parent_id is None:
            return None
        versions = conn.execute(
            sa.select(checkpoints.c.versions).where(
                checkpoints.c.thread_id == thread_id,
                checkpoints.c.checkpoint_ns == ns,
                checkpoints.c.checkpoint_id == parent_id,
            )
        ).scalar_one_or_none()
        version = None if versions is None else json.loads(versions).get(channel)
        if version is None:
            return None
        data = _load_channels(conn, thread_id, ns, {channel: version}).get(channel)
        if data is None or data[0] != "msgpack":
            return None
        array = _delta.split_array(data[1])
        return None if array is None else _Last(version, array[0], bytes(array[1]))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        conf = config["configurable"]
        base = {
            "thread_id": str(conf["thread_id"]),
            "checkpoint_ns": str(conf.get("checkpoint_ns", "")),
            "checkpoint_id": str(conf["checkpoint_id"]),
            "task_id": task_id,
            "task_path": task_path,
        }
        regular: builtins.list[dict[str, Any]] = []
        special: builtins.list[dict[str, Any]] = []
        for idx, (channel, value) in enumerate(writes):
            type_, data = self.serde.dumps_typed(value)
            row = {
                **base,
                "idx": WRITES_IDX_MAP.get(channel, idx),
                "channel": channel,
                "type": type_,
                "blob": data,
            }
            (special if channel in WRITES_IDX_MAP else regular).append(row)
        insert = self.db.dialect.insert
        with self.db.begin("saving LangGraph writes") as conn:
            if regular:  # a write already stored for (task, idx) stays as it is
                conn.execute(insert(writes_t).on_conflict_do_nothing(), regular)
            for row in special:  # errors, interrupts... replace the previous one
                stmt = insert(writes_t).values(row)
                conn.execute(
                    stmt.on_conflict_do_update(
                        index_elements=["thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"],
                        set_={
                            "channel": stmt.excluded.channel,
                            "type": stmt.excluded.type,
                            "blob": stmt.excluded.blob,
                        },
                    )
                )

    # --- reading ---------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = config["configurable"]
        checkpoint_id = get_checkpoint_id(config)
        q = sa.select(checkpoints).where(
            checkpoints.c.thread_id == str(conf["thread_id"]),
            checkpoints.c.checkpoint_ns == str(conf.get("checkpoint_ns", "")),
        )
        if checkpoint_id:
            q = q.where(checkpoints.c.checkpoint_id == str(checkpoint_id))
        else:
            q = q.order_by(checkpoints.c.checkpoint_id.desc()).limit(1)
        with self.db.read("reading a LangGraph checkpoint") as conn:
            row = conn.execute(q).mappings().first()
            if row is None:
                return None
            found: CheckpointTuple = self._tuples(conn, [row])[0]
            return found

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        q = sa.select(checkpoints).order_by(checkpoints.c.checkpoint_id.desc())
        if config is not None:
            conf = config["configurable"]
            q = q.where(checkpoints.c.thread_id == str(conf["thread_id"]))
            if conf.get("checkpoint_ns") is not None:
                q = q.where(checkpoints.c.checkpoint_ns == str(conf["checkpoint_ns"]))
            if checkpoint_id := get_checkpoint_id(config):
                q = q.where(checkpoints.c.checkpoint_id == str(checkpoint_id))
        if before is not None and (before_id := get_checkpoint_id(before)):
            q = q.where(checkpoints.c.checkpoint_id < str(before_id))
        if limit is not None and not filter:
            q = q.limit(max(limit, 0))
        with self.db.read("listing LangGraph checkpoints") as conn:
            rows = list(conn.execute(q).mappings())
            if filter:
                rows = [r for r in rows if _matches(self._metadata(r), filter)]
                if limit is not None:
                    rows = rows[: max(limit, 0)]
            found = self._tuples(conn, rows)
        yield from found

    def _metadata(self, row: Any) -> CheckpointMetadata:
        return cast(CheckpointMetadata, self.serde.loads_typed((row["metadata_type"], row["metadata"])))

    def _tuples(self, conn: Connection, rows: builtins.list[Any]) -> builtins.list[CheckpointTuple]:
        pending = _pending_writes(conn, rows)
        out = []
        for row in rows:
            thread_id, ns, checkpoint_id = row["thread_id"], row["checkpoint_ns"], row["checkpoint_id"]
            checkpoint = cast(dict[str, Any], self.serde.loads_typed((row["type"], row["checkpoint"])))
            stored = _load_channels(conn, thread_id, ns, json.loads(row["versions"]))
            checkpoint["channel_values"] = {
                k: self.serde.loads_typed(typed) for k, typed in stored.items() if typed[0] != _EMPTY
            }
            parent = row["parent_checkpoint_id"]
            out.append(
                CheckpointTuple(
                    config={
                        "configurable": {
                            "thread_id": thread_id,
                            "checkpoint_ns": ns,
                            "checkpoint_id": checkpoint_id,
                        }
                    },
                    checkpoint=cast(Checkpoint, checkpoint),
                    metadata=self._metadata(row),
                    parent_config=(
                        {
                            "configurable": {
                                "thread_id": thread_id,
                                "checkpoint_ns": ns,
                                "checkpoint_id": parent,
                            }
                        }
                        if parent
                        else None
                    ),
                    pending_writes=[
                        (w["task_id"], w["channel"], self.serde.loads_typed((w["type"], w["blob"])))
                        for w in pending.get((thread_id, ns, checkpoint_id), [])
                    ],
                )
            )
        return out

    # --- deleting and copying --------------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        with self.db.begin("deleting a LangGraph thread") as conn:
            for table in (writes_t, blobs, checkpoints):
                conn.execute(table.delete().where(table.c.thread_id == str(thread_id)))
        self._forget([str(thread_id)])

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints these runs wrote, their writes, and the blobs nothing reaches any more."""
        ids = [str(r) for r in run_ids]
        if not ids:
            return
        with self.db.begin("deleting LangGraph runs") as conn:
            doomed = list(
                conn.execute(
                    sa.select(
                        checkpoints.c.thread_id, checkpoints.c.checkpoint_ns, checkpoints.c.checkpoint_id
                    ).where(checkpoints.c.run_id.in_(ids))
                )
            )
            _delete_checkpoints(conn, doomed)
            threads = sorted({t for t, _, _ in doomed})
            for thread_id in threads:
                _collect_garbage(conn, thread_id)
        self._forget(threads)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep each namespace's latest checkpoint of each thread (``keep_latest``), or none (``delete``).

        Blobs the kept checkpoints still reach (the chain of a grown list included) stay.
        """
        if strategy not in ("keep_latest", "delete"):
            raise InvalidInputError("must be 'keep_latest' or 'delete'", field="strategy")
        threads = [str(t) for t in thread_ids]
        if strategy == "delete":
            for thread_id in threads:
                self.delete_thread(thread_id)
            return
        with self.db.begin("pruning LangGraph threads") as conn:
            for thread_id in threads:
                rows = list(
                    conn.execute(
                        sa.select(checkpoints.c.checkpoint_ns, checkpoints.c.checkpoint_id).where(
                            checkpoints.c.thread_id == thread_id
                        )
                    )
                )
                latest: dict[str, str] = {}
                for ns, cid in rows:
                    latest[ns] = max(latest.get(ns, cid), cid)
                doomed = [(thread_id, ns, cid) for ns, cid in rows if latest[ns] != cid]
                _delete_checkpoints(conn, doomed)
                _collect_garbage(conn, thread_id)
        self._forget(threads)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, blob and write of one thread to another (which keeps what it had)."""
        source, target = str(source_thread_id), str(target_thread_id)
        insert = self.db.dialect.insert
        with self.db.begin("copying a LangGraph thread") as conn:
            for table in (checkpoints, blobs, writes_t):
                rows = [
                    {**r, "thread_id": target}
                    for r in conn.execute(sa.select(table).where(table.c.thread_id == source)).mappings()
                ]
                if rows:
                    conn.execute(insert(table).on_conflict_do_nothing(), rows)

    # --- async: the same operations in a worker thread -------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


# --- SQL helpers ---------------------------------------------------------------------------


def _exists(conn: Connection, thread_id: str, ns: str, channel: str, version: str) -> bool:
    """Whether a blob row is (still) there: another process may have pruned a cached base."""
    return (
        conn.execute(
            sa.select(sa.literal(1)).where(
                blobs.c.thread_id == thread_id,
                blobs.c.checkpoint_ns == ns,
                blobs.c.channel == channel,
                blobs.c.version == version,
            )
        ).first()
        is not None
    )


def _load_channels(
    conn: Connection, thread_id: str, ns: str, versions: dict[str, str]
) -> dict[str, tuple[str, bytes]]:
    """The serialized value of each channel at its version, deltas joined back into whole lists."""
    if not versions:
        return {}
    keys = [(k, str(v)) for k, v in versions.items()]
    rows = conn.execute(
        sa.select(
            blobs.c.channel, blobs.c.version, blobs.c.type, blobs.c.blob, blobs.c.base_version, blobs.c.added
        ).where(
            blobs.c.thread_id == thread_id,
            blobs.c.checkpoint_ns == ns,
            sa.tuple_(blobs.c.channel, blobs.c.version).in_(keys),
        )
    ).all()
    out: dict[str, tuple[str, bytes]] = {}
    chained = []
    for channel, _version, type_, blob, _base, _items in rows:
        if type_ == _DELTA:
            chained.append(channel)
        else:
            out[channel] = (type_, blob or b"")
    if chained:
        history: dict[str, dict[str, tuple[str, bytes, str | None, int | None]]] = defaultdict(dict)
        for channel, version, type_, blob, base, items in conn.execute(
            sa.select(
                blobs.c.channel,
                blobs.c.version,
                blobs.c.type,
                blobs.c.blob,
                blobs.c.base_version,
                blobs.c.added,
            ).where(blobs.c.thread_id == thread_id, blobs.c.checkpoint_ns == ns, blobs.c.channel.in_(chained))
        ):
            history[channel][version] = (type_, blob or b"", base, items)
        for channel in chained:
            out[channel] = ("msgpack", _rebuild(history[channel], str(versions[channel])))
    return out


def _rebuild(history: dict[str, tuple[str, bytes, str | None, int | None]], version: str) -> bytes:
    """Walk a delta chain back to a whole list, then join the item bytes forward."""
    parts: list[tuple[int, bytes | memoryview]] = []
    current: str | None = version
    while current is not None:
        type_, blob, base, items = history[current]
        if type_ != _DELTA:
            array = _delta.split_array(blob)
            if array is None:  # pragma: no cover - a delta's root is always an array
                raise ValueError(f"the base {current!r} of a list delta is not a list")
            parts.append(array)
            break
        parts.append((int(items or 0), blob))
        current = base
    return _delta.join(reversed(parts))


def _pending_writes(conn: Connection, rows: list[Any]) -> dict[tuple[str, str, str], list[Any]]:
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
    for ws in found.values():
        ws.sort(key=lambda w: writes_sort_key(w["task_path"], w["task_id"], w["idx"]))
    return found


def _delete_checkpoints(conn: Connection, doomed: list[Any]) -> None:
    keys = [tuple(d) for d in doomed]
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        for table in (writes_t, checkpoints):
            conn.execute(
                table.delete().where(
                    sa.tuple_(table.c.thread_id, table.c.checkpoint_ns, table.c.checkpoint_id).in_(chunk)
                )
            )


def _collect_garbage(conn: Connection, thread_id: str) -> None:
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


def _matches(metadata: CheckpointMetadata, query: dict[str, Any]) -> bool:
    meta = cast(dict[str, Any], metadata)
    return all(meta.get(k) == v for k, v in query.items())
