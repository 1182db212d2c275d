"""``pip install statekeep`` alone: the SQLite stores, the runtime and the CLI work, and an extra's
feature fails with an error that names the extra to install."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from statekeep.config import Settings
from statekeep.context import Message, SQLContextStore, ToolCall
from statekeep.models import ModelResponse, ScriptedModel
from statekeep.models import ToolCall as ModelToolCall
from statekeep.runtime import Agent, AgentTool, Runtime
from statekeep.workflow import Engine, Registry, RunContext, RunStatus
from statekeep.working import SQLWorkingStateStore, WorkingState

from .conftest import BLOCK, without_extras

CORE_MODULES = (
    "statekeep",
    "statekeep.cli",
    "statekeep.config",
    "statekeep.context",
    "statekeep.db",
    "statekeep.errors",
    "statekeep.models",
    "statekeep.runtime",
    "statekeep.workflow",
    "statekeep.working",
)
HEAVY = ("numpy", "torch", "sentence_transformers", "lancedb", "pyarrow", "psycopg", "fastapi", "uvicorn")


def test_the_core_imports_without_any_extra() -> None:
    """Every core module imports where no extra's module can be imported."""
    done = without_extras(f"import importlib\nfor m in {CORE_MODULES!r}: importlib.import_module(m)\n")
    assert done.returncode == 0, done.stderr


def test_the_core_loads_no_heavy_module_even_when_installed() -> None:
    """Importing the core loads none of the extras' modules, installed or not (it stays fast)."""
    code = (
        f"import importlib, json, sys\nfor m in {CORE_MODULES!r}: importlib.import_module(m)\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_context_store_on_sqlite(sqlite_url: str) -> None:
    """Append a session's events, tool calls and results, and build the context within a budget."""
    store = SQLContextStore(sqlite_url)
    store.append("s", Message.user("Weather in Oslo?"))
    store.append("s", Message.assistant("", tool_calls=[ToolCall("c1", "weather", {"city": "Oslo"})]))
    store.append("s", Message.tool_result("c1", "snow", name="weather"))
    last = store.append("s", Message.assistant("Snow in Oslo."))
    assert last.seq == store.last_seq("s") == 4
    assert last.tokens > 0  # counted with tiktoken, a core dependency
    built = store.build("s", budget=1000, system="You answer briefly.")
    assert [m.role for m in built.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert built.report.total <= 1000


class Plan(WorkingState):
    state_schema: ClassVar[str] = "core.plan"
    state_version: ClassVar[int] = 1
    lead: str
    todo: list[str] = []


def test_working_state_on_sqlite(sqlite_url: str) -> None:
    """Typed working state saves versions and loads them back."""
    store = SQLWorkingStateStore(sqlite_url)
    store.save("run-1", Plan(lead="Ada", todo=["research"]), expected_version=0)
    store.save("run-1", Plan(lead="Ada", todo=[]), expected_version=1)
    assert store.load("run-1", Plan).todo == []


def test_workflow_on_sqlite_resumes_without_repeating_steps(sqlite_url: str) -> None:
    """A durable workflow runs, and a second run of the same id replays its journal."""
    registry = Registry()
    calls: list[str] = []

    def fetch(email: str) -> dict[str, str]:
        calls.append(email)
        return {"name": email.split("@")[0].title()}

    @registry.workflow("onboard", version=1)
    def onboard(ctx: RunContext, email: str) -> str:
        profile = ctx.step("fetch", fetch, email)
        return f"Hi {profile['name']}"

    engine = Engine(sqlite_url, registry)
    run = engine.run(onboard, "onboard-ada", "ada@example.com")
    assert (run.status, run.output) == (RunStatus.COMPLETED, "Hi Ada")
    assert engine.resume("onboard-ada").output == "Hi Ada"
    assert calls == ["ada@example.com"]


def test_runtime_runs_an_agent_without_memory(tmp_path: Path) -> None:
    """The runtime composes the SQL stores; an agent with memory_k=0 never opens memory."""
    model = ScriptedModel(
        [
            ModelResponse(tool_calls=(ModelToolCall("c1", "add", {"a": 2, "b": 3}),)),
            ModelResponse(content="5"),
        ]
    )
    agent = Agent(
        name="adder",
        system="You add.",
        tools=[AgentTool("add", lambda key, a, b: {"sum": a + b}, "Add two numbers.")],
        memory_k=0,
    )
    with Runtime.open(Settings.load(home=tmp_path / "home"), model=model) as rt:
        run = rt.run(agent, "add-1", owner="ada", task="2 + 3?")
        assert (run.status, run.output) == ("completed", "5")


def test_arun_without_the_async_extra_runs_the_steps_in_a_thread(tmp_path: Path) -> None:
    """Without greenlet and aiosqlite, ``arun`` still runs an agent (its steps in a worker thread)."""
    code = """
        import asyncio, sys
        from statekeep.config import Settings
        from statekeep.models import ModelResponse, ScriptedModel
        from statekeep.runtime import Agent, Runtime
        from statekeep.db import aio

        async def main():
            rt = Runtime.open(Settings.load(home=sys.argv[1]), model=ScriptedModel([ModelResponse("hi")]))
            agent = Agent("a", system="s", tools=[], memory_k=0)
            run = await rt.arun(agent, "r1", owner="ada", task="say hi")
            rt.close()
            return run.output

        assert not aio.available("sqlite")
        print(asyncio.run(main()))
    """
    done = without_extras(code, str(tmp_path / "home"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "hi"


def test_cli_core_commands(tmp_path: Path) -> None:
    """``statekeep db upgrade`` and ``runs list`` work on the embedded SQLite default."""
    home = str(tmp_path / "home")
    code = "import sys\nsys.argv = ['statekeep', *sys.argv[1:]]\nfrom statekeep.cli import main\nmain()\n"
    for args in (["db", "upgrade", "--home", home], ["runs", "list", "--home", home]):
        done = without_extras(code, *args)
        assert done.returncode == 0, done.stderr


MISSING = [
    pytest.param("import statekeep.memory", "lancedb", id="memory"),
    pytest.param("import statekeep\nstatekeep.open_memory_store(sys.argv[1])", "lancedb", id="open-memory"),
    pytest.param("from statekeep.memory.lancedb import LanceDBMemoryStore", "lancedb", id="lancedb-module"),
    pytest.param(
        "from statekeep.db import Database\nDatabase('postgresql://u:pw@h/db')", "postgres", id="postgres"
    ),
    pytest.param(
        "from statekeep.workflow import SQLWorkflowStore\nSQLWorkflowStore('postgresql://h/db')",
        "postgres",
        id="workflow-on-postgres",
    ),
    pytest.param("from statekeep.web import create_app", "web", id="web"),
]


@pytest.mark.parametrize(("code", "extra"), MISSING)
def test_a_missing_extra_names_itself(code: str, extra: str, tmp_path: Path) -> None:
    """Each extra's feature, without the extra, raises MissingExtraError with the pip line that fixes it."""
    catch = (
        "from statekeep.errors import MissingExtraError, StatekeepError\n"
        "try:\n"
        + "".join(f"    {line}\n" for line in code.splitlines())
        + "except MissingExtraError as exc:\n"
        "    assert isinstance(exc, StatekeepError)\n"
        "    print(exc.extra, '|', exc)\n"
    )
    done = without_extras(catch, str(tmp_path / "memory"))
    assert done.returncode == 0, done.stderr
    name, _, message = done.stdout.partition(" | ")
    assert name == extra
    assert f"pip install 'statekeep[{extra}]'" in message


@pytest.mark.parametrize(
    ("args", "extra"),
    [(["memory", "search", "ada", "tea"], "lancedb"), (["serve", "--tokens-file", "t.json"], "web")],
    ids=["memory-search", "serve"],
)
def test_the_cli_names_a_missing_extra_in_one_line(args: list[str], extra: str, tmp_path: Path) -> None:
    """A CLI command that needs an extra exits 1 with one line naming it, no traceback."""
    (tmp_path / "t.json").write_text('{"alice@example.com": "a-long-random-token-of-alice"}')
    code = "import os, sys\nos.chdir(sys.argv[1])\nsys.argv = ['statekeep', *sys.argv[2:]]\n"
    code += "from statekeep.cli import main\nmain()\n"
    done = without_extras(code, str(tmp_path), *args, "--home", str(tmp_path / "home"))
    assert done.returncode == 1
    assert f"pip install 'statekeep[{extra}]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_blocker_blocks() -> None:
    """The children above really run without the extras (here too, where they may be installed)."""
    assert "sys.modules['numpy'] = None" in BLOCK
    done = without_extras("import numpy")
    assert done.returncode != 0
    assert "ModuleNotFoundError" in done.stderr
