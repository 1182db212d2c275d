"""``StatekeepSaver``: a LangGraph checkpointer on statekeep's SQL databases.

One implementation of each operation, synchronous; the ``a*`` methods run it in a
worker thread. Values go through LangGraph's serde (``JsonPlusSerializer``, pickle
fallback off), never pickle.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import logging
import random
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.db import Database
from statekeep.errors import InvalidInputError
from statekeep.integrations._extras import missing
from statekeep.workflow import SQLWorkflowStore, WorkflowStore

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
    from langgraph.checkpoint.serde.types import INTERRUPT, RESUME
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise missing("langgraph", "statekeep.integrations.langgraph", exc) from exc

from statekeep.integrations.langgraph import _deleted, _owners, _sql
from statekeep.integrations.langgraph._lists import Lists
from statekeep.integrations.langgraph._runs import ThreadRuns
from statekeep.integrations.langgraph._tables import checkpoints, setup
from statekeep.integrations.langgraph._tables import writes as writes_t

__all__ = ["StatekeepSaver"]

log = logging.getLogger("statekeep.langgraph")


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

    Each thread is also a run of the workflow store (``langgraph:<thread_id>``), so
    ``statekeep runs list``, the console and the webhook see LangGraph threads
    beside statekeep's own runs.

    A thread invoked with an owner (``config["configurable"]["owner"]``, or the key
    ``owner_key`` names) belongs to that owner: a write naming another owner is refused
    (:class:`~statekeep.errors.ConflictError`), and erasing the owner
    (:func:`statekeep.erasure.erase_owner`, ``statekeep erase``) deletes its threads
    (:func:`statekeep.integrations.langgraph.erasure.erase_threads`).

    Args:
        db: a :class:`~statekeep.db.Database` or a database URL (SQLite or PostgreSQL).
        serde: LangGraph serializer; default ``JsonPlusSerializer()`` (no pickle).
        runs: where threads are recorded as runs: True (default) for a workflow store
            on the same database, a :class:`~statekeep.workflow.WorkflowStore`
            (another database, a key ring), or False for nowhere.
        owner_key: the config key that names a thread's owner, in ``configurable`` or
            else in ``metadata``: ``"owner"`` (default), ``"user_id"`` as in LangGraph's
            guides, or None for threads without owners.

    Raises:
        InvalidInputError: (from a write) the config's owner is not an owner id.
        ConflictError: (from a write) the thread belongs to another owner; nothing was written.
    """

    def __init__(
        self,
        db: Database | str,
        *,
        serde: SerializerProtocol | None = None,
        runs: WorkflowStore | bool = True,
        owner_key: str | None = "owner",
    ) -> None:
        super().__init__(serde=serde or JsonPlusSerializer(pickle_fallback=False))
        if getattr(self.serde, "pickle_fallback", False):
            raise InvalidInputError("a serializer with a pickle fallback is refused", field="serde")
        self.db = db if isinstance(db, Database) else Database(db, setting="STATEKEEP_DATABASE_URL")
        setup(self.db)
        self._sql = _sql.Statements.build(self.db.dialect.insert)
        store = SQLWorkflowStore(self.db) if runs is True else runs or None
        self.runs = None if store is None else ThreadRuns(store)
        self._lists = Lists()
        self.owner_key = owner_key
        # one writer at a time on SQLite: LangGraph writes from several threads, and a writer
        # queued on a lock wakes at once where SQLite's busy handler would sleep
        self._write_lock: AbstractContextManager[Any] = (
            threading.Lock() if self.db.dialect.single_writer else nullcontext()
        )

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

    @contextmanager
    def _writing(self, what: str) -> Iterator[Connection]:
        with self._write_lock, self.db.begin(what) as conn:
            yield conn

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
        owner = _owners.owner_in(config, self.owner_key)
        row = {
            _deleted.KEY: _deleted.thread_key(thread_id),
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
            k: self.serde.dumps_typed(values[k]) if k in values else (_sql.EMPTY, None) for k in new_versions
        }
        with self._writing("saving a LangGraph checkpoint") as conn:
            claimed = _owners.check(conn, thread_id, owner) is not None
            # the checkpoint first: a late one (its thread deleted) is not stored, nor are its blobs
            stored = conn.execute(self._sql.put_checkpoint, row).first() is not None
            if stored:
                if not claimed:
                    _owners.claim(conn, self.db.dialect.insert, thread_id, owner)
                blob_rows = [
                    self._lists.blob_row(conn, (thread_id, ns), k, str(v), serialized[k], parent_id)
                    for k, v in new_versions.items()
                ]
                if blob_rows:
                    conn.execute(self._sql.put_blobs, blob_rows)
        if not stored:
            self._refused((thread_id, ns, checkpoint["id"]))
        elif self.runs is not None:
            where = {k: row[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id")}
            self._opened(self.runs.writing(thread_id), checkpoints, where)
        return _config(thread_id, ns, checkpoint["id"])

    def _opened(self, opened: bool, table: sa.Table, key: dict[str, Any]) -> None:
        """A thread's run was opened after a write: if the thread was deleted in between, it goes too."""
        if opened and self.runs is not None:
            with self.db.read("checking a LangGraph thread is still there") as conn:
                if _sql.stored(conn, table, key):
                    return
            self.runs.deleted([key["thread_id"]])

    def _refused(self, where: tuple[str, str, str]) -> None:
        """A late checkpoint of a deleted thread was not stored: nor will the writes that follow it be."""
        thread_id = where[0]
        with self._writing("ignoring a late write to a deleted LangGraph thread") as conn:
            self._deleting(conn)
            _deleted.refused(conn, self.db.dialect.insert, where)
            # its task's interrupt, saved first, may have opened the thread's run again: unless a new
            # conversation has the thread id, that run goes too (its id holds the thread id)
            empty = not any(_sql.stored(conn, t, {"thread_id": thread_id}) for t in (checkpoints, writes_t))
        if empty and self.runs is not None:
            self.runs.deleted([thread_id])
        log.info(
            "a late checkpoint of a deleted LangGraph thread was ignored", extra={"checkpoint_id": where[2]}
        )

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        conf = config["configurable"]
        owner = _owners.owner_in(config, self.owner_key)
        base = {
            _deleted.KEY: _deleted.thread_key(str(conf["thread_id"])),
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
        with self._writing("saving LangGraph writes") as conn:
            _owners.check(conn, base["thread_id"], owner)
            if regular:
                conn.execute(self._sql.put_writes, regular)
            stored = [row for row in special if conn.execute(self._sql.replace_write, row).first()]
        if self.runs is not None and stored:  # not for the interrupt of a late task of a deleted thread
            channels = {r["channel"] for r in stored}
            opened = RESUME in channels and self.runs.resumed(base["thread_id"])
            opened = (INTERRUPT in channels and self.runs.interrupted(base["thread_id"])) or opened
            key = {k: stored[0][k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id", "task_id")}
            self._opened(opened, writes_t, key)

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
        pending = _sql.pending_writes(conn, rows)
        return [self._tuple(conn, row, pending.get(_where(row), [])) for row in rows]

    def _tuple(self, conn: Connection, row: Any, writes: builtins.list[Any]) -> CheckpointTuple:
        thread_id, ns, checkpoint_id = _where(row)
        checkpoint = cast(dict[str, Any], self.serde.loads_typed((row["type"], row["checkpoint"])))
        stored = _sql.load_channels(conn, thread_id, ns, json.loads(row["versions"]))
        checkpoint["channel_values"] = {
            k: self.serde.loads_typed(typed) for k, typed in stored.items() if typed[0] != _sql.EMPTY
        }
        parent = row["parent_checkpoint_id"]
        writes = sorted(writes, key=lambda w: writes_sort_key(w["task_path"], w["task_id"], w["idx"]))
        return CheckpointTuple(
            config=_config(thread_id, ns, checkpoint_id),
            checkpoint=cast(Checkpoint, checkpoint),
            metadata=self._metadata(row),
            parent_config=_config(thread_id, ns, parent) if parent else None,
            pending_writes=[
                (w["task_id"], w["channel"], self.serde.loads_typed((w["type"], w["blob"]))) for w in writes
            ],
        )

    # --- deleting and copying --------------------------------------------------------------

    def _deleting(self, conn: Connection) -> None:
        """Hold off the saver's writers until this transaction ends (PostgreSQL; SQLite already does)."""
        self.db.dialect.lock_tables(conn, _deleted.TABLES)

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, blob and pending write of the thread, and its run; for good.

        A late write with a config from before the delete (a stale worker, a graph still
        running) is ignored, not refused with an error: it stores nothing, and its graph
        runs on without disturbing a new conversation on the same thread id. A ``put``
        without a parent checkpoint (a config without ``checkpoint_id``) starts that new
        conversation. What is kept is the SHA-256 of the thread id and the greater of the
        greatest checkpoint id it had and the id of this moment, which late writes are
        checked against.
        """
        with self._writing("deleting a LangGraph thread") as conn:
            self._deleting(conn)
            upto = _deleted.horizon(conn, str(thread_id))
            _deleted.record(conn, self.db.dialect.insert, str(thread_id), upto)
            _sql.delete_thread(conn, str(thread_id))
            _owners.forget(conn, [str(thread_id)])
        self._lists.forget([str(thread_id)])
        if self.runs is not None:
            self.runs.deleted([str(thread_id)])

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints these runs wrote, their writes, and the blobs nothing reaches any more.

        As after :meth:`delete_thread`, a late write that continues a deleted checkpoint is ignored.
        """
        ids = [str(r) for r in run_ids]
        if not ids:
            return
        with self._writing("deleting LangGraph runs") as conn:
            self._deleting(conn)
            doomed = _sql.run_checkpoints(conn, ids)
            _sql.delete_checkpoints(conn, doomed)
            threads = sorted({t for t, _, _ in doomed})
            for thread_id in threads:
                upto = max(cid for t, _, cid in doomed if t == thread_id)
                _deleted.record(conn, self.db.dialect.insert, thread_id, upto)
                _sql.collect_garbage(conn, thread_id)
        self._lists.forget(threads)

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
        with self._writing("pruning LangGraph threads") as conn:
            for thread_id in threads:
                rows = _sql.thread_checkpoints(conn, thread_id)
                latest: dict[str, str] = {}
                for ns, cid in rows:
                    latest[ns] = max(latest.get(ns, cid), cid)
                doomed = [(thread_id, ns, cid) for ns, cid in rows if latest[ns] != cid]
                _sql.delete_checkpoints(conn, doomed)
                _sql.collect_garbage(conn, thread_id)
        self._lists.forget(threads)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, blob and write of one thread to another (which keeps what it had).

        The copy is of one moment: no write to the source lands halfway through it. The
        target becomes the source's owner's (erasing the owner erases the copy too).

        Raises:
            ConflictError: the target belongs to another owner than the source; nothing was copied.
        """
        source, target = str(source_thread_id), str(target_thread_id)
        with self._writing("copying a LangGraph thread") as conn:
            self._deleting(conn)
            owner = _owners.owner_of(conn, source)
            _owners.check(conn, target, owner)
            _sql.copy_thread(conn, self._sql, source, target)
            _owners.claim(conn, self.db.dialect.insert, target, owner)

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


def _where(row: Any) -> tuple[str, str, str]:
    return row["thread_id"], row["checkpoint_ns"], row["checkpoint_id"]


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}


def _matches(metadata: CheckpointMetadata, query: dict[str, Any]) -> bool:
    meta = cast(dict[str, Any], metadata)
    return all(meta.get(k) == v for k, v in query.items())
