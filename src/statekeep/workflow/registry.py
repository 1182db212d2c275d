"""The registry: workflows (name + version), tools (with an optional reconciler), migrations."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

import pydantic

from statekeep._check import check_duration, check_id, check_int, check_storable
from statekeep.errors import InvalidInputError, UnknownWorkflowError
from statekeep.workflow._types import LedgerEntry, Reconciliation, RetryPolicy, StepRecord

if TYPE_CHECKING:
    from statekeep.workflow.run_context import AsyncRunContext, RunContext

P = ParamSpec("P")
R = TypeVar("R")

#: A journal migration: rewrite a run's journal so that the new version's code replays it.
JournalMigration = Callable[[list[StepRecord]], list[StepRecord]]


class Reconciler(Protocol):
    """Decides whether an ambiguous tool call (started, never completed) actually happened."""

    def __call__(self, call: LedgerEntry) -> Reconciliation: ...


@dataclass(frozen=True)
class Workflow(Generic[P, R]):
    """A registered workflow function. Start it with :meth:`Engine.run`."""

    name: str
    version: int
    fn: Callable[..., Any]
    retry: RetryPolicy
    state: type[pydantic.BaseModel] | None
    #: the parameter that names the run's owner (whose data it holds), if any
    owner: str | None = None

    @property
    def is_async(self) -> bool:
        """True for an ``async def`` workflow (it receives an :class:`AsyncRunContext`)."""
        return inspect.iscoroutinefunction(self.fn)

    def owner_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """The owner a run started with these arguments belongs to (None without an ``owner`` parameter).

        Raises:
            InvalidInputError: the owner argument is missing or not a non-empty string.
        """
        if self.owner is None:
            return None
        try:
            bound = inspect.signature(self.fn).bind(None, *args, **kwargs)
        except TypeError as exc:
            raise InvalidInputError(f"arguments do not fit {self.name!r}: {exc}", field="input") from None
        value = bound.arguments.get(self.owner)
        if not isinstance(value, str) or not value.strip():
            raise InvalidInputError("the owner must be a non-empty string", field=self.owner)
        return check_id(value, self.owner)


@dataclass(frozen=True)
class Gate:
    """An approval a person must give before a tool call runs."""

    reason: str
    expires_in: timedelta | None = None


@dataclass(frozen=True)
class Tool(Generic[P, R]):
    """A side-effecting function called through the ledger. Its first argument is the idempotency key."""

    name: str
    fn: Callable[..., Any]
    reconciler: Reconciler | None = None
    gate: Gate | None = None

    def requiring_approval(self, reason: str, *, expires_in: timedelta | None = None) -> Tool[P, R]:
        """The same tool, gated: each call waits for a person's approval of its exact arguments.

        Examples:
            >>> # ctx.call_tool(refund.requiring_approval("over 100 EUR"), order_id, amount)
        """
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInputError("must say why approval is needed", field="reason")
        check_storable(reason, "reason")
        if expires_in is not None:
            check_duration(expires_in, "expires_in")
        return dataclasses.replace(self, gate=Gate(reason, expires_in))


@dataclass(frozen=True)
class Step:
    """Options of one step: its journal name and retry policy (``ctx.step(Step(...), fn, ...)``)."""

    name: str
    retry: RetryPolicy | None = None

    def __post_init__(self) -> None:
        check_id(self.name, "step name")
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise InvalidInputError("must be a RetryPolicy or None", field="retry")


class _WorkflowDecorator:
    def __init__(
        self, registry: Registry, name: str, version: int, retry: RetryPolicy, state: Any, owner: str | None
    ) -> None:
        self._args = (registry, name, version, retry, state, owner)

    @overload
    def __call__(
        self, fn: Callable[Concatenate[AsyncRunContext, P], Coroutine[Any, Any, R]]
    ) -> Workflow[P, R]: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[RunContext, P], R]) -> Workflow[P, R]: ...
    def __call__(self, fn: Callable[..., Any]) -> Workflow[Any, Any]:
        registry, name, version, retry, state, owner = self._args
        if owner is not None and owner not in inspect.signature(fn).parameters:
            raise InvalidInputError(f"{fn.__name__}() has no parameter {owner!r}", field="owner")
        workflow: Workflow[Any, Any] = Workflow(name, version, fn, retry, state, owner)
        registry._add(workflow)
        return workflow


class _ToolDecorator:
    def __init__(self, registry: Registry, name: str | None, reconciler: Reconciler | None) -> None:
        self._args = (registry, name, reconciler)

    @overload
    def __call__(self, fn: Callable[Concatenate[str, P], Coroutine[Any, Any, R]]) -> Tool[P, R]: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[str, P], R]) -> Tool[P, R]: ...
    def __call__(self, fn: Callable[..., Any]) -> Tool[Any, Any]:
        registry, name, reconciler = self._args
        tool: Tool[Any, Any] = Tool(name or fn.__name__, fn, reconciler)
        registry.tools[tool.name] = tool
        return tool


class Registry:
    """Workflows by name and version, tools by name, and journal migrations between versions.

    Examples:
        >>> registry = Registry()
        >>> @registry.workflow("hello", version=1)
        ... def hello(ctx, name: str) -> str:
        ...     return ctx.step("greet", str.upper, name)
        >>> registry.get("hello", 1).version
        1
    """

    def __init__(self) -> None:
        self.workflows: dict[tuple[str, int], Workflow[Any, Any]] = {}
        self.tools: dict[str, Tool[Any, Any]] = {}
        self.migrations: dict[tuple[str, int], tuple[int, JournalMigration]] = {}

    def workflow(
        self,
        name: str,
        *,
        version: int = 1,
        retry: RetryPolicy | None = None,
        state: type[pydantic.BaseModel] | None = None,
        owner: str | None = None,
    ) -> _WorkflowDecorator:
        """Register a workflow function (plain or ``async``) under ``name`` and ``version``.

        ``retry`` is the default policy of its steps; ``state`` the working-state model it keeps.
        ``owner`` names the parameter that holds the person whose data a run holds: each
        run records it (its child runs inherit it), a key ring seals the run's payloads
        with that owner's data key, and erasing the owner deletes the run.
        """
        _check_name(name)
        check_int(version, "version", minimum=1, maximum=MAX_VERSION)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidInputError("must be a RetryPolicy or None", field="retry")
        if state is not None and not (isinstance(state, type) and issubclass(state, pydantic.BaseModel)):
            raise InvalidInputError("must be a pydantic model class or None", field="state")
        if owner is not None:
            check_id(owner, "owner")
        return _WorkflowDecorator(self, name, version, retry or RetryPolicy(), state, owner)

    def tool(self, name: str | None = None, *, reconciler: Reconciler | None = None) -> _ToolDecorator:
        """Register a tool; ``reconciler`` settles its ambiguous calls after a crash."""
        if name is not None:
            _check_name(name)
        return _ToolDecorator(self, name, reconciler)

    def migration(
        self, name: str, *, from_version: int, to_version: int
    ) -> Callable[[JournalMigration], JournalMigration]:
        """Register how runs of ``name`` started under ``from_version`` continue under ``to_version``.

        The function gets the run's journal and returns the journal the new code replays
        (return it unchanged when the new code is replay-compatible).
        """
        _check_name(name)
        check_int(from_version, "from_version", minimum=1, maximum=MAX_VERSION)
        check_int(to_version, "to_version", minimum=1, maximum=MAX_VERSION)
        if to_version <= from_version:
            raise InvalidInputError("must be greater than from_version", field="to_version")

        def _register(fn: JournalMigration) -> JournalMigration:
            self.migrations[(name, from_version)] = (to_version, fn)
            return fn

        return _register

    def _add(self, workflow: Workflow[Any, Any]) -> None:
        key = (workflow.name, workflow.version)
        if key in self.workflows and self.workflows[key].fn is not workflow.fn:
            raise InvalidInputError(
                f"{workflow.name!r} v{workflow.version} is registered twice", field="version"
            )
        self.workflows[key] = workflow

    def get(self, name: str, version: int) -> Workflow[Any, Any]:
        """The workflow registered under ``name`` and ``version``.

        Raises:
            InvalidInputError: ``name`` is not a name or ``version`` not an int >= 1.
            UnknownWorkflowError: nothing is registered under that name and version.
        """
        _check_name(name)
        check_int(version, "version", minimum=1, maximum=MAX_VERSION)
        try:
            return self.workflows[(name, version)]
        except KeyError:
            raise UnknownWorkflowError("workflow", name, version) from None

    def versions(self, name: str) -> list[int]:
        """Registered versions of a workflow, ascending."""
        return sorted(v for n, v in self.workflows if n == name)

    def migration_path(self, name: str, version: int) -> tuple[int, list[JournalMigration]] | None:
        """The registered version a run of ``version`` can reach, and the migrations on the way."""
        chain: list[JournalMigration] = []
        while (name, version) not in self.workflows:
            if (name, version) not in self.migrations:
                return None
            version, fn = self.migrations[(name, version)]
            chain.append(fn)
        return version, chain

    def runnable(self) -> list[tuple[str, int]]:
        """Every (workflow, version) a worker with this registry can run, directly or by migration."""
        sources = set(self.workflows) | set(self.migrations)
        return sorted(k for k in sources if self.migration_path(*k) is not None)


#: Workflow versions are 32-bit integers in the runs table.
MAX_VERSION = 2**31 - 1


def _check_name(name: object) -> None:
    check_id(name, "name")
