"""A stale worker's refused checkpoint must not cost a new conversation on the thread id its writes.

A refused checkpoint is kept by its exact id: had it raised the thread's horizon to its id, a new
conversation's checkpoint made before it (its put in flight, its writes saved first, as LangGraph
does in parallel) would lose those writes: here, an interrupt.
"""

from __future__ import annotations

from langchain_core.runnables import RunnableConfig

from statekeep.integrations.langgraph import StatekeepSaver

from .test_langgraph_delete import _checkpoint, _fresh, _put


def test_a_refused_stale_put_keeps_a_new_conversations_early_writes(database_url: str) -> None:
    saver = StatekeepSaver(database_url)
    try:
        old = _checkpoint(saver, "old")
        stale = _put(saver, _fresh(), old)
        saver.delete_thread("t-erase")
        new = _checkpoint(saver, "new")
        cfg = _put(saver, _fresh(), new)  # a new conversation
        step = _checkpoint(saver, "step", new)  # its next checkpoint, id made now, put in flight
        late = _checkpoint(saver, "late", old)  # a stale worker's checkpoint, made just after
        _put(saver, stale, late)  # refused
        early: RunnableConfig = {"configurable": {**_fresh()["configurable"], "checkpoint_id": step["id"]}}
        saver.put_writes(early, [("__interrupt__", "ask a person")], "task-early")  # before its checkpoint
        _put(saver, cfg, step)
        found = saver.get_tuple(_fresh())
        assert found is not None
        assert found.checkpoint["id"] == step["id"]
        assert found.pending_writes == [("task-early", "__interrupt__", "ask a person")]
    finally:
        saver.close()
