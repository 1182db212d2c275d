"""JSON that no store may take: nesting past the limit, lone surrogates. Refused where it enters.

Found by a hostile probe: a value nested 100,000 deep raised a bare RecursionError
from context ``append`` and ``build(pinned=...)``, workflow input, ``send_event``,
``decide`` and memory metadata; a lone surrogate passed the workflow codec (which
escapes it as ASCII), was stored, and then broke every reader that encodes text
as UTF-8. Each store now refuses both with an ``InvalidInputError`` naming the
field, before anything is written, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest

from statekeep._check import MAX_DEPTH, check_json, json_problem
from statekeep.context import SQLContextStore
from statekeep.errors import InvalidInputError, StateValidationError
from statekeep.workflow import Engine, Registry, RunContext, RunStatus, codec
from statekeep.working import SQLWorkingStateStore

HUGE = 100_000


def nest(levels: int, leaf: Any = 1) -> Any:
    """``leaf`` inside ``levels`` lists: a JSON document ``levels`` deep."""
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def test_the_check_walks_without_recursion_and_counts_lists_and_objects() -> None:
    """Depth counts arrays and objects; scalars, keys and a cycle are handled; nothing recurses."""
    assert json_problem(nest(MAX_DEPTH)) is None
    assert json_problem({"a": [{"b": nest(MAX_DEPTH - 3)}]}) is None
    assert "64 levels" in str(json_problem(nest(MAX_DEPTH + 1)))
    assert "64 levels" in str(json_problem(nest(HUGE)))
    assert "surrogate" in str(json_problem({"k": ["ok", "\udc00"]}))
    assert "surrogate" in str(json_problem({"\ud800": 1}))
    assert json_problem({"emoji \U0001f600": "é ✓ \U0001f600", "n": [1.5, None, True]}) is None
    cycle: list[Any] = []
    cycle.append(cycle)
    assert "levels" in str(json_problem(cycle))
    with pytest.raises(InvalidInputError) as err:
        check_json(nest(HUGE), "payload")
    assert err.value.field == "payload"


def test_the_workflow_codec_refuses_what_the_other_stores_refuse() -> None:
    """to_json refuses deep values and lone surrogates: NotJSONError, which callers turn into InvalidInput."""
    for bad in (nest(HUGE), nest(MAX_DEPTH + 1), "\ud800", {"args": ["acct-\udfff"]}):
        with pytest.raises(codec.NotJSONError):
            codec.to_json(bad)
    assert codec.to_json(nest(MAX_DEPTH)) == "[" * MAX_DEPTH + "1" + "]" * MAX_DEPTH
    assert codec.to_json({"payload": nest(MAX_DEPTH)}, limit=MAX_DEPTH + 1)  # an engine envelope
    assert codec.to_json("\U0001f600") == '"\\ud83d\\ude00"'  # a valid pair: stored as before


BAD_VALUES = [nest(HUGE), nest(MAX_DEPTH + 1), {"a": "\ud800"}]
IDS = ["100k-deep", "just-past-the-limit", "lone-surrogate"]


@pytest.mark.parametrize("bad", BAD_VALUES, ids=IDS)
def test_context_refuses_deep_or_broken_arguments_and_pinned_state(database_url: str, bad: Any) -> None:
    """append (tool-call arguments) and build(pinned=...): InvalidInputError, and nothing appended."""
    store = SQLContextStore(database_url)
    store.append("s1", {"role": "user", "content": "hello"})
    call = {"id": "c", "name": "t", "arguments": {"a": bad}}
    with pytest.raises(InvalidInputError) as err:
        store.append("s1", {"role": "assistant", "content": "", "tool_calls": [call]})
    assert err.value.field == "message"
    with pytest.raises(InvalidInputError) as err:
        store.build("s1", 1000, pinned={"task": bad})
    assert err.value.field == "pinned"
    assert [e.seq for e in store.events("s1")] == [1]
    fine = {"id": "c", "name": "t", "arguments": {"a": nest(MAX_DEPTH - 4)}}  # the message wraps it 4 deep
    store.append("s1", {"role": "assistant", "content": "", "tool_calls": [fine]})
    store.build("s1", 1000, pinned={"task": nest(MAX_DEPTH - 1)})
    store.db.dispose()


class Plan(pydantic.BaseModel):
    steps: Any = None


@pytest.mark.parametrize("bad", BAD_VALUES, ids=IDS)
def test_working_state_refuses_deep_or_broken_state(database_url: str, bad: Any) -> None:
    """A state past the limit is a StateValidationError; nothing is saved. One level less is fine."""
    store = SQLWorkingStateStore(database_url)
    with pytest.raises(StateValidationError):
        store.save("r1", Plan(steps=bad))
    assert store.latest_version("r1") == 0
    assert store.save("r1", Plan(steps=nest(MAX_DEPTH - 1))).version == 1  # the model is one level
    store.db.dispose()


def _registry(effects: Path) -> Registry:
    registry = Registry()

    @registry.tool("charge")
    def charge(key: str, account: Any) -> str:
        with effects.open("a") as f:
            f.write(f"{key}\n")
        return "charged"

    @registry.workflow("echo", version=1)
    def echo(ctx: RunContext, value: Any) -> Any:
        return ctx.wait_for_event("go")

    @registry.workflow("charge", version=1)
    def charge_flow(ctx: RunContext, which: int) -> Any:
        return ctx.call_tool(charge, BAD_VALUES[which])

    @registry.workflow("gated", version=1)
    def gated_flow(ctx: RunContext, which: int) -> Any:
        return ctx.call_tool(charge.requiring_approval("a person checks"), BAD_VALUES[which])

    @registry.workflow("output", version=1)
    def output_flow(ctx: RunContext, which: int) -> Any:
        return ctx.step("make", lambda: BAD_VALUES[which])

    return registry


@pytest.mark.parametrize("which", range(len(BAD_VALUES)), ids=IDS)
def test_workflow_entry_points_refuse_deep_or_broken_json(
    database_url: str, tmp_path: Path, which: int
) -> None:
    """Input, send_event, tool arguments (gated or not) and step output: refused, nothing written."""
    bad = BAD_VALUES[which]
    effects = tmp_path / "effects"
    engine = Engine(database_url, _registry(effects))
    store = engine.store
    with pytest.raises(InvalidInputError) as err:
        engine.run(engine.registry.get("echo", 1), "in", bad)
    assert err.value.field == "input"
    assert store.find("in") is None

    assert engine.run(engine.registry.get("echo", 1), "ev", 1).status is RunStatus.WAITING_FOR_EVENT
    with pytest.raises(InvalidInputError) as err:
        store.send_event("ev", "go", bad)
    assert err.value.field == "payload"
    store.send_event("ev", "go", nest(MAX_DEPTH - 1))  # the wait wraps it one level deeper
    assert engine.resume("ev").status is RunStatus.COMPLETED

    for workflow, field in (("charge", "args"), ("gated", "args"), ("output", "output")):
        with pytest.raises(InvalidInputError) as err:  # the run's code is at fault: the run is held
            engine.run(engine.registry.get(workflow, 1), workflow, which)
        assert err.value.field == field
        assert "held" in (store.get(workflow).waiting or {})
        assert store.tool_calls(workflow) == []
    assert store.approvals(status=None) == []
    assert not effects.exists()
    store.close()


def test_an_event_payload_at_the_limit_can_be_waited_for(database_url: str) -> None:
    """send_event takes a payload 64 levels deep; the wait that consumes it must not refuse it."""
    registry = Registry()

    @registry.workflow("echo", version=1)
    def echo(ctx: RunContext) -> Any:
        return ctx.wait_for_event("go")

    engine = Engine(database_url, registry)
    try:
        engine.run(echo, "ev")
        engine.store.send_event("ev", "go", nest(MAX_DEPTH))
        assert engine.resume("ev").output == nest(MAX_DEPTH)
    finally:
        engine.store.close()


@pytest.mark.parametrize("bad", [*BAD_VALUES, "acct-\ud800"], ids=[*IDS, "surrogate-string"])
def test_a_decision_result_is_refused_before_the_decision_is_recorded(
    database_url: str, tmp_path: Path, bad: Any
) -> None:
    """decide(result=...) that no reader could show: InvalidInputError, and the approval stays pending."""
    registry = Registry()

    @registry.tool("pay")
    def pay(key: str, amount: int) -> str:
        return "paid"

    @registry.workflow("pay", version=1)
    def flow(ctx: RunContext) -> Any:
        return ctx.call_tool(pay.requiring_approval("check"), 5)

    engine = Engine(database_url, registry)
    engine.run(flow, "p")
    (ask,) = engine.store.approvals()
    with pytest.raises(InvalidInputError) as err:
        engine.store.decide(ask.approval_id, approve=False, by="ann", result=bad)
    assert err.value.field == "result"
    assert engine.store.approval(ask.approval_id).status == "pending"
    engine.store.close()


@pytest.mark.parametrize("backend", ["memory", "lancedb", "pgvector"])
@pytest.mark.parametrize("bad", BAD_VALUES, ids=IDS)
def test_memory_metadata_past_the_limit_is_refused(
    backend: str, bad: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """remember(metadata=...): InvalidInputError naming metadata; nothing is stored."""
    from statekeep.memory import FakeEmbedder
    from tests.memory.conftest import open_backend

    store = open_backend(backend, request, tmp_path)(FakeEmbedder())
    try:
        with pytest.raises(InvalidInputError) as err:
            store.remember("ann", "likes tea", metadata={"deep": bad})
        assert err.value.field == "metadata"
        assert store.list_memories("ann") == []
        store.remember("ann", "likes tea", metadata={"deep": nest(MAX_DEPTH - 1)})
        assert len(store.list_memories("ann")) == 1
    finally:
        store.close()
