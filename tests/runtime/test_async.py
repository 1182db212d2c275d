"""Async all the way to the runtime: arun/aresume/astream leave the caller's event loop free; streams
yield typed events as they happen, and only completed messages are journaled."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from statekeep.config import Settings
from statekeep.errors import InvalidInputError
from statekeep.memory import FakeEmbedder
from statekeep.models import ModelResponse, OpenAIChatModel, ScriptedModel, ToolCall
from statekeep.runtime import (
    Agent,
    AgentTool,
    ApprovalRequested,
    RunCompleted,
    Runtime,
    RunWaiting,
    TextDelta,
    ToolCallRequested,
    ToolResult,
)
from statekeep.workflow import RunStatus
from tests.runtime.llm_server import openai_answer, serving, tool_results

TURNS = 10


async def weather(key: str, city: str) -> dict[str, Any]:
    """Today's weather in a city.

    Args:
        city: the city
    """
    await asyncio.sleep(0.005)
    return {"city": city, "weather": "sun"}


def send(key: str, to: str, body: str) -> dict[str, Any]:
    """Email the traveller."""
    return {"sent": True, "to": to}


AGENT = Agent(
    "ticker", system="You plan trips.", tools=[AgentTool("weather", weather)], max_turns=TURNS + 1, memory_k=0
)


def ten_turns(path: str, body: dict[str, Any]) -> Any:
    """A conversation of ten tool calls, then an answer; streamed when the client asks for a stream."""
    n = len(tool_results(body))
    if n < TURNS:
        return openai_answer(body, f"Checking city {n}.", [(f"c{n}", "weather", {"city": f"city-{n}"})])
    return openai_answer(body, "Every city is sunny.")


class SlowCallbacks(logging.Handler):
    """Collects asyncio debug mode's reports of callbacks slower than ``slow_callback_duration``."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.reports: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Executing") and " took " in message:
            self.reports.append(message)


@contextmanager
def statements() -> Iterator[list[tuple[str, bool]]]:
    """(thread name, through an async driver?) of every SQL statement any engine executes meanwhile."""
    seen: list[tuple[str, bool]] = []

    def record(conn: Any, *_: Any) -> None:
        seen.append((threading.current_thread().name, bool(conn.dialect.is_async)))

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", record)


def test_a_long_run_never_stalls_the_event_loop(settings: Settings) -> None:
    """An asyncio app with a ticker task: a 40-step agent run (10 turns of an async tool, on a model
    served over HTTP) through arun, then astream, with asyncio's debug mode reporting no callback
    slower than 100 ms; the ticker keeps ticking. Every statement of the run goes through the async
    driver on the loop's own thread (the lease heartbeat's thread aside): no thread hop per statement.

    Debug mode measures wall time, so on a machine whose cores are busy with other work a callback
    can be reported slow because the OS did not schedule the loop's thread. Such a report does not
    recur at the same place; a blocking call on the loop would, in every run. Hence up to three runs,
    the last of which must be clean.
    """
    slow = SlowCallbacks()
    logger = logging.getLogger("asyncio")
    logger.addHandler(slow)
    # The test process holds pytest's, SQLAlchemy's and both SDKs' objects: a full garbage collection
    # of that heap, in whatever callback it lands, takes longer than 100 ms on a loaded machine. A
    # latency-minded app freezes its start-up heap; so does this one, to measure the runtime alone.
    gc.collect()
    gc.freeze()

    async def app(server_url: str, attempt: int) -> tuple[Any, list[Any], float]:
        loop = asyncio.get_running_loop()
        loop.slow_callback_duration = 0.1
        model = await asyncio.to_thread(OpenAIChatModel, "mimic", base_url=server_url)
        rt = await asyncio.to_thread(Runtime.open, settings, model=model, embedder=FakeEmbedder())
        gaps: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            last = loop.time()
            while not done.is_set():
                await asyncio.sleep(0.01)
                gaps.append(loop.time() - last)
                last = loop.time()

        ticking = asyncio.create_task(ticker())
        task = "Weather in ten cities"
        try:
            with statements() as seen:
                run = await rt.arun(AGENT, f"tick-{attempt}", owner="ada", task=task)
                events = [
                    e async for e in rt.astream(AGENT, f"tick-{attempt}-stream", owner="ada", task=task)
                ]
            steps = await asyncio.to_thread(rt.engine.store.steps, f"tick-{attempt}")
        finally:
            done.set()
            await ticking
            await rt.__aexit__()
        assert len(steps) >= 40
        here = threading.current_thread().name
        assert len([s for s in seen if s == (here, True)]) >= 40  # at least one per step, on the loop
        assert [s for s in seen if s[0] == here and not s[1]] == []  # no blocking driver on the loop
        assert {name for name, _ in seen if name != here} <= {
            f"lease-tick-{attempt}",
            f"lease-tick-{attempt}-stream",
        }
        return run, events, max(gaps)

    try:
        with serving(ten_turns) as server:
            for attempt in range(3):
                slow.reports.clear()
                run, events, worst_gap = asyncio.run(app(server.url, attempt), debug=True)
                if not slow.reports:
                    break
    finally:
        gc.unfreeze()
        logger.removeHandler(slow)
    assert slow.reports == []
    assert run.status is RunStatus.COMPLETED
    assert run.output == "Every city is sunny."
    assert worst_gap < 1.0  # the loop kept running (its exact latency depends on the machine's load)
    kinds = [e.kind for e in events]
    assert kinds.count("tool_call") == kinds.count("tool_result") == TURNS
    assert kinds[-1] == "completed"
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text.endswith("Every city is sunny.")
    assert any(isinstance(e, TextDelta) and e.text == " sunny." for e in events)  # word by word


def test_astream_stops_at_the_gate_and_aresume_finishes(settings: Settings) -> None:
    """Events in order: text, the tool call and its result, then the approval and the wait; after the
    decision, aresume_stream tells only what happens from then on."""
    script = ScriptedModel(
        [
            ModelResponse(content="Looking.", tool_calls=(ToolCall("c1", "weather", {"city": "Rome"}),)),
            ModelResponse(tool_calls=(ToolCall("c2", "send", {"to": "ada@example.com", "body": "Rome"}),)),
            ModelResponse(content="Told Ada."),
        ]
    )
    agent = Agent(
        "gated",
        system="s",
        tools=[AgentTool("weather", weather), AgentTool("send", send, approval="emails a customer")],
        memory_k=0,
    )

    async def app() -> tuple[list[Any], list[Any]]:
        rt = await asyncio.to_thread(Runtime.open, settings, model=script, embedder=FakeEmbedder())
        async with rt:
            first = [e async for e in rt.astream(agent, "g-1", owner="ada", task="Rome?")]
            [approval] = await asyncio.to_thread(rt.engine.store.approvals, run_id="g-1")
            await asyncio.to_thread(rt.engine.store.decide, approval.approval_id, approve=True, by="boss")
            second = [e async for e in rt.aresume_stream("g-1")]
        return first, second

    first, second = asyncio.run(app())
    assert [type(e) for e in first] == [
        TextDelta,
        ToolCallRequested,
        ToolResult,
        ToolCallRequested,
        ApprovalRequested,
        RunWaiting,
    ]
    assert first[0].text == "Looking."
    assert first[2].result == {"city": "Rome", "weather": "sun"}
    assert (first[4].action, first[4].arguments) == ("send", {"to": "ada@example.com", "body": "Rome"})
    assert first[5].status == "waiting_for_approval"
    assert [type(e) for e in second] == [ToolCallRequested, ToolResult, TextDelta, TextDelta, RunCompleted]
    assert second[-1].output == "Told Ada."


def test_sync_stream_yields_as_it_goes(settings: Settings) -> None:
    """rt.stream (sync) yields deltas from a streaming model, then the final event; a stream left early
    lets the run reach its stop."""
    model = ScriptedModel([ModelResponse(content="Rome is sunny today.")])
    rt = Runtime.open(settings, model=model, embedder=FakeEmbedder())
    try:
        events = list(
            rt.stream(Agent("s", system="s", tools=[], memory_k=0), "s-1", owner="ada", task="Rome?")
        )
        deltas = [e.text for e in events if isinstance(e, TextDelta)]
        assert deltas == ["Rome", " is", " sunny", " today."]
        assert isinstance(events[-1], RunCompleted)
        stream = rt.stream(Agent("s", system="s", tools=[], memory_k=0), "s-2", owner="ada", task="Rome?")
        assert isinstance(next(stream), TextDelta)
        stream.close()  # waits for the run to reach its stop
        assert rt.engine.store.get("s-2").status is RunStatus.COMPLETED
        assert [e.kind for e in rt.context.events("s-2")] == ["user", "assistant"]  # the whole message, once
    finally:
        rt.close()


def test_turn_limits_work_across_async_calls(settings: Settings) -> None:
    """turns= bounds arun like run: the run parks after that many turns; aresume continues it."""
    script = ScriptedModel(
        [ModelResponse(tool_calls=(ToolCall(f"c{i}", "weather", {"city": f"c{i}"}),)) for i in range(3)]
        + [ModelResponse(content="done")]
    )

    async def app() -> list[RunStatus]:
        rt = await asyncio.to_thread(Runtime.open, settings, model=script, embedder=FakeEmbedder())
        async with rt:
            statuses = [(await rt.arun(AGENT, "lim", owner="ada", task="x", turns=2)).status]
            statuses.append((await rt.aresume("lim", turns=1)).status)
            statuses.append((await rt.aresume("lim")).status)
        return statuses

    assert asyncio.run(app()) == [RunStatus.SLEEPING, RunStatus.SLEEPING, RunStatus.COMPLETED]


@pytest.mark.parametrize("bad", [0, True])
def test_bad_turn_limits_are_refused_before_anything_runs(settings: Settings, bad: Any) -> None:
    """arun validates its arguments on the caller's side, like run."""
    rt = Runtime.open(settings, model=ScriptedModel([ModelResponse(content="x")]), embedder=FakeEmbedder())
    try:
        with pytest.raises(InvalidInputError, match="turns"):
            asyncio.run(rt.arun(AGENT, "bad", owner="ada", task="x", turns=bad))
        assert rt.engine.store.find("bad") is None
    finally:
        rt.close()
