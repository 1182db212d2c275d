"""Erasing an owner's LangGraph data: the saver's threads, and the long-term store's owner record.

:func:`erase_threads` deletes every thread recorded as the owner's (see
:class:`~statekeep.integrations.langgraph.StatekeepSaver`'s ``owner_key``) as
``delete_thread`` does: checkpoints of every namespace, pending writes, channel blobs,
the owner record, and the thread's run; a stale worker's late writes stay refused
(the deleted-thread record keeps the SHA-256 of the thread id, not the id). SQLite
deletes with ``secure_delete`` and truncates the WAL
(:meth:`Database.scrub <statekeep.db.Database.scrub>`); PostgreSQL rewrites the
saver's tables (``VACUUM FULL``), as the memory store rewrites an owner's partition,
because the saver's values are not sealed and a dead tuple would keep them.

The long-term store's part is
:func:`~statekeep.integrations.langgraph.store.forget_registration`: it removes the
owner's entry from the owner registry of
:class:`~statekeep.integrations.langgraph.StatekeepStore` (whose items are the owner's
memories, erased by ``memory.forget``). :func:`statekeep.erasure.erase_owner` calls both.
"""

from __future__ import annotations

from statekeep._check import check_id
from statekeep.db import Database
from statekeep.db.migrations import current_version
from statekeep.db.rewrite import MARK, rewrite
from statekeep.integrations.langgraph import _deleted, _owners, _sql
from statekeep.integrations.langgraph._runs import ThreadRuns
from statekeep.integrations.langgraph._tables import SCHEMA, blobs, checkpoints, threads, writes
from statekeep.workflow import SQLWorkflowStore
from statekeep.workflow.tables import SCHEMA as WORKFLOW_SCHEMA

__all__ = ["erase_threads"]

#: The migration of the saver's schema that records owners: a database below it has no owned thread.
OWNERS_VERSION = 4
#: The tables PostgreSQL rewrites after an erasure (the deleted-thread records hold digests only).
REWRITTEN = (checkpoints, blobs, writes, threads)


def erase_threads(db: Database, owner: str) -> dict[str, int]:
    """Delete every LangGraph thread of ``owner`` from the saver's tables in ``db``, for good.

    Returns how many ``threads``, ``checkpoints``, ``writes``, ``blobs`` and thread
    ``runs`` (of a workflow store on the same database) went: all zero where the saver
    never ran, or the owner has no thread. Calling it again is harmless. Creates nothing.

    Raises:
        InvalidInputError: ``owner`` is not an owner id.
        ErasureError: the rows were deleted but the tables could not be rewritten, an
            older transaction still saw them (PostgreSQL), or a reader kept the WAL
            (SQLite); see the message.
    """
    check_id(owner, "owner")
    counts = dict.fromkeys(("threads", "checkpoints", "writes", "blobs", "runs"), 0)
    if current_version(db, "langgraph", SCHEMA) < OWNERS_VERSION:
        return counts
    with db.read("finding an owner's LangGraph threads") as conn:
        found = _owners.threads_of(conn, owner)
    # the runs first: should the process die in between, the threads are still there to find
    counts["runs"] = _delete_runs(db, found)
    with db.begin("erasing an owner's LangGraph threads") as conn:
        db.dialect.lock_tables(conn, _deleted.TABLES)  # as delete_thread: writers wait, then see it
        thread_ids = _owners.threads_of(conn, owner)
        for thread_id in thread_ids:
            _deleted.record(conn, db.dialect.insert, thread_id, _deleted.horizon(conn, thread_id))
            for table, removed in _sql.delete_thread(conn, thread_id).items():
                counts[table] += removed
        counts["threads"] = _owners.forget(conn, thread_ids)
        mark = conn.exec_driver_sql(MARK).scalar_one() if db.dialect.keeps_dead_rows and thread_ids else None
    counts["runs"] += _delete_runs(db, thread_ids)  # a run a write opened again meanwhile
    if mark is not None:
        rewrite(db, [f"{SCHEMA}.{t.name}" for t in REWRITTEN], mark=str(mark), owner=owner)
    if thread_ids:
        db.scrub(owner)  # SQLite: the WAL's old frames go too (the runtime's erasure scrubs again)
    return counts


def _delete_runs(db: Database, thread_ids: list[str]) -> int:
    """Cancel and delete the threads' runs in the workflow store of ``db`` (none without one)."""
    if not thread_ids or current_version(db, "workflow", WORKFLOW_SCHEMA) == 0:
        return 0
    return ThreadRuns(SQLWorkflowStore(db)).deleted(thread_ids)
