"""The saver under a real LangGraph graph: deltas read back exactly, across restarts, forks and prunes."""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

import pytest
import sqlalchemy as sa

pytest.importorskip("langgraph.graph", reason="the langgraph extra")

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from statekeep.integrations.langgraph import StatekeepSaver
from statekeep.integrations.langgraph._tables import blobs


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    log: Annotated[list[str], operator.add]
    n: int


def _graph(saver: StatekeepSaver, steps: int):  # type: ignore[no-untyped-def]
    def step(state: State) -> dict[str, object]:
        n = state.get("n", 0) + 1
        return {"messages": [AIMessage(f"step {n} " + "x" * 400)], "log": [f"s{n}"], "n": n}

    def route(state: State) -> str:
        return "step" if state["n"] < steps else END

    g = StateGraph(State)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", route)
    return g.compile(checkpointer=saver)


def _blob_stats(saver: StatekeepSaver) -> tuple[int, int]:
    with saver.db.read() as conn:
        rows = conn.execute(sa.select(blobs.c.type, sa.func.length(blobs.c.blob))).all()
    return sum(1 for t, _ in rows if t == "delta"), sum(n or 0 for _, n in rows)


def test_grown_lists_are_deltas_and_read_back_whole(database_url: str) -> None:
    saver = StatekeepSaver(database_url)
    config = {"configurable": {"thread_id": "t1"}, "recursion_limit": 200}
    out = _graph(saver, 40).invoke({"messages": [HumanMessage("go")], "n": 0}, config)
    assert len(out["messages"]) == 41
    assert out["log"][-1] == "s40"
    deltas, size = _blob_stats(saver)
    assert deltas >= 70  # messages and log grow by deltas at (nearly) every step
    assert size < 41 * 600 * 3  # linear: each message stored about once, not once per step
    # a fresh saver (another process, after a crash) reads the same state
    again = StatekeepSaver(database_url)
    state = _graph(again, 40).get_state(config)
    assert [m.content for m in state.values["messages"]] == [m.content for m in out["messages"]]
    history = list(_graph(again, 40).get_state_history(config))
    assert [len(h.values.get("messages", [])) for h in history][:3] == [41, 40, 39]
    saver.close()
    again.close()


def test_restart_fork_and_prune_keep_values_exact(database_url: str) -> None:
    config = {"configurable": {"thread_id": "t2"}, "recursion_limit": 200}
    first = StatekeepSaver(database_url)
    graph = _graph(first, 10)
    graph.invoke({"messages": [HumanMessage("go")], "n": 0}, config)
    first.close()
    # resumed by a new saver: its first write finds the base in the database, not in a cache
    second = StatekeepSaver(database_url)
    graph = _graph(second, 20)
    deltas_before, _ = _blob_stats(second)
    graph.invoke({"messages": [HumanMessage("more")]}, config)
    deltas_after, _ = _blob_stats(second)
    assert deltas_after - deltas_before >= 18
    # fork from an earlier checkpoint: the forked branch differs, both read back exactly
    past = next(h for h in graph.get_state_history(config) if len(h.values.get("messages", [])) == 5)
    forked = graph.update_state(past.config, {"messages": [HumanMessage("fork")]})
    assert [m.content for m in graph.get_state(forked).values["messages"]][-1] == "fork"
    assert len(graph.get_state(config).values["messages"]) == 6
    latest = graph.get_state({"configurable": {"thread_id": "t2"}})
    second.prune(["t2"], strategy="keep_latest")
    kept = graph.get_state({"configurable": {"thread_id": "t2"}})
    assert [m.content for m in kept.values["messages"]] == [m.content for m in latest.values["messages"]]
    assert len(list(second.list({"configurable": {"thread_id": "t2"}}))) == 1
    second.delete_thread("t2")
    assert _blob_stats(second) == (0, 0)
    second.close()


def test_pickle_fallback_is_refused() -> None:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from statekeep.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="pickle"):
        StatekeepSaver("sqlite:///:memory:", serde=JsonPlusSerializer(pickle_fallback=True))


class Ask(TypedDict):
    question: str
    answer: str


def test_threads_are_runs_the_cli_lists(database_url: str) -> None:
    """A thread is the run langgraph:<thread>: waiting at an interrupt, running on resume, gone on delete."""
    import os
    import subprocess
    import sys

    from langchain_core.runnables import RunnableConfig
    from langgraph.types import Command, interrupt

    from statekeep.workflow import SQLWorkflowStore

    def ask(state: Ask) -> dict[str, str]:
        return {"answer": str(interrupt(state["question"]))}

    g = StateGraph(Ask)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    saver = StatekeepSaver(database_url)
    graph = g.compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": "t-int"}}
    graph.invoke({"question": "ship it?", "answer": ""}, config)
    runs = SQLWorkflowStore(database_url)
    assert runs.get("langgraph:t-int").status == "waiting_for_event"
    listed = subprocess.run(
        [sys.executable, "-m", "statekeep", "runs", "list", "--database-url", database_url],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "250"},
    )
    assert listed.returncode == 0, listed.stderr
    assert "langgraph:t-int" in listed.stdout
    assert "waiting_for_event" in listed.stdout
    for refused in ("cancel", "retry"):  # the graph drives the thread: a cancel here would stop nothing
        answer = subprocess.run(
            [
                sys.executable,
                "-m",
                "statekeep",
                "runs",
                refused,
                "langgraph:t-int",
                "--database-url",
                database_url,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "250"},
        )
        assert answer.returncode != 0
        assert "LangGraph thread" in answer.stderr + answer.stdout
    assert runs.get("langgraph:t-int").status == "waiting_for_event"
    from statekeep.cli.runs import LANGGRAPH
    from statekeep.integrations.langgraph._runs import WORKFLOW

    assert LANGGRAPH == WORKFLOW  # the CLI names the adapter's workflow without importing LangGraph
    resume: Command[str] = Command(resume="yes")  # not Command[str](...): a slotted dataclass
    out = graph.invoke(resume, config)
    assert out["answer"] == "yes"
    assert runs.get("langgraph:t-int").status == "running"
    saver.delete_thread("t-int")
    assert runs.find("langgraph:t-int") is None
    runs.close()
    saver.close()
