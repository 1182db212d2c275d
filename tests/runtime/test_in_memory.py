"""The runtime over the four in-memory stores: the same agent as over SQL, nothing on disk."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from statekeep.context import InMemoryContextStore
from statekeep.memory import FakeEmbedder, InMemoryMemoryStore
from statekeep.models import ScriptedModel
from statekeep.runtime import AgentState, Runtime
from statekeep.workflow import Engine, InMemoryWorkflowStore, Registry, RunStatus
from statekeep.working import InMemoryWorkingStateStore
from tests.runtime import agent_app
from tests.runtime.conftest import effects


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Runtime:
    monkeypatch.setenv("STATEKEEP_TEST_EFFECTS", str(tmp_path / "effects.jsonl"))
    working = InMemoryWorkingStateStore()
    memory = InMemoryMemoryStore(FakeEmbedder())
    runtime = Runtime(
        engine=Engine(InMemoryWorkflowStore(), Registry(), state_store=working),
        context=InMemoryContextStore(),
        working=working,
        memory=lambda: memory,
        model=ScriptedModel(agent_app.script),
    )
    runtime.register(agent_app.AGENT)
    monkeypatch.setattr(agent_app, "RUNTIMES", [runtime])  # the note tool remembers through it
    return runtime


def test_an_agent_runs_to_its_gate_and_completes_once_approved_in_memory(runtime: Runtime) -> None:
    """The gated tool waits for a person; approved, the run completes with each effect once, state in step."""
    run = runtime.run(agent_app.AGENT, "trip", owner=agent_app.OWNER, task="Plan a trip")
    assert run.status is RunStatus.WAITING_FOR_APPROVAL
    store = runtime.engine.store
    for approval in store.approvals(run_id="trip"):
        store.decide(approval.approval_id, approve=True, by="tester@example.com")
    run = runtime.resume("trip")
    assert (run.status, run.output) == (RunStatus.COMPLETED, "done after 4 tool results")
    assert Counter(e["kind"] for e in effects()) == {"model": 4, "lookup": 2, "note": 1, "send": 1}
    state = runtime.working.load("trip", AgentState)
    assert state.cursor == runtime.context.last_seq("trip") == store.get("trip").cursor
    for step in (s for s in store.steps("trip") if s.kind == "step"):
        assert step.state_version is not None
        assert runtime.working.load("trip", AgentState, version=step.state_version).cursor == step.cursor
    (note,) = runtime.memory.list_memories(agent_app.OWNER)
    assert (note.content, note.tags) == ("The user plans a trip from Oslo to Rome.", ("note",))


def test_erasing_the_owner_leaves_no_run_of_theirs_in_memory(runtime: Runtime) -> None:
    """Erasure cancels the owner's live run and removes it with its journal, ledger and approvals."""
    runtime.run(agent_app.AGENT, "trip", owner=agent_app.OWNER, task="Plan a trip")
    steps = len(runtime.engine.store.steps("trip"))
    receipt = runtime.erase_owner(agent_app.OWNER, cancel_live=True)
    assert receipt.cancelled == ("trip",)
    assert receipt.workflow["runs"] == 1
    assert receipt.workflow["steps"] == steps > 0
    assert receipt.workflow["approvals"] == 1
    assert runtime.engine.store.runs_of(agent_app.OWNER) == []
    assert runtime.engine.store.approvals(status=None) == []
