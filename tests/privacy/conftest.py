"""Privacy fixtures: a runtime on each backend, an agent whose every write carries its owner's markers."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from statekeep.cli import main
from statekeep.config import Settings
from statekeep.memory import FakeEmbedder
from statekeep.models import Message, ModelResponse, ScriptedModel, ToolCall
from statekeep.runtime import Agent, AgentTool, Runtime
from tests.runtime.conftest import terminal_width


@pytest.fixture(params=["sqlite", "postgres"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """SQLite + LanceDB (the embedded default), or PostgreSQL + pgvector in one database."""
    url = request.getfixturevalue(f"{request.param}_url")
    memory = str(tmp_path / "memory") if request.param == "sqlite" else url
    return Settings.load(home=tmp_path / "home", database_url=url, memory_url=memory, env={})


@dataclass
class Person:
    """An owner and the unique words of theirs that every store receives."""

    owner: str
    markers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tag = uuid.uuid4().hex[:12]
        for kind in ("task", "args", "result", "reply", "gated", "memory", "task2"):
            self.markers[kind] = f"zq{kind}{self.owner[:3]}{tag}"

    @property
    def sealed(self) -> dict[str, str]:
        """The markers that only sealed columns receive (memory content is plain, by design)."""
        return {k: v for k, v in self.markers.items() if k != "memory"}


PEOPLE: dict[str, Person] = {}


def lookup(key: str, query: str) -> dict[str, Any]:
    person = next(p for p in PEOPLE.values() if p.markers["args"] in query)
    return {"answer": f"found {person.markers['result']}"}


def send(key: str, body: str) -> dict[str, Any]:
    return {"sent": True}


def script(messages: Sequence[Message]) -> ModelResponse:
    """Task 1: lookup, then answer. Task 2: a gated send, which waits for a person."""
    task = next(str(m.get("content")) for m in messages if m.get("role") == "user")
    person = next(p for p in PEOPLE.values() if p.markers["task"] in task or p.markers["task2"] in task)
    if person.markers["task2"] in task:
        return ModelResponse(tool_calls=(ToolCall("c-send", "send", {"body": person.markers["gated"]}),))
    if not any(m.get("role") == "tool" for m in messages):
        query = f"about {person.markers['args']}"
        return ModelResponse(tool_calls=(ToolCall("c-look", "lookup", {"query": query}),))
    return ModelResponse(content=f"the answer is {person.markers['reply']}")


AGENT = Agent(
    name="helper",
    system="You help.",
    tools=[
        AgentTool("lookup", lookup, "Look something up."),
        AgentTool("send", send, "Send a message.", approval="sends a message"),
    ],
    memory_k=3,
)


@pytest.fixture
def runtime(settings: Settings) -> Iterator[Runtime]:
    rt = Runtime.open(settings, model=ScriptedModel(script), embedder=FakeEmbedder())
    yield rt
    rt.close()


def populate(rt: Runtime, person: Person, *, gated: bool) -> dict[str, str]:
    """Write the person's markers into every store; return their run ids by name."""
    PEOPLE[person.owner] = person
    owner, m = person.owner, person.markers
    rt.remember(f"{owner} keeps a note: {m['memory']}", owner=owner)
    first = rt.run(AGENT, f"{owner}-run-1", owner=owner, task=f"please {m['task']}", session_id=f"{owner}-s1")
    assert first.status == "completed", first
    rt.context.compact(f"{owner}-s1")  # a rolling summary that folds the owner's words
    runs = {"first": first.run_id}
    if gated:
        second = rt.run(
            AGENT, f"{owner}-run-2", owner=owner, task=f"then {m['task2']}", session_id=f"{owner}-s2"
        )
        assert second.status == "waiting_for_approval", second
        runs["gated"] = second.run_id
    return runs


Cli = Callable[..., tuple[int, str]]


@pytest.fixture
def cli(settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    """Run ``statekeep ARGS`` in this process against the test's stores; return (exit code, output)."""
    monkeypatch.setenv("STATEKEEP_HOME", str(settings.home))
    monkeypatch.setenv("STATEKEEP_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("STATEKEEP_MEMORY_URL", settings.memory_url)
    terminal_width(monkeypatch, 250)

    def run(*args: str) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["statekeep", *args])
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = int(exc.code or 0)
        out = capsys.readouterr()
        return code, out.out + out.err

    return run
