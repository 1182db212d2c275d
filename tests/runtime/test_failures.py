"""Model failures are classified, retried durably and recoverable; a run can be retried and forked.

Every test talks to a local server that speaks the provider's API (OpenAI chat
completions or Anthropic messages), on both backends. The crash tests kill a real
worker process mid-stream, after a completed stream, and between two attempts.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from statekeep.config import Settings
from statekeep.errors import InvalidInputError, RunConflictError, RunNotFoundError
from statekeep.memory import FakeEmbedder
from statekeep.models import AnthropicModel, OpenAIChatModel
from statekeep.runtime import Agent, AgentState, AgentTool, ModelRetrying, Runtime, Usage
from statekeep.workflow import RetryPolicy, RunStatus
from statekeep.workflow.tables import events as events_table
from tests.runtime import llm_app
from tests.runtime.conftest import ROOT, apart, subprocess_env
from tests.runtime.llm_server import (
    LLMServer,
    Reply,
    anthropic_answer,
    anthropic_error,
    openai_answer,
    openai_error,
    serving,
    tool_results,
)

LOOKUPS: list[str] = []


def lookup(key: str, city: str) -> dict[str, Any]:
    """Today's weather in a city.

    Args:
        city: the city
    """
    LOOKUPS.append(key)
    return {"city": city, "weather": "sun"}


AGENT = Agent(
    "trip",
    system="You plan trips.",
    tools=[AgentTool("lookup", lookup)],
    memory_k=0,
    model_retry=RetryPolicy(attempts=3, backoff=0.05),
)


class Provider:
    """One API: how to build its model, its answers and its errors."""

    def __init__(self, name: str) -> None:
        self.name = name

    def model(self, server: LLMServer) -> Any:
        if self.name == "openai":
            return OpenAIChatModel("mimic", base_url=server.url)
        return AnthropicModel("mimic", base_url=server.root)

    def answer(self, body: dict[str, Any], content: str | None = None, calls: Any = ()) -> Reply:
        return (openai_answer if self.name == "openai" else anthropic_answer)(body, content, calls)

    def error(self, status: int, message: str, retry_after: str | None = None) -> Reply:
        return (openai_error if self.name == "openai" else anthropic_error)(
            status, message, retry_after=retry_after
        )


@pytest.fixture(params=["openai", "anthropic"])
def provider(request: pytest.FixtureRequest) -> Provider:
    return Provider(request.param)


def trip(provider: Provider, failures: list[Reply]) -> Callable[[str, dict[str, Any]], Reply]:
    """A conversation: lookup Oslo, then answer; ``failures`` are served first, in order."""
    pending = list(failures)

    def respond(path: str, body: dict[str, Any]) -> Reply:
        if pending:
            return pending.pop(0)
        if not tool_results(body):
            return provider.answer(body, "Checking.", [("c1", "lookup", {"city": "Oslo"})])
        return provider.answer(body, "Oslo it is.")

    return respond


@pytest.fixture
def served(settings: Settings) -> Iterator[Callable[..., tuple[Runtime, LLMServer]]]:
    """Open a runtime on a model served by a local server (closed after the test)."""
    opened: list[tuple[Runtime, LLMServer]] = []

    def open_(provider: Provider, respond: Any, **kw: Any) -> tuple[Runtime, LLMServer]:
        server = LLMServer(respond).start()
        rt = Runtime.open(settings, model=provider.model(server), embedder=FakeEmbedder(), **kw)
        opened.append((rt, server))
        return rt, server

    LOOKUPS.clear()
    yield open_
    for rt, server in opened:
        rt.close()
        server.stop()


def _steps(rt: Runtime, run_id: str) -> list[tuple[str, Any]]:
    return [(s.name, json.loads(s.output)) for s in rt.engine.store.steps(run_id)]


def _notes(rt: Runtime, run_id: str) -> list[tuple[str, Any]]:
    store: Any = rt.engine.store
    q = sa.select(events_table.c.name, events_table.c.payload).where(events_table.c.run_id == run_id)
    with store.db.read() as conn:
        rows = conn.execute(q.order_by(events_table.c.id))
        return [(r.name, json.loads(rt.keys.open(r.payload) if rt.keys else r.payload)) for r in rows]


def test_a_429_waits_as_long_as_retry_after_says_and_each_attempt_is_journaled(
    served: Any, provider: Provider
) -> None:
    """A 429 with Retry-After: 1 is retried after a second, not before; the failed attempt and its wait
    are journal entries; the run completes and its usage is the sum of its model calls."""
    rt, server = served(
        provider, trip(provider, [provider.error(429, "Rate limit reached", retry_after="1")])
    )
    events = list(rt.stream(AGENT, "r429", owner="ada", task="Oslo or Rome?"))
    run = events[-1].run
    assert run.status is RunStatus.COMPLETED
    assert run.output == "Oslo it is."
    first, second = server.requests[0]["at"], server.requests[1]["at"]
    assert second - first >= 1.0
    steps = _steps(rt, "r429")
    assert [name for name, _ in steps[:4]] == ["begin", "model-0", "model-0-retry-1", "model-0"]
    failed = steps[1][1]["failed"]
    assert (failed["status"], failed["transient"], failed["attempt"], failed["final"]) == (
        429,
        True,
        1,
        False,
    )
    assert failed["retry_after"] == 1.0
    assert "Rate limit reached" in failed["error"]
    [retrying] = [e for e in events if isinstance(e, ModelRetrying)]
    assert (retrying.attempt, retrying.status) == (1, 429)
    assert rt.usage("r429") == Usage(prompt=20, completion=10, cached=0, calls=2)
    with pytest.raises(RunNotFoundError):
        rt.usage("no-such-run")


def test_a_400_fails_at_once_with_the_providers_message(served: Any, provider: Provider) -> None:
    """A permanent error is not retried: one request, and the run's error is the provider's own words."""
    bad = provider.error(400, "Invalid schema for function 'lookup': 'city' is not valid")
    rt, server = served(provider, trip(provider, [bad]))
    run = rt.run(AGENT, "r400", owner="ada", task="Oslo or Rome?")
    assert run.status is RunStatus.FAILED
    assert "HTTP 400" in (run.error or "")
    assert "Invalid schema for function 'lookup'" in (run.error or "")
    assert len(server.requests) == 1
    assert _steps(rt, "r400")[-1][1]["failed"]["final"] is True
    assert rt.resume("r400").status is RunStatus.FAILED  # resume does not revive it; retry does


def test_attempts_run_out_then_retry_starts_a_new_series(served: Any) -> None:
    """500s until the policy's attempts are spent fail the run; rt.retry continues from the last
    completed step with fresh attempts, and the retry is recorded."""
    provider = Provider("openai")
    rt, server = served(provider, trip(provider, [provider.error(500, "The server had an error")] * 3))
    run = rt.run(AGENT, "r500", owner="ada", task="Oslo or Rome?")
    assert run.status is RunStatus.FAILED
    assert "attempt 3 of 3" in (run.error or "")
    assert len(server.requests) == 3
    run = rt.retry("r500")
    assert run.status is RunStatus.COMPLETED
    assert len(server.requests) == 5  # one answer per turn, nothing asked twice
    [(note, payload)] = _notes(rt, "r500")
    assert note == "statekeep.retried"
    assert payload["after_seq"] == 6  # begin, then 3 failed attempts and the 2 waits between them
    assert "HTTP 500" in payload["error"]
    assert len(LOOKUPS) == 1


def test_a_long_wait_parks_the_run_for_a_worker(served: Any) -> None:
    """A Retry-After longer than retry_wait returns the run sleeping (no process waits); a worker
    retries it when it is due."""
    provider = Provider("openai")
    limited = provider.error(429, "Rate limit reached", retry_after="1.5")
    rt, server = served(provider, trip(provider, [limited]), retry_wait=0.2)
    run = rt.run(AGENT, "parked", owner="ada", task="Oslo or Rome?")
    assert run.status is RunStatus.SLEEPING
    assert len(server.requests) == 1
    handled = rt.worker(poll=0.05, max_poll=0.2).run(idle_exit=3)
    assert handled >= 1
    assert rt.engine.store.get("parked").status is RunStatus.COMPLETED
    assert server.requests[1]["at"] - server.requests[0]["at"] >= 1.5


def test_fork_continues_from_a_completed_step_without_redoing_it(served: Any) -> None:
    """A fork copies the journal, the working state and the session up to a step; the copy goes its
    own way from there. The source is untouched, the fork records where it came from."""
    provider = Provider("openai")
    rt, server = served(provider, trip(provider, []))
    source = rt.run(AGENT, "src", owner="ada", task="Oslo or Rome?")
    assert source.output == "Oslo it is."
    steps = rt.engine.store.steps("src")
    observed = next(s.seq for s in steps if s.name == "observe-0-0")
    fork = rt.fork("src", at_step=observed, new_id="src-b")
    assert fork.status is RunStatus.PENDING
    assert fork.input["forked_from"] == {"run_id": "src", "seq": observed}
    assert rt.fork("src", at_step=observed, new_id="src-b") == fork  # idempotent
    with pytest.raises(RunConflictError):
        rt.fork("src", at_step=2, new_id="src-b")
    with pytest.raises(InvalidInputError, match="at_step"):
        rt.fork("src", at_step=999, new_id="src-c")
    server.responder = lambda path, body: provider.answer(body, "Rome, then.")
    forked = rt.resume("src-b")
    assert forked.output == "Rome, then."
    assert rt.engine.store.get("src").output == "Oslo it is."
    assert len(LOOKUPS) == 1  # the tool ran once, for the source; the fork has its result
    [call] = rt.engine.store.tool_calls("src-b")
    assert call.key.startswith("src-b/")
    source_events = [(e.kind, e.payload) for e in rt.context.events("src")]
    fork_events = [(e.kind, e.payload) for e in rt.context.events("src-b")]
    assert fork_events[:3] == source_events[:3]
    assert fork_events[3][1]["content"] == "Rome, then."
    state = rt.working.load("src-b", AgentState)
    assert (state.session_id, state.cursor) == ("src-b", 4)
    assert ("statekeep.forked", {"run_id": "src-b", "at_seq": observed}) in _notes(rt, "src")


# --- crash tests: a real worker process, killed ------------------------------------------------


def _worker(settings: Settings, server: LLMServer, run_id: str, **env: str) -> subprocess.Popen[str]:
    full = {**subprocess_env(settings), "STATEKEEP_TEST_LLM_URL": server.url, **env}
    script = str(ROOT / "tests" / "runtime" / "llm_app.py")
    return subprocess.Popen(
        [sys.executable, script, run_id], env=full, cwd=ROOT, text=True, stdout=subprocess.PIPE
    )


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)  # reaps it and closes its stdout pipe


def _wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _status(rt: Runtime, run_id: str) -> RunStatus | None:
    run = rt.engine.store.find(run_id)
    return None if run is None else run.status


def _turn0(server: LLMServer) -> int:
    return sum(1 for b in server.bodies() if not tool_results(b))


def _transcript(rt: Runtime, run_id: str) -> list[str]:
    return [e.kind for e in rt.context.events(run_id)]


@pytest.mark.crash
def test_a_worker_killed_mid_stream_asks_again_and_logs_once(settings: Settings) -> None:
    """SIGKILL while the model's answer streams: nothing of it was journaled; the resumed run asks the
    model again, and the transcript holds each message once."""

    def respond(path: str, body: dict[str, Any]) -> Reply:
        if not tool_results(body):
            hang = 3 if _turn0(server) == 1 else None  # the first answer stalls after 3 events
            return openai_answer(
                body, "Let me check the weather", [("c1", "lookup", {"city": "Oslo"})], hang_after=hang
            )
        return openai_answer(body, "Oslo it is.")

    with serving(respond) as server:
        proc = _worker(settings, server, "mid-stream")
        assert server.streaming.wait(120)
        _kill(proc)
        rt = llm_app.build_runtime(settings, server.url)
        try:
            assert rt.engine.store.get("mid-stream").last_seq == 1  # begin only
            run = rt.resume("mid-stream")
            assert run.status is RunStatus.COMPLETED
            assert _transcript(rt, "mid-stream") == ["user", "tool_call", "tool_result", "assistant"]
        finally:
            rt.close()
        assert _turn0(server) == 2  # asked again: the cut stream was never an answer


@pytest.mark.crash
def test_a_stream_that_completed_before_the_kill_is_not_paid_twice(settings: Settings) -> None:
    """Stores in separate databases: SIGKILL after the streamed answer was logged, before its step
    committed: the resumed run uses the logged answer instead of asking (and paying) again."""
    settings, env = apart(settings)
    provider = Provider("openai")
    with serving(trip(provider, [])) as server:
        proc = _worker(settings, server, "after-stream", STATEKEEP_TEST_KILL_AFTER="model-0", **env)
        proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL
        rt = llm_app.build_runtime(settings, server.url)
        try:
            assert not rt.engine.store.shares(getattr(rt.context, "db", None))  # a database of its own
            run = rt.resume("after-stream")
            assert run.status is RunStatus.COMPLETED
            assert _transcript(rt, "after-stream") == ["user", "tool_call", "tool_result", "assistant"]
        finally:
            rt.close()
        assert _turn0(server) == 1
        assert len(server.requests) == 2


@pytest.mark.crash
def test_a_kill_before_the_step_commits_leaves_no_event_when_the_stores_share_a_database(
    settings: Settings,
) -> None:
    """One database: the answer's event commits with its step, so SIGKILL between the answer and the
    commit leaves neither; the resumed run asks again and logs the answer once (no orphan, no twin)."""
    provider = Provider("openai")
    with serving(trip(provider, [])) as server:
        proc = _worker(settings, server, "joined", STATEKEEP_TEST_KILL_AFTER="model-0")
        proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL
        rt = llm_app.build_runtime(settings, server.url)
        try:
            assert _transcript(rt, "joined") == ["user"]  # the begin step committed; model-0 did not
            run = rt.resume("joined")
            assert run.status is RunStatus.COMPLETED
            assert _transcript(rt, "joined") == ["user", "tool_call", "tool_result", "assistant"]
        finally:
            rt.close()
        assert _turn0(server) == 2


@pytest.mark.crash
def test_a_worker_killed_between_attempts_keeps_the_count_and_the_wait(settings: Settings) -> None:
    """SIGKILL while a worker sits out a Retry-After: the failed attempt is in the journal and the due
    time in the run, so the resumed run waits out the rest, then makes attempt 2, not attempt 1."""
    provider = Provider("openai")
    with serving(trip(provider, [provider.error(429, "Rate limit reached", retry_after="3")])) as server:
        proc = _worker(settings, server, "mid-retry")
        rt = llm_app.build_runtime(settings, server.url)
        try:
            _wait_for(lambda: _status(rt, "mid-retry") is RunStatus.SLEEPING)
            _kill(proc)
            assert len(server.requests) == 1
            run = rt.resume("mid-retry")
            assert run.status is RunStatus.COMPLETED
            steps = _steps(rt, "mid-retry")
        finally:
            rt.close()
        assert server.requests[1]["at"] - server.requests[0]["at"] >= 3.0
        names = [name for name, _ in steps]
        assert names[:4] == ["begin", "model-0", "model-0-retry-1", "model-0"]
        assert steps[1][1]["failed"]["attempt"] == 1
        assert len(server.requests) == 3  # 429, the answer after the wait, the final answer


@pytest.mark.crash
def test_the_worker_process_prints_the_stream(settings: Settings) -> None:
    """The worker of the crash tests, left alone, streams the whole run (the control case)."""
    provider = Provider("openai")
    with serving(trip(provider, [])) as server:
        proc = _worker(settings, server, "whole")
        out, _ = proc.communicate(timeout=120)
    kinds = out.split()
    assert kinds[0] == "text_delta"
    assert kinds[-1] == "completed"
    assert {"tool_call", "tool_result"} <= set(kinds)
