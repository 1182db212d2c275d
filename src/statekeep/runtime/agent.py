"""What an agent is: its tools, its limits, and the working state of one of its runs."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

import pydantic

from statekeep._check import MAX_ID, check_int, check_run_id, check_text, check_unicode
from statekeep.errors import InvalidInputError
from statekeep.models import INVALID_ARGUMENTS, ToolSpec
from statekeep.runtime.schema import arguments_model, describe, explain, json_schema
from statekeep.workflow import Reconciler, RetryPolicy
from statekeep.working import WorkingState

#: What happens when a tool raises (after its transient errors were retried):
#: ``model``, the error is the tool's result and the model decides; ``fail``, the run
#: fails (``rt.retry`` calls the tool again); ``ask``, a person approves calling it again
#: (a rejection hands the error to the model).
OnError = Literal["model", "fail", "ask"]


#: What model providers accept as a tool's name (OpenAI's and Anthropic's rule).
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class AgentTool:
    """A tool an agent may call. ``fn(idempotency_key, **arguments)`` returns JSON.

    The JSON schema the model is shown comes from ``fn``'s signature and type
    hints, with descriptions from its docstring (see :mod:`statekeep.runtime.schema`);
    ``description`` defaults to the docstring's first part. ``parameters`` overrides
    the schema shown (validation still follows the signature). The model's
    arguments are validated before the ledger records a call; invalid ones are
    answered to the model as an error, and the tool never runs.

    ``fn`` may be ``async def``: it is awaited on the caller's event loop under
    ``arun``/``astream``, on the runtime's own loop otherwise.

    ``approval`` (a reason) makes every call wait for a person's approval of its
    exact arguments; ``reconciler`` decides, after a crash, whether a call that
    started but never completed actually happened. ``on_error`` says what a
    raised error does (see :data:`OnError`); transient errors (timeouts, 429, 5xx)
    are first retried under ``retry`` (default: the agent's ``tool_retry``), in
    process, with the same idempotency key.

    Examples:
        >>> def lookup(key: str, city: str) -> dict:
        ...     '''Today's weather.
        ...
        ...     Args:
        ...         city: a city name, in English
        ...     '''
        ...     return {"city": city}
        >>> AgentTool("lookup", lookup).spec.parameters["properties"]["city"]
        {'description': 'a city name, in English', 'type': 'string'}
    """

    name: str
    fn: Callable[..., Any]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    approval: str | None = None
    reconciler: Reconciler | None = None
    on_error: OnError = "model"
    retry: RetryPolicy | None = None
    arguments: type[pydantic.BaseModel] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_words(self.name, "name")
        if not TOOL_NAME.fullmatch(self.name):
            raise InvalidInputError(
                "must be 1 to 64 letters, digits, '_' or '-': model providers refuse other tool names",
                field="name",
            )
        if not callable(self.fn):
            raise InvalidInputError("must be callable", field="fn")
        object.__setattr__(self, "arguments", arguments_model(self.fn, self.name))
        if self.description is None:
            object.__setattr__(self, "description", describe(self.fn)[0])
        if not isinstance(self.description, str):
            raise InvalidInputError("must be a string or None", field="description")
        check_unicode(self.description, "description")
        if self.parameters is None:
            object.__setattr__(self, "parameters", json_schema(self.arguments))
        if not isinstance(self.parameters, dict):
            raise InvalidInputError("must be a JSON schema object (a dict)", field="parameters")
        try:
            check_unicode(json.dumps(self.parameters, allow_nan=False, ensure_ascii=False), "parameters")
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"must be JSON: {exc}", field="parameters") from exc
        if self.approval is not None:
            check_words(self.approval, "approval")
        if self.reconciler is not None and not callable(self.reconciler):
            raise InvalidInputError("must be a function of the ambiguous call, or None", field="reconciler")
        if self.on_error not in get_args(OnError):
            raise InvalidInputError(f"must be one of {get_args(OnError)}", field="on_error")
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise InvalidInputError("must be a RetryPolicy or None", field="retry")

    @property
    def spec(self) -> ToolSpec:
        """What the model is told about this tool."""
        return ToolSpec(self.name, self.description or "", dict(self.parameters or {}))

    def check_arguments(self, arguments: object) -> dict[str, Any]:
        """The model's arguments, validated and as JSON (what the ledger records).

        Raises:
            InvalidInputError: why they cannot be passed to ``fn``, in words for the model.
        """
        if not isinstance(arguments, dict):
            raise InvalidInputError(f"the arguments of {self.name!r} must be a JSON object")
        if INVALID_ARGUMENTS in arguments:
            text = str(arguments[INVALID_ARGUMENTS])[:200]
            raise InvalidInputError(f"the arguments of {self.name!r} are not a JSON object: {text!r}")
        try:
            valid = self.arguments.model_validate(arguments)
        except pydantic.ValidationError as exc:
            raise InvalidInputError(f"bad arguments for {self.name!r}: {explain(exc)}") from None
        return valid.model_dump(mode="json", exclude_unset=True)

    def bad_arguments(self, arguments: object) -> str | None:
        """Why the model's arguments cannot be passed to ``fn``; None when they can."""
        try:
            self.check_arguments(arguments)
        except InvalidInputError as exc:
            return str(exc)
        return None

    def invoke(self, key: str, arguments: dict[str, Any]) -> Any:
        """Call ``fn`` with the idempotency key and the recorded arguments, as Python values again."""
        valid = self.arguments.model_validate(arguments)
        values = {name: getattr(valid, name) for name in valid.model_fields_set}
        values.update(valid.model_extra or {})
        return self.fn(key, **values)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    approval: str | None = None,
    reconciler: Reconciler | None = None,
    on_error: OnError = "model",
    retry: RetryPolicy | None = None,
) -> Any:
    """An :class:`AgentTool` named after its function; use it as ``tool(fn)`` or as a decorator.

    Examples:
        >>> @tool(approval="emails a customer")
        ... def send_quote(key: str, to: str, amount: int) -> dict:
        ...     '''Email a quote.'''
        ...     return {"sent": True}
        >>> send_quote.name, send_quote.parameters["required"]
        ('send_quote', ['to', 'amount'])
    """

    def make(f: Callable[..., Any]) -> AgentTool:
        return AgentTool(
            name or str(getattr(f, "__name__", "")),
            f,
            description,
            approval=approval,
            reconciler=reconciler,
            on_error=on_error,
            retry=retry,
        )

    return make if fn is None else make(fn)


@dataclass(frozen=True)
class Agent:
    """An agent: a system prompt, tools, and the limits and retry policies of one run.

    ``model_retry`` bounds the attempts of one model call that fails transiently
    (timeouts, 429, 5xx): each failed attempt and its wait (the provider's
    ``Retry-After``, or the policy's backoff with jitter) are journaled, so a
    crash between attempts neither resets the count nor the wait. ``tool_retry``
    is the in-process retry of a tool's transient errors.
    """

    name: str
    system: str
    tools: Sequence[AgentTool]
    version: int = 1
    budget: int = 8_000
    max_turns: int = 20
    memory_k: int = 5
    model_retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(attempts=5, backoff=1.0))
    tool_retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(attempts=3, backoff=0.5))

    def __post_init__(self) -> None:
        check_words(self.name, "name")
        if not isinstance(self.system, str):
            raise InvalidInputError("must be a string", field="system")
        check_unicode(self.system, "system")
        if isinstance(self.tools, str | bytes) or not isinstance(self.tools, Sequence):
            raise InvalidInputError("must be a list of AgentTool objects", field="tools")
        if any(not isinstance(t, AgentTool) for t in self.tools):
            raise InvalidInputError("must be AgentTool objects", field="tools")
        for policy in ("model_retry", "tool_retry"):
            if not isinstance(getattr(self, policy), RetryPolicy):
                raise InvalidInputError("must be a RetryPolicy", field=policy)
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise InvalidInputError(f"tool names must be unique, got {names}", field="tools")
        for name, minimum in (("version", 1), ("budget", 1), ("max_turns", 1), ("memory_k", 0)):
            check_int(getattr(self, name), name, minimum=minimum)


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


def check_words(value: object, name: str, limit: int = MAX_ID) -> None:
    """A string with more than whitespace, of at most ``limit`` characters, that every backend can store."""
    check_text(
        "" if isinstance(value, str) and not value.strip() else value, name, limit=limit
    )  # blank is empty


def check_run(run_id: object, owner: object, task: object, session_id: object) -> None:
    """The arguments that start a run, checked before anything is written."""
    check_run_id(run_id)  # first: the session defaults to the run id, and would be blamed for it
    check_words(owner, "owner")
    check_words(task, "task", limit=100_000)
    if session_id is not None:
        check_words(session_id, "session_id")
