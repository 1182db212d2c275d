"""The runtime composes the four stores: one agent step from the stores alone, every time."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from statekeep.config import Settings
from statekeep.errors import InvalidInputError
from statekeep.memory import FakeEmbedder
from statekeep.models import ModelResponse, ScriptedModel, ToolCall
from statekeep.runtime import Agent, AgentState, Runtime
from statekeep.workflow import Run, RunStatus
from tests.runtime import agent_app
from tests.runtime.conftest import ROOT, apart, effects, subprocess_env

TASK = "Plan a trip"


def _approve_all(rt: Runtime, run_id: str) -> None:
    for approval in rt.engine.store.approvals(run_id=run_id):
        rt.engine.store.decide(approval.approval_id, approve=True, by="tester@example.com")


def _transcript(rt: Runtime, run_id: str) -> list[tuple[str, Any]]:
    return [(e.kind, e.payload) for e in rt.context.events(run_id)]


def test_agent_run_stops_at_the_gate_then_finishes_once_approved(runtime: Runtime) -> None:
    """The gated tool waits for a person; after approval the run completes and each effect happened once."""
    run = runtime.run(agent_app.AGENT, "trip-1", owner=agent_app.OWNER, task=TASK)
    assert run.status is RunStatus.WAITING_FOR_APPROVAL
    assert [e["kind"] for e in effects()] == ["model", "lookup", "model", "lookup", "note", "model"]
    _approve_all(runtime, "trip-1")
    run = runtime.resume("trip-1")
    assert run.status is RunStatus.COMPLETED
    assert run.output == "done after 4 tool results"
    assert Counter(e["kind"] for e in effects()) == {"model": 4, "lookup": 2, "note": 1, "send": 1}
    state = runtime.working.load("trip-1", AgentState)
    assert state.facts["send"] == {"sent": True, "to": "ada@example.com"}
    assert state.cursor == runtime.context.last_seq("trip-1")
    assert runtime.engine.store.get("trip-1").cursor == state.cursor


def test_every_step_commits_state_and_cursor_with_its_completion(runtime: Runtime) -> None:
    """Each model and observe step records the working-state version and context cursor it produced."""
    runtime.run(agent_app.AGENT, "trip-2", owner=agent_app.OWNER, task=TASK)
    steps = [s for s in runtime.engine.store.steps("trip-2") if s.kind == "step"]
    assert steps
    for step in steps:
        assert step.state_version is not None
        assert step.cursor is not None
        state = runtime.working.load("trip-2", AgentState, version=step.state_version)
        assert state.cursor == step.cursor


def test_each_step_in_a_fresh_process_matches_one_process(settings: Settings) -> None:
    """Running every turn in a new process gives the same transcript, state and effects as one process."""
    one = agent_app.build_runtime(settings)
    try:
        one.run(agent_app.AGENT, "same", owner=agent_app.OWNER, task=TASK)
        _approve_all(one, "same")
        expected = one.resume("same")
    finally:
        one.close()
    env = subprocess_env(settings)
    statuses = []
    for _ in range(12):
        out = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "runtime" / "step_once.py"), "split"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        statuses.append(out.stdout.strip())
        if statuses[-1] == "waiting_for_approval":
            rt = agent_app.build_runtime(settings)
            _approve_all(rt, "split")
            rt.close()
        if statuses[-1] == "completed":
            break
    assert statuses[-1] == "completed"
    assert "sleeping" in statuses  # it really paused between turns
    rt = agent_app.build_runtime(settings)
    try:
        split = rt.engine.store.get("split")
        assert split.output == expected.output
        assert _transcript(rt, "split") == _transcript(rt, "same")
        a, b = rt.working.load("split", AgentState), rt.working.load("same", AgentState)
        assert (a.facts.keys(), a.turn) == (b.facts.keys(), b.turn)
    finally:
        rt.close()
    # no model call and no tool ran twice because the run was split over processes
    assert Counter(e["kind"] for e in effects()) == {"model": 8, "lookup": 4, "note": 2, "send": 2}


def test_memory_written_in_a_run_carries_its_provenance(runtime: Runtime) -> None:
    """A tool that calls runtime.remember() gets the run's owner, session, run and event for free."""
    runtime.run(agent_app.AGENT, "trip-3", owner=agent_app.OWNER, task=TASK, session_id="chat-9")
    [hit] = runtime.memory.search(agent_app.OWNER, "trip from Oslo to Rome", k=1)
    p = hit.memory.provenance
    assert (p.source, p.session_id, p.run_id) == ("agent_inferred", "chat-9", "trip-3")
    asked = runtime.context.events("chat-9")[int(p.event_id or 0) - 1]
    assert any(c["name"] == "note" for c in asked.payload["tool_calls"])


def test_retrieved_memories_reach_the_model_as_a_data_block(settings: Settings) -> None:
    """Memories of the owner are in the prompt, delimited as data, with provenance; other owners' are not."""
    seen: list[list[dict[str, Any]]] = []

    def model(messages: Any) -> ModelResponse:
        seen.append(list(messages))
        return ModelResponse(content="ok")

    rt = Runtime.open(settings, model=ScriptedModel(model), embedder=FakeEmbedder())
    try:
        rt.remember("Ada plans a trip to Rome in May", owner="ada", source="user_supplied")
        rt.remember("Bob hates trips", owner="bob")
        rt.run(Agent("echo", system="sys", tools=[]), "m-1", owner="ada", task="trip to Rome")
    finally:
        rt.close()
    prompt = "\n".join(str(m.get("content")) for m in seen[0])
    assert "Ada plans a trip to Rome in May" in prompt
    assert "user_supplied" in prompt
    assert 'trust="0.80"' in prompt  # the block the memory store renders is the block the model sees
    assert "Bob hates trips" not in prompt
    assert "<memories" in prompt


def test_remember_outside_a_run_needs_an_owner(runtime: Runtime) -> None:
    """Outside a run there is no provenance to borrow: the owner must be named."""
    with pytest.raises(InvalidInputError):
        runtime.remember("a fact")


def test_async_model_works(settings: Settings) -> None:
    """An async model is awaited by the same runtime."""

    class Async:
        name = "async-echo"

        async def acomplete(self, messages: Any, tools: Any = ()) -> ModelResponse:
            return ModelResponse(content=f"{len(messages)} messages")

    rt = Runtime.open(settings, model=Async(), embedder=FakeEmbedder())
    try:
        run = rt.run(Agent("a", system="s", tools=[]), "async-1", owner="o", task="hi")
    finally:
        rt.close()
    assert run.status is RunStatus.COMPLETED
    assert run.output.endswith("messages")


def test_async_model_works_inside_a_running_loop_on_one_loop_of_its_own(settings: Settings) -> None:
    """As in a notebook: called while a loop runs, every model call is awaited on one other loop."""
    loops: list[asyncio.AbstractEventLoop] = []

    class Async:
        name = "async-echo"

        async def acomplete(self, messages: Any, tools: Any = ()) -> ModelResponse:
            loops.append(asyncio.get_running_loop())
            await asyncio.sleep(0)
            return ModelResponse(content=f"{len(messages)} messages")

    async def cell() -> tuple[list[Run], asyncio.AbstractEventLoop]:
        rt = Runtime.open(settings, model=Async(), embedder=FakeEmbedder())
        try:
            agent = Agent("a", system="s", tools=[])
            runs = [rt.run(agent, f"nb-{i}", owner="o", task="hi") for i in range(3)]
        finally:
            rt.close()
        return runs, asyncio.get_running_loop()

    runs, notebook_loop = asyncio.run(cell())
    assert [r.status for r in runs] == [RunStatus.COMPLETED] * 3
    assert len(loops) == 3
    assert len({id(loop) for loop in loops}) == 1
    assert loops[0] is not notebook_loop
    assert loops[0].is_closed()  # closed with the runtime


def test_turns_must_be_positive(runtime: Runtime) -> None:
    """A bad per-invocation turn limit is refused before anything runs."""
    with pytest.raises(InvalidInputError):
        runtime.run(agent_app.AGENT, "t", owner="o", task="x", turns=0)
    assert runtime.engine.store.find("t") is None


@pytest.mark.crash
@pytest.mark.parametrize(
    ("step", "layout"),
    [
        ("model-0", "shared"),
        ("observe-0-0", "shared"),
        ("model-1", "shared"),
        ("observe-1-1", "shared"),
        ("model-1", "apart"),
        ("observe-0-0", "apart"),
    ],
)
def test_invariant_1_a_killed_step_neither_duplicates_events_nor_pays_the_model_twice(
    settings: Settings, step: str, layout: str
) -> None:
    """SIGKILL after a step wrote its events but before it committed: the resumed run logs each
    event once, runs each tool once, and ends like an uncrashed run. With the context store on a
    database of its own ("apart") the events had committed, and the model is called once per turn;
    with one database ("shared") they were in the step's uncommitted transaction and are gone with
    it, so a killed model step asks the model again, and nothing is logged twice."""
    extra: dict[str, str] = {}
    if layout == "apart":
        settings, extra = apart(settings)
    env = {**subprocess_env(settings), **extra, "STATEKEEP_TEST_KILL_AFTER": step}
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "runtime" / "crash_app.py"), "crashed"],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == -9, out.stderr  # really killed, at that point
    rt = agent_app.build_runtime(settings)
    try:
        assert rt.engine.store.shares(getattr(rt.context, "db", None)) is (layout == "shared")
        run = rt.resume("crashed")
        assert run.status is RunStatus.WAITING_FOR_APPROVAL
        _approve_all(rt, "crashed")
        assert rt.resume("crashed").status is RunStatus.COMPLETED
        rt.run(agent_app.AGENT, "clean", owner=agent_app.OWNER, task=TASK)
        _approve_all(rt, "clean")
        rt.resume("clean")
        assert _transcript(rt, "crashed") == _transcript(rt, "clean")
        state = rt.working.load("crashed", AgentState)
        assert state.cursor == rt.context.last_seq("crashed") == rt.engine.store.get("crashed").cursor
    finally:
        rt.close()
    counts = Counter(e["kind"] for e in effects())
    # two runs: the model answered 4 times per run (and once more for a shared model step killed
    # before its answer committed), every tool ran once per run
    asked_again = layout == "shared" and step.startswith("model")
    assert counts == {"model": 8 + asked_again, "lookup": 4, "note": 2, "send": 2}


def test_bad_agents_and_run_arguments_are_refused(runtime: Runtime) -> None:
    """Agent definitions and run arguments are validated before anything is written."""
    with pytest.raises(InvalidInputError, match="unique"):
        Agent("a", system="s", tools=[agent_app.AGENT.tools[0], agent_app.AGENT.tools[0]])
    with pytest.raises(InvalidInputError):
        Agent("a", system="s", tools=[], max_turns=0)
    with pytest.raises(InvalidInputError):
        Agent("", system="s", tools=[])
    for kwargs in (
        {"owner": "", "task": "x"},
        {"owner": "o", "task": "  "},
        {"owner": "o", "task": "x", "turns": True},
    ):
        with pytest.raises(InvalidInputError):
            runtime.run(agent_app.AGENT, "bad", **kwargs)
    assert runtime.engine.store.find("bad") is None
    for run_id in ("", "x" * 1000, 7):  # the session defaults to the run id: the run id is blamed
        for call in (runtime.run, runtime.start):
            with pytest.raises(InvalidInputError) as refused:
                call(agent_app.AGENT, run_id, owner="o", task="x")  # type: ignore[operator]
            assert refused.value.field == "run_id"


def test_a_changed_agent_needs_a_new_version(runtime: Runtime) -> None:
    """Registering another definition under the same name and version is refused, not ignored."""
    runtime.register(agent_app.AGENT)
    changed = Agent(agent_app.AGENT.name, system="other prompt", tools=agent_app.AGENT.tools)
    with pytest.raises(InvalidInputError, match="bump"):
        runtime.register(changed)
    newer = Agent(agent_app.AGENT.name, system="other prompt", tools=agent_app.AGENT.tools, version=2)
    assert runtime.register(newer).version == 2


def test_a_bad_tool_call_is_answered_not_fatal(settings: Settings) -> None:
    """Unknown tools and wrong arguments come back to the model as errors; the run goes on."""

    def model(messages: Any) -> ModelResponse:
        results = [m for m in messages if m.get("role") == "tool"]
        if not results:
            return ModelResponse(
                tool_calls=(
                    ToolCall("c1", "lookup", {"town": "Oslo"}),
                    ToolCall("c2", "teleport", {}),
                )
            )
        return ModelResponse(content=" | ".join(str(m["content"]) for m in results))

    rt = Runtime.open(settings, model=ScriptedModel(model), embedder=FakeEmbedder())
    try:
        run = rt.run(
            Agent("t", system="s", tools=[agent_app.AGENT.tools[0]]), "bad-call", owner="o", task="x"
        )
    finally:
        rt.close()
    assert run.status is RunStatus.COMPLETED
    assert "bad arguments for 'lookup'" in run.output
    assert "no tool named 'teleport'" in run.output
    assert [e for e in effects() if e["kind"] != "model"] == []  # the tool never ran with bad arguments
