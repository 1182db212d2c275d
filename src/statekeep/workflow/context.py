"""The run context: steps, tool calls, child runs, state and cursor, written once (sync).

``async`` step functions and tools are awaited on the workflow's event loop (or a
private one); :class:`AsyncRunContext` is a thin bridge that runs the same sync
methods in a thread, so there is one implementation of every operation.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

import pydantic

from statekeep._numbers import check_int
from statekeep.errors import (
    ConfigError,
    InvalidInputError,
    LeaseLostError,
    NonDeterminismError,
    StateNotFoundError,
    StepFailedError,
    StepOutputError,
    StorageError,
)
from statekeep.workflow import codec, store
from statekeep.workflow._types import Checkpoint, Run, StepRecord
from statekeep.workflow.registry import Step, Tool, Workflow
from statekeep.working import StateVersion

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from statekeep.workflow.engine import Engine

#: errors of the infrastructure, not of a step: never retried as a step failure, never fail the run
_INFRASTRUCTURE = (StorageError, LeaseLostError, ConfigError)

P = ParamSpec("P")
T = TypeVar("T")
M = TypeVar("M", bound=pydantic.BaseModel)
PAGE = 500


class _Journal:
    """The recorded steps of a run, read lazily a page at a time (replay never loads it all)."""

    def __init__(self, engine: Engine, run: Run) -> None:
        self._engine, self._run_id, self.last_seq = engine, run.run_id, run.last_seq
        self._page: dict[int, StepRecord] = {}
        self._span = range(0)

    def get(self, seq: int) -> StepRecord | None:
        if seq > self.last_seq:
            return None
        if seq not in self._span:
            self._span = range(seq, seq + PAGE)
            self._page = {s.seq: s for s in self._engine.store.journal(self._run_id, seq, PAGE)}
        return self._page.get(seq)


class RunContext:
    """What a (plain) workflow function receives: the door to steps, tools, waits and state.

    On resume the workflow runs again from the top; each completed step returns its
    recorded JSON output instead of running.
    """

    def __init__(self, engine: Engine, run: Run, workflow: Workflow[Any, Any]) -> None:
        self.engine, self.run, self.workflow = engine, run, workflow
        self.loop: asyncio.AbstractEventLoop | None = None
        self._journal = _Journal(engine, run)
        self._seq = 0
        self._calls = 0
        self._state: tuple[pydantic.BaseModel, StateVersion] | None = None
        self._cursor: int | None = None
        self._latest_state = run.state_version

    @property
    def run_id(self) -> str:
        """The id of the run."""
        return self.run.run_id

    @property
    def replaying(self) -> bool:
        """True while the workflow is re-walking steps that already completed."""
        return self._seq < self._journal.last_seq

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
        (:meth:`set_state`, :meth:`set_cursor`) commit with this step's completion.

        Raises:
            StepFailedError: every attempt of the retry policy raised.
            StepOutputError: the output is not JSON; nothing was recorded.
            NonDeterminismError: the journal recorded another step at this position.
        """
        spec = name if isinstance(name, Step) else Step(name)
        seq, recorded = self._position(spec.name, "step")
        if recorded is not None:
            return recorded.value
        policy = spec.retry or self.workflow.retry
        started = store.now()
        for attempt in range(1, max(1, policy.attempts) + 1):
            try:
                value = self._call(fn, args, kwargs)
            except _INFRASTRUCTURE:
                raise  # not the step's fault: the run stays resumable, its lease lapses, it is retried
            except Exception as exc:
                if attempt >= policy.attempts:
                    raise StepFailedError(self.run_id, spec.name, seq, attempt, repr(exc)) from exc
                time.sleep(policy.delay(attempt))
                continue
            output = self._encode(spec.name, value)
            return self._commit(seq, spec.name, "step", _loose_hash(args, kwargs), output, attempt, started)
        raise AssertionError("unreachable")  # pragma: no cover

    def set_state(self, state: pydantic.BaseModel) -> None:
        """Stage a working-state version; it commits with the next step's completion."""
        if self.engine.state_store is None:
            raise InvalidInputError("this engine has no working-state store", field="state")
        self._state = (state, self.engine.state_store.prepare(self.run_id, state))  # validated; not written

    def set_cursor(self, cursor: int) -> None:
        """Stage an opaque context cursor (e.g. an event sequence number) for the next completion."""
        self._cursor = check_int(cursor, "cursor")

    def state(self, model: type[M]) -> M | None:
        """The working state the last committed step points at, loaded into ``model``.

        None before the first. A version written by a step that crashed before its
        completion committed (stores in separate databases) is never seen.
        """
        if self.engine.state_store is None or self._latest_state is None:
            return None
        try:  # one primary-key lookup, however many versions the run has
            return self.engine.state_store.load(self.run_id, model, version=self._latest_state)
        except StateNotFoundError:
            return None

    def fast_forward(self) -> Checkpoint | None:
        """Skip replay: continue after the last completed step, and return that checkpoint.

        For loops whose progress lives in the working state (an agent's turns): resume
        then costs O(1), however long the run. Call it first, before any step.
        """
        if self._seq != 0:
            raise InvalidInputError("must be called before any step", field="fast_forward")
        if self._journal.last_seq == 0:
            return None
        self._seq = self._journal.last_seq
        return Checkpoint(self.run_id, self.run.last_seq, self.run.state_version, self.run.cursor)

    # --- tools, waits, children (see tools.py) --------------------------------------------

    def call_tool(self, tool: Tool[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call a tool through the ledger, exactly once across crashes; see :mod:`.tools`."""
        from statekeep.workflow import tools

        return tools.call(self, tool, args, kwargs)  # type: ignore[no-any-return]

    def child(self, workflow: Workflow[P, T], run_id: str, /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Start (or resume) a child run inline and return its output; the runs are linked."""
        from statekeep.workflow import waits

        return waits.child(self, workflow, run_id, args, kwargs)  # type: ignore[no-any-return]

    def sleep(self, name: str, seconds: float | None = None, *, until: datetime | None = None) -> None:
        """Sleep durably: the run parks as ``sleeping`` and any worker wakes it when due."""
        from statekeep.workflow import waits

        waits.sleep(self, name, seconds, until)

    def wait_for_event(self, name: str, *, timeout: float | None = None, default: Any = None) -> Any:
        """Wait durably for the event ``name``; return its payload, or ``default`` on timeout."""
        from statekeep.workflow import waits

        return waits.wait_for_event(self, name, timeout, default)

    # --- the shared core ------------------------------------------------------------------

    def _position(self, name: str, kind: str) -> tuple[int, StepRecord | None]:
        # ``name`` is checked where it enters: Step(), the registry (tools, child workflows)
        # and the waits, so the hot path of a step does not check it twice.
        self._seq += 1
        recorded = self._journal.get(self._seq)
        if recorded is not None and (recorded.name, recorded.kind) != (name, kind):
            raise NonDeterminismError(
                self.run_id, self._seq, f"{recorded.kind} {recorded.name}", f"{kind} {name}"
            )
        return self._seq, recorded

    def _call(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = fn(*args, **kwargs)
        if not inspect.isawaitable(result):
            return result
        if self.loop is not None:
            return asyncio.run_coroutine_threadsafe(_coro(result), self.loop).result()
        return asyncio.run(_coro(result))

    def _encode(self, name: str, value: Any) -> str:
        try:
            return codec.to_json(value)
        except codec.NotJSONError as exc:
            raise StepOutputError(self.run_id, name, str(exc)) from exc

    def _commit(
        self, seq: int, name: str, kind: str, input_hash: str, output: str, attempt: int, started: datetime
    ) -> Any:
        with self.engine.store.db.begin() as conn:  # record_step fences the write
            self._write(conn, seq, name, kind, input_hash, output, attempt, started)
        return json.loads(output)

    def _write(
        self,
        conn: Connection,
        seq: int,
        name: str,
        kind: str,
        input_hash: str,
        output: str,
        attempt: int,
        started: datetime,
    ) -> None:
        """Write a completion (with staged state and cursor) inside the caller's fenced transaction."""
        version = self.engine._save_state(conn, self._state, self._latest_state)
        step = StepRecord(
            self.run_id,
            seq,
            name,
            kind,
            input_hash,
            output,
            attempt,
            started,
            store.now(),
            version,
            self._cursor,
        )
        store.record_step(conn, step, self.run.epoch)
        self._state, self._cursor = None, None
        if version is not None:
            self._latest_state = version  # only read again after this transaction commits


class AsyncRunContext:
    """What an ``async`` workflow receives: the same operations, awaitable.

    Each method runs the one sync implementation in a thread; ``async`` step
    functions and tools are awaited back on the workflow's own event loop.
    """

    def __init__(self, ctx: RunContext) -> None:
        self.sync = ctx

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
        return await asyncio.to_thread(self.sync.step, name, fn, *args, **kwargs)  # type: ignore[arg-type]

    async def call_tool(self, tool: Tool[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Awaitable :meth:`RunContext.call_tool`."""
        return await asyncio.to_thread(self.sync.call_tool, tool, *args, **kwargs)

    async def child(self, workflow: Workflow[P, T], run_id: str, /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Awaitable :meth:`RunContext.child`."""
        return await asyncio.to_thread(self.sync.child, workflow, run_id, *args, **kwargs)

    async def sleep(self, name: str, seconds: float | None = None, *, until: datetime | None = None) -> None:
        """Awaitable :meth:`RunContext.sleep`."""
        await asyncio.to_thread(self.sync.sleep, name, seconds, until=until)

    async def wait_for_event(self, name: str, *, timeout: float | None = None, default: Any = None) -> Any:
        """Awaitable :meth:`RunContext.wait_for_event`."""
        return await asyncio.to_thread(self.sync.wait_for_event, name, timeout=timeout, default=default)

    def set_state(self, state: pydantic.BaseModel) -> None:
        """See :meth:`RunContext.set_state`."""
        self.sync.set_state(state)

    async def state(self, model: type[M]) -> M | None:
        """Awaitable :meth:`RunContext.state`."""
        return await asyncio.to_thread(self.sync.state, model)

    def fast_forward(self) -> Checkpoint | None:
        """See :meth:`RunContext.fast_forward` (no I/O)."""
        return self.sync.fast_forward()

    def set_cursor(self, cursor: int) -> None:
        """See :meth:`RunContext.set_cursor`."""
        self.sync.set_cursor(cursor)


async def _coro(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _loose_hash(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A hash of a step's arguments for the journal (non-JSON values hashed by their repr)."""
    return codec.loose_digest([list(args), kwargs])
