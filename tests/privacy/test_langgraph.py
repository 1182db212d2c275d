"""LangGraph under erasure: an owner's threads and store items go with the owner, to the last byte.

Each backend pair of tests/privacy (SQLite + LanceDB, PostgreSQL + pgvector). A real graph
writes an owner's threads through :class:`StatekeepSaver` (a subgraph's checkpoint
namespace, pending writes of a step that an interrupt stopped) and their long-term items
through :class:`StatekeepStore` on the runtime's memory store; every value, and the thread
ids, namespaces and keys, carry the owner's marker. The scans read every file of the
database (and of the LanceDB folder, deleted rows decoded) before the erasure, where they
must find the markers, and after it.
"""

from __future__ import annotations

import operator
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

pytest.importorskip("langgraph.graph", reason="the langgraph extra")

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from statekeep.config import Settings
from statekeep.integrations.langgraph import StatekeepSaver, StatekeepStore
from statekeep.integrations.langgraph._tables import SCHEMA, blobs, checkpoints, threads, writes
from statekeep.integrations.langgraph.store import REGISTRY
from statekeep.memory.lancedb._files import decode_folder
from statekeep.runtime import Runtime
from tests.privacy.scan import folder_files, plain_hits, postgres_files, sqlite_files


class State(TypedDict):
    said: Annotated[list[str], operator.add]


def _graph(saver: StatekeepSaver, store: StatekeepStore, marker: str) -> Any:
    """A subgraph (its own checkpoint namespace), then two nodes at once: one interrupts, so the
    other's writes stay pending on the checkpoint."""

    def inner(state: State) -> dict[str, list[str]]:
        return {"said": [f"the child heard {marker}child"]}

    child = StateGraph(State)
    child.add_node("inner", inner)
    child.add_edge(START, "inner")
    child.add_edge("inner", END)

    def ask(state: State) -> dict[str, list[str]]:
        answer = interrupt(f"what about {marker}question?")
        return {"said": [f"answer {answer}"]}

    def fast(state: State) -> dict[str, list[str]]:
        return {"said": [f"fast note {marker}pending"]}

    g = StateGraph(State)
    g.add_node("child", child.compile())
    g.add_node("ask", ask)
    g.add_node("fast", fast)
    g.add_edge(START, "child")
    g.add_edge("child", "ask")
    g.add_edge("child", "fast")
    g.add_edge("ask", END)
    g.add_edge("fast", END)
    return g.compile(checkpointer=saver, store=store)


def _write(saver: StatekeepSaver, store: StatekeepStore, owner: str, marker: str) -> list[str]:
    """Two threads of ``owner``: one waits at its interrupt, one was answered; and two store items."""
    graph = _graph(saver, store, marker)
    thread_ids = [f"{marker}thread-{n}" for n in (1, 2)]
    for thread_id in thread_ids:
        config = {"configurable": {"thread_id": thread_id, "owner": owner}}
        graph.invoke({"said": [f"{owner} says {marker}input"]}, config)
    answered = {"configurable": {"thread_id": thread_ids[1], "owner": owner}}
    graph.invoke(Command(resume=f"{marker}resume"), answered)
    for n in (1, 2):
        store.put((owner, f"{marker}ns"), f"{marker}key{n}", {"text": f"{owner} likes {marker}item{n}"})
    return thread_ids


def _counts(saver: StatekeepSaver, thread_ids: list[str]) -> dict[str, int]:
    with saver.db.read() as conn:
        return {
            t.name: conn.execute(
                sa.select(sa.func.count()).select_from(t).where(t.c.thread_id.in_(thread_ids))
            ).scalar_one()
            for t in (checkpoints, writes, blobs, threads)
        }


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _saver_files(url: str) -> list[Path]:
    """The files of the saver's relations on PostgreSQL: tables, their TOAST and every index."""
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        paths = conn.execute(
            """WITH rel AS (
                   SELECT c.oid FROM pg_class c WHERE c.relnamespace = CAST(%(s)s AS regnamespace)
                   UNION SELECT c.reltoastrelid FROM pg_class c
                   WHERE c.relnamespace = CAST(%(s)s AS regnamespace) AND c.reltoastrelid <> 0)
               SELECT pg_relation_filepath(r.oid) FROM rel r
               UNION SELECT pg_relation_filepath(i.indexrelid)
               FROM pg_index i JOIN rel r ON i.indrelid = r.oid""",
            {"s": SCHEMA},
        ).fetchall()
        data_dir = Path(conn.execute("SHOW data_directory").fetchone()[0])  # type: ignore[index]
    found: list[Path] = []
    for (relative,) in paths:
        if relative is None:
            continue
        base = data_dir / relative
        found += [
            p for p in base.parent.iterdir() if p.name == base.name or p.name.startswith(f"{base.name}.")
        ]
    assert found
    return found


def _analyze(url: str) -> None:
    if url.startswith("postgresql"):
        with psycopg.connect(_libpq(url), autocommit=True) as conn:
            conn.execute("ANALYZE")


def test_erase_owner_leaves_nothing_of_the_owners_langgraph_data_in_any_file(
    settings: Settings, runtime: Runtime
) -> None:
    """After erase_owner(alice): no byte of her threads or items in any file; bob's stay whole."""
    sqlite = settings.database_url.startswith("sqlite")
    a, b = f"zqlga{uuid.uuid4().hex[:10]}", f"zqlgb{uuid.uuid4().hex[:10]}"
    saver = StatekeepSaver(settings.database_url)
    dims = runtime.memory.embedder.dimension
    store = StatekeepStore(runtime.memory, index={"dims": dims, "fields": ["text"]})
    alice_threads = _write(saver, store, "alice", a)
    bob_threads = _write(saver, store, "bob", b)
    _analyze(settings.database_url)  # pg_statistic samples whatever it would: it is scanned too
    before = _counts(saver, alice_threads)
    with saver.db.read() as conn:
        q = sa.select(checkpoints.c.checkpoint_ns).where(checkpoints.c.thread_id.in_(alice_threads))
        namespaces = set(conn.execute(q.distinct()).scalars())
    assert len(namespaces) >= 2, "the subgraph's checkpoints have a namespace of their own"
    assert before["writes"] > 0
    assert before["threads"] == 2

    def files() -> list[Path]:
        sql = sqlite_files(settings.database_url) if sqlite else postgres_files(settings.database_url)
        return sql + (folder_files(Path(settings.memory.location)) if sqlite else [])

    def decoded() -> list[str]:
        return [text for _, text in decode_folder(settings.memory.location)] if sqlite else []

    kinds = ("child", "question", "pending", "input", "resume", "ns", "key1", "item1", "thread-1")
    alice, bob = [f"{a}{k}" for k in kinds], [f"{b}{k}" for k in kinds]
    assert set(alice) <= plain_hits(files(), alice, decoded()), "the scan sees what erasure must remove"

    receipt = runtime.erase_owner("alice")

    assert receipt.langgraph == {
        "threads": 2,
        "checkpoints": before["checkpoints"],
        "writes": before["writes"],
        "blobs": before["blobs"],
        "runs": 2,
    }
    assert receipt.langgraph_store == {"registrations": 1}
    assert receipt.counts()["langgraph.checkpoints"] == before["checkpoints"]
    assert receipt.as_dict()["langgraph"]["threads"] == 2
    assert receipt.memory is not None
    assert receipt.memory["removed"] == 2  # alice's two items
    assert not any("LangGraph checkpoints and store items" in line for line in receipt.not_reached)
    assert _counts(saver, alice_threads) == dict.fromkeys(("checkpoints", "writes", "blobs", "threads"), 0)

    if sqlite:
        assert plain_hits(files(), alice, decoded()) == set()
    else:
        # every value is gone from every file; the thread ids are gone from the saver's own files
        # (the workflow store's dead tuples keep run ids, "langgraph:<thread id>" among them, as
        # the receipt's not_reached says of run ids)
        values = [m for m in alice if not m.endswith("thread-1")]
        assert plain_hits(files(), values) == set()
        assert plain_hits(_saver_files(settings.database_url), alice) == set()
    # bob's threads and items are whole, and the scan still sees them
    assert set(bob) - {f"{b}thread-1"} <= plain_hits(files(), bob, decoded())
    config = {"configurable": {"thread_id": bob_threads[1]}}
    said = _graph(saver, store, b).get_state(config).values["said"]
    assert f"answer {b}resume" in said
    assert store.get(("bob", f"{b}ns"), f"{b}key1") is not None
    assert store.owners() == ["bob"]
    assert runtime.memory.list_memories(REGISTRY)[0].content == "bob"
    # alice is gone from the saver's and the store's APIs
    assert list(saver.list({"configurable": {"thread_id": alice_threads[0]}})) == []
    assert runtime.engine.store.find(f"langgraph:{alice_threads[0]}") is None
    assert store.get(("alice", f"{a}ns"), f"{a}key1") is None

    again = runtime.erase_owner("alice")
    assert again.langgraph == dict.fromkeys(("threads", "checkpoints", "writes", "blobs", "runs"), 0)
    assert again.langgraph_store == {"registrations": 0}
    saver.close()
