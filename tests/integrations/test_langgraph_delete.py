"""Deleting a LangGraph thread is final: a late write with a config from before the delete stores nothing.

A stale worker or a graph still running holds a config that names a checkpoint of the
deleted thread; its ``put`` and ``put_writes`` are ignored (no error), while a new
conversation on the same thread id (a ``put`` without a parent checkpoint) is kept.
"""

from __future__ import annotations

import asyncio
import operator
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
import sqlalchemy as sa

pytest.importorskip("langgraph.graph", reason="the langgraph extra")

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from langgraph.graph import END, START, StateGraph

from statekeep.integrations.langgraph import StatekeepSaver, _sql
from statekeep.integrations.langgraph._tables import blobs, checkpoints, deleted_threads, writes
from statekeep.workflow import SQLWorkflowStore

THREAD = "t-erase"


def _fresh(thread_id: str = THREAD) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


def _checkpoint(saver: StatekeepSaver, text: str, previous: Checkpoint | None = None) -> Checkpoint:
    cp = empty_checkpoint()
    before = None if previous is None else str(previous["channel_versions"]["messages"])
    version = saver.get_next_version(before, None)
    cp["channel_values"] = {"messages": [text]}
    cp["channel_versions"] = {"messages": version}
    return cp


def _put(saver: StatekeepSaver, config: RunnableConfig, cp: Checkpoint) -> RunnableConfig:
    return saver.put(config, cp, {"source": "loop", "step": 1}, dict(cp["channel_versions"]))


def _rows(saver: StatekeepSaver, thread_id: str = THREAD) -> dict[str, int]:
    with saver.db.read() as conn:
        return {
            t.name: conn.execute(sa.select(sa.func.count()).where(t.c.thread_id == thread_id)).scalar_one()
            for t in (checkpoints, blobs, writes)
        }


def _stored_text(saver: StatekeepSaver, thread_id: str = THREAD) -> list[str]:
    """Every channel value and pending write the thread has, as read through the saver."""
    found: list[str] = []
    for t in saver.list(_fresh(thread_id)):
        found.extend(str(v) for v in t.checkpoint["channel_values"].values())
        found.extend(str(w[2]) for w in t.pending_writes or [])
    return found


def _late_writes(saver: StatekeepSaver, stale: RunnableConfig, previous: Checkpoint) -> None:
    """What a stale worker does with a config it got before the delete: a checkpoint, then writes."""
    late = _checkpoint(saver, "late secret", previous)
    returned = _put(saver, stale, late)
    saver.put_writes(stale, [("messages", "late write")], "task-late")
    saver.put_writes(returned, [("messages", "late write 2")], "task-late-2")
    saver.put_writes(stale, [("__interrupt__", "late interrupt")], "task-late-3")


def test_late_writes_after_delete_thread_do_not_resurrect_it(database_url: str) -> None:
    saver = StatekeepSaver(database_url)
    first = _checkpoint(saver, "secret")
    stale = _put(saver, _fresh(), first)
    saver.put_writes(stale, [("messages", "pending secret")], "task-1")
    assert _rows(saver)["writes"] == 1
    saver.delete_thread(THREAD)
    _late_writes(saver, stale, first)
    assert saver.get_tuple(_fresh()) is None
    assert saver.get_tuple(stale) is None
    assert list(saver.list(_fresh())) == []
    assert _rows(saver) == {"checkpoints": 0, "blobs": 0, "writes": 0}
    runs = SQLWorkflowStore(database_url)
    assert runs.find(f"langgraph:{THREAD}") is None  # nor does the thread's run come back
    runs.close()
    saver.close()


def test_a_first_checkpoint_made_before_the_delete_and_saved_after_it_is_refused(database_url: str) -> None:
    """A graph whose first checkpoint was still being saved (LangGraph saves in the background) when
    its thread was deleted: that checkpoint has no parent, but was made before the delete, so it is
    not taken for a new conversation; one made after the delete is."""
    saver = StatekeepSaver(database_url)
    in_flight = _checkpoint(saver, "secret in flight")  # made (its id) before the delete
    saver.delete_thread(THREAD)  # nothing of the thread is stored yet
    returned = _put(saver, _fresh(), in_flight)
    saver.put_writes(returned, [("messages", "pending secret")], "task-1")
    assert _rows(saver) == {"checkpoints": 0, "blobs": 0, "writes": 0}
    fresh = _checkpoint(saver, "a new conversation")
    _put(saver, _fresh(), fresh)
    assert _stored_text(saver) == ["['a new conversation']"]
    saver.close()


def test_async_late_writes_are_ignored_too(database_url: str) -> None:
    saver = StatekeepSaver(database_url)
    first = _checkpoint(saver, "secret")

    async def scenario() -> None:
        stale = await saver.aput(_fresh(), first, {"step": 0}, dict(first["channel_versions"]))
        await saver.adelete_thread(THREAD)
        late = _checkpoint(saver, "late secret", first)
        returned = await saver.aput(stale, late, {"step": 1}, dict(late["channel_versions"]))
        await saver.aput_writes(stale, [("messages", "late write")], "task-late")
        await saver.aput_writes(returned, [("messages", "late write 2")], "task-late-2")
        assert await saver.aget_tuple(_fresh()) is None

    asyncio.run(scenario())
    assert _rows(saver) == {"checkpoints": 0, "blobs": 0, "writes": 0}
    saver.close()


def test_a_new_conversation_after_delete_is_kept(database_url: str) -> None:
    """A put without a parent checkpoint starts over; stale writes still cannot join it."""
    saver = StatekeepSaver(database_url)
    old = _checkpoint(saver, "old secret")
    stale = _put(saver, _fresh(), old)
    saver.delete_thread(THREAD)
    new = _checkpoint(saver, "hello again")
    cfg = _put(saver, _fresh(), new)
    saver.put_writes(cfg, [("messages", "new pending")], "task-new")
    after = _checkpoint(saver, "second step", new)
    cfg2 = _put(saver, cfg, after)
    saver.put_writes(cfg2, [("messages", "next pending")], "task-next")
    _late_writes(saver, stale, old)  # a stale worker wakes up after the new conversation started
    latest = saver.get_tuple(_fresh())
    assert latest is not None
    assert latest.config == cfg2
    assert latest.checkpoint["channel_values"] == {"messages": ["second step"]}
    assert latest.parent_config == cfg
    assert [w[2] for w in latest.pending_writes or []] == ["next pending"]
    stored = ["['hello again']", "new pending", "['second step']", "next pending"]
    assert sorted(_stored_text(saver)) == sorted(stored)
    assert _rows(saver)["checkpoints"] == 2
    assert SQLWorkflowStore(database_url).get(f"langgraph:{THREAD}").status == "running"
    saver.close()


def test_late_writes_after_delete_for_runs_are_ignored(database_url: str) -> None:
    """A run whose checkpoints were deleted cannot write them back; the thread's other runs go on."""
    saver = StatekeepSaver(database_url)
    kept = _checkpoint(saver, "kept")
    kept_cfg = saver.put(_fresh(), kept, {"run_id": "run-kept"}, dict(kept["channel_versions"]))
    doomed = _checkpoint(saver, "doomed secret", kept)
    doomed_cfg = saver.put(kept_cfg, doomed, {"run_id": "run-doomed"}, dict(doomed["channel_versions"]))
    saver.put_writes(doomed_cfg, [("messages", "doomed pending")], "task-d")
    saver.delete_for_runs(["run-doomed"])
    late = _checkpoint(saver, "late secret", doomed)
    saver.put(doomed_cfg, late, {"run_id": "run-doomed"}, dict(late["channel_versions"]))
    saver.put_writes(doomed_cfg, [("messages", "late write")], "task-late")
    assert [t.config for t in saver.list(_fresh())] == [kept_cfg]
    assert _stored_text(saver) == ["['kept']"]
    # the kept run still writes: to its checkpoint, and a next step from it
    saver.put_writes(kept_cfg, [("messages", "kept pending")], "task-k")
    nxt = _checkpoint(saver, "next", kept)
    nxt_cfg = saver.put(kept_cfg, nxt, {"run_id": "run-kept"}, dict(nxt["channel_versions"]))
    assert saver.get_tuple(_fresh()) is not None
    assert [t.config for t in saver.list(_fresh())] == [nxt_cfg, kept_cfg]
    saver.close()


def _in_thread(fn: Callable[[], object]) -> threading.Thread:
    worker = threading.Thread(target=fn, daemon=True)
    worker.start()
    return worker


def test_a_put_under_way_when_the_delete_starts_is_deleted_with_the_rest(database_url: str) -> None:
    """The delete waits for a checkpoint being written (another connection), then deletes it too."""
    writer, deleter = StatekeepSaver(database_url), StatekeepSaver(database_url)
    first = _checkpoint(writer, "secret")
    stale = _put(writer, _fresh(), first)
    inside, release = threading.Event(), threading.Event()
    blob_row = writer._lists.blob_row

    def paused(*args: Any) -> dict[str, Any]:  # the put's checkpoint row is in, its transaction open
        inside.set()
        release.wait(10)
        return blob_row(*args)

    writer._lists.blob_row = paused  # type: ignore[method-assign,assignment]
    put = _in_thread(lambda: _put(writer, stale, _checkpoint(writer, "in flight", first)))
    assert inside.wait(10)
    delete = _in_thread(lambda: deleter.delete_thread(THREAD))
    delete.join(0.5)
    assert delete.is_alive()  # waiting for the put's transaction
    release.set()
    put.join(10)
    delete.join(10)
    assert _rows(deleter) == {"checkpoints": 0, "blobs": 0, "writes": 0}
    writer.close()
    deleter.close()


def test_a_late_put_during_the_delete_waits_and_is_ignored(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale put from another connection while the delete's transaction is open stores nothing after it."""
    writer, deleter = StatekeepSaver(database_url), StatekeepSaver(database_url)
    first = _checkpoint(writer, "secret")
    stale = _put(writer, _fresh(), first)
    inside, release = threading.Event(), threading.Event()
    delete_rows = _sql.delete_thread

    def paused(*args: Any) -> None:  # the rows are deleted, the delete's transaction not committed yet
        delete_rows(*args)
        inside.set()
        release.wait(10)

    monkeypatch.setattr(_sql, "delete_thread", paused)
    delete = _in_thread(lambda: deleter.delete_thread(THREAD))
    assert inside.wait(10)
    put = _in_thread(lambda: _put(writer, stale, _checkpoint(writer, "late", first)))
    writes = _in_thread(lambda: writer.put_writes(stale, [("messages", "late write")], "task-late"))
    put.join(0.5)
    assert put.is_alive()
    release.set()
    for worker in (delete, put, writes):
        worker.join(10)
    assert _rows(deleter) == {"checkpoints": 0, "blobs": 0, "writes": 0}
    writer.close()
    deleter.close()


class Talk(TypedDict):
    messages: Annotated[list[str], operator.add]


def test_a_graph_still_running_when_its_thread_is_deleted_ends_without_storing(database_url: str) -> None:
    """A real graph whose thread is deleted mid-step finishes without error; nothing of it is stored."""
    saver = StatekeepSaver(database_url)
    inside, release = threading.Event(), threading.Event()

    def slow(state: Talk) -> dict[str, list[str]]:
        inside.set()
        release.wait(10)
        return {"messages": ["answer with a secret"]}

    g = StateGraph(Talk)
    g.add_node("slow", slow)
    g.add_node("after", lambda state: {"messages": ["after"]})
    g.add_edge(START, "slow")
    g.add_edge("slow", "after")
    g.add_edge("after", END)
    graph = g.compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": THREAD}}
    out: list[Any] = []
    run = _in_thread(lambda: out.append(graph.invoke({"messages": ["question"]}, config)))
    assert inside.wait(10)
    # LangGraph saves checkpoints in the background: the node may start before the thread's first
    # checkpoint is stored, and a thread that stored nothing is a new conversation after a delete
    deadline = time.monotonic() + 10
    while saver.get_tuple(config) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert saver.get_tuple(config) is not None
    saver.delete_thread(THREAD)
    release.set()
    run.join(20)
    assert out, "the stale run raised"
    assert out[0]["messages"][-1] == "after"
    assert graph.get_state(config).values == {}
    assert _rows(saver) == {"checkpoints": 0, "blobs": 0, "writes": 0}
    # a new conversation on the same thread id is stored
    release.set()
    again = graph.invoke({"messages": ["new question"]}, config)
    assert again["messages"] == ["new question", "answer with a secret", "after"]
    assert graph.get_state(config).values["messages"] == again["messages"]
    saver.close()


def test_a_delete_between_a_write_and_its_run_leaves_no_run(database_url: str) -> None:
    """A thread's run is opened after the write that needs it; a delete in between takes it too."""
    writer, deleter = StatekeepSaver(database_url), StatekeepSaver(database_url)
    assert writer.runs is not None
    take = writer.runs._take

    def deleted_first(thread_id: str) -> Any:  # another process deletes the thread at that moment
        deleter.delete_thread(thread_id)
        return take(thread_id)

    writer.runs._take = deleted_first  # type: ignore[method-assign]
    _put(writer, _fresh(), _checkpoint(writer, "secret"))  # its first checkpoint opens the run
    assert SQLWorkflowStore(database_url).find(f"langgraph:{THREAD}") is None
    # an interrupt stored by a process that did not hold the run opens it too
    stored = _put(deleter, _fresh("t-ask"), _checkpoint(deleter, "ask"))
    writer.put_writes(stored, [("__interrupt__", "ask a person")], "task-ask")
    assert SQLWorkflowStore(database_url).find("langgraph:t-ask") is None
    assert _rows(deleter) == {"checkpoints": 0, "blobs": 0, "writes": 0}
    assert _rows(deleter, "t-ask") == {"checkpoints": 0, "blobs": 0, "writes": 0}
    writer.close()
    deleter.close()


def test_a_late_interrupt_saved_before_its_refused_checkpoint_leaves_no_run(database_url: str) -> None:
    """LangGraph may save a task's interrupt before the step's checkpoint: the interrupt opens the
    thread's run again; when the checkpoint is refused, that run goes with the interrupt."""
    saver = StatekeepSaver(database_url)
    old = _checkpoint(saver, "old")
    stale = _put(saver, _fresh(), old)
    saver.delete_thread(THREAD)
    late = _checkpoint(saver, "late", old)
    early: RunnableConfig = {"configurable": {**_fresh()["configurable"], "checkpoint_id": late["id"]}}
    saver.put_writes(early, [("__interrupt__", "late question")], "task-late")
    assert SQLWorkflowStore(database_url).find(f"langgraph:{THREAD}") is not None  # what the test is about
    _put(saver, stale, late)
    assert _rows(saver) == {"checkpoints": 0, "blobs": 0, "writes": 0}
    assert SQLWorkflowStore(database_url).find(f"langgraph:{THREAD}") is None
    saver.close()


def test_a_new_conversation_stores_what_the_first_did_subgraphs_included(database_url: str) -> None:
    """After a delete, the same graph on the same thread id stores the same rows, in every namespace."""
    saver = StatekeepSaver(database_url)
    inner = StateGraph(Talk)
    inner.add_node("think", lambda state: {"messages": ["thought"]})
    inner.add_edge(START, "think")
    inner.add_edge("think", END)
    outer = StateGraph(Talk)
    outer.add_node("sub", inner.compile())
    outer.add_node("reply", lambda state: {"messages": ["reply"]})
    outer.add_edge(START, "sub")
    outer.add_edge("sub", "reply")
    outer.add_edge("reply", END)
    graph = outer.compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": THREAD}}

    def by_namespace() -> dict[bool, int]:
        with saver.db.read() as conn:
            q = sa.select(checkpoints.c.checkpoint_ns).where(checkpoints.c.thread_id == THREAD)
            namespaces = list(conn.execute(q).scalars())
        return {nested: sum(1 for ns in namespaces if bool(ns) == nested) for nested in (False, True)}

    first = graph.invoke({"messages": ["hi"]}, config, durability="sync")
    stored = by_namespace()
    assert stored[True] > 0  # the subgraph's checkpoints have their own namespace
    saver.delete_thread(THREAD)
    again = graph.invoke({"messages": ["hi"]}, config, durability="sync")
    assert again == first
    assert by_namespace() == stored
    saver.close()


def test_writes_that_come_before_their_checkpoint_are_kept_in_a_new_conversation(database_url: str) -> None:
    """LangGraph saves a step's writes beside its checkpoint: even first, a new conversation keeps them."""
    saver = StatekeepSaver(database_url)
    old = _checkpoint(saver, "old")
    _put(saver, _fresh(), old)
    saver.delete_thread(THREAD)
    new = _checkpoint(saver, "new")  # its id is newer than anything the deleted thread had
    early: RunnableConfig = {"configurable": {**_fresh()["configurable"], "checkpoint_id": new["id"]}}
    saver.put_writes(early, [("messages", "early write")], "task-early")
    assert _put(saver, _fresh(), new) == early
    found = saver.get_tuple(_fresh())
    assert found is not None
    assert found.pending_writes == [("task-early", "messages", "early write")]
    saver.close()


def test_a_deleted_thread_leaves_no_id_in_the_clear(database_url: str) -> None:
    """What a delete keeps names the thread by a hash of its id."""
    saver = StatekeepSaver(database_url)
    _put(saver, _fresh(), _checkpoint(saver, "secret"))
    saver.delete_thread(THREAD)
    with saver.db.read() as conn:
        kept = conn.execute(sa.select(deleted_threads)).all()
    assert len(kept) == 1
    assert THREAD not in "".join(str(v) for v in kept[0])
    saver.close()


def test_a_copy_into_a_deleted_thread_is_a_new_conversation_there(database_url: str) -> None:
    """Copied checkpoints exist in the deleted thread id: writes to them and steps from them are kept."""
    saver = StatekeepSaver(database_url)
    _put(saver, _fresh(), _checkpoint(saver, "old secret"))
    saver.delete_thread(THREAD)
    source = _checkpoint(saver, "copied")
    copied = _put(saver, _fresh("t-source"), source)
    saver.copy_thread("t-source", THREAD)
    here: RunnableConfig = {"configurable": {**copied["configurable"], "thread_id": THREAD}}
    saver.put_writes(here, [("messages", "pending")], "task-1")
    nxt = _put(saver, here, _checkpoint(saver, "continued", source))
    assert [t.config for t in saver.list(_fresh())] == [nxt, here]
    assert _stored_text(saver) == ["['continued']", "['copied']", "pending"]
    saver.close()
