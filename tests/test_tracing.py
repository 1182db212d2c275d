"""OpenTelemetry traces, read back with the SDK's in-memory exporter.

A run's trace context is stored with the run, so an attempt on another worker,
after a crash, continues the same trace; model calls carry the GenAI semantic
conventions; tool calls their idempotency key and ledger outcome; approvals the
wait and the decision; memory and context builds their own spans.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from statekeep import tracing
from statekeep.config import Settings
from statekeep.workflow import Engine, Registry, RunContext, RunStatus, Worker
from tests.runtime import agent_app

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans this test produced (the SDK is installed once per process, as an application would)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


class Crash(BaseException):
    """The process dies here: nothing after it runs (a BaseException, like a SIGKILL mid-step)."""


def order_registry(crash_once: dict[str, bool]) -> Registry:
    registry = Registry()

    @registry.tool("charge")
    def charge(key: str, amount: int) -> dict[str, Any]:
        return {"charged": amount, "key": key}

    def pack() -> str:
        if crash_once.pop("armed", False):
            raise Crash
        return "packed"

    @registry.workflow("order", version=1)
    def order(ctx: RunContext, n: int) -> str:
        amount = ctx.step("quote", lambda: n * 2)
        ctx.call_tool(charge, amount)
        ctx.step("pack", pack)
        return str(ctx.step("ship", lambda: "shipped"))

    return registry


def _ours(span: ReadableSpan) -> bool:
    return span.instrumentation_scope is not None and span.instrumentation_scope.name == "statekeep"


def _attr(span: ReadableSpan, key: str) -> Any:
    return (span.attributes or {}).get(key)


def test_a_run_resumed_on_another_worker_after_a_crash_is_one_trace_covering_each_step_once(
    database_url: str, spans: InMemorySpanExporter
) -> None:
    registry = order_registry({"armed": True})
    first = Engine(database_url, registry, owner="worker-1", lease=0.3)
    run = first.start(registry.get("order", 1), "order-1", 21)
    assert run.trace_context is not None  # stored with the run, for every later attempt
    (claimed,) = first.store.claim("worker-1", first.lease, 1, registry.runnable())
    with pytest.raises(Crash):
        first.execute(claimed)
    time.sleep(0.4)  # worker 1's lease lapses
    second = Engine(database_url, registry, owner="worker-2", lease=5)
    assert Worker(second).run_once() == 1
    assert second.store.get("order-1").status is RunStatus.COMPLETED

    finished = [s for s in spans.get_finished_spans() if _ours(s)]
    assert len({s.context.trace_id for s in finished}) == 1, [s.name for s in finished]
    (start,) = [s for s in finished if s.name == "run.start order"]
    attempts = [s for s in finished if s.name == "run order"]
    assert [_attr(s, "statekeep.worker") for s in attempts] == ["worker-1", "worker-2"]
    assert all(s.parent is not None and s.parent.span_id == start.context.span_id for s in attempts)
    assert _attr(attempts[1], "statekeep.run.status") == "completed"
    crashed = [s for s in finished if any(e.name == "crash" for e in s.events)]
    assert {s.name for s in crashed} == {"step pack", "run order"}  # the crash, in attempt 1
    # every journal entry has exactly one span that completed it, in the attempt that ran it
    completed = [s for s in finished if s.name.startswith(("step ", "execute_tool ")) and s not in crashed]
    journal = second.store.steps("order-1")
    assert sorted(_attr(s, "statekeep.step.seq") for s in completed) == [e.seq for e in journal]
    (tool,) = [s for s in completed if s.name == "execute_tool charge"]
    assert _attr(tool, "statekeep.tool.idempotency_key") == "order-1/2/0"
    assert _attr(tool, "statekeep.tool.ledger_outcome") == "executed"
    assert _attr(tool, "gen_ai.operation.name") == "execute_tool"
    by_step = {s.name: s for s in completed}
    assert by_step["step quote"].parent.span_id == attempts[0].context.span_id  # type: ignore[union-attr]
    assert by_step["step ship"].parent.span_id == attempts[1].context.span_id  # type: ignore[union-attr]
    first.store.close()
    second.store.close()


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("STATEKEEP_TEST_EFFECTS", str(tmp_path / "effects.jsonl"))
    url = f"sqlite:///{tmp_path / 'statekeep.db'}"
    return Settings.load(home=tmp_path, database_url=url, memory_url=str(tmp_path / "memory"), env={})


def test_an_agent_run_traces_model_calls_tools_approvals_memory_and_context(
    settings: Settings, spans: InMemorySpanExporter
) -> None:
    from statekeep.web import Stores, create_app

    runtime = agent_app.build_runtime(settings)
    assert (
        runtime.run(agent_app.AGENT, "trip-1", owner="ada", task="Plan a trip").status
        == "waiting_for_approval"
    )
    (ask,) = runtime.engine.store.approvals(run_id="trip-1")
    token = "alice-token-0123456789"
    app = create_app(
        runtime.engine.store, tokens={"alice@example.com": token}, stores=Stores(runtime.engine.store)
    )
    with TestClient(app) as client:
        decided = client.post(
            f"/api/approvals/{ask.approval_id}/decision",
            json={"approve": True},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert decided.status_code == 200, decided.text
    assert runtime.resume("trip-1").status is RunStatus.COMPLETED
    runtime.close()

    finished = [s for s in spans.get_finished_spans() if _ours(s)]  # not FastAPI's own request spans
    by_trace: dict[int, list[str]] = {}
    for s in finished:
        by_trace.setdefault(s.context.trace_id, []).append(s.name)
    assert len(by_trace) == 1, list(by_trace.values())
    names = [s.name for s in finished]
    chats = [s for s in finished if s.name == "chat scripted"]
    assert len(chats) == 4  # one per model call: never again on replay
    for chat in chats:
        assert _attr(chat, "gen_ai.operation.name") == "chat"
        assert _attr(chat, "gen_ai.request.model") == "scripted"
        assert _attr(chat, "gen_ai.usage.input_tokens") == 0  # what the scripted model reports
        assert _attr(chat, "gen_ai.usage.output_tokens") == 0
    sends = [s for s in finished if s.name == "execute_tool send"]
    assert [_attr(s, "statekeep.tool.ledger_outcome") for s in sends] == [
        "not run: waiting_for_approval",
        "executed",
    ]
    (waited,) = [s for s in finished if s.name == "approval send"]
    assert _attr(waited, "statekeep.approval.decided_by") == "alice@example.com"
    assert waited.start_time is not None
    assert waited.end_time is not None
    assert waited.end_time - waited.start_time > 0
    (decision,) = [s for s in finished if s.name == "decide send"]
    assert (_attr(decision, "statekeep.approval.via"), _attr(decision, "statekeep.approval.status")) == (
        "api",
        "approved",
    )
    assert "memory.write" in names  # the note tool remembers
    searches = [s for s in finished if s.name == "memory.search"]
    assert len(searches) == len(chats)
    builds = [s for s in finished if s.name == "context.build"]
    assert len(builds) == len(chats)
    for build in builds:
        assert _attr(build, "statekeep.context.tokens.total") > 0
        assert _attr(build, "statekeep.context.tokens.system") > 0
        assert _attr(build, "statekeep.context.tokens.pinned") > 0
        assert _attr(build, "statekeep.context.budget") == agent_app.AGENT.budget


def test_without_opentelemetry_every_span_is_a_no_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "trace", None)
    registry = order_registry({})
    engine = Engine(f"sqlite:///{tmp_path / 'x.db'}", registry)
    run = engine.run(registry.get("order", 1), "order-1", 1)
    assert (run.status, run.trace_context) == (RunStatus.COMPLETED, None)
    assert not tracing.enabled()
    engine.store.close()
