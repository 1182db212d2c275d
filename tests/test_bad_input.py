"""Bad settings, URLs, models and agents: a statekeep error naming what is wrong, and no side effect.

Each case raised TypeError or AttributeError before, or was accepted and failed
later (a NUL in the home folder, a negative model timeout, an agent whose system
prompt no model API can encode).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statekeep.config import Settings
from statekeep.context import SQLContextStore
from statekeep.errors import ConfigError, InvalidInputError
from statekeep.models import ModelResponse, OpenAIChatModel, ScriptedModel
from statekeep.runtime import Agent, AgentTool, Runtime
from statekeep.workflow import SQLWorkflowStore
from statekeep.working import SQLWorkingStateStore


@pytest.mark.parametrize(
    ("call", "setting"),
    [
        (lambda: Settings.load(home=5, env={}), "home"),  # type: ignore[arg-type]
        (lambda: Settings.load(home="/tmp/h\x00", env={}), "STATEKEEP_HOME"),
        (lambda: Settings.load(database_url=5, env={}), "database_url"),  # type: ignore[arg-type]
        (lambda: Settings.load(context_url=5, env={}), "context_url"),  # type: ignore[arg-type]
        (lambda: Settings.load(memory_url=5, env={}), "memory_url"),  # type: ignore[arg-type]
        (lambda: Settings.load(memory_url="/tmp/m\x00", env={}), "STATEKEEP_MEMORY_URL"),
        (lambda: Settings.load(env=5), "env"),  # type: ignore[arg-type]
        (lambda: SQLContextStore(None), "STATEKEEP_CONTEXT_URL"),  # type: ignore[arg-type]
        (lambda: SQLWorkflowStore(None), "STATEKEEP_WORKFLOW_URL"),  # type: ignore[arg-type]
        (lambda: SQLWorkingStateStore(5), "STATEKEEP_WORKING_URL"),  # type: ignore[arg-type]
        (lambda: SQLWorkflowStore("sqlite:////tmp/a\x00b.db"), "STATEKEEP_WORKFLOW_URL"),
        (lambda: Settings.load(home="h", env={"STATEKEEP_HOME": 5}), "STATEKEEP_HOME"),  # type: ignore[dict-item]
        (lambda: Settings.load(home="h", env={}).url_for("bogus"), "store"),
    ],
)
def test_bad_settings_are_config_errors_naming_the_setting(
    call: Callable[[], Any], setting: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.setting == setting
    assert list(tmp_path.iterdir()) == []  # no folder made on the way


def _tool(**kw: Any) -> AgentTool:
    return AgentTool(**{"name": "t", "fn": lambda key: None, "description": "d", **kw})


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: OpenAIChatModel("m", base_url=8000), "base_url"),  # type: ignore[arg-type]
        (lambda: OpenAIChatModel("m", base_url="http://x", temperature=3), "temperature"),
        (lambda: OpenAIChatModel("m", base_url="http://x", max_tokens=0), "max_tokens"),
        (lambda: OpenAIChatModel("m", base_url="http://x", tool_choice=""), "tool_choice"),
        (lambda: OpenAIChatModel("m", base_url="http://x", timeout=-1), "timeout"),
        (lambda: OpenAIChatModel("m", base_url="http://x", timeout=float("nan")), "timeout"),
        (lambda: OpenAIChatModel("", base_url="http://x"), "model"),
        (lambda: OpenAIChatModel("m", base_url="http://x", api_key="a\nb"), "api_key"),
        (lambda: Agent("a", system="\ud800", tools=[]), "system"),
        (lambda: Agent("a", system="s", tools=None), "tools"),  # type: ignore[arg-type]
        (lambda: Agent("a", system="s", tools=[], model_retry=5), "model_retry"),  # type: ignore[arg-type]
        (lambda: Agent("a", system="s", tools=[], tool_retry=5), "tool_retry"),  # type: ignore[arg-type]
        (lambda: _tool(on_error="ignore"), "on_error"),
        (lambda: _tool(description=5), "description"),
        (lambda: _tool(parameters={"a": {1, 2}}), "parameters"),
        (lambda: _tool(parameters=[]), "parameters"),
        (lambda: Runtime.open({}, model=ScriptedModel([ModelResponse("ok")])), "settings"),  # type: ignore[arg-type]
        (lambda: Runtime.open(5, model=ScriptedModel([ModelResponse("ok")])), "settings"),  # type: ignore[arg-type]
        (lambda: Runtime.open(None, model=ScriptedModel([ModelResponse("ok")]), embedder=5), "embedder"),  # type: ignore[arg-type]
        (lambda: ScriptedModel(5), "script"),  # type: ignore[arg-type]
        (lambda: ScriptedModel(["hello"]), "script"),  # type: ignore[list-item]
        (lambda: _tool(reconciler=5), "reconciler"),
    ],
)
def test_bad_models_and_agents_are_refused_when_built(
    call: Callable[[], Any], field: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidInputError) as err:
        call()
    assert err.value.field == field
    assert list(tmp_path.iterdir()) == []  # Runtime.open({}) used to create .statekeep here


def test_lenient_where_it_should_be(tmp_path: Path) -> None:
    """Settings ignore environment entries they never read, take a Path for home; owner "" is the default."""
    from statekeep.workflow import Engine, Registry

    settings = Settings.load(env={1: "x", "STATEKEEP_OTHER": 5, "STATEKEEP_HOME": tmp_path})  # type: ignore[dict-item]
    assert settings.home == tmp_path
    engine = Engine(f"sqlite:///{tmp_path / 'w.db'}", Registry(), owner="")
    assert engine.owner
    engine.store.close()
