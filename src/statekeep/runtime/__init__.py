"""The runtime: the one place where the four stores meet.

One agent step, every time, from the stores and nothing else::

    load run + working state -> retrieve the owner's memories -> build context
    -> model call -> tool calls through the ledger (or an approval gate)
    -> commit (step completion + working-state version + context cursor)

An agent is a workflow of the workflow store: every model call and every tool
call is a journaled step, so a crash, a restart or a wait of days for a person
resumes after the last completed step, on any worker.

The package, by concern: :mod:`~statekeep.runtime.agent` (what an agent is),
:mod:`~statekeep.runtime.core` (the :class:`Runtime`), :mod:`~statekeep.runtime.steps`
(the steps of a run), :mod:`~statekeep.runtime.scope` (who a tool runs for) and
:mod:`~statekeep.runtime.model_loop` (awaiting async models),
:mod:`~statekeep.runtime.schema` (a tool's JSON schema from its signature),
:mod:`~statekeep.runtime.failures` (transient or permanent), :mod:`~statekeep.runtime.events`
(what a stream yields), :mod:`~statekeep.runtime.fork` and :mod:`~statekeep.runtime.usage`.

Examples:
    >>> from statekeep.config import Settings
    >>> from statekeep.models import ModelResponse, ScriptedModel
    >>> agent = Agent("greeter", system="You greet people.", tools=[])
    >>> import tempfile
    >>> rt = Runtime.open(Settings.load(home=tempfile.mkdtemp()), model=ScriptedModel([ModelResponse("Hi!")]))
    >>> rt.run(agent, "greet-1", owner="ada", task="say hi").output
    'Hi!'
    >>> rt.close()
"""

from statekeep.runtime.agent import Agent, AgentState, AgentTool, OnError, tool
from statekeep.runtime.core import Runtime
from statekeep.runtime.events import (
    ApprovalRequested,
    ModelRetrying,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunWaiting,
    TextDelta,
    ToolCallRequested,
    ToolResult,
)
from statekeep.runtime.scope import RunScope, current_scope
from statekeep.runtime.usage import Usage

__all__ = [
    "Agent",
    "AgentState",
    "AgentTool",
    "ApprovalRequested",
    "ModelRetrying",
    "OnError",
    "RunCompleted",
    "RunEvent",
    "RunFailed",
    "RunScope",
    "RunWaiting",
    "Runtime",
    "TextDelta",
    "ToolCallRequested",
    "ToolResult",
    "Usage",
    "current_scope",
    "tool",
]
