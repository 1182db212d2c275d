"""A small agent for the runtime tests: deterministic model, fake embedder, one gated tool.

Importable by subprocesses (``build_runtime`` is a ``statekeep worker --app``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from statekeep.config import Settings
from statekeep.memory import FakeEmbedder
from statekeep.models import Message, ModelResponse, ScriptedModel, ToolCall
from statekeep.runtime import Agent, AgentTool, Runtime

OWNER = "owner-1"
RUNTIMES: list[Runtime] = []


def effects_file() -> Path:
    """Side effects are counted outside the databases under test: one line per effect."""
    return Path(os.environ["STATEKEEP_TEST_EFFECTS"])


def _effect(kind: str, key: str) -> None:
    with open(effects_file(), "a") as f:
        f.write(json.dumps({"kind": kind, "key": key}) + "\n")


def lookup(key: str, city: str) -> dict[str, Any]:
    _effect("lookup", key)
    return {"city": city, "weather": {"Oslo": "snow", "Rome": "sun"}.get(city, "fog")}


def note(key: str, text: str) -> dict[str, Any]:
    RUNTIMES[0].remember(text, tags=["note"])
    _effect("note", key)
    return {"remembered": text}


def send(key: str, to: str, body: str) -> dict[str, Any]:
    _effect("send", key)
    return {"sent": True, "to": to}


def script(messages: Sequence[Message]) -> ModelResponse:
    """lookup Oslo -> lookup Rome + note -> send (gated) -> final answer. Each call is a paid effect."""
    tools = [m for m in messages if m.get("role") == "tool"]
    _effect("model", str(len(tools)))
    if not tools:
        return ModelResponse(tool_calls=(ToolCall("c-oslo", "lookup", {"city": "Oslo"}),))
    if len(tools) == 1:
        return ModelResponse(
            tool_calls=(
                ToolCall("c-rome", "lookup", {"city": "Rome"}),
                ToolCall("c-note", "note", {"text": "The user plans a trip from Oslo to Rome."}),
            )
        )
    if len(tools) == 3:
        return ModelResponse(
            tool_calls=(ToolCall("c-send", "send", {"to": "ada@example.com", "body": "Pack for sun."}),)
        )
    return ModelResponse(content=f"done after {len(tools)} tool results")


AGENT = Agent(
    name="trip",
    system="You plan trips.",
    tools=[
        AgentTool("lookup", lookup, "Weather of a city."),
        AgentTool("note", note, "Remember a note about the user."),
        AgentTool("send", send, "Send an email.", approval="sends an email to a customer"),
    ],
)


def build_runtime(settings: Settings | None = None) -> Runtime:
    runtime = Runtime.open(settings, model=ScriptedModel(script), embedder=FakeEmbedder(), lease=5)
    runtime.register(AGENT)
    RUNTIMES[:] = [runtime]
    return runtime
