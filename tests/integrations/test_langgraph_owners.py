"""A LangGraph thread's owner: named by the config, checked, recorded once, and erased with the owner.

The byte scans of an erasure are in tests/privacy/test_langgraph.py; these tests are about
the owner's rules and :func:`erase_threads`' completeness, on SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

pytest.importorskip("langgraph.graph", reason="the langgraph extra")

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint

from statekeep.db import Database, upgrade
from statekeep.db.migrations import current_version
from statekeep.errors import ConflictError, InvalidInputError
from statekeep.integrations.langgraph import StatekeepSaver, StatekeepStore
from statekeep.integrations.langgraph._tables import (
    MIGRATIONS,
    SCHEMA,
    blobs,
    checkpoints,
    deleted_threads,
    threads,
    writes,
)
from statekeep.integrations.langgraph.erasure import erase_threads
from statekeep.integrations.langgraph.store import forget_registration
from statekeep.memory import FakeEmbedder, InMemoryMemoryStore
from statekeep.workflow import SQLWorkflowStore


def _config(thread_id: str, **extra: Any) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", **extra}}


def _checkpoint(saver: StatekeepSaver, text: str) -> Checkpoint:
    cp = empty_checkpoint()
    cp["channel_values"] = {"messages": [text]}
    cp["channel_versions"] = {"messages": saver.get_next_version(None, None)}
    return cp


def _put(saver: StatekeepSaver, config: RunnableConfig, text: str = "hello") -> RunnableConfig:
    cp = _checkpoint(saver, text)
    return saver.put(config, cp, {"source": "input", "step": -1}, dict(cp["channel_versions"]))


def _owner(saver: StatekeepSaver, thread_id: str) -> str | None:
    with saver.db.read() as conn:
        found = conn.execute(sa.select(threads.c.owner).where(threads.c.thread_id == thread_id)).scalar()
    return None if found is None else str(found)


def _rows(db: Database, thread_id: str) -> dict[str, int]:
    with db.read() as conn:
        return {
            t.name: conn.execute(
                sa.select(sa.func.count()).select_from(t).where(t.c.thread_id == thread_id)
            ).scalar_one()
            for t in (checkpoints, writes, blobs, threads)
        }


def test_the_config_names_the_owner_and_the_first_checkpoint_records_it(database_url: str) -> None:
    saver = StatekeepSaver(database_url)
    _put(saver, _config("t-a", owner="alice"))
    _put(saver, {"configurable": {"thread_id": "t-m", "checkpoint_ns": ""}, "metadata": {"owner": "bob"}})
    _put(saver, _config("t-none"))
    assert (_owner(saver, "t-a"), _owner(saver, "t-m"), _owner(saver, "t-none")) == ("alice", "bob", None)
    # LangGraph's guides name the user "user_id": a saver told so reads that key, and only it
    by_user = StatekeepSaver(database_url, owner_key="user_id")
    _put(by_user, _config("t-u", user_id="carol", owner="ignored"))
    assert _owner(saver, "t-u") == "carol"
    unowned = StatekeepSaver(database_url, owner_key=None)
    _put(unowned, _config("t-x", owner="dave"))
    assert _owner(saver, "t-x") is None
    saver.close()


@pytest.mark.parametrize("bad", ["", "x" * 256, 42, "a\x00b"])
def test_an_invalid_owner_is_refused_and_nothing_is_written(database_url: str, bad: object) -> None:
    saver = StatekeepSaver(database_url)
    with pytest.raises(InvalidInputError, match=r"config\.configurable\.owner"):
        _put(saver, _config("t-bad", owner=bad))
    with pytest.raises(InvalidInputError, match=r"config\.configurable\.owner"):
        saver.put_writes(_config("t-bad", owner=bad, checkpoint_id="c1"), [("messages", "x")], "task")
    assert _rows(saver.db, "t-bad") == {"checkpoints": 0, "writes": 0, "blobs": 0, "threads": 0}
    saver.close()


def test_a_thread_claimed_by_one_owner_cannot_be_written_by_another(database_url: str) -> None:
    saver = StatekeepSaver(database_url)
    mine = _put(saver, _config("t-1", owner="alice"), "alice's words")
    with pytest.raises(ConflictError, match="belongs to another owner"):
        _put(saver, _config("t-1", owner="bob"), "bob's words")
    with pytest.raises(ConflictError, match="belongs to another owner"):
        saver.put_writes({"configurable": {**mine["configurable"], "owner": "bob"}}, [("m", "x")], "task")
    assert _rows(saver.db, "t-1") == {"checkpoints": 1, "writes": 0, "blobs": 1, "threads": 1}
    # a write that names no owner (update_state from an admin tool) stays the owner's thread
    _put(saver, _config("t-1"), "no owner named")
    saver.put_writes(mine, [("messages", "pending")], "task")
    assert _owner(saver, "t-1") == "alice"
    assert _rows(saver.db, "t-1")["checkpoints"] == 2
    saver.close()


def test_a_copy_is_the_source_owners_and_not_into_another_owners_thread(database_url: str) -> None:
    saver = StatekeepSaver(database_url)
    _put(saver, _config("src", owner="alice"))
    _put(saver, _config("bobs", owner="bob"))
    saver.copy_thread("src", "dst")
    assert _owner(saver, "dst") == "alice"
    with pytest.raises(ConflictError):
        saver.copy_thread("src", "bobs")
    assert _rows(saver.db, "bobs")["checkpoints"] == 1
    saver.delete_thread("src")
    assert _owner(saver, "src") is None  # a deleted thread keeps no owner record
    saver.close()


def test_erase_threads_deletes_every_thread_of_the_owner_as_delete_thread_does(database_url: str) -> None:
    """Every namespace, write, blob, owner record and run of alice's threads go; bob's stay; late
    writes of a stale worker are ignored; a new conversation of alice's is kept; twice is a no-op."""
    saver = StatekeepSaver(database_url)
    stale = _put(saver, _config("a-1", owner="alice"))
    _put(saver, _config("a-1", owner="alice", checkpoint_ns="child:1"), "in a subgraph")
    saver.put_writes(stale, [("messages", "pending"), ("__interrupt__", "ask")], "task")
    _put(saver, _config("a-2", owner="alice"))
    _put(saver, _config("b-1", owner="bob"))
    runs = SQLWorkflowStore(saver.db)
    assert runs.find("langgraph:a-1") is not None

    counts = erase_threads(saver.db, "alice")

    assert counts == {"threads": 2, "checkpoints": 3, "writes": 2, "blobs": 3, "runs": 2}
    for thread_id in ("a-1", "a-2"):
        assert _rows(saver.db, thread_id) == {"checkpoints": 0, "writes": 0, "blobs": 0, "threads": 0}
        assert runs.find(f"langgraph:{thread_id}") is None
    assert _rows(saver.db, "b-1") == {"checkpoints": 1, "writes": 0, "blobs": 1, "threads": 1}
    with saver.db.read() as conn:
        kept = [str(k) for k in conn.execute(sa.select(deleted_threads.c.thread_key)).scalars()]
    assert len(kept) == 2
    assert all(len(k) == 64 and "a-" not in k for k in kept)  # digests, not thread ids
    # a stale worker's late writes are ignored, as after delete_thread
    late = _checkpoint(saver, "late")
    saver.put(stale, late, {"step": 1}, dict(late["channel_versions"]))
    saver.put_writes(stale, [("messages", "late")], "task-late")
    assert _rows(saver.db, "a-1")["checkpoints"] == 0
    assert _rows(saver.db, "a-1")["writes"] == 0
    assert erase_threads(saver.db, "alice") == dict.fromkeys(counts, 0)
    # erasure is not a ban: alice starts a new conversation on the same thread id
    _put(saver, _config("a-1", owner="alice"), "again")
    assert _owner(saver, "a-1") == "alice"
    with pytest.raises(InvalidInputError):
        erase_threads(saver.db, "")
    runs.close()
    saver.close()


def test_erase_threads_creates_nothing_where_the_saver_never_ran_or_is_older(database_url: str) -> None:
    db = Database(database_url)
    assert erase_threads(db, "alice") == dict.fromkeys(
        ("threads", "checkpoints", "writes", "blobs", "runs"), 0
    )
    assert current_version(db, "langgraph", SCHEMA) == 0
    upgrade(db, "langgraph", SCHEMA, MIGRATIONS[:3])  # a database of the saver before owners
    assert erase_threads(db, "alice")["threads"] == 0
    assert current_version(db, "langgraph", SCHEMA) == 3
    saver = StatekeepSaver(db, runs=False)  # upgrades it: its old threads have no owner
    assert current_version(db, "langgraph", SCHEMA) == len(MIGRATIONS)
    _put(saver, _config("old"))
    assert _owner(saver, "old") is None
    db.dispose()


def test_forget_registration_removes_the_owner_from_every_scopes_registry() -> None:
    memory = InMemoryMemoryStore(FakeEmbedder(), duplicate_threshold=None)
    plain, scoped = StatekeepStore(memory), StatekeepStore(memory, scope="app1:")
    plain.put(("alice", "prefs"), "drink", {"text": "tea"})
    plain.put(("bob", "prefs"), "drink", {"text": "coffee"})
    scoped.put(("alice", "prefs"), "drink", {"text": "water"})
    assert (plain.owners(), scoped.owners()) == (["alice", "bob"], ["app1:alice"])
    assert forget_registration(memory, "alice") == 1
    assert forget_registration(memory, "app1:alice") == 1
    assert (plain.owners(), scoped.owners()) == (["bob"], [])
    assert forget_registration(memory, "alice") == 0
    with pytest.raises(InvalidInputError):
        forget_registration(memory, "")


def test_a_claim_that_finds_another_owners_record_fails(database_url: str) -> None:
    """Two owners' first writes may both find a new thread unowned; the second claim is refused."""
    from statekeep.integrations.langgraph import _owners

    saver = StatekeepSaver(database_url)
    with saver.db.begin() as conn:
        _owners.claim(conn, saver.db.dialect.insert, "t-race", "alice")
        _owners.claim(conn, saver.db.dialect.insert, "t-race", "alice")  # the same owner: nothing to do
    with pytest.raises(ConflictError), saver.db.begin() as conn:
        _owners.claim(conn, saver.db.dialect.insert, "t-race", "bob")
    assert _owner(saver, "t-race") == "alice"
    saver.close()
