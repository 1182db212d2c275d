"""The typed events of a streamed run (:meth:`Runtime.stream`, :meth:`Runtime.astream`).

Events tell what happens while it happens; they are not the record. The record
is the journal and the context log, where only completed messages are written:
a stream cut by a crash is asked again, a stream that completed is never paid
for twice. A resumed stream tells only what happens from then on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from statekeep.workflow import Run


@dataclass(frozen=True)
class TextDelta:
    """A piece of the model's answer, as the provider streamed it (a non-streaming model sends one)."""

    kind: ClassVar[str] = "text_delta"
    run_id: str
    turn: int
    text: str


@dataclass(frozen=True)
class ToolCallRequested:
    """The model asked for a tool call; it runs next (or waits for an approval)."""

    kind: ClassVar[str] = "tool_call"
    run_id: str
    turn: int
    call_id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    """What a tool call returned to the model; ``is_error`` for a failed or refused call."""

    kind: ClassVar[str] = "tool_result"
    run_id: str
    turn: int
    call_id: str
    name: str
    result: Any
    is_error: bool


@dataclass(frozen=True)
class ModelRetrying:
    """A model call failed transiently; it is tried again at ``due`` (the wait is journaled)."""

    kind: ClassVar[str] = "model_retry"
    run_id: str
    turn: int
    attempt: int
    error: str
    status: int | None
    due: str


@dataclass(frozen=True)
class ApprovalRequested:
    """The run waits for a person to decide ``approval_id`` (see ``statekeep approvals``)."""

    kind: ClassVar[str] = "approval"
    run_id: str
    approval_id: str
    action: str
    arguments: dict[str, Any]
    reason: str


@dataclass(frozen=True)
class RunWaiting:
    """The run stopped without finishing: for an approval, an event, a timer, or its turn limit."""

    kind: ClassVar[str] = "waiting"
    run_id: str
    status: str
    run: Run


@dataclass(frozen=True)
class RunCompleted:
    """The run finished; ``output`` is the model's final answer."""

    kind: ClassVar[str] = "completed"
    run_id: str
    output: Any
    run: Run


@dataclass(frozen=True)
class RunFailed:
    """The run failed; ``rt.retry(run_id)`` continues it from its last completed step."""

    kind: ClassVar[str] = "failed"
    run_id: str
    error: str | None
    run: Run


RunEvent = (
    TextDelta
    | ToolCallRequested
    | ToolResult
    | ModelRetrying
    | ApprovalRequested
    | RunWaiting
    | RunCompleted
    | RunFailed
)

__all__ = [
    "ApprovalRequested",
    "ModelRetrying",
    "RunCompleted",
    "RunEvent",
    "RunFailed",
    "RunWaiting",
    "TextDelta",
    "ToolCallRequested",
    "ToolResult",
]
