"""The run context: what a workflow function receives (sync), and its awaitable twin.

Every operation is written once, in :class:`~statekeep.workflow.execution.Execution`
and the ledger and wait modules; ``async`` step functions and tools are awaited on
the workflow's event loop, and :class:`AsyncRunContext` runs the same sync
methods in a thread.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from functools import partial
from typing import Any, ParamSpec, TypeVar, overload

import pydantic

from statekeep._check import check_int
from statekeep.db import aio
from statekeep.errors import ConfigError, LeaseLostError, SealedDataError, StepFailedError, StorageError
from statekeep.workflow import codec, spans, tools, waits
from statekeep.workflow._types import Checkpoint, Run
from statekeep.workflow.execution import Execution
from statekeep.workflow.registry import Step, Tool, Workflow
from statekeep.workflow.run_write import now

#: A step named by a string, checked once per name (a replay re-walks the same few names thousands of times).
_step = functools.lru_cache(maxsize=1024)(Step)

#: errors of the infrastructure, not of a step: never retried as a step failure, never fail the run
#: (a sealed value this process has no key ring for is its configuration's fault, not the run's)
_INFRASTRUCTURE = (StorageError, LeaseLostError, ConfigError, SealedDataError)

P = ParamSpec("P")
T = TypeVar("T")
M = TypeVar("M", bound=pydantic.BaseModel)


class RunContext:
    """What a (plain) workflow function receives: the door to steps, tools, waits and state.

    On resume the workflow runs again from the top; each completed step returns its
    recorded JSON output instead of running, and :meth:`state` returns the state as
    it was at that point of the run.
    """

    def __init__(self, execution: Execution) -> None:
        self.execution = execution

    @property
    def run(self) -> Run:
        """The run as it was when this execution took it."""
        return self.execution.run

    @property
    def run_id(self) -> str:
        """The id of the run."""
        return self.execution.run_id

    @property
    def replaying(self) -> bool:
        """True while the workflow is re-walking steps that already completed."""
        return self.execution.replaying

    @property
    def seq(self) -> int:
        """The journal position of the latest step the workflow asked for (0 before the first)."""
        return self.execution.seq

    # --- steps ----------------------------------------------------------------------------

    @overload
    def step(
        self, name: str | Step, fn: Callable[P, Coroutine[Any, Any, T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T: ...
    @overload
    def step(self, name: str | Step, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...
    def step(self, name: str | Step, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` as a step, or return its recorded output on replay.

        The output must be JSON; the value returned is always the decoded JSON, so a
        first run and a replay see the same thing. Staged state and cursor
        (:meth:`set_state`, :meth:`set_cursor`) commit with this step's completion. A
        :class:`~statekeep.workflow.Finish` returned by ``fn`` is finished inside the
        completion's transaction (see :meth:`joins`).

        Raises:
            StepFailedError: every attempt of the retry policy raised.
            StepOutputError: the output is not JSON; nothing was recorded.
            NonDeterminismError: the journal recorded another step at this position.
        """
        spec = name if isinstance(name, Step) else _step(name) if isinstance(name, str) else Step(name)
        exe = self.execution
        seq, recorded = exe.position(spec.name, "step")
        if recorded is not None:
            return recorded.value
        policy = spec.retry or exe.workflow.retry
        started = now()
        with spans.step(exe.run, spec.name, seq):
            for attempt in range(1, max(1, policy.attempts) + 1):
                try:
                    value = exe.invoke(fn, args, kwargs)
                except _INFRASTRUCTURE:
                    raise  # not the step's fault: the run stays resumable, its lease lapses, it is retried
                except Exception as exc:
                    if attempt >= policy.attempts:
                        raise StepFailedError(self.run_id, spec.name, seq, attempt, repr(exc)) from exc
                    spans.retrying(exe.run, spec.name, seq, attempt, exc, policy.delay(attempt))
                    aio.pause(policy.delay(attempt))
                    continue
                input_hash = _loose_hash(args, kwargs)
                return exe.complete(seq, spec.name, input_hash, value, attempt=attempt, started=started)
        raise AssertionError("unreachable")  # pragma: no cover

    def joins(self, db: object) -> bool:
        """True when writes on ``db`` can join this run's step transactions (the stores share it).

        A step function then returns a :class:`~statekeep.workflow.execution.Finish`
        that writes through ``tx.connection(db)``: its writes and the step's
        completion commit in one transaction.
        """
        return self.execution.store.shares(db)

    def set_state(self, state: pydantic.BaseModel) -> None:
        """Stage a working-state version; it commits with the next step's completion."""
        self.execution.stage_state(state)

    def set_cursor(self, cursor: int) -> None:
        """Stage an opaque context cursor (e.g. an event sequence number) for the next completion."""
        self.execution.stage_cursor(check_int(cursor, "cursor"))

    def state(self, model: type[M]) -> M | None:
        """The working state as of this point of the run, loaded into ``model``.

        On a first run, the version the last committed step produced; on replay, the
        version committed with the step just replayed (None before the first), never
        a later one. A version written by a step that crashed before its completion
        committed (stores in separate databases) is never seen.
        """
        return self.execution.state(model)

    def fast_forward(self) -> Checkpoint | None:
        """Skip replay: continue after the last completed step, and return that checkpoint.

        For loops whose progress lives in the working state (an agent's turns): resume
        then costs O(1), however long the run. Call it first, before any step.
        """
        return self.execution.fast_forward()

    # --- tools, waits, children -----------------------------------------------------------

    def call_tool(self, tool: Tool[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call a tool through the ledger, exactly once across crashes; see :mod:`.tools`."""
        return tools.call(self.execution, tool, args, kwargs)  # type: ignore[no-any-return]

    def child(self, workflow: Workflow[P, T], run_id: str, /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Start (or resume) a child run inline and return its output; the runs are linked.

        The child is taken only while this run holds its lease, and only if no other
        worker holds the child; otherwise this run waits for the child to finish.
        """
        return waits.child(self.execution, workflow, run_id, args, kwargs)  # type: ignore[no-any-return]

    def sleep(self, name: str, seconds: float | None = None, *, until: datetime | None = None) -> None:
        """Sleep durably: the run parks as ``sleeping`` and any worker wakes it when due."""
        waits.sleep(self.execution, name, seconds, until)

    def wait_for_event(self, name: str, *, timeout: float | None = None, default: Any = None) -> Any:
        """Wait durably for the event ``name``; return its payload, or ``default`` on timeout."""
        return waits.wait_for_event(self.execution, name, timeout, default)


class AsyncRunContext:
    """What an ``async`` workflow receives: the same operations, awaitable.

    Each method runs the one sync implementation, driven on the workflow's event
    loop (:mod:`statekeep.db.aio`): its statements go through the async driver and
    ``async`` step functions and tools are awaited on the loop. Without the
    ``async`` extra it runs in a thread instead.
    """

    def __init__(self, ctx: RunContext) -> None:
        self.sync = ctx
        db = getattr(ctx.execution.store, "db", None)
        self._driven = bool(getattr(db, "async_capable", False))

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        call = partial(fn, *args, **kwargs)
        return await (aio.drive(call) if self._driven else asyncio.to_thread(call))

    @property
    def run_id(self) -> str:
        """The id of the run."""
        return self.sync.run_id

    async def step(
        self,
        name: str | Step,
        fn: Callable[P, Awaitable[T]] | Callable[P, T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Awaitable :meth:`RunContext.step`."""
        return await self._call(self.sync.step, name, fn, *args, **kwargs)

    async def call_tool(self, tool: Tool[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Awaitable :meth:`RunContext.call_tool`."""
        return await self._call(self.sync.call_tool, tool, *args, **kwargs)

    async def child(self, workflow: Workflow[P, T], run_id: str, /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Awaitable :meth:`RunContext.child`."""
        return await self._call(self.sync.child, workflow, run_id, *args, **kwargs)

    async def sleep(self, name: str, seconds: float | None = None, *, until: datetime | None = None) -> None:
        """Awaitable :meth:`RunContext.sleep`."""
        await self._call(self.sync.sleep, name, seconds, until=until)

    async def wait_for_event(self, name: str, *, timeout: float | None = None, default: Any = None) -> Any:
        """Awaitable :meth:`RunContext.wait_for_event`."""
        return await self._call(self.sync.wait_for_event, name, timeout=timeout, default=default)

    def set_state(self, state: pydantic.BaseModel) -> None:
        """See :meth:`RunContext.set_state`."""
        self.sync.set_state(state)

    async def state(self, model: type[M]) -> M | None:
        """Awaitable :meth:`RunContext.state`."""
        return await self._call(self.sync.state, model)

    def fast_forward(self) -> Checkpoint | None:
        """See :meth:`RunContext.fast_forward` (no I/O)."""
        return self.sync.fast_forward()

    def set_cursor(self, cursor: int) -> None:
        """See :meth:`RunContext.set_cursor`."""
        self.sync.set_cursor(cursor)


def _loose_hash(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A hash of a step's arguments for the journal (non-JSON values hashed by their repr)."""
    return codec.loose_digest([list(args), kwargs])
