"""What an agent is: its tools, its limits, and the working state of one of its runs."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from statekeep._text import check_id, check_unicode
from statekeep.errors import InvalidInputError
from statekeep.models import ToolSpec
from statekeep.workflow import Reconciler, RetryPolicy
from statekeep.working import WorkingState


@dataclass(frozen=True)
class AgentTool:
    """A tool an agent may call. ``fn(idempotency_key, **arguments)`` returns JSON.

    ``approval`` (a reason) makes every call wait for a person's approval of its
    exact arguments; ``reconciler`` decides, after a crash, whether a call that
    started but never completed actually happened.
    """

    name: str
    fn: Callable[..., Any]
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    approval: str | None = None
    reconciler: Reconciler | None = None

    def __post_init__(self) -> None:
        check_text(self.name, "name")
        if not callable(self.fn):
            raise InvalidInputError("must be callable", field="fn")
        if not isinstance(self.description, str):
            raise InvalidInputError("must be a string", field="description")
        check_unicode(self.description, "description")
        if not isinstance(self.parameters, dict):
            raise InvalidInputError("must be a JSON schema object (a dict)", field="parameters")
        try:
            check_unicode(json.dumps(self.parameters, allow_nan=False, ensure_ascii=False), "parameters")
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"must be JSON: {exc}", field="parameters") from exc
        if self.approval is not None:
            check_text(self.approval, "approval")
        if self.reconciler is not None and not callable(self.reconciler):
            raise InvalidInputError("must be a function of the ambiguous call, or None", field="reconciler")

    @property
    def spec(self) -> ToolSpec:
        """What the model is told about this tool."""
        return ToolSpec(self.name, self.description, self.parameters)

    def bad_arguments(self, arguments: object) -> str | None:
        """Why the model's arguments cannot be passed to ``fn``; None when they can."""
        if not isinstance(arguments, dict):
            return f"the arguments of {self.name!r} must be a JSON object"
        try:
            inspect.signature(self.fn).bind("idempotency-key", **arguments)
        except TypeError as exc:
            return f"bad arguments for {self.name!r}: {exc}"
        return None


@dataclass(frozen=True)
class Agent:
    """An agent: a system prompt, tools, and the limits of one run."""

    name: str
    system: str
    tools: Sequence[AgentTool]
    version: int = 1
    budget: int = 8_000
    max_turns: int = 20
    memory_k: int = 5
    #: how often a failing model call (an HTTP 429, a timeout) is tried before the run fails
    model_retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(attempts=3, backoff=1.0))

    def __post_init__(self) -> None:
        check_text(self.name, "name")
        if not isinstance(self.system, str):
            raise InvalidInputError("must be a string", field="system")
        check_unicode(self.system, "system")
        if isinstance(self.tools, str | bytes) or not isinstance(self.tools, Sequence):
            raise InvalidInputError("must be a list of AgentTool objects", field="tools")
        if any(not isinstance(t, AgentTool) for t in self.tools):
            raise InvalidInputError("must be AgentTool objects", field="tools")
        if not isinstance(self.model_retry, RetryPolicy):
            raise InvalidInputError("must be a RetryPolicy", field="model_retry")
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise InvalidInputError(f"tool names must be unique, got {names}", field="tools")
        for name, minimum in (("version", 1), ("budget", 1), ("max_turns", 1), ("memory_k", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise InvalidInputError(f"must be an int >= {minimum}", field=name)


class AgentState(WorkingState):
    """The working state of an agent run: its task, its progress, what its tools returned."""

    state_schema: ClassVar[str] = "statekeep.agent"
    state_version: ClassVar[int] = 1
    owner: str
    session_id: str
    task: str
    turn: int = 0
    #: the last context event a committed step covers
    cursor: int = 0
    #: the latest result of each tool, for the application; the model sees results in the
    #: window as tool messages, never promoted into the system prompt
    facts: dict[str, Any] = {}

    def pinned(self) -> dict[str, Any]:
        """What the model sees of this state before each call: the task and how far it got."""
        return {"task": self.task, "turn": self.turn}


def check_text(value: object, name: str, limit: int = 255) -> None:
    """A string with more than whitespace, of at most ``limit`` characters, that every backend can store."""
    check_id("" if isinstance(value, str) and not value.strip() else value, name, limit)  # blank is empty


def check_run(owner: object, task: object, session_id: object) -> None:
    """The arguments that start a run, checked before anything is written."""
    check_text(owner, "owner")
    check_text(task, "task", limit=100_000)
    if session_id is not None:
        check_text(session_id, "session_id")
